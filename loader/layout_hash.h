/* layout_hash: a layout's hash (gmsfs(5)) from the allocations and entries to be made. */
#ifndef GMSFS_LOADER_LAYOUT_HASH_H
#define GMSFS_LOADER_LAYOUT_HASH_H

#include <gmsfs/gmsfs.h>

#include <stddef.h>

/* hex: 32 lowercase digits and a NUL, as gmsfs_layout_hash gives.  0 or -ENOMEM. */
int lh_of(const struct gmsfs_new *nv, size_t na, const struct gmsfs_entry *ev, size_t ne, char hex[33]);

#endif
