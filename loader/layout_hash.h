/* layout_hash: a layout's hash (gmsfs(5)) from the allocations and entries to be made, and
 * a store's content hash from its pieces' hashes. */
#ifndef GMSFS_LOADER_LAYOUT_HASH_H
#define GMSFS_LOADER_LAYOUT_HASH_H

#include <gmsfs/gmsfs.h>

#include <stddef.h>
#include <stdint.h>

/* hex: 32 lowercase digits and a NUL, as gmsfs_layout_hash gives.  0 or -ENOMEM. */
int lh_of(const struct gmsfs_new *nv, size_t na, const struct gmsfs_entry *ev, size_t ne, char hex[33]);

/* The content hash (gmsfs(5), CONTENT HASH) under the layout hash layout (32 hex digits)
 * of n allocations (any order) named names[i], of sizes[i] bytes, whose LH_PIECE pieces
 * hash (XXH3-64) to pieces[i][0..]: what gmsfs_digest computes, from what a snapshot's
 * copies hashed as the bytes passed.  hex: 32 digits.  0, -EINVAL (layout) or -ENOMEM. */
#define LH_PIECE (2ull << 20)
int lh_content_of(const char *layout, const char *const *names, const uint64_t *sizes, uint64_t *const *pieces,
		  size_t n, char hex[33]);

#endif
