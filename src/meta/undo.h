/* undo: the log of what changed since the commit, which a rollback replays backwards.
 * Each call comes before the change it prepares for; -ENOMEM changes nothing. */
#ifndef GMSFS_META_UNDO_H
#define GMSFS_META_UNDO_H
#include "node.h"

int meta_undo_reserve(struct meta_store *s, size_t k);      /* room for k records: those calls cannot fail */
int meta_save(struct meta_node *n);        /* before a field of n changes (the first change is logged) */
int meta_undo_grew(struct meta_node *dir); /* before a new child is linked into dir */
int meta_undo_removed(struct meta_node *n); /* before n is unlinked: the record keeps its tree hold */
/* Commit (the new nodes become committed) or the store's end: the log lets go of what it holds. */
void meta_undo_forget(struct meta_store *s, bool commit);

#endif
