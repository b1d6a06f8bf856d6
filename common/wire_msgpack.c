/* wire_msgpack: the guard in front of msgpack-c, the readers of fields, the packer
 * (wire_msgpack.h); the messages themselves are in wire_req.c and wire_reply.c. */
#include "wire_msgpack.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the guard in front of msgpack-c ---- */

static uint64_t be(const uint8_t *p, int n)
{
	uint64_t v = 0;
	while (n--)
		v = v << 8 | *p++;
	return v;
}

/* Walk one object at *off: a container may not declare more elements than bytes remain,
 * nesting stays within WIRE_DEPTH.  0 or -1. */
static int precheck(const uint8_t *p, size_t len, size_t *off, int depth)
{
	if (*off >= len || depth > WIRE_DEPTH)
		return -1;
	uint8_t b = p[(*off)++];
	uint64_t n = 0, skip = 0;
	int lenbytes = 0;
	bool container = false;
	if (b <= 0x7f || b >= 0xe0 || b == 0xc0 || b == 0xc2 || b == 0xc3)
		return 0;
	if ((b & 0xf0) == 0x80 || (b & 0xf0) == 0x90) {
		n = (uint64_t)(b & 0x0f) * ((b & 0xf0) == 0x80 ? 2 : 1);
		container = true;
	} else if ((b & 0xe0) == 0xa0) {
		skip = b & 0x1f;
	} else {
		switch (b) {
		case 0xc4: case 0xd9: lenbytes = 1; break;
		case 0xc5: case 0xda: lenbytes = 2; break;
		case 0xc6: case 0xdb: lenbytes = 4; break;
		case 0xc7: lenbytes = 1, skip = 1; break;
		case 0xc8: lenbytes = 2, skip = 1; break;
		case 0xc9: lenbytes = 4, skip = 1; break;
		case 0xca: skip = 4; break;
		case 0xcb: skip = 8; break;
		case 0xcc: case 0xd0: skip = 1; break;
		case 0xcd: case 0xd1: skip = 2; break;
		case 0xce: case 0xd2: skip = 4; break;
		case 0xcf: case 0xd3: skip = 8; break;
		case 0xd4: skip = 2; break;
		case 0xd5: skip = 3; break;
		case 0xd6: skip = 5; break;
		case 0xd7: skip = 9; break;
		case 0xd8: skip = 17; break;
		case 0xdc: case 0xde: lenbytes = 2, container = true; break;
		case 0xdd: case 0xdf: lenbytes = 4, container = true; break;
		default: return -1; /* 0xc1: never used */
		}
		if (lenbytes) {
			if (len - *off < (size_t)lenbytes)
				return -1;
			uint64_t v = be(p + *off, lenbytes);
			*off += (size_t)lenbytes;
			if (container)
				n = b >= 0xde ? 2 * v : v;
			else
				skip += v;
		}
	}
	if (container) {
		if (n > len - *off)
			return -1;
		for (uint64_t i = 0; i < n; i++)
			if (precheck(p, len, off, depth + 1))
				return -1;
		return 0;
	}
	if (skip > len - *off)
		return -1;
	*off += (size_t)skip;
	return 0;
}

/* Unpack exactly one map that fills buf. */
int wire_unpack_map(const void *buf, size_t len, msgpack_unpacked *u)
{
	size_t pre = 0, off = 0;
	if (precheck(buf, len, &pre, 0) || pre != len)
		return -1;
	if (msgpack_unpack_next(u, buf, len, &off) != MSGPACK_UNPACK_SUCCESS || off != len ||
	    u->data.type != MSGPACK_OBJECT_MAP)
		return -1;
	return 0;
}

/* ---- reading fields ---- */

int wire_get_u64(const msgpack_object *o, uint64_t *out)
{
	if (o->type != MSGPACK_OBJECT_POSITIVE_INTEGER)
		return -1;
	*out = o->via.u64;
	return 0;
}

int wire_get_bool(const msgpack_object *o, bool *out)
{
	if (o->type != MSGPACK_OBJECT_BOOLEAN)
		return -1;
	*out = o->via.boolean;
	return 0;
}

/* A string of at most max bytes without NUL, copied; NULL if it is not one. */
char *wire_get_str(const msgpack_object *o, size_t max)
{
	if (o->type != MSGPACK_OBJECT_STR || o->via.str.size > max || memchr(o->via.str.ptr, 0, o->via.str.size))
		return NULL;
	return strndup(o->via.str.ptr, o->via.str.size);
}

char *wire_get_path(const msgpack_object *o)
{
	char *s = wire_get_str(o, GMSFS_PATH_MAX);
	if (s && !gmsfs_path_valid(s, strlen(s))) {
		free(s);
		return NULL;
	}
	return s;
}

char *wire_get_tag(const msgpack_object *o)
{
	char *s = wire_get_str(o, GMSFS_TAG_MAX);
	if (s && !gmsfs_tag_valid(s, strlen(s))) {
		free(s);
		return NULL;
	}
	return s;
}

/* Bytes (bin, or str for the shell's sake) of at most max, copied. */
int wire_get_bytes(const msgpack_object *o, size_t max, uint8_t **out, size_t *len)
{
	const char *p;
	size_t n;
	if (o->type == MSGPACK_OBJECT_BIN)
		p = o->via.bin.ptr, n = o->via.bin.size;
	else if (o->type == MSGPACK_OBJECT_STR)
		p = o->via.str.ptr, n = o->via.str.size;
	else
		return -1;
	if (n > max)
		return -1;
	*out = malloc(n ? n : 1);
	if (!*out)
		return -1;
	memcpy(*out, p, n);
	*len = n;
	return 0;
}


void wire_pack_bin(msgpack_packer *pk, const void *p, size_t n)
{
	msgpack_pack_bin(pk, n);
	msgpack_pack_bin_body(pk, p, n);
}

static int sb_write(void *data, const char *buf, size_t len)
{
	struct wire_packer *p = data;
	if (p->err)
		return -1;
	if (msgpack_sbuffer_write(p->sb, buf, len)) {
		p->err = -ENOMEM;
		return -1;
	}
	return 0;
}

void wire_packer_init(struct wire_packer *p, msgpack_sbuffer *sb)
{
	p->sb = sb;
	p->err = 0;
	msgpack_packer_init(&p->pk, p, sb_write);
}

/* ---- the maps of one allocation and one entry (manifests, requests, images) ---- */

static const char *const tier_name[] = { "store", "device", "host" };

void wire_pack_alloc(msgpack_packer *pk, const struct wire_alloc *a)
{
	msgpack_pack_map(pk, 6 + (a->tier != WIRE_TIER_STORE) + (a->npieces ? 2 : 0) + a->ro + (a->nstandby != 0));
	if (a->nstandby) {
		/* an image's: each piece's host memory made ahead, [fd, fdoff] or nil */
		wire_pack_str(pk, WIRE_K_STANDBY), msgpack_pack_array(pk, a->nstandby);
		for (uint32_t i = 0; i < a->nstandby; i++) {
			if (a->standby[i].fd == WIRE_NO_FD) {
				msgpack_pack_nil(pk);
				continue;
			}
			msgpack_pack_array(pk, 2);
			msgpack_pack_uint32(pk, a->standby[i].fd);
			msgpack_pack_uint64(pk, a->standby[i].fd_offset);
		}
	}
	if (a->tier != WIRE_TIER_STORE)
		wire_pack_str(pk, WIRE_K_TIER), wire_pack_str(pk, tier_name[a->tier]);
	if (a->ro)
		wire_pack_str(pk, GMSFS_K_RO), msgpack_pack_true(pk);
	wire_pack_str(pk, GMSFS_K_PATH), wire_pack_str(pk, a->path);
	wire_pack_str(pk, GMSFS_K_SIZE), msgpack_pack_uint64(pk, a->size);
	wire_pack_str(pk, GMSFS_K_ALIGNED), msgpack_pack_uint64(pk, a->aligned);
	wire_pack_str(pk, GMSFS_K_TAG), wire_pack_str(pk, a->tag);
	wire_pack_str(pk, GMSFS_K_FD), msgpack_pack_uint32(pk, a->fd);
	wire_pack_str(pk, GMSFS_K_FD_OFFSET), msgpack_pack_uint64(pk, a->fd_offset);
	if (!a->npieces)
		return;
	wire_pack_str(pk, GMSFS_K_PIECE), msgpack_pack_uint64(pk, a->piece);
	wire_pack_str(pk, GMSFS_K_PIECES), msgpack_pack_array(pk, a->npieces);
	for (uint32_t i = 0; i < a->npieces; i++) {
		/* [fd, fdoff], and in an image the piece's tier where it is not the head's */
		bool tier = a->pieces[i].tier != WIRE_TIER_STORE;
		msgpack_pack_array(pk, 2 + tier);
		msgpack_pack_uint32(pk, a->pieces[i].fd);
		msgpack_pack_uint64(pk, a->pieces[i].fd_offset);
		if (tier)
			wire_pack_str(pk, tier_name[a->pieces[i].tier]);
	}
}

void wire_alloc_free(struct wire_alloc *a)
{
	free(a->path);
	free(a->tag);
	free(a->pieces);
	free(a->standby);
	a->path = a->tag = NULL;
	a->pieces = a->standby = NULL;
	a->npieces = a->nstandby = 0;
}

static int parse_tier(const msgpack_object *v, enum wire_tier *out)
{
	char *t = wire_get_str(v, 8);
	bool host = t && !strcmp(t, "host"), device = t && !strcmp(t, "device");
	free(t);
	*out = host ? WIRE_TIER_HOST : WIRE_TIER_DEVICE;
	return host || device ? 0 : -1;
}

/* "pieces": each [fd, fdoff] (an image's may add its tier), fd below nfds. */
static int parse_pieces(const msgpack_object *v, struct wire_alloc *a, uint64_t nfds, bool image)
{
	if (v->type != MSGPACK_OBJECT_ARRAY || v->via.array.size < 2 || v->via.array.size > GMSFS_PIECES_MAX ||
	    !(a->pieces = calloc(v->via.array.size, sizeof *a->pieces)))
		return -1;
	a->npieces = v->via.array.size;
	for (uint32_t i = 0; i < a->npieces; i++) {
		const msgpack_object *p = &v->via.array.ptr[i];
		uint64_t fd;
		if (p->type != MSGPACK_OBJECT_ARRAY || p->via.array.size < 2 || p->via.array.size > 2u + image ||
		    wire_get_u64(&p->via.array.ptr[0], &fd) || fd >= nfds ||
		    wire_get_u64(&p->via.array.ptr[1], &a->pieces[i].fd_offset) ||
		    (p->via.array.size == 3 && parse_tier(&p->via.array.ptr[2], &a->pieces[i].tier)))
			return -1;
		a->pieces[i].fd = (uint32_t)fd;
	}
	return 0;
}

/* An image's "standby": each [fd, fdoff] or nil (WIRE_NO_FD), fd below nfds. */
static int parse_standby(const msgpack_object *v, struct wire_alloc *a, uint64_t nfds)
{
	if (v->type != MSGPACK_OBJECT_ARRAY || !v->via.array.size || v->via.array.size > GMSFS_PIECES_MAX ||
	    !(a->standby = calloc(v->via.array.size, sizeof *a->standby)))
		return -1;
	a->nstandby = v->via.array.size;
	for (uint32_t i = 0; i < a->nstandby; i++) {
		const msgpack_object *p = &v->via.array.ptr[i];
		uint64_t fd;
		a->standby[i] = (struct wire_piece){ .fd = WIRE_NO_FD, .tier = WIRE_TIER_HOST };
		if (p->type == MSGPACK_OBJECT_NIL)
			continue;
		if (p->type != MSGPACK_OBJECT_ARRAY || p->via.array.size != 2 || wire_get_u64(&p->via.array.ptr[0], &fd) ||
		    fd >= nfds || wire_get_u64(&p->via.array.ptr[1], &a->standby[i].fd_offset))
			return -1;
		a->standby[i].fd = (uint32_t)fd;
	}
	return 0;
}

/* An allocation's fields agree: aligned holds size; pieces, if any, are as many as piece
 * bytes need, their first where fd and fdoff say, none past the end of numbers. */
static bool alloc_whole(const struct wire_alloc *a)
{
	if (!a->size || a->aligned < a->size || a->fd_offset > UINT64_MAX - a->aligned)
		return false;
	if (a->nstandby && a->nstandby != (a->npieces ? a->npieces : 1))
		return false; /* one a piece */
	if (!a->npieces)
		return !a->piece;
	if (!a->piece || a->piece >= a->aligned ||
	    a->aligned / a->piece + (a->aligned % a->piece != 0) != a->npieces ||
	    a->pieces[0].fd != a->fd || a->pieces[0].fd_offset != a->fd_offset)
		return false;
	for (uint32_t i = 0; i < a->npieces; i++)
		if (a->pieces[i].fd_offset > UINT64_MAX - a->piece)
			return false;
	return true;
}

int wire_parse_alloc(const msgpack_object *o, struct wire_alloc *a, uint64_t nfds, bool image)
{
	if (o->type != MSGPACK_OBJECT_MAP)
		return -1;
	unsigned seen = 0;
	uint64_t fd = 0;
	for (uint32_t i = 0; i < o->via.map.size; i++) {
		const msgpack_object *k = &o->via.map.ptr[i].key, *v = &o->via.map.ptr[i].val;
		if (wire_key_is(k, GMSFS_K_PATH)) {
			if (SEEN(0) || !(a->path = wire_get_path(v)))
				return -1;
		} else if (wire_key_is(k, GMSFS_K_TAG)) {
			if (SEEN(1) || !(a->tag = wire_get_tag(v)))
				return -1;
		} else if (wire_key_is(k, GMSFS_K_SIZE)) {
			if (SEEN(2) || wire_get_u64(v, &a->size))
				return -1;
		} else if (wire_key_is(k, GMSFS_K_ALIGNED)) {
			if (SEEN(3) || wire_get_u64(v, &a->aligned))
				return -1;
		} else if (wire_key_is(k, GMSFS_K_FD)) {
			if (SEEN(4) || wire_get_u64(v, &fd) || fd >= nfds)
				return -1;
			a->fd = (uint32_t)fd;
		} else if (wire_key_is(k, GMSFS_K_FD_OFFSET)) {
			if (SEEN(5) || wire_get_u64(v, &a->fd_offset))
				return -1;
		} else if (image && wire_key_is(k, WIRE_K_TIER)) {
			if (SEEN(6) || parse_tier(v, &a->tier))
				return -1;
		} else if (wire_key_is(k, GMSFS_K_PIECE)) {
			if (SEEN(7) || wire_get_u64(v, &a->piece))
				return -1;
		} else if (wire_key_is(k, GMSFS_K_PIECES)) {
			if (SEEN(8) || parse_pieces(v, a, nfds, image))
				return -1;
		} else if (!image && wire_key_is(k, GMSFS_K_RO)) {
			if (SEEN(9) || wire_get_bool(v, &a->ro))
				return -1;
		} else if (image && wire_key_is(k, WIRE_K_STANDBY)) {
			if (SEEN(10) || parse_standby(v, a, nfds))
				return -1;
		} else {
			return -1;
		}
	}
	return (seen & 0x3f) == 0x3f && alloc_whole(a) ? 0 : -1;
}

void wire_pack_entry(msgpack_packer *pk, const struct entry_rec *e)
{
	msgpack_pack_map(pk, 6);
	wire_pack_str(pk, GMSFS_K_KEY), wire_pack_str(pk, e->key);
	wire_pack_str(pk, GMSFS_K_ALLOC), wire_pack_str(pk, e->alloc);
	wire_pack_str(pk, GMSFS_K_OFFSET), msgpack_pack_uint64(pk, e->offset);
	wire_pack_str(pk, GMSFS_K_SIZE), msgpack_pack_uint64(pk, e->size);
	wire_pack_str(pk, GMSFS_K_FLAGS), msgpack_pack_uint32(pk, e->flags);
	wire_pack_str(pk, GMSFS_K_VALUE), wire_pack_bin(pk, e->value_len ? (const void *)e->value : "", e->value_len);
}

int wire_parse_entry(const msgpack_object *o, struct entry_rec *e)
{
	if (o->type != MSGPACK_OBJECT_MAP)
		return -1;
	unsigned seen = 0;
	for (uint32_t i = 0; i < o->via.map.size; i++) {
		const msgpack_object *k = &o->via.map.ptr[i].key, *v = &o->via.map.ptr[i].val;
		uint64_t f;
		if (wire_key_is(k, GMSFS_K_KEY)) {
			if (SEEN(0) || !(e->key = wire_get_path(v)))
				return -1;
		} else if (wire_key_is(k, GMSFS_K_ALLOC)) {
			if (SEEN(1) || !(e->alloc = wire_get_path(v)))
				return -1;
		} else if (wire_key_is(k, GMSFS_K_OFFSET)) {
			if (SEEN(2) || wire_get_u64(v, &e->offset))
				return -1;
		} else if (wire_key_is(k, GMSFS_K_SIZE)) {
			if (SEEN(3) || wire_get_u64(v, &e->size))
				return -1;
		} else if (wire_key_is(k, GMSFS_K_FLAGS)) {
			if (SEEN(4) || wire_get_u64(v, &f) || (f & ~(uint64_t)GMSFS_ENTRY_FLAGS))
				return -1;
			e->flags = (uint32_t)f;
		} else if (wire_key_is(k, GMSFS_K_VALUE)) {
			uint8_t *value;
			if (SEEN(5) || wire_get_bytes(v, GMSFS_VALUE_MAX, &value, &e->value_len))
				return -1;
			e->value = value;
		} else {
			return -1;
		}
	}
	return (seen & 3) == 3 ? 0 : -1; /* key and alloc; the rest default to 0 and "" */
}

