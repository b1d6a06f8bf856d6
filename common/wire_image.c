/* wire_image: a store's image (wire.h), the daemon's alone: what a handover carries to
 * the next daemon and what a state file keeps for a restart.  Records, each a u32
 * length (little-endian) and one msgpack map; the head says how many of each follow. */
#include "wire_msgpack.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define IMAGE_V 1
#define IMAGE_FDS_MAX (1u << 20)
#define IMAGE_READERS_MAX (1u << 16)

/* The head's keys; allocations and entries use the manifest's (abi.h). */
#define K_IMAGE "gmsfs_image"
#define K_STORE "store"
#define K_DEVICE "device"
#define K_BACKEND "backend"
#define K_GENERATION "generation"
#define K_COMMITS "commits"
#define K_HASH "hash"
#define K_QUOTA "quota"
#define K_PRIORITY "priority"
#define K_VERSIONS "versions"
#define K_MIN "min"
#define K_TORN "torn"
#define K_CONTENT "content_hash"
#define K_NAMED "named"
#define NAMED_MAX 4096 /* 32 names of 64 characters, with their generations */
#define K_TIER WIRE_K_TIER
#define K_NDIRS "dirs"
#define K_NALLOCS "allocs"
#define K_NENTRIES "entries"
#define K_NFDS "fds"
#define K_FDNAMES "fdnames"
#define K_READERS "readers"
#define K_AREA "area"

/* A record's length goes first: room for it now, its value once the map is packed. */
static size_t record_begin(msgpack_sbuffer *sb, int *err)
{
	size_t at = sb->size;
	if (msgpack_sbuffer_write(sb, "\0\0\0\0", 4))
		*err = -ENOMEM;
	return at;
}

static int record_end(msgpack_sbuffer *sb, size_t at, int err)
{
	if (err)
		return err;
	uint64_t n = sb->size - at - 4;
	if (n > UINT32_MAX)
		return -E2BIG;
	for (int i = 0; i < 4; i++)
		sb->data[at + (size_t)i] = (char)(n >> (8 * i) & 0xff);
	return 0;
}

int wire_image_next(const void *buf, size_t len, size_t *off, const void **rec, size_t *reclen)
{
	const uint8_t *p = buf;
	if (*off > len || len - *off < 4)
		return -1;
	uint32_t n = (uint32_t)p[*off] | (uint32_t)p[*off + 1] << 8 | (uint32_t)p[*off + 2] << 16 |
		     (uint32_t)p[*off + 3] << 24;
	if (n > len - *off - 4)
		return -1;
	*rec = p + *off + 4;
	*reclen = n;
	*off += 4 + (size_t)n;
	return 0;
}

int wire_pack_image(msgpack_sbuffer *sb, const struct wire_image *h)
{
	int err = 0;
	size_t at = record_begin(sb, &err);
	struct wire_packer p;
	wire_packer_init(&p, sb);
	msgpack_pack_map(&p.pk, 14 + (h->fdnames != NULL) + (h->nreaders != 0) + (h->min != 0) + h->torn + (h->versions > 1) +
				       h->has_content + (h->named != NULL));
	wire_pack_str(&p.pk, K_IMAGE), msgpack_pack_int(&p.pk, IMAGE_V);
	wire_pack_str(&p.pk, K_STORE), wire_pack_str(&p.pk, h->store);
	wire_pack_str(&p.pk, K_DEVICE), wire_pack_str(&p.pk, h->device);
	wire_pack_str(&p.pk, K_BACKEND), wire_pack_str(&p.pk, h->backend);
	wire_pack_str(&p.pk, K_GENERATION), msgpack_pack_uint64(&p.pk, h->generation);
	wire_pack_str(&p.pk, K_COMMITS), msgpack_pack_uint64(&p.pk, h->commits);
	wire_pack_str(&p.pk, K_HASH), wire_pack_bin(&p.pk, h->hash, sizeof h->hash);
	wire_pack_str(&p.pk, K_QUOTA), msgpack_pack_uint64(&p.pk, h->quota);
	wire_pack_str(&p.pk, K_PRIORITY), msgpack_pack_int64(&p.pk, h->priority);
	if (h->min)
		wire_pack_str(&p.pk, K_MIN), msgpack_pack_uint64(&p.pk, h->min);
	if (h->torn)
		wire_pack_str(&p.pk, K_TORN), msgpack_pack_true(&p.pk);
	if (h->versions > 1)
		wire_pack_str(&p.pk, K_VERSIONS), msgpack_pack_uint64(&p.pk, h->versions);
	if (h->has_content) /* of the image's generation */
		wire_pack_str(&p.pk, K_CONTENT), wire_pack_bin(&p.pk, h->content, sizeof h->content);
	if (h->named)
		wire_pack_str(&p.pk, K_NAMED), wire_pack_str(&p.pk, h->named);
	wire_pack_str(&p.pk, K_TIER), wire_pack_str(&p.pk, h->host ? "host" : "device");
	wire_pack_str(&p.pk, K_NDIRS), msgpack_pack_uint64(&p.pk, h->ndirs);
	wire_pack_str(&p.pk, K_NALLOCS), msgpack_pack_uint64(&p.pk, h->nallocs);
	wire_pack_str(&p.pk, K_NENTRIES), msgpack_pack_uint64(&p.pk, h->nentries);
	wire_pack_str(&p.pk, K_NFDS), msgpack_pack_uint64(&p.pk, h->nfds);
	if (h->fdnames) {
		wire_pack_str(&p.pk, K_FDNAMES);
		msgpack_pack_array(&p.pk, h->nfds);
		for (uint64_t i = 0; i < h->nfds; i++)
			wire_pack_str(&p.pk, h->fdnames[i]);
	}
	if (h->nreaders) {
		wire_pack_str(&p.pk, K_READERS);
		msgpack_pack_array(&p.pk, h->nreaders);
		for (uint64_t i = 0; i < h->nreaders; i++) {
			msgpack_pack_array(&p.pk, h->readers[i].writer ? 4 : 3);
			msgpack_pack_uint32(&p.pk, h->readers[i].pid);
			msgpack_pack_uint64(&p.pk, h->readers[i].start);
			msgpack_pack_uint32(&p.pk, h->readers[i].count);
			if (h->readers[i].writer)
				msgpack_pack_uint32(&p.pk, 1);
		}
	}
	return record_end(sb, at, err ? err : p.err);
}

void wire_image_free(struct wire_image *h)
{
	free(h->store);
	free(h->device);
	free(h->backend);
	for (size_t i = 0; h->fdnames && h->fdnames[i]; i++) /* NULL-terminated: the file's count may lie */
		free(h->fdnames[i]);
	free(h->fdnames);
	free(h->readers);
	free(h->named);
	memset(h, 0, sizeof *h);
}

static int get_i64(const msgpack_object *o, int64_t *out)
{
	if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER && o->via.u64 <= INT64_MAX)
		*out = (int64_t)o->via.u64;
	else if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER)
		*out = o->via.i64;
	else
		return -1;
	return 0;
}

/* A service manager's descriptor name: printable, no ':' (sd_pid_notify(3)). */
static char *get_fdname(const msgpack_object *o)
{
	char *s = wire_get_str(o, 255);
	for (const char *c = s; c && *c; c++)
		if (*c <= ' ' || *c > '~' || *c == ':') {
			free(s);
			return NULL;
		}
	return s && *s ? s : (free(s), NULL);
}

static int parse_fdnames(const msgpack_object *v, struct wire_image *h)
{
	if (v->type != MSGPACK_OBJECT_ARRAY || v->via.array.size > IMAGE_FDS_MAX)
		return -1;
	uint32_t n = v->via.array.size;
	if (!(h->fdnames = calloc((size_t)n + 1, sizeof *h->fdnames)))
		return -1;
	for (uint32_t i = 0; i < n; i++)
		if (!(h->fdnames[i] = get_fdname(&v->via.array.ptr[i])))
			return -1;
	return (int)n;
}

/* [[pid, start, count(, 1: a kept session's leader)], ...]: pids of 1..INT32_MAX, counts
 * of at least 1. */
static int parse_readers(const msgpack_object *v, struct wire_image *h)
{
	if (v->type != MSGPACK_OBJECT_ARRAY || v->via.array.size > IMAGE_READERS_MAX)
		return -1;
	uint32_t n = v->via.array.size;
	if (!(h->readers = calloc(n ? n : 1, sizeof *h->readers)))
		return -1;
	for (uint32_t i = 0; i < n; i++) {
		const msgpack_object *r = &v->via.array.ptr[i];
		uint64_t pid, start, count, writer = 0;
		if (r->type != MSGPACK_OBJECT_ARRAY || r->via.array.size < 3 || r->via.array.size > 4 ||
		    wire_get_u64(&r->via.array.ptr[0], &pid) || wire_get_u64(&r->via.array.ptr[1], &start) ||
		    wire_get_u64(&r->via.array.ptr[2], &count) ||
		    (r->via.array.size == 4 && (wire_get_u64(&r->via.array.ptr[3], &writer) || writer != 1)) || !pid ||
		    pid > INT32_MAX || !count || count > UINT32_MAX)
			return -1;
		h->readers[i] = (struct wire_reader){ .pid = (uint32_t)pid, .start = start, .count = (uint32_t)count,
						      .writer = (uint32_t)writer };
	}
	h->nreaders = n;
	return 0;
}

static int image_field(struct wire_image *h, const msgpack_object *k, const msgpack_object *v, unsigned *seenp,
		       uint64_t *version, int *names)
{
	unsigned seen = *seenp;
	int e = -1;
	uint8_t *hash = NULL;
	size_t hlen = 0;
	char *tier = NULL;
	if (wire_key_is(k, K_IMAGE))
		e = SEEN(0) || wire_get_u64(v, version);
	else if (wire_key_is(k, K_STORE))
		e = SEEN(1) || !(h->store = wire_get_str(v, 255));
	else if (wire_key_is(k, K_DEVICE))
		e = SEEN(2) || !(h->device = wire_get_str(v, 63));
	else if (wire_key_is(k, K_BACKEND))
		e = SEEN(3) || !(h->backend = wire_get_str(v, 15));
	else if (wire_key_is(k, K_GENERATION))
		e = SEEN(4) || wire_get_u64(v, &h->generation);
	else if (wire_key_is(k, K_COMMITS))
		e = SEEN(5) || wire_get_u64(v, &h->commits);
	else if (wire_key_is(k, K_HASH)) {
		e = SEEN(6) || wire_get_bytes(v, sizeof h->hash, &hash, &hlen) || hlen != sizeof h->hash;
		if (!e)
			memcpy(h->hash, hash, sizeof h->hash);
		free(hash);
	} else if (wire_key_is(k, K_QUOTA))
		e = SEEN(7) || wire_get_u64(v, &h->quota);
	else if (wire_key_is(k, K_PRIORITY))
		e = SEEN(8) || get_i64(v, &h->priority) || h->priority < INT32_MIN || h->priority > INT32_MAX;
	else if (wire_key_is(k, K_TIER)) {
		e = SEEN(9) || !(tier = wire_get_str(v, 8)) || (strcmp(tier, "host") && strcmp(tier, "device"));
		h->host = tier && !strcmp(tier, "host");
		free(tier);
	} else if (wire_key_is(k, K_NDIRS))
		e = SEEN(10) || wire_get_u64(v, &h->ndirs);
	else if (wire_key_is(k, K_NALLOCS))
		e = SEEN(11) || wire_get_u64(v, &h->nallocs);
	else if (wire_key_is(k, K_NENTRIES))
		e = SEEN(12) || wire_get_u64(v, &h->nentries);
	else if (wire_key_is(k, K_NFDS))
		e = SEEN(13) || wire_get_u64(v, &h->nfds) || h->nfds > IMAGE_FDS_MAX;
	else if (wire_key_is(k, K_FDNAMES))
		e = SEEN(14) || (*names = parse_fdnames(v, h)) < 0;
	else if (wire_key_is(k, K_READERS))
		e = SEEN(15) || parse_readers(v, h);
	else if (wire_key_is(k, K_MIN))
		e = SEEN(16) || wire_get_u64(v, &h->min) || !h->min;
	else if (wire_key_is(k, K_TORN)) /* only ever true: a daemon before it reads images without */
		e = SEEN(17) || v->type != MSGPACK_OBJECT_BOOLEAN || !(h->torn = v->via.boolean);
	else if (wire_key_is(k, K_VERSIONS)) /* only ever 2: a daemon before it reads images without */
		e = SEEN(18) || wire_get_u64(v, &h->versions) || h->versions != 2;
	else if (wire_key_is(k, K_CONTENT)) { /* a daemon before it reads images without */
		e = SEEN(19) || wire_get_bytes(v, sizeof h->content, &hash, &hlen) || hlen != sizeof h->content;
		if (!e)
			memcpy(h->content, hash, sizeof h->content), h->has_content = true;
		free(hash);
	} else if (wire_key_is(k, K_NAMED)) /* a daemon before it reads images without; the lines: named.c */
		e = SEEN(20) || !(h->named = wire_get_str(v, NAMED_MAX));
	*seenp = seen;
	return e ? -1 : 0;
}

int wire_parse_image(const void *buf, size_t len, struct wire_image *h, char *why, size_t whylen)
{
	memset(h, 0, sizeof *h);
	msgpack_unpacked u;
	msgpack_unpacked_init(&u);
	const char *bad = "not one msgpack map";
	char field[80];
	int e = -EINVAL, names = -1;
	uint64_t version = 0;
	unsigned seen = 0;
	if (wire_unpack_map(buf, len, &u))
		goto out;
	bad = "an unknown, repeated or malformed field";
	for (uint32_t i = 0; i < u.data.via.map.size; i++)
		if (image_field(h, &u.data.via.map.ptr[i].key, &u.data.via.map.ptr[i].val, &seen, &version, &names)) {
			const msgpack_object *k = &u.data.via.map.ptr[i].key; /* named: which one says what to look at */
			bool printable = k->type == MSGPACK_OBJECT_STR && k->via.str.size < 32;
			for (uint32_t c = 0; printable && c < k->via.str.size; c++)
				printable = k->via.str.ptr[c] > ' ' && k->via.str.ptr[c] <= '~';
			if (printable) {
				snprintf(field, sizeof field, "an unknown, repeated or malformed field (%.*s)",
					 (int)k->via.str.size, k->via.str.ptr);
				bad = field;
			}
			goto out;
		}
	bad = "not a store image, or one of another version";
	if (!(seen & 1) || version != IMAGE_V)
		goto out;
	bad = "a field is missing";
	if ((seen & 0x3fff) != 0x3fff)
		goto out;
	bad = "as many descriptor names as descriptors";
	if (names >= 0 && (uint64_t)names != h->nfds)
		goto out;
	e = 0;
out:
	msgpack_unpacked_destroy(&u);
	if (e) {
		wire_image_free(h);
		why_fmt(why, whylen, e, "image head: %s", bad);
	}
	return e;
}

int wire_pack_image_dir(msgpack_sbuffer *sb, int area, const char *path)
{
	int err = 0;
	size_t at = record_begin(sb, &err);
	struct wire_packer p;
	wire_packer_init(&p, sb);
	msgpack_pack_map(&p.pk, 2);
	wire_pack_str(&p.pk, K_AREA), msgpack_pack_int(&p.pk, area);
	wire_pack_str(&p.pk, GMSFS_K_PATH), wire_pack_str(&p.pk, path);
	return record_end(sb, at, err ? err : p.err);
}

int wire_parse_image_dir(const void *buf, size_t len, int *area, char **path)
{
	msgpack_unpacked u;
	msgpack_unpacked_init(&u);
	unsigned seen = 0;
	uint64_t a = 0;
	int e = wire_unpack_map(buf, len, &u);
	*path = NULL;
	for (uint32_t i = 0; !e && i < u.data.via.map.size; i++) {
		const msgpack_object *k = &u.data.via.map.ptr[i].key, *v = &u.data.via.map.ptr[i].val;
		if (wire_key_is(k, K_AREA))
			e = SEEN(0) || wire_get_u64(v, &a) || a > 1;
		else if (wire_key_is(k, GMSFS_K_PATH))
			e = SEEN(1) || !(*path = wire_get_path(v));
		else
			e = -1;
	}
	msgpack_unpacked_destroy(&u);
	if (e || seen != 3) {
		free(*path);
		*path = NULL;
		return -EINVAL;
	}
	*area = (int)a;
	return 0;
}

int wire_pack_image_alloc(msgpack_sbuffer *sb, const struct wire_alloc *a)
{
	int err = 0;
	size_t at = record_begin(sb, &err);
	struct wire_packer p;
	wire_packer_init(&p, sb);
	wire_pack_alloc(&p.pk, a);
	return record_end(sb, at, err ? err : p.err);
}

int wire_parse_image_alloc(const void *buf, size_t len, struct wire_alloc *a, uint64_t nfds)
{
	msgpack_unpacked u;
	msgpack_unpacked_init(&u);
	memset(a, 0, sizeof *a);
	int e = wire_unpack_map(buf, len, &u) || wire_parse_alloc(&u.data, a, nfds, true) ? -EINVAL : 0;
	msgpack_unpacked_destroy(&u);
	if (e) {
		wire_alloc_free(a);
		memset(a, 0, sizeof *a);
	}
	return e;
}

int wire_pack_image_entry(msgpack_sbuffer *sb, const struct entry_rec *x)
{
	int err = 0;
	size_t at = record_begin(sb, &err);
	struct wire_packer p;
	wire_packer_init(&p, sb);
	wire_pack_entry(&p.pk, x);
	return record_end(sb, at, err ? err : p.err);
}

int wire_parse_image_entry(const void *buf, size_t len, struct entry_rec *x)
{
	msgpack_unpacked u;
	msgpack_unpacked_init(&u);
	memset(x, 0, sizeof *x);
	int e = wire_unpack_map(buf, len, &u) || wire_parse_entry(&u.data, x) ? -EINVAL : 0;
	msgpack_unpacked_destroy(&u);
	if (e) {
		free(x->key);
		free(x->alloc);
		free(x->value);
		memset(x, 0, sizeof *x);
	}
	return e;
}
