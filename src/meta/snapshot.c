/* snapshot: commit (validate, hash, remember the layout) and rollback (back to it). */
#include "meta.h"
#include "meta_internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A string the snapshot holds: the node gets it back if it still shares it, else it goes. */
static void give_back(struct meta_node *n, char *p, unsigned bit)
{
	if (p && (n->shared & bit))
		n->shared &= ~bit; /* the node's field is p */
	else
		free(p);
}

void meta_snapshot_drop(struct meta_store *s)
{
	for (size_t i = 0; i < s->nsnap; i++) {
		struct meta_node *n = s->snap[i].node;
		give_back(n, s->snap[i].str, META_SHARED_STR);
		give_back(n, s->snap[i].value, META_SHARED_VALUE);
		meta_unhold(n);
	}
	free(s->snap);
	s->snap = NULL;
	s->nsnap = 0;
}

static int validate_entry(struct meta_node *n, void *arg)
{
	struct meta_check *c = arg;
	char key[GMSFS_PATH_MAX + 1] = "?";
	if (n->kind == META_ALLOC && !n->size) {
		meta_path(n, key, sizeof key);
		snprintf(c->err, c->errlen, "allocs/%s: never sized (ftruncate it)", key);
		return -EINVAL;
	}
	if (n->kind != META_ENTRY)
		return 0;
	meta_path(n, key, sizeof key);
	if (!n->alloc) {
		snprintf(c->err, c->errlen, "meta/%s: no user.gms.alloc", key);
		return -EINVAL;
	}
	struct meta_node *a = meta_resolve(c->store, META_AREA_ALLOCS, n->alloc);
	if (!a || a->kind != META_ALLOC) {
		snprintf(c->err, c->errlen, "meta/%s: allocation '%s' does not exist", key, n->alloc);
		return -EINVAL;
	}
	if (n->offset >= a->size) {
		snprintf(c->err, c->errlen, "meta/%s: offset %llu is past the end of '%s' (size %llu)", key,
			 (unsigned long long)n->offset, n->alloc, (unsigned long long)a->size);
		return -EINVAL;
	}
	if (n->extent > a->size - n->offset) {
		snprintf(c->err, c->errlen, "meta/%s: offset %llu + size %llu passes the end of '%s' (size %llu)", key,
			 (unsigned long long)n->offset, (unsigned long long)n->extent, n->alloc,
			 (unsigned long long)a->size);
		return -EINVAL;
	}
	return 0;
}

int meta_commit(struct meta_store *s, char *err, size_t errlen)
{
	struct meta_check c = { .store = s, .err = err, .errlen = errlen };
	if (errlen)
		err[0] = '\0';
	for (int a = 0; a < 2; a++) {
		int e = meta_walk(s->root[a], validate_entry, &c);
		if (e)
			return e;
	}
	uint8_t digest[16];
	int e = meta_layout_hash(s, digest);
	if (e)
		return e;

	struct meta_nodes v = {0};
	for (int a = 0; a < 2 && !e; a++)
		e = meta_walk(s->root[a], meta_collect, &v);
	struct meta_snap *snap = e ? NULL : calloc(v.n ? v.n : 1, sizeof *snap);
	if (!snap) {
		free(v.v);
		return -ENOMEM;
	}
	/* Nothing fails past here.  The old snapshot goes first, so that what it shared is
	 * the nodes' own again before the new one shares it: no string is copied. */
	meta_snapshot_drop(s);
	for (size_t i = 0; i < v.n; i++) {
		struct meta_node *n = v.v[i];
		char **str = meta_str_of(n);
		snap[i].node = n;
		n->holds++;
		if (str && (snap[i].str = *str))
			n->shared |= META_SHARED_STR;
		if (n->kind != META_ENTRY)
			continue;
		snap[i].offset = n->offset;
		snap[i].extent = n->extent;
		snap[i].flags = n->flags;
		snap[i].value_len = n->value_len;
		if ((snap[i].value = n->value))
			n->shared |= META_SHARED_VALUE;
	}
	s->snap = snap;
	s->nsnap = v.n;
	free(v.v);
	memcpy(s->hash, digest, sizeof s->hash);
	for (int i = 0; i < 16; i++)
		sprintf(s->hash_hex + 2 * i, "%02x", digest[i]);
	s->committed = true;
	s->dirty = false;
	return 0;
}

/* The node's field becomes the snapshot's string again, shared. */
static void share(struct meta_node *n, char **field, char *p, unsigned bit)
{
	meta_put_str(n, field, bit, p);
	if (p)
		n->shared |= bit;
}

void meta_rollback(struct meta_store *s)
{
	if (!s->dirty)
		return; /* nothing changed since the snapshot (or since the store was made) */
	struct meta_nodes v = {0};
	bool whole = true;
	if (meta_unlink_all(s, &v)) {
		/* Out of memory while listing, before anything was unlinked: leave the layout as it is. */
		free(v.v);
		return;
	}
	for (size_t i = 0; i < s->nsnap; i++) {
		struct meta_snap *r = &s->snap[i];
		struct meta_node *n = r->node;
		if (meta_link(n->parent, n)) {
			whole = false; /* out of memory: the node stays out */
			continue;
		}
		char **str = meta_str_of(n);
		if (str)
			share(n, str, r->str, META_SHARED_STR);
		if (n->kind == META_ENTRY) {
			share(n, &n->value, r->value, META_SHARED_VALUE);
			n->value_len = r->value_len;
			n->offset = r->offset;
			n->extent = r->extent;
			n->flags = r->flags;
		}
	}
	for (size_t i = 0; i < v.n; i++)
		meta_unhold(v.v[i]);
	free(v.v);
	s->dirty = !whole;
}
