/* undo: what a rollback needs to return to the last commit, kept only for what changed
 * since.  A committed store holds no copy of itself: a node made since the commit is
 * marked META_NEW; the log records a committed node's fields at its first change
 * (META_SAVED), a committed node unlinked (the record keeps its tree hold), and a
 * committed directory that got new children (META_GREW).  Commit forgets the log;
 * rollback applies it.  Both cost what changed, not the store's size. */
#include "meta.h"
#include "grow.h"
#include "undo.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

int meta_undo_reserve(struct meta_store *s, size_t k)
{
	return ROOM(s->undo, s->nundo + k, s->undo_cap, 16);
}

static int record(struct meta_node *n, enum undo_kind kind, struct meta_undo **out)
{
	struct meta_store *s = n->store;
	int e = meta_undo_reserve(s, 1);
	if (e)
		return e;
	struct meta_undo *r = &s->undo[s->nundo++];
	*r = (struct meta_undo){ .node = n, .kind = kind };
	s->dirty = true;
	if (out)
		*out = r;
	return 0;
}

int meta_save(struct meta_node *n)
{
	if (!n->store || (n->marks & (META_NEW | META_SAVED)) || n->kind == META_DIR) {
		meta_dirty(n);
		return 0;
	}
	struct meta_undo *r;
	int e = record(n, UNDO_FIELDS, &r);
	if (e)
		return e;
	/* The record takes a reference to the interned string, and the value, which the node
	 * shares until it changes it. */
	r->str = meta_ref(*meta_str_of(n));
	r->mtime_ns = n->mtime_ns;
	if (n->kind == META_ENTRY) {
		if ((r->value = n->value))
			n->marks |= META_SHARED_VALUE;
		r->value_len = n->value_len;
		r->flags = n->flags;
		r->offset = n->offset;
		r->extent = n->extent;
	}
	n->marks |= META_SAVED;
	return 0;
}

int meta_undo_grew(struct meta_node *dir)
{
	if (!dir->store || (dir->marks & (META_NEW | META_GREW)))
		return 0;
	int e = record(dir, UNDO_GREW, NULL);
	if (!e)
		dir->marks |= META_GREW;
	return e;
}

int meta_undo_removed(struct meta_node *n)
{
	return n->store && !(n->marks & META_NEW) ? record(n, UNDO_REMOVED, NULL) : 0;
}

/* The value the record holds: the node gets it back if it still shares it, else it goes. */
static void give_back(struct meta_node *n, char *p)
{
	if (p && (n->marks & META_SHARED_VALUE))
		n->marks &= ~META_SHARED_VALUE; /* the node's value is p */
	else
		free(p);
}

/* The new children of dir and all below them: committed now, or (drop) gone.  A
 * committed child's own new children are under a GREW record of its own. */
static void settle_new(struct meta_node *dir, bool drop)
{
	for (size_t i = dir->nkids; i-- > 0;) {
		struct meta_node *k = dir->kids[i];
		if (!(k->marks & META_NEW))
			continue;
		if (k->kind == META_DIR)
			settle_new(k, drop);
		k->marks &= ~META_NEW;
		if (drop)
			meta_unlink_free(k); /* the last kid moves to slot i: one already visited */
	}
}

void meta_undo_forget(struct meta_store *s, bool commit)
{
	if (commit)
		for (size_t i = 0; i < s->nundo; i++)
			if (s->undo[i].kind == UNDO_GREW)
				settle_new(s->undo[i].node, false);
	/* The holds last: a REMOVED record may free a node that a FIELDS record names (an
	 * entry written through a handle after its unlink has its FIELDS after it). */
	for (size_t i = 0; i < s->nundo; i++) {
		struct meta_undo *r = &s->undo[i];
		struct meta_node *n = r->node;
		if (r->kind == UNDO_FIELDS) {
			meta_unref(r->str);
			give_back(n, r->value);
			n->marks &= ~META_SAVED;
		} else if (r->kind == UNDO_GREW) {
			n->marks &= ~META_GREW;
		}
	}
	for (size_t i = 0; i < s->nundo; i++)
		if (s->undo[i].kind == UNDO_REMOVED)
			meta_unhold(s->undo[i].node);
	free(s->undo);
	s->undo = NULL;
	s->nundo = s->undo_cap = 0;
	s->dirty = false;
}

/* The node's fields as the record saved them; the node owns the strings again. */
static void restore(struct meta_node *n, struct meta_undo *r)
{
	meta_put_ref(meta_str_of(n), r->str);
	if (n->kind == META_ENTRY) {
		meta_put_value(n, r->value);
		n->value_len = r->value_len;
		n->offset = r->offset;
		n->extent = r->extent;
		n->flags = r->flags;
	}
	n->marks &= ~META_SAVED;
	meta_watch(n, false);
}

void meta_rollback(struct meta_store *s)
{
	if (!s->dirty)
		return; /* nothing changed since the commit (or since the store was made) */
	/* The new nodes go first, so that no name is taken when the removed come back. */
	for (size_t i = 0; i < s->nundo; i++)
		if (s->undo[i].kind == UNDO_GREW)
			settle_new(s->undo[i].node, true);
	/* Back to front; a node that cannot be linked back (out of memory) keeps its record,
	 * moved behind those still to come, and a later rollback tries again. */
	size_t top = s->nundo;
	for (size_t i = s->nundo; i-- > 0;) {
		struct meta_undo r = s->undo[i];
		if (r.kind == UNDO_FIELDS)
			restore(r.node, &r);
		else if (r.kind == UNDO_GREW)
			r.node->marks &= ~META_GREW;
		else if (meta_link(r.node->parent, r.node))
			s->undo[--top] = r;
		else
			meta_unhold(r.node); /* the record's hold is the tree's again */
	}
	size_t kept = s->nundo - top;
	memmove(s->undo, s->undo + top, kept * sizeof *s->undo);
	s->nundo = kept;
	if (!kept) {
		free(s->undo);
		s->undo = NULL;
		s->undo_cap = 0;
	}
	s->dirty = kept > 0;
}
