/* node: the store's and the nodes' insides, shared by the files of src/meta (not part of
 * the module's interface, meta.h).  The files stand in the layers src/meta/layers lists,
 * each using only those below it (tests/layout.sh checks it). */
#ifndef GMSFS_META_NODE_H
#define GMSFS_META_NODE_H
#include "meta.h"
#include "intern.h"

#include <time.h>

/* One record of the undo log (undo.c): a committed node's fields at its first change
 * (FIELDS), a committed node unlinked (REMOVED: the record keeps its tree hold), a
 * committed directory that got new children (GREW).  view.c reads them for the
 * committed view. */
enum undo_kind { UNDO_FIELDS, UNDO_REMOVED, UNDO_GREW };
struct meta_undo {
	struct meta_node *node;
	uint8_t kind;           /* enum undo_kind */
	uint32_t value_len, flags;
	char *str;              /* FIELDS: an allocation's tag, an entry's allocation path (a reference) */
	char *value;
	uint64_t offset, extent;
	int64_t mtime_ns;
};
struct meta_store {
	struct meta_node *root[2];
	void (*release_buf)(void *buf, void *ctx);
	void *release_ctx;
	void (*changed)(struct meta_node *n, bool gone, void *ctx); /* meta_set_watch */
	void *watch_ctx;
	struct meta_graveyard *grave;
	struct meta_stats stats;
	struct meta_strtab strs;   /* interned strings */
	struct meta_undo *undo;    /* what changed since the commit, in order */
	size_t nundo, undo_cap;
	bool committed;
	bool dirty;                /* the live layout may differ from the commit: rollback has work */
	char hash_hex[33];
	uint8_t hash[GMSFS_HASH_LEN];          /* the same digest, canonical bytes */
};

struct meta_nodes { struct meta_node **v; size_t n, cap; };

/* A change to the live layout: a rollback has work (one that finds nothing changed
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
		s->changed(n, gone, s->watch_ctx);
}
/* n was changed now. */
static inline void meta_touch(struct meta_node *n)
{
	struct timespec t;
	clock_gettime(CLOCK_REALTIME, &t);
	n->mtime_ns = (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}
/* n's bytes or size changed: a new mtime, a rollback has work, the kernel is told. */
static inline void meta_changed(struct meta_node *n)
{
	meta_touch(n);
	meta_dirty(n);
	meta_watch(n, false);
}
struct meta_check { struct meta_store *store; char *err; size_t errlen; };

/* The store's table of strings; NULL for a node out of every store. */
static inline struct meta_strtab *meta_strs(struct meta_store *s)
{
	return s ? &s->strs : NULL;
}

struct meta_node *meta_node_new(struct meta_store *s, enum meta_kind kind, enum meta_area area, const char *name);
void meta_node_free(struct meta_node *n);
char **meta_str_of(struct meta_node *n); /* the interned field (tag, allocation path); NULL for a directory */
void meta_put_value(struct meta_node *n, char *p); /* the old value is freed unless the undo log shares it */
void meta_put_ref(char **field, char *p);   /* an interned field takes p's reference, drops its own */
int meta_set_str(struct meta_node *n, const char *src, size_t len); /* interned into meta_str_of(n) */
int meta_link(struct meta_node *dir, struct meta_node *n);  /* into the live layout */
void meta_unlink(struct meta_node *n);                       /* out of it; the tree's hold stays */
void meta_unhold(struct meta_node *n);                       /* the last hold frees */
int meta_collect(struct meta_node *n, void *arg);            /* meta_walk into a meta_nodes */
/* Unlink the whole live layout; the nodes (still holding their tree hold) go to v. */
int meta_unlink_all(struct meta_store *s, struct meta_nodes *v);
void meta_unlink_free(struct meta_node *n);                  /* out of the live layout, its hold dropped */

#endif
