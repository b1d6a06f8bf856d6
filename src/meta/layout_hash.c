/* The layout hash: XXH3-128 over the canonical encoding (man gmsfs(5)):
 *
 *   "GMSFSLH2"                                   8 bytes
 *   u64 number of allocations
 *   per allocation, sorted by path (bytewise):   u32 len, path, u64 size, u32 len, tag
 *   u64 number of metadata entries
 *   per entry, sorted by key (bytewise):         u32 len, key, u32 len, allocation path,
 *                                                u64 offset, u64 size (extent, 0: none),
 *                                                u32 flags, u32 len, value
 *
 * Integers little-endian; paths relative to allocs/ and meta/; size is the
 * requested size, so every backend gives the same hash. */
#include "meta.h"
#include "grow.h"
#include "node.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

/* Paths are kept in one text buffer (an offset while it grows, then a pointer): a store
 * of a million entries would otherwise make a million small strings per commit. */
struct item {
	union { size_t off; const char *path; };
	uint32_t len;
	struct meta_node *n;
};
struct items {
	struct item *v;
	size_t n, cap;
	enum meta_kind kind;
	char *text;
	size_t used, room;
};

static int gather(struct meta_node *n, void *arg)
{
	struct items *it = arg;
	if (n->kind != it->kind || (n->kind == META_ENTRY && (n->flags & GMSFS_ENTRY_NOTE)))
		return 0; /* a note is about the layout, not of it */
	char path[GMSFS_PATH_MAX + 1];
	int e = meta_path(n, path, sizeof path);
	if (e)
		return e;
	size_t len = strlen(path);
	if (GROW(it->v, it->n, it->cap, 256) || ROOM(it->text, it->used + len + 1, it->room, 1 << 16))
		return -ENOMEM;
	memcpy(it->text + it->used, path, len + 1);
	it->v[it->n++] = (struct item){ .off = it->used, .len = (uint32_t)len, .n = n };
	it->used += len + 1;
	return 0;
}

static void settle(struct items *it)
{
	for (size_t i = 0; i < it->n; i++)
		it->v[i].path = it->text + it->v[i].off;
}

static int by_path(const void *a, const void *b)
{
	return strcmp(((const struct item *)a)->path, ((const struct item *)b)->path);
}

/* The encoding goes to XXH3 through a buffer: the same bytes in a few large updates, not
 * eight small ones an entry. */
struct sink {
	XXH3_state_t *st;
	size_t n;
	uint8_t buf[1 << 16];
};

static void put_raw(struct sink *k, const void *p, size_t len)
{
	if (k->n + len > sizeof k->buf) {
		XXH3_128bits_update(k->st, k->buf, k->n);
		k->n = 0;
	}
	if (len > sizeof k->buf) {
		XXH3_128bits_update(k->st, p, len);
		return;
	}
	memcpy(k->buf + k->n, p, len);
	k->n += len;
}

static void put_u32(struct sink *k, uint32_t v)
{
	uint8_t b[4] = { v, v >> 8, v >> 16, v >> 24 };
	put_raw(k, b, 4);
}

static void put_u64(struct sink *k, uint64_t v)
{
	uint8_t b[8];
	for (int i = 0; i < 8; i++)
		b[i] = v >> (8 * i);
	put_raw(k, b, 8);
}

static void put_bytes(struct sink *k, const char *p, size_t len)
{
	put_u32(k, (uint32_t)len);
	if (len)
		put_raw(k, p, len);
}

static void items_free(struct items *it)
{
	free(it->v);
	free(it->text);
}

int meta_layout_hash(struct meta_store *s, uint8_t out[GMSFS_HASH_LEN])
{
	struct items allocs = { .kind = META_ALLOC }, entries = { .kind = META_ENTRY };
	int e = meta_walk(s->root[META_AREA_ALLOCS], gather, &allocs);
	if (!e)
		e = meta_walk(s->root[META_AREA_META], gather, &entries);
	struct sink *k = e ? NULL : malloc(sizeof *k);
	if (k && !(k->st = XXH3_createState())) {
		free(k);
		k = NULL;
	}
	if (!k) {
		items_free(&allocs);
		items_free(&entries);
		return e ? e : -ENOMEM;
	}
	settle(&allocs);
	settle(&entries);
	if (allocs.n)
		qsort(allocs.v, allocs.n, sizeof *allocs.v, by_path);
	if (entries.n)
		qsort(entries.v, entries.n, sizeof *entries.v, by_path);

	XXH3_128bits_reset(k->st);
	k->n = 0;
	put_raw(k, "GMSFSLH2", 8);
	put_u64(k, allocs.n);
	for (size_t i = 0; i < allocs.n; i++) {
		const struct meta_node *n = allocs.v[i].n;
		put_bytes(k, allocs.v[i].path, allocs.v[i].len);
		put_u64(k, n->size);
		put_bytes(k, n->tag ? n->tag : "", n->tag ? strlen(n->tag) : 0);
	}
	put_u64(k, entries.n);
	for (size_t i = 0; i < entries.n; i++) {
		const struct meta_node *n = entries.v[i].n;
		put_bytes(k, entries.v[i].path, entries.v[i].len);
		put_bytes(k, n->alloc ? n->alloc : "", n->alloc ? strlen(n->alloc) : 0);
		put_u64(k, n->offset);
		put_u64(k, n->extent);
		put_u32(k, n->flags);
		put_bytes(k, n->value, n->value_len);
	}
	XXH3_128bits_update(k->st, k->buf, k->n);
	XXH128_canonical_t c;
	XXH128_canonicalFromHash(&c, XXH3_128bits_digest(k->st));
	memcpy(out, c.digest, GMSFS_HASH_LEN);
	XXH3_freeState(k->st);
	free(k);
	items_free(&allocs);
	items_free(&entries);
	return 0;
}

static int hex_digit(char c)
{
	return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

int meta_content_parse(const char *value, size_t size, uint64_t *gen, uint8_t hash[GMSFS_HASH_LEN])
{
	char text[64];
	if (size && value[size - 1] == '\n')
		size--;
	if (size <= 2 * GMSFS_HASH_LEN + 1 || size >= sizeof text || memchr(value, '\0', size))
		return -EINVAL;
	memcpy(text, value, size);
	text[size] = '\0';
	const char *hex = strchr(text, ' ');
	char *end = NULL;
	if (!hex || text[0] < '0' || text[0] > '9')
		return -EINVAL;
	errno = 0;
	unsigned long long g = strtoull(text, &end, 10);
	if (end != hex || errno || strlen(hex + 1) != 2 * GMSFS_HASH_LEN)
		return -EINVAL;
	for (int i = 0; i < GMSFS_HASH_LEN; i++) {
		int a = hex_digit(hex[1 + 2 * i]), b = hex_digit(hex[2 + 2 * i]);
		if (a < 0 || b < 0) /* no shift of a bad digit's -1 */
			return -EINVAL;
		hash[i] = (uint8_t)(a << 4 | b);
	}
	*gen = g;
	return 0;
}
