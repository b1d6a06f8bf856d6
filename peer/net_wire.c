/* net_wire: gmsfs-peer's messages (net_wire.h). */
#include "net_wire.h"
#include "wire_msgpack.h"
#include "version_name.h"

#include <errno.h>
#include <msgpack.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- packing ---- */

static void pack_str(msgpack_packer *p, const char *s)
{
	size_t n = strlen(s);
	msgpack_pack_str(p, n);
	msgpack_pack_str_body(p, s, n);
}

static void pack_key(msgpack_packer *p, const char *k)
{
	pack_str(p, k);
}

/* The frame: the body packed by fill, after its length. */
static int frame(void (*fill)(msgpack_packer *p, const void *arg), const void *arg, void **out, size_t *len)
{
	msgpack_sbuffer sb;
	msgpack_sbuffer_init(&sb);
	msgpack_packer p;
	msgpack_packer_init(&p, &sb, msgpack_sbuffer_write);
	uint8_t head[4] = { 0 };
	msgpack_sbuffer_write(&sb, (const char *)head, sizeof head);
	fill(&p, arg);
	if (!sb.data || sb.size < sizeof head || sb.size - sizeof head > UINT32_MAX) {
		msgpack_sbuffer_destroy(&sb);
		return -ENOMEM;
	}
	uint32_t body = (uint32_t)(sb.size - sizeof head);
	for (int i = 0; i < 4; i++)
		((uint8_t *)sb.data)[i] = (uint8_t)(body >> (8 * i));
	*out = sb.data;
	*len = sb.size;
	return 0;
}

static void fill_hello(msgpack_packer *p, const void *arg)
{
	const struct nw_hello *h = arg;
	msgpack_pack_map(p, 5);
	pack_key(p, "v");
	msgpack_pack_uint32(p, h->version);
	pack_key(p, "stripe");
	msgpack_pack_uint32(p, h->stripe);
	pack_key(p, "stripes");
	msgpack_pack_uint32(p, h->stripes);
	pack_key(p, "token");
	msgpack_pack_bin(p, h->token_len);
	msgpack_pack_bin_body(p, h->token, h->token_len);
	pack_key(p, "store");
	pack_str(p, h->store);
}

static void fill_layout(msgpack_packer *p, const void *arg)
{
	const struct nw_layout *l = arg;
	msgpack_pack_map(p, l->error ? 2 : 5 + (l->content[0] != 0) + (l->version[0] != 0));
	pack_key(p, "error");
	msgpack_pack_int32(p, l->error);
	if (l->error) {
		pack_key(p, "why");
		pack_str(p, l->why);
		return;
	}
	pack_key(p, "hash");
	pack_str(p, l->hash);
	if (l->content[0]) { /* optional: a puller before it ignores it */
		pack_key(p, "content");
		pack_str(p, l->content);
	}
	if (l->version[0]) { /* optional too */
		pack_key(p, "version");
		pack_str(p, l->version);
	}
	pack_key(p, "stripes");
	msgpack_pack_uint32(p, l->stripes);
	pack_key(p, "allocs");
	msgpack_pack_array(p, l->nallocs);
	for (size_t i = 0; i < l->nallocs; i++) {
		msgpack_pack_array(p, 3);
		pack_str(p, l->allocs[i].name);
		pack_str(p, l->allocs[i].tag ? l->allocs[i].tag : "");
		msgpack_pack_uint64(p, l->allocs[i].size);
	}
	pack_key(p, "entries");
	msgpack_pack_array(p, l->nentries);
	for (size_t i = 0; i < l->nentries; i++) {
		const struct nw_entry *e = &l->entries[i];
		msgpack_pack_array(p, 6);
		pack_str(p, e->key);
		pack_str(p, e->alloc ? e->alloc : "");
		msgpack_pack_uint64(p, e->offset);
		msgpack_pack_uint64(p, e->size);
		msgpack_pack_uint32(p, e->flags);
		msgpack_pack_bin(p, e->value_len);
		msgpack_pack_bin_body(p, e->value, e->value_len);
	}
}

struct digests {
	const uint64_t *v;
	size_t n;
};

static void fill_trailer(msgpack_packer *p, const void *arg)
{
	const struct digests *d = arg;
	msgpack_pack_map(p, 1);
	pack_key(p, "xxh3");
	msgpack_pack_array(p, d->n);
	for (size_t i = 0; i < d->n; i++)
		msgpack_pack_uint64(p, d->v[i]);
}

int nw_pack_hello(const struct nw_hello *h, void **out, size_t *len)
{
	return frame(fill_hello, h, out, len);
}

int nw_pack_layout(const struct nw_layout *l, void **out, size_t *len)
{
	return frame(fill_layout, l, out, len);
}

int nw_pack_trailer(const uint64_t *digests, size_t n, void **out, size_t *len)
{
	struct digests d = { digests, n };
	return frame(fill_trailer, &d, out, len);
}

/* ---- parsing: every field checked ---- */

static int bad(char *why, size_t whylen, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(why, whylen, fmt, ap);
	va_end(ap);
	return -EPROTO;
}

/* The one msgpack map buf holds, whole; *u to destroy.  The codec's guard first: no
 * container may declare more elements than bytes remain (msgpack-c would allocate for
 * them: 80 bytes asking for 64 GB). */
static int unpack(const void *buf, size_t len, msgpack_unpacked *u, char *why, size_t whylen)
{
	msgpack_unpacked_init(u);
	if (wire_unpack_map(buf, len, u))
		return bad(why, whylen, "not one msgpack map of %zu bytes", len);
	return 0;
}

static const msgpack_object *field(const msgpack_object *map, const char *key)
{
	size_t n = strlen(key);
	for (uint32_t i = 0; i < map->via.map.size; i++) {
		const msgpack_object *k = &map->via.map.ptr[i].key;
		if (k->type == MSGPACK_OBJECT_STR && k->via.str.size == n && !memcmp(k->via.str.ptr, key, n))
			return &map->via.map.ptr[i].val;
	}
	return NULL;
}

static int get_u64(const msgpack_object *o, uint64_t max, uint64_t *out)
{
	if (!o || o->type != MSGPACK_OBJECT_POSITIVE_INTEGER || o->via.u64 > max)
		return -1;
	*out = o->via.u64;
	return 0;
}

/* A string of at most max bytes with no NUL, copied (malloc'ed) into *out. */
static int get_str(const msgpack_object *o, size_t max, char **out)
{
	if (!o || o->type != MSGPACK_OBJECT_STR || o->via.str.size > max ||
	    memchr(o->via.str.ptr, '\0', o->via.str.size))
		return -1;
	if (!(*out = strndup(o->via.str.ptr, o->via.str.size)))
		return -1;
	return 0;
}

int nw_version_name_ok(const char *name)
{
	return gmsfs_version_name_valid(name, strlen(name));
}

int nw_store_name_ok(const char *name)
{
	size_t n = strlen(name);
	return n && n <= NW_NAME_MAX && !strchr(name, '/') && strcmp(name, ".") && strcmp(name, "..");
}

int nw_parse_hello(const void *buf, size_t len, struct nw_hello *h, char *why, size_t whylen)
{
	msgpack_unpacked u;
	memset(h, 0, sizeof *h);
	int e = unpack(buf, len, &u, why, whylen);
	const msgpack_object *m = &u.data, *t = e ? NULL : field(m, "token");
	uint64_t v = 0, stripe = 0, stripes = 0;
	char *store = NULL;
	if (!e && (get_u64(field(m, "v"), UINT32_MAX, &v) || v != NW_VERSION))
		e = bad(why, whylen, "hello: version: not %d", NW_VERSION);
	if (!e && (get_u64(field(m, "stripes"), NW_STRIPES_MAX, &stripes) || !stripes))
		e = bad(why, whylen, "hello: stripes: 1 to %d", NW_STRIPES_MAX);
	if (!e && (get_u64(field(m, "stripe"), stripes - 1, &stripe)))
		e = bad(why, whylen, "hello: stripe: 0 to stripes - 1 (%llu)", (unsigned long long)stripes - 1);
	if (!e && (!t || t->type != MSGPACK_OBJECT_BIN || !t->via.bin.size || t->via.bin.size > NW_TOKEN_MAX))
		e = bad(why, whylen, "hello: token: 1 to %d bytes", NW_TOKEN_MAX);
	if (!e && (get_str(field(m, "store"), NW_NAME_MAX, &store) || !nw_store_name_ok(store)))
		e = bad(why, whylen, "hello: store: a store's name (one path component)");
	if (!e && m->via.map.size != 5)
		e = bad(why, whylen, "hello: %u fields, not 5", m->via.map.size);
	if (!e) {
		h->version = (uint32_t)v;
		h->stripe = (uint32_t)stripe;
		h->stripes = (uint32_t)stripes;
		memcpy(h->token, t->via.bin.ptr, t->via.bin.size);
		h->token_len = t->via.bin.size;
		strcpy(h->store, store);
	}
	free(store);
	msgpack_unpacked_destroy(&u);
	return e;
}

static int parse_allocs(const msgpack_object *a, struct nw_layout *l, char *why, size_t whylen)
{
	if (!a || a->type != MSGPACK_OBJECT_ARRAY || a->via.array.size > NW_ALLOCS_MAX)
		return bad(why, whylen, "layout: allocs: an array of at most %u", NW_ALLOCS_MAX);
	l->allocs = calloc(a->via.array.size + 1, sizeof *l->allocs);
	if (!l->allocs)
		return -ENOMEM;
	for (uint32_t i = 0; i < a->via.array.size; i++) {
		const msgpack_object *x = &a->via.array.ptr[i];
		struct nw_alloc *d = &l->allocs[l->nallocs];
		if (x->type != MSGPACK_OBJECT_ARRAY || x->via.array.size != 3 ||
		    get_str(&x->via.array.ptr[0], 4096, &d->name) || !d->name[0] ||
		    get_str(&x->via.array.ptr[1], 4096, &d->tag) || get_u64(&x->via.array.ptr[2], 1ull << 48, &d->size)) {
			free(d->name);
			free(d->tag);
			*d = (struct nw_alloc){ 0 };
			return bad(why, whylen, "layout: allocation %u: [name, tag, size]", i);
		}
		l->nallocs++;
	}
	return 0;
}

static int parse_entries(const msgpack_object *a, struct nw_layout *l, char *why, size_t whylen)
{
	if (!a || a->type != MSGPACK_OBJECT_ARRAY || a->via.array.size > NW_ENTRIES_MAX)
		return bad(why, whylen, "layout: entries: an array of at most %u", NW_ENTRIES_MAX);
	l->entries = calloc(a->via.array.size + 1, sizeof *l->entries);
	if (!l->entries)
		return -ENOMEM;
	for (uint32_t i = 0; i < a->via.array.size; i++) {
		const msgpack_object *x = &a->via.array.ptr[i];
		int whole = x->type == MSGPACK_OBJECT_ARRAY && x->via.array.size == 6;
		const msgpack_object *v = whole ? &x->via.array.ptr[5] : NULL;
		struct nw_entry *d = &l->entries[l->nentries];
		uint64_t flags = 0;
		int ok = whole && !get_str(&x->via.array.ptr[0], 4096, &d->key) && d->key[0] &&
			 !get_str(&x->via.array.ptr[1], 4096, &d->alloc) &&
			 !get_u64(&x->via.array.ptr[2], 1ull << 48, &d->offset) &&
			 !get_u64(&x->via.array.ptr[3], 1ull << 48, &d->size) &&
			 !get_u64(&x->via.array.ptr[4], UINT32_MAX, &flags) && v->type == MSGPACK_OBJECT_BIN;
		if (ok && !(d->value = malloc(v->via.bin.size + 1)))
			ok = 0;
		if (!ok) {
			free(d->key);
			free(d->alloc);
			*d = (struct nw_entry){ 0 };
			return bad(why, whylen, "layout: entry %u: [key, alloc, offset, size, flags, value]", i);
		}
		memcpy(d->value, v->via.bin.ptr, v->via.bin.size);
		d->value[v->via.bin.size] = '\0';
		d->value_len = v->via.bin.size;
		d->flags = (uint32_t)flags;
		l->nentries++;
	}
	return 0;
}

int nw_parse_layout(const void *buf, size_t len, struct nw_layout *l, char *why, size_t whylen)
{
	msgpack_unpacked u;
	memset(l, 0, sizeof *l);
	int e = unpack(buf, len, &u, why, whylen);
	const msgpack_object *m = &u.data, *err = e ? NULL : field(m, "error");
	char *s = NULL;
	if (!e && (!err || (err->type != MSGPACK_OBJECT_POSITIVE_INTEGER && err->type != MSGPACK_OBJECT_NEGATIVE_INTEGER) ||
		   err->via.i64 < 0 || err->via.i64 > 4095))
		e = bad(why, whylen, "layout: error: an errno");
	if (!e && err->via.i64) {
		l->error = (int)err->via.i64;
		if (get_str(field(m, "why"), sizeof l->why - 1, &s))
			e = bad(why, whylen, "layout: why: words");
		else
			snprintf(l->why, sizeof l->why, "%s", s);
	} else if (!e) {
		if (get_str(field(m, "hash"), 32, &s) || strlen(s) != 32 || strspn(s, "0123456789abcdef") != 32)
			e = bad(why, whylen, "layout: hash: 32 hex digits");
		else
			memcpy(l->hash, s, 33);
		const msgpack_object *c = field(m, "content"); /* optional: a server before it sends none */
		char *cs = NULL;
		if (!e && c && (get_str(c, 32, &cs) || strlen(cs) != 32 || strspn(cs, "0123456789abcdef") != 32))
			e = bad(why, whylen, "layout: content: 32 hex digits");
		else if (!e && c)
			memcpy(l->content, cs, 33);
		free(cs);
		const msgpack_object *vn = field(m, "version"); /* optional: a server before it sends none */
		char *vs = NULL;
		if (!e && vn && (get_str(vn, 64, &vs) || !nw_version_name_ok(vs)))
			e = bad(why, whylen, "layout: version: a version name");
		else if (!e && vn)
			snprintf(l->version, sizeof l->version, "%s", vs);
		free(vs);
		uint64_t n = 0;
		if (!e && (get_u64(field(m, "stripes"), NW_STRIPES_MAX, &n) || !n))
			e = bad(why, whylen, "layout: stripes: 1 to %d", NW_STRIPES_MAX);
		l->stripes = (uint32_t)n;
		if (!e)
			e = parse_allocs(field(m, "allocs"), l, why, whylen);
		if (!e)
			e = parse_entries(field(m, "entries"), l, why, whylen);
	}
	free(s);
	msgpack_unpacked_destroy(&u);
	if (e)
		nw_layout_free(l);
	return e;
}

int nw_parse_trailer(const void *buf, size_t len, uint64_t *digests, size_t n, char *why, size_t whylen)
{
	msgpack_unpacked u;
	int e = unpack(buf, len, &u, why, whylen);
	const msgpack_object *a = e ? NULL : field(&u.data, "xxh3");
	if (!e && (!a || a->type != MSGPACK_OBJECT_ARRAY || a->via.array.size != n))
		e = bad(why, whylen, "trailer: xxh3: one a segment (%zu)", n);
	for (size_t i = 0; !e && i < n; i++)
		if (get_u64(&a->via.array.ptr[i], UINT64_MAX, &digests[i]))
			e = bad(why, whylen, "trailer: xxh3 %zu: a number", i);
	msgpack_unpacked_destroy(&u);
	return e;
}

/* ---- stripes ---- */

/* A stripe's bytes: all of them in count parts, each whole NW_STRIPE_ALIGN units (the
 * last the rest). */
static uint64_t stripe_bytes(const struct nw_layout *l, uint32_t count, uint64_t *total)
{
	uint64_t t = 0;
	for (size_t i = 0; i < l->nallocs; i++)
		t += l->allocs[i].size; /* fits: the puller asks once its store made the sizes, the server of its own */
	*total = t;
	uint64_t units = (t + NW_STRIPE_ALIGN - 1) / NW_STRIPE_ALIGN;
	return (units + count - 1) / count * NW_STRIPE_ALIGN;
}

int nw_stripe(const struct nw_layout *l, uint32_t k, uint32_t count, struct nw_segment **out, size_t *n)
{
	uint64_t total, per = stripe_bytes(l, count, &total);
	uint64_t from = (uint64_t)k * per, to = from + per;
	if (from > total)
		from = total;
	if (to > total)
		to = total;
	*out = NULL;
	*n = 0;
	size_t cap = 0;
	for (uint64_t base = 0, i = 0; i < l->nallocs; base += l->allocs[i++].size)
		cap += base < to && base + l->allocs[i].size > from;
	if (!cap)
		return 0;
	struct nw_segment *v = calloc(cap, sizeof *v);
	if (!v)
		return -ENOMEM;
	for (uint64_t base = 0, i = 0; i < l->nallocs; base += l->allocs[i++].size) {
		uint64_t lo = base > from ? base : from, hi = base + l->allocs[i].size < to ? base + l->allocs[i].size : to;
		if (lo < hi)
			v[(*n)++] = (struct nw_segment){ .i = i, .at = lo - base, .len = hi - lo };
	}
	*out = v;
	return 0;
}

uint32_t nw_stripes_for(const struct nw_layout *l, uint32_t wanted)
{
	uint32_t count = wanted < l->stripes ? wanted : l->stripes;
	if (count < 1)
		count = 1;
	uint64_t total;
	while (count > 1 && (uint64_t)(count - 1) * stripe_bytes(l, count, &total) >= total)
		count--; /* its last stripe would hold no bytes */
	return count;
}

void nw_layout_free(struct nw_layout *l)
{
	for (size_t i = 0; l->allocs && i < l->nallocs; i++) {
		free(l->allocs[i].name);
		free(l->allocs[i].tag);
	}
	for (size_t i = 0; l->entries && i < l->nentries; i++) {
		free(l->entries[i].key);
		free(l->entries[i].alloc);
		free(l->entries[i].value);
	}
	free(l->allocs);
	free(l->entries);
	l->allocs = NULL;
	l->entries = NULL;
	l->nallocs = l->nentries = 0;
}
