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
#include "meta_internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

struct item { char *path; struct meta_node *n; };
struct items { struct item *v; size_t n, cap; enum meta_kind kind; };

static int gather(struct meta_node *n, void *arg)
{
	struct items *it = arg;
	if (n->kind != it->kind)
		return 0;
	if (GROW(it->v, it->n, it->cap, 256))
		return -ENOMEM;
	char path[GMSFS_PATH_MAX + 1];
	int e = meta_path(n, path, sizeof path);
	if (e)
		return e;
	if (!(it->v[it->n].path = strdup(path)))
		return -ENOMEM;
	it->v[it->n++].n = n;
	return 0;
}

static int by_path(const void *a, const void *b)
{
	return strcmp(((const struct item *)a)->path, ((const struct item *)b)->path);
}

static void put_u32(XXH3_state_t *st, uint32_t v)
{
	uint8_t b[4] = { v, v >> 8, v >> 16, v >> 24 };
	XXH3_128bits_update(st, b, 4);
}

static void put_u64(XXH3_state_t *st, uint64_t v)
{
	uint8_t b[8];
	for (int i = 0; i < 8; i++)
		b[i] = v >> (8 * i);
	XXH3_128bits_update(st, b, 8);
}

static void put_bytes(XXH3_state_t *st, const char *p, size_t len)
{
	put_u32(st, (uint32_t)len);
	if (len)
		XXH3_128bits_update(st, p, len);
}

static void items_free(struct items *it)
{
	for (size_t i = 0; i < it->n; i++)
		free(it->v[i].path);
	free(it->v);
}

int meta_layout_hash(struct meta_store *s, uint8_t out[16])
{
	struct items allocs = { .kind = META_ALLOC }, entries = { .kind = META_ENTRY };
	int e = meta_walk(s->root[META_AREA_ALLOCS], gather, &allocs);
	if (!e)
		e = meta_walk(s->root[META_AREA_META], gather, &entries);
	XXH3_state_t *st = e ? NULL : XXH3_createState();
	if (!st) {
		items_free(&allocs);
		items_free(&entries);
		return e ? e : -ENOMEM;
	}
	if (allocs.n)
		qsort(allocs.v, allocs.n, sizeof *allocs.v, by_path);
	if (entries.n)
		qsort(entries.v, entries.n, sizeof *entries.v, by_path);

	XXH3_128bits_reset(st);
	XXH3_128bits_update(st, "GMSFSLH2", 8);
	put_u64(st, allocs.n);
	for (size_t i = 0; i < allocs.n; i++) {
		const struct meta_node *n = allocs.v[i].n;
		put_bytes(st, allocs.v[i].path, strlen(allocs.v[i].path));
		put_u64(st, n->size);
		put_bytes(st, n->tag ? n->tag : "", n->tag ? strlen(n->tag) : 0);
	}
	put_u64(st, entries.n);
	for (size_t i = 0; i < entries.n; i++) {
		const struct meta_node *n = entries.v[i].n;
		put_bytes(st, entries.v[i].path, strlen(entries.v[i].path));
		put_bytes(st, n->alloc ? n->alloc : "", n->alloc ? strlen(n->alloc) : 0);
		put_u64(st, n->offset);
		put_u64(st, n->extent);
		put_u32(st, n->flags);
		put_bytes(st, n->value, n->value_len);
	}
	XXH128_canonical_t c;
	XXH128_canonicalFromHash(&c, XXH3_128bits_digest(st));
	memcpy(out, c.digest, 16);
	XXH3_freeState(st);
	items_free(&allocs);
	items_free(&entries);
	return 0;
}
