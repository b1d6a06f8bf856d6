/* layout_hash: the layout hash of gmsfs(5) (XXH3-128 over the canonical encoding, as the
 * daemon's src/meta/layout_hash.c computes it at a commit) of a layout given as the
 * allocations and entries a client is about to make: a restore checks what its manifest
 * records before anything is committed. */
#include "layout_hash.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#define XXH_INLINE_ALL /* header only: the loader links nothing more */
#include <xxhash.h>

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

static void put_bytes(XXH3_state_t *st, const void *p, size_t len)
{
	put_u32(st, (uint32_t)len);
	if (len)
		XXH3_128bits_update(st, p, len);
}

static void put_str(XXH3_state_t *st, const char *s)
{
	put_bytes(st, s ? s : "", s ? strlen(s) : 0);
}

static const struct gmsfs_new *sort_nv;
static const struct gmsfs_entry *sort_ev;
static int by_name(const void *a, const void *b)
{
	return strcmp(sort_nv[*(const size_t *)a].name, sort_nv[*(const size_t *)b].name);
}

static int by_key(const void *a, const void *b)
{
	return strcmp(sort_ev[*(const size_t *)a].key, sort_ev[*(const size_t *)b].key);
}

int lh_of(const struct gmsfs_new *nv, size_t na, const struct gmsfs_entry *ev, size_t ne, char hex[33])
{
	size_t *ia = malloc((na ? na : 1) * sizeof *ia), *ie = malloc((ne ? ne : 1) * sizeof *ie);
	XXH3_state_t *st = XXH3_createState();
	if (!ia || !ie || !st) {
		free(ia), free(ie), XXH3_freeState(st);
		return -ENOMEM;
	}
	for (size_t i = 0; i < na; i++)
		ia[i] = i;
	for (size_t i = 0; i < ne; i++)
		ie[i] = i;
	sort_nv = nv, sort_ev = ev; /* the loader's one thread */
	qsort(ia, na, sizeof *ia, by_name);
	qsort(ie, ne, sizeof *ie, by_key);
	XXH3_128bits_reset(st);
	XXH3_128bits_update(st, "GMSFSLH2", 8);
	put_u64(st, na);
	for (size_t i = 0; i < na; i++) {
		put_str(st, nv[ia[i]].name);
		put_u64(st, nv[ia[i]].size);
		put_str(st, nv[ia[i]].tag ? nv[ia[i]].tag : "default");
	}
	size_t hashed = 0; /* notes are left out (gmsfs(5), LAYOUT HASH) */
	for (size_t i = 0; i < ne; i++)
		hashed += !(ev[i].flags & GMSFS_ENTRY_NOTE);
	put_u64(st, hashed);
	for (size_t i = 0; i < ne; i++) {
		const struct gmsfs_entry *x = &ev[ie[i]];
		if (x->flags & GMSFS_ENTRY_NOTE)
			continue;
		put_str(st, x->key);
		put_str(st, x->alloc);
		put_u64(st, x->offset);
		put_u64(st, x->size);
		put_u32(st, x->flags);
		put_bytes(st, x->value, x->value_len);
	}
	XXH128_canonical_t c;
	XXH128_canonicalFromHash(&c, XXH3_128bits_digest(st));
	for (int i = 0; i < 16; i++)
		snprintf(hex + 2 * i, 3, "%02x", c.digest[i]);
	XXH3_freeState(st);
	free(ia), free(ie);
	return 0;
}

/* An allocation's digest (gmsfs(5), CONTENT HASH): XXH3-128 over its pieces' XXH3-64s in
 * canonical (big-endian) form. */
static void alloc_digest(const uint64_t *pieces, size_t n, XXH3_state_t *st, uint8_t out[16])
{
	XXH3_128bits_reset(st);
	for (size_t i = 0; i < n; i++) {
		XXH64_canonical_t c;
		XXH64_canonicalFromHash(&c, pieces[i]);
		XXH3_128bits_update(st, c.digest, sizeof c.digest);
	}
	XXH128_canonical_t c;
	XXH128_canonicalFromHash(&c, XXH3_128bits_digest(st));
	memcpy(out, c.digest, 16);
}

static const char *const *sort_names;

static int by_name_at(const void *a, const void *b)
{
	return strcmp(sort_names[*(const size_t *)a], sort_names[*(const size_t *)b]);
}

int lh_content_of(const char *layout, const char *const *names, const uint64_t *sizes, uint64_t *const *pieces,
		  size_t n, char hex[33])
{
	uint8_t lh[16], d[16];
	for (int i = 0; i < 16; i++) {
		unsigned v;
		if (!layout || sscanf(layout + 2 * i, "%2x", &v) != 1)
			return -EINVAL;
		lh[i] = (uint8_t)v;
	}
	XXH3_state_t *st = XXH3_createState(), *one = XXH3_createState();
	size_t *ia = calloc(n + 1, sizeof *ia);
	if (!st || !one || !ia) {
		XXH3_freeState(st), XXH3_freeState(one), free(ia);
		return -ENOMEM;
	}
	for (size_t i = 0; i < n; i++)
		ia[i] = i;
	sort_names = names; /* the loader hashes from one thread */
	qsort(ia, n, sizeof *ia, by_name_at);
	XXH3_128bits_reset(st);
	XXH3_128bits_update(st, "GMSFSCH1", 8);
	XXH3_128bits_update(st, lh, 16);
	put_u64(st, n);
	for (size_t k = 0; k < n; k++) {
		size_t i = ia[k];
		put_str(st, names[i]);
		put_u64(st, sizes[i]);
		alloc_digest(pieces[i], (size_t)((sizes[i] + LH_PIECE - 1) / LH_PIECE), one, d);
		XXH3_128bits_update(st, d, 16);
	}
	XXH128_canonical_t c;
	XXH128_canonicalFromHash(&c, XXH3_128bits_digest(st));
	for (int i = 0; i < 16; i++)
		snprintf(hex + 2 * i, 3, "%02x", c.digest[i]);
	XXH3_freeState(st), XXH3_freeState(one), free(ia);
	return 0;
}
