/* store_files: what a store's and its mount's text files say (state, device), read
 * without a lock, as the tools need it before and around their sessions. */
#ifndef GMSFS_LOADER_STORE_FILES_H
#define GMSFS_LOADER_STORE_FILES_H

#include <stddef.h>

/* The value of "key: value" in STORE/NAME ("state"), or in STORE/../NAME ("../device");
 * 0, or -errno (-ENOENT: no such key). */
int sf_field(const char *store, const char *name, const char *key, char *out, size_t len);
/* The layout's allocations as STORE/state counts them, or -1. */
long sf_allocations(const char *store);

#endif
