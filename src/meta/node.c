/* node: the tree of a store and what reads it: nodes, the directory index, links with
 * the store's counts, holds and the kernel's lookups.  Nothing here is logged for a
 * rollback: the changes a rollback undoes are made in store.c, batch.c and entry.c. */
#include "node.h"
#include "grow.h"
#include "hash.h"
#include "probe.h"

#include <assert.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct meta_node *meta_node_new(struct meta_store *s, enum meta_kind kind, enum meta_area area, const char *name)
{
	size_t len = strlen(name) + 1;
	struct meta_node *n = calloc(1, sizeof *n + len);
	if (!n)
		return NULL;
	memcpy(n->name, name, len);
	n->magic = META_NODE_MAGIC;
	n->kind = kind;
	n->area = area;
	n->store = s;
	meta_touch(n);
	return n;
}

/* The interned string field of n, or NULL for a directory. */
char **meta_str_of(struct meta_node *n)
{
	return n->kind == META_ALLOC ? &n->tag : n->kind == META_ENTRY ? &n->alloc : NULL;
}

void meta_put_value(struct meta_node *n, char *p)
{
	if (n->value != p && !(n->marks & META_SHARED_VALUE))
		free(n->value);
	n->value = p;
	n->marks &= ~META_SHARED_VALUE;
}

void meta_put_ref(char **field, char *p)
{
	meta_unref(*field);
	*field = p;
}

void meta_node_free(struct meta_node *n)
{
	n->magic = 0;
	if (n->kind == META_DIR) {
		free(n->kids);
		free(n->index);
	} else {
		meta_put_ref(meta_str_of(n), NULL);
		if (n->kind == META_ENTRY)
			meta_put_value(n, NULL);
	}
	free(n);
}

/* ---- the index of a directory: open addressing, linear probing ---- */

static uint64_t kid_home(const void *kid, const void *ctx)
{
	return name_hash(((const struct meta_node *)kid)->name);
}

static int index_put(struct meta_node *dir, struct meta_node *kid)
{
	if ((dir->nkids + 1) * 4 > dir->index_cap * 3 && /* at most 3/4 full */
	    probe_grow(&dir->index, &dir->index_cap, 8, kid_home, NULL))
		return -ENOMEM;
	probe_put(dir->index, dir->index_cap, kid, kid_home, NULL);
	return 0;
}

static size_t index_find(const struct meta_node *dir, const char *name)
{
	if (!dir->index_cap)
		return SIZE_MAX;
	size_t mask = dir->index_cap - 1, i = name_hash(name) & mask;
	for (; dir->index[i]; i = (i + 1) & mask)
		if (!strcmp(((const struct meta_node *)dir->index[i])->name, name))
			return i;
	return SIZE_MAX;
}

static void index_del(struct meta_node *dir, size_t i)
{
	probe_del(dir->index, dir->index_cap, i, kid_home, NULL);
}

/* ---- linking into the live layout, with the store's counts ---- */

static void account(struct meta_store *s, const struct meta_node *n, int sign)
{
	if (n->kind == META_ALLOC) {
		s->stats.allocations += sign;
		s->stats.bytes += sign * (int64_t)n->size;
		s->stats.aligned_bytes += sign * (int64_t)n->aligned;
	} else if (n->kind == META_ENTRY) {
		s->stats.entries += sign;
	}
}

int meta_set_str(struct meta_node *n, const char *src, size_t len)
{
	char *p = meta_intern(meta_strs(n->store), src, len);
	if (!p)
		return -ENOMEM;
	meta_put_ref(meta_str_of(n), p);
	return 0;
}

int meta_link(struct meta_node *dir, struct meta_node *n)
{
	if (GROW(dir->kids, dir->nkids, dir->kids_cap, 8))
		return -ENOMEM;
	int e = index_put(dir, n);
	if (e)
		return e;
	n->slot = dir->nkids;
	dir->kids[dir->nkids++] = n;
	n->parent = dir;
	n->linked = true;
	n->holds++;
	account(dir->store, n, +1);
	meta_dirty(dir);
	meta_watch(dir, false);
	meta_watch(n, false); /* a rollback links a node back with its old attributes */
	return 0;
}

/* Drop one hold; the memory goes with the last, the struct with the last lookup too. */
void meta_unhold(struct meta_node *n)
{
	assert(n->holds > 0);
	if (--n->holds)
		return;
	struct meta_store *s = n->store;
	if (n->kind == META_ALLOC) {
		if (n->buf && s && s->release_buf)
			s->release_buf(n->buf, s->release_ctx);
		n->buf = NULL;
	}
	n->store = NULL;
	if (!n->lookups) {
		meta_node_free(n);
		return;
	}
	struct meta_graveyard *g = s ? s->grave : NULL;
	if (g && !GROW(g->v, g->n, g->cap, 64)) {
		n->grave = g;
		n->slot = g->n;
		g->v[g->n++] = n;
	}
}

void meta_set_graveyard(struct meta_store *s, struct meta_graveyard *g)
{
	s->grave = g;
}

void meta_graveyard_free(struct meta_graveyard *g)
{
	for (size_t i = 0; i < g->n; i++)
		meta_node_free(g->v[i]);
	free(g->v);
	*g = (struct meta_graveyard){0};
}

void meta_unlink(struct meta_node *n)
{
	struct meta_node *dir = n->parent;
	meta_watch(n, true);
	meta_watch(dir, false);
	size_t i = index_find(dir, n->name);
	if (i != SIZE_MAX)
		index_del(dir, i);
	struct meta_node *last = dir->kids[--dir->nkids];
	dir->kids[n->slot] = last;
	last->slot = n->slot;
	n->linked = false;
	account(dir->store, n, -1);
	meta_dirty(dir);
}

void meta_unlink_free(struct meta_node *n)
{
	meta_unlink(n);
	meta_unhold(n);
}

int meta_collect(struct meta_node *n, void *arg)
{
	struct meta_nodes *v = arg;
	if (GROW(v->v, v->n, v->cap, 64))
		return -ENOMEM;
	v->v[v->n++] = n;
	return 0;
}

/* Unlink the whole live layout; returns the nodes (still holding their tree hold). */
int meta_unlink_all(struct meta_store *s, struct meta_nodes *v)
{
	for (int a = 0; a < 2; a++) {
		int e = meta_walk(s->root[a], meta_collect, v);
		if (e)
			return e;
	}
	for (size_t i = 0; i < v->n; i++) {
		struct meta_node *n = v->v[i];
		meta_watch(n, true);
		n->linked = false;
		account(s, n, -1);
		if (n->kind == META_DIR) {
			n->nkids = 0;
			if (n->index)
				memset(n->index, 0, n->index_cap * sizeof *n->index);
		}
	}
	for (int a = 0; a < 2; a++) {
		meta_watch(s->root[a], false);
		s->root[a]->nkids = 0;
		if (s->root[a]->index)
			memset(s->root[a]->index, 0, s->root[a]->index_cap * sizeof *s->root[a]->index);
	}
	return 0;
}

void *meta_context(const struct meta_node *n)
{
	return n->store ? n->store->release_ctx : NULL;
}

void meta_set_watch(struct meta_store *s, void (*changed)(struct meta_node *n, bool gone, void *ctx), void *ctx)
{
	s->changed = changed;
	s->watch_ctx = ctx;
}

struct meta_node *meta_root(struct meta_store *s, enum meta_area area)
{
	return s->root[area == META_AREA_META];
}

struct meta_node *meta_lookup(const struct meta_node *dir, const char *name)
{
	if (dir->kind != META_DIR || !dir->linked)
		return NULL;
	size_t i = index_find(dir, name);
	return i == SIZE_MAX ? NULL : dir->index[i];
}

bool meta_name_valid(const char *name)
{
	size_t len = strlen(name);
	if (!len || len > 255 || !strcmp(name, ".") || !strcmp(name, ".."))
		return false;
	return !strchr(name, '/');
}

int meta_path(const struct meta_node *n, char *buf, size_t size)
{
	/* Build right to left, then move to the front. */
	if (!size)
		return -ENAMETOOLONG;
	size_t pos = size - 1;
	buf[pos] = '\0';
	for (const struct meta_node *p = n; p && p->parent; p = p->parent) {
		size_t l = strlen(p->name) + (p != n);
		if (l > pos)
			return -ENAMETOOLONG;
		pos -= l;
		memcpy(buf + pos, p->name, strlen(p->name));
		if (p != n)
			buf[pos + l - 1] = '/';
	}
	memmove(buf, buf + pos, size - pos);
	return 0;
}

struct meta_node *meta_resolve(struct meta_store *s, enum meta_area area, const char *path)
{
	char name[256];
	struct meta_node *n = meta_root(s, area);
	const char *p = path;
	while (n && *p) {
		const char *slash = strchr(p, '/');
		size_t l = slash ? (size_t)(slash - p) : strlen(p);
		if (!l || l > 255)
			return NULL;
		memcpy(name, p, l);
		name[l] = '\0';
		n = meta_lookup(n, name);
		p += l + (slash != NULL);
	}
	return n;
}

void meta_hold(struct meta_node *n) { n->holds++; }
void meta_drop(struct meta_node *n) { meta_unhold(n); }
/* Where the count of nodes the kernel holds is kept: the store's graveyard, or the one
 * the node waits in. */
static struct meta_graveyard *kernel_of(const struct meta_node *n)
{
	return n->store ? n->store->grave : n->grave;
}

void meta_lookup_ref(struct meta_node *n)
{
	struct meta_graveyard *g = kernel_of(n);
	if (!n->lookups++ && g)
		g->known++;
}

void meta_forget(struct meta_node *n, uint64_t nlookup)
{
	assert(nlookup <= n->lookups); /* the kernel forgets what it looked up, no more */
	n->lookups -= nlookup;
	struct meta_graveyard *k = kernel_of(n), *g = n->grave;
	if (!n->lookups && k)
		k->known--;
	if (n->lookups || n->holds)
		return;
	if (g) {
		g->v[n->slot] = g->v[--g->n];
		g->v[n->slot]->slot = n->slot;
	}
	meta_node_free(n);
}

int meta_walk(struct meta_node *dir, int (*fn)(struct meta_node *n, void *arg), void *arg)
{
	for (size_t i = 0; i < dir->nkids; i++) {
		struct meta_node *k = dir->kids[i];
		int e = fn(k, arg);
		if (e)
			return e;
		if (k->kind == META_DIR && (e = meta_walk(k, fn, arg)))
			return e;
	}
	return 0;
}

void meta_stats(const struct meta_store *s, struct meta_stats *out)
{
	*out = s->stats;
}

const char *meta_hash_hex(const struct meta_store *s)
{
	return s->hash_hex;
}

bool meta_hash(const struct meta_store *s, uint8_t out[GMSFS_HASH_LEN])
{
	if (s->committed)
		memcpy(out, s->hash, sizeof s->hash);
	return s->committed;
}
