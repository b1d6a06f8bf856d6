/* view: the layout as the last commit published it, while a writer session changes the
 * live one.  Callers outside the session see this (gmsfs(5), "What a session shows"):
 * nodes made since the commit are not there, committed nodes removed since are (the undo
 * log holds them), and a committed node's fields are what its FIELDS record saved.  It
 * costs what the session changed, not the store's size. */
#include "meta.h"
#include "node.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

bool meta_committed(const struct meta_node *n)
{
	return !(n->marks & META_NEW);
}

/* The undo record of kind for n, or NULL. */
static const struct meta_undo *record_of(const struct meta_store *s, const struct meta_node *n, enum undo_kind kind)
{
	for (size_t i = 0; s && i < s->nundo; i++)
		if (s->undo[i].node == n && s->undo[i].kind == kind)
			return &s->undo[i];
	return NULL;
}

struct meta_node *meta_committed_child(struct meta_node *dir, const char *name)
{
	struct meta_store *s = dir->store;
	if (dir->kind != META_DIR || !meta_committed(dir) || !s)
		return NULL;
	struct meta_node *k = dir->linked ? meta_lookup(dir, name) : NULL;
	if (k && meta_committed(k))
		return k;
	for (size_t i = 0; i < s->nundo; i++) { /* removed since the commit */
		struct meta_node *n = s->undo[i].node;
		if (s->undo[i].kind == UNDO_REMOVED && n->parent == dir && !strcmp(n->name, name))
			return n;
	}
	return NULL;
}

int meta_committed_children(struct meta_node *dir, struct meta_node ***out, size_t *count)
{
	struct meta_store *s = dir->store;
	*out = NULL;
	*count = 0;
	if (dir->kind != META_DIR || !meta_committed(dir) || !s)
		return 0;
	size_t n = 0, cap = (dir->linked ? dir->nkids : 0) + s->nundo;
	struct meta_node **v = malloc((cap ? cap : 1) * sizeof *v);
	if (!v)
		return -ENOMEM;
	for (size_t i = 0; dir->linked && i < dir->nkids; i++)
		if (meta_committed(dir->kids[i]))
			v[n++] = dir->kids[i];
	for (size_t i = 0; i < s->nundo; i++)
		if (s->undo[i].kind == UNDO_REMOVED && s->undo[i].node->parent == dir)
			v[n++] = s->undo[i].node;
	*out = v;
	*count = n;
	return 0;
}

void meta_committed_fields(const struct meta_node *n, struct meta_fields *f)
{
	const struct meta_undo *r = n->marks & META_SAVED ? record_of(n->store, n, UNDO_FIELDS) : NULL;
	*f = (struct meta_fields){ .mtime_ns = n->mtime_ns };
	if (n->kind == META_ALLOC) {
		f->str = r ? r->str : n->tag;
		f->size = n->size;
		f->aligned = n->aligned;
	} else if (n->kind == META_ENTRY) {
		f->str = r ? r->str : n->alloc;
		f->value = r ? r->value : n->value;
		f->value_len = r ? r->value_len : n->value_len;
		f->offset = r ? r->offset : n->offset;
		f->extent = r ? r->extent : n->extent;
		f->flags = r ? r->flags : n->flags;
	}
	if (r)
		f->mtime_ns = r->mtime_ns;
}

void meta_live_fields(const struct meta_node *n, struct meta_fields *f)
{
	*f = (struct meta_fields){ .mtime_ns = n->mtime_ns };
	if (n->kind == META_ALLOC)
		*f = (struct meta_fields){ .str = n->tag, .size = n->size, .aligned = n->aligned, .mtime_ns = n->mtime_ns };
	else if (n->kind == META_ENTRY)
		*f = (struct meta_fields){ .str = n->alloc, .value = n->value, .value_len = n->value_len,
					   .offset = n->offset, .extent = n->extent, .flags = n->flags,
					   .mtime_ns = n->mtime_ns };
}
