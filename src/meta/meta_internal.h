/* Shared between meta.c and layout_hash.c; not part of the module's interface. */
#ifndef GMSFS_META_INTERNAL_H
#define GMSFS_META_INTERNAL_H
#include "meta.h"

#include <time.h>

/* What a rollback restores of one node.  The strings are the node's own at commit,
 * shared with it (META_SHARED_*) until either side lets go. */
struct meta_snap {
	struct meta_node *node; /* held by the snapshot */
	char *str;              /* an allocation's tag, an entry's allocation path */
	char *value;
	uint64_t offset, extent;
	uint32_t value_len, flags;
};

struct meta_store {
	struct meta_node *root[2];
	void (*release_buf)(void *buf, void *ctx);
	void *release_ctx;
	void (*changed)(struct meta_node *n, bool gone, void *ctx); /* meta_set_watch */
	struct meta_graveyard *grave;
	struct meta_stats stats;
	struct meta_snap *snap; /* pre-order: parents before children */
	size_t nsnap;
	bool committed;
	bool dirty;                /* the live layout may differ from the snapshot: rollback has work */
	char hash_hex[33];
	uint8_t hash[16];          /* the same digest, canonical bytes */
};

struct meta_nodes { struct meta_node **v; size_t n, cap; };

/* A change to the live layout: a rollback must undo it (one that finds nothing changed
 * costs nothing, so an open-and-close writer is O(1) in the store's size). */
static inline void meta_dirty(struct meta_node *n)
{
	if (n->store)
		n->store->dirty = true;
}
/* Tell the watcher that n changed, if the kernel knows n. */
static inline void meta_watch(struct meta_node *n, bool gone)
{
	struct meta_store *s = n->store;
	if (n->lookups && s && s->changed)
		s->changed(n, gone, s->release_ctx);
}
/* n's bytes or size changed: a new mtime, a rollback has work, the kernel is told. */
static inline void meta_changed(struct meta_node *n)
{
	clock_gettime(CLOCK_REALTIME, &n->mtime);
	meta_dirty(n);
	meta_watch(n, false);
}
struct meta_check { struct meta_store *store; char *err; size_t errlen; };

/* meta.c */
char **meta_str_of(struct meta_node *n); /* the field META_SHARED_STR covers; NULL for a directory */
void meta_put_str(struct meta_node *n, char **field, unsigned bit, char *p);
int meta_set_str(struct meta_node *n, const char *src, size_t len); /* a copy into meta_str_of(n) */
int meta_link(struct meta_node *dir, struct meta_node *n);  /* into the live layout */
void meta_unhold(struct meta_node *n);                       /* the last hold frees */
int meta_collect(struct meta_node *n, void *arg);            /* meta_walk into a meta_nodes */
/* Unlink the whole live layout; the nodes (still holding their tree hold) go to v. */
int meta_unlink_all(struct meta_store *s, struct meta_nodes *v);
/* snapshot.c */
void meta_snapshot_drop(struct meta_store *s);

#endif
