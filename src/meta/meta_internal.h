/* Shared between meta.c and layout_hash.c; not part of the module's interface. */
#ifndef GMSFS_META_INTERNAL_H
#define GMSFS_META_INTERNAL_H
#include "meta.h"

struct meta_snap {
	struct meta_node *node; /* held by the snapshot */
	char *tag, *alloc, *value;
	size_t value_len;
	uint64_t offset;
};

struct meta_store {
	struct meta_node *root[2];
	void (*release_buf)(void *buf, void *ctx);
	void *release_ctx;
	struct meta_stats stats;
	struct meta_snap *snap; /* pre-order: parents before children */
	size_t nsnap;
	bool committed;
	char hash_hex[33];
	uint8_t hash[16];          /* the same digest, canonical bytes */
};

struct meta_nodes { struct meta_node **v; size_t n, cap; };
struct meta_check { struct meta_store *store; char *err; size_t errlen; };

#endif
