/* wire_reply: replies (wire.h): plain ones and manifests, packed by the daemon and
 * parsed by the client. */
#include "wire_msgpack.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define WIRE_V 2

size_t wire_alloc_cost(const char *path, const char *tag)
{
	/* A map of 6, six short keys, two uint64, two small ints, two strings and headers. */
	return 80 + strlen(path) + strlen(tag);
}

size_t wire_chunk_cost(const char *key, const char *alloc, size_t nbytes)
{
	return 96 + strlen(key) + strlen(alloc) + nbytes;
}

int wire_pack_reply(msgpack_sbuffer *sb, const struct wire_head *h, const struct wire_alloc *a, size_t na,
		    const struct wire_chunk *c, size_t nc)
{
	struct wire_packer p;
	wire_packer_init(&p, sb);
	msgpack_pack_map(&p.pk, 2 + (h->msg != NULL) + (h->manifest ? 6 + h->has_gen : 0));
	wire_pack_str(&p.pk, GMSFS_K_VERSION), msgpack_pack_int(&p.pk, WIRE_V);
	wire_pack_str(&p.pk, GMSFS_K_ERR), msgpack_pack_int(&p.pk, h->err);
	if (h->msg)
		wire_pack_str(&p.pk, GMSFS_K_MSG), wire_pack_str(&p.pk, h->msg);
	if (!h->manifest)
		return p.err;
	wire_pack_str(&p.pk, GMSFS_K_TOTAL), msgpack_pack_uint64(&p.pk, h->total);
	wire_pack_str(&p.pk, GMSFS_K_NENTRIES), msgpack_pack_uint64(&p.pk, h->nentries);
	wire_pack_str(&p.pk, GMSFS_K_FIRST), msgpack_pack_uint64(&p.pk, h->first);
	wire_pack_str(&p.pk, GMSFS_K_LAST), h->last ? msgpack_pack_true(&p.pk) : msgpack_pack_false(&p.pk);
	if (h->has_gen)
		wire_pack_str(&p.pk, GMSFS_K_GEN), msgpack_pack_uint64(&p.pk, h->gen);
	wire_pack_str(&p.pk, GMSFS_K_ALLOCS);
	msgpack_pack_array(&p.pk, na);
	for (size_t i = 0; i < na; i++)
		wire_pack_alloc(&p.pk, &a[i]);
	wire_pack_str(&p.pk, GMSFS_K_META);
	msgpack_pack_array(&p.pk, nc);
	for (size_t i = 0; i < nc; i++) {
		bool head = c[i].voff == 0;
		msgpack_pack_map(&p.pk, head ? 8 : 3);
		wire_pack_str(&p.pk, GMSFS_K_KEY), wire_pack_str(&p.pk, c[i].key);
		wire_pack_str(&p.pk, GMSFS_K_VALUE_OFF), msgpack_pack_uint64(&p.pk, c[i].voff);
		wire_pack_str(&p.pk, GMSFS_K_VALUE), wire_pack_bin(&p.pk, c[i].nbytes ? (const void *)c[i].bytes : "", c[i].nbytes);
		if (!head)
			continue;
		wire_pack_str(&p.pk, GMSFS_K_ALLOC), wire_pack_str(&p.pk, c[i].alloc);
		wire_pack_str(&p.pk, GMSFS_K_OFFSET), msgpack_pack_uint64(&p.pk, c[i].offset);
		wire_pack_str(&p.pk, GMSFS_K_SIZE), msgpack_pack_uint64(&p.pk, c[i].size);
		wire_pack_str(&p.pk, GMSFS_K_FLAGS), msgpack_pack_uint32(&p.pk, c[i].flags);
		wire_pack_str(&p.pk, GMSFS_K_VALUE_LEN), msgpack_pack_uint64(&p.pk, c[i].value_len);
	}
	return p.err;
}

/* ---- replies ---- */

void wire_reply_free(struct wire_reply *r)
{
	for (size_t i = 0; i < r->nallocs; i++)
		wire_alloc_free(&r->allocs[i]);
	free(r->allocs);
	for (size_t i = 0; i < r->nchunks; i++) {
		free(r->chunks[i].key);
		free(r->chunks[i].alloc);
		free(r->chunks[i].bytes);
	}
	free(r->chunks);
	r->allocs = NULL;
	r->chunks = NULL;
	r->nallocs = r->nchunks = 0;
}

static int parse_chunk(const msgpack_object *o, struct wire_chunk *c)
{
	if (o->type != MSGPACK_OBJECT_MAP)
		return -1;
	unsigned seen = 0;
	uint64_t f;
	for (uint32_t i = 0; i < o->via.map.size; i++) {
		const msgpack_object *k = &o->via.map.ptr[i].key, *v = &o->via.map.ptr[i].val;
		if (wire_key_is(k, GMSFS_K_KEY)) {
			if (SEEN(0) || !(c->key = wire_get_path(v)))
				return -1;
		} else if (wire_key_is(k, GMSFS_K_VALUE_OFF)) {
			if (SEEN(1) || wire_get_u64(v, &c->voff))
				return -1;
		} else if (wire_key_is(k, GMSFS_K_VALUE)) {
			if (SEEN(2) || wire_get_bytes(v, GMSFS_VALUE_MAX, &c->bytes, &c->nbytes))
				return -1;
		} else if (wire_key_is(k, GMSFS_K_ALLOC)) {
			/* "" for an entry of a writer's session that names no allocation yet */
			if (SEEN(3) || !(c->alloc = wire_get_str(v, GMSFS_PATH_MAX)) ||
			    (c->alloc[0] && !gmsfs_path_valid(c->alloc, strlen(c->alloc))))
				return -1;
		} else if (wire_key_is(k, GMSFS_K_OFFSET)) {
			if (SEEN(4) || wire_get_u64(v, &c->offset))
				return -1;
		} else if (wire_key_is(k, GMSFS_K_SIZE)) {
			if (SEEN(5) || wire_get_u64(v, &c->size))
				return -1;
		} else if (wire_key_is(k, GMSFS_K_FLAGS)) {
			if (SEEN(6) || wire_get_u64(v, &f) || (f & ~(uint64_t)GMSFS_ENTRY_FLAGS))
				return -1;
			c->flags = (uint32_t)f;
		} else if (wire_key_is(k, GMSFS_K_VALUE_LEN)) {
			if (SEEN(7) || wire_get_u64(v, &c->value_len) || c->value_len > GMSFS_VALUE_MAX)
				return -1;
		} else {
			return -1;
		}
	}
	if ((seen & 7) != 7)
		return -1;
	if (c->voff == 0) {
		if (seen != 0xff)
			return -1;
	} else if (seen != 7) {
		return -1; /* a continuation carries key, voff and value only */
	}
	return c->voff <= GMSFS_VALUE_MAX && c->nbytes <= GMSFS_VALUE_MAX - c->voff ? 0 : -1;
}

/* The manifest's arrays: 0, or -EPROTO/-ENOMEM with *bad set. */
static int parse_arrays(struct wire_reply *r, const msgpack_object *allocs, const msgpack_object *meta,
			const char **bad)
{
	uint32_t na = allocs->via.array.size, nc = meta->via.array.size;
	*bad = "inconsistent counts";
	if (na > GMSFS_FDS_PER_MSG || r->first > r->total || na > r->total - r->first ||
	    (r->last && r->first + na != r->total))
		return -EPROTO;
	if ((na && !(r->allocs = calloc(na, sizeof *r->allocs))) || (nc && !(r->chunks = calloc(nc, sizeof *r->chunks))))
		return -ENOMEM;
	*bad = "bad allocation (path, tag, size, aligned >= size, fd, fdoff)";
	for (uint32_t i = 0; i < na; i++)
		if (r->nallocs++, wire_parse_alloc(&allocs->via.array.ptr[i], &r->allocs[i], GMSFS_FDS_PER_MSG, false))
			return -EPROTO;
	*bad = "bad metadata chunk (key, voff, value; alloc, offset, size, flags, vlen first)";
	for (uint32_t i = 0; i < nc; i++)
		if (r->nchunks++, parse_chunk(&meta->via.array.ptr[i], &r->chunks[i]))
			return -EPROTO;
	return 0;
}

/* One field of the reply's map into r; the arrays are kept for parse_arrays.  0 or -1. */
static int parse_field(struct wire_reply *r, const msgpack_object *k, const msgpack_object *val, unsigned *seenp,
		       uint64_t *v, uint64_t *err, const msgpack_object **allocs, const msgpack_object **meta)
{
	unsigned seen = *seenp;
	int e = -1;
	if (wire_key_is(k, GMSFS_K_VERSION)) {
		e = SEEN(0) || wire_get_u64(val, v);
	} else if (wire_key_is(k, GMSFS_K_ERR)) {
		e = SEEN(1) || wire_get_u64(val, err);
	} else if (wire_key_is(k, GMSFS_K_MSG)) {
		if (!(e = SEEN(2) || val->type != MSGPACK_OBJECT_STR)) {
			size_t n = val->via.str.size < sizeof r->msg - 1 ? val->via.str.size : sizeof r->msg - 1;
			memcpy(r->msg, val->via.str.ptr, n);
			r->msg[n] = '\0';
		}
	} else if (wire_key_is(k, GMSFS_K_TOTAL)) {
		e = SEEN(3) || wire_get_u64(val, &r->total);
	} else if (wire_key_is(k, GMSFS_K_NENTRIES)) {
		e = SEEN(4) || wire_get_u64(val, &r->nentries);
	} else if (wire_key_is(k, GMSFS_K_FIRST)) {
		e = SEEN(5) || wire_get_u64(val, &r->first);
	} else if (wire_key_is(k, GMSFS_K_LAST)) {
		e = SEEN(6) || wire_get_bool(val, &r->last);
	} else if (wire_key_is(k, GMSFS_K_GEN)) {
		e = SEEN(9) || wire_get_u64(val, &r->gen);
		r->has_gen = !e;
	} else if (wire_key_is(k, GMSFS_K_ALLOCS)) {
		e = SEEN(7) || val->type != MSGPACK_OBJECT_ARRAY;
		*allocs = val;
	} else if (wire_key_is(k, GMSFS_K_META)) {
		e = SEEN(8) || val->type != MSGPACK_OBJECT_ARRAY;
		*meta = val;
	}
	*seenp = seen;
	return e ? -1 : 0;
}

int wire_parse_reply(const void *buf, size_t len, struct wire_reply *r, char *why, size_t whylen)
{
	memset(r, 0, sizeof *r);
	msgpack_unpacked u;
	msgpack_unpacked_init(&u);
	int e = -EPROTO;
	const char *bad = "not one msgpack map";
	if (wire_unpack_map(buf, len, &u))
		goto out;
	const msgpack_object_map *map = &u.data.via.map;
	uint64_t v = 0, err = 0;
	unsigned seen = 0;
	const msgpack_object *allocs = NULL, *meta = NULL;
	bad = "unknown, repeated or malformed field";
	for (uint32_t i = 0; i < map->size; i++)
		if (parse_field(r, &map->ptr[i].key, &map->ptr[i].val, &seen, &v, &err, &allocs, &meta))
			goto out;
	bad = "missing version or error field";
	if ((seen & 3) != 3 || v != WIRE_V || err > 4095)
		goto out;
	r->err = (int)err;
	unsigned manifest = seen & 0x1f8;
	bad = "a manifest field is missing, or came with an error";
	if ((manifest && (manifest != 0x1f8 || err)) || ((seen & 0x200) && !manifest))
		goto out;
	r->manifest = manifest != 0;
	e = r->manifest ? parse_arrays(r, allocs, meta, &bad) : 0;
out:
	msgpack_unpacked_destroy(&u);
	if (e) {
		wire_reply_free(r);
		why_fmt(why, whylen, e, "%s", e == -EPROTO ? bad : strerror(-e));
	}
	return e;
}
