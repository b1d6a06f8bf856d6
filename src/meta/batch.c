/* Batches: many changes at once, all or nothing.  Each batch is checked whole before
 * anything changes; what can still fail while applying (memory) is undone in reverse,
 * so a failed batch leaves the layout exactly as it was.  Errors name the item. */
#include "meta.h"
#include "grow.h"
#include "hash.h"
#include "node.h"
#include "undo.h"
#include "why.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Nodes a batch created, in order, so that an undo removes them in reverse. */
struct made {
	struct meta_node **v;
	size_t n, cap;
};

static int made_add(struct made *m, struct meta_node *n)
{
	if (GROW(m->v, m->n, m->cap, 16))
		return -ENOMEM;
	m->v[m->n++] = n;
	return 0;
}

static void made_undo(struct made *m)
{
	while (m->n)
		meta_remove(m->v[--m->n]);
}

/* Walk path's parents below root: each must be a directory or missing.  With create,
 * missing ones are made (and recorded); else *dir is NULL when one is missing.  *leaf
 * points at the last component of path. */
static int parents(struct meta_node *root, const char *path, bool create, struct made *made,
		   struct meta_node **dir, const char **leaf)
{
	char name[GMSFS_NAME_MAX + 1];
	struct meta_node *d = root;
	const char *p = path, *slash;
	while ((slash = strchr(p, '/'))) {
		size_t l = (size_t)(slash - p);
		memcpy(name, p, l);
		name[l] = '\0';
		struct meta_node *k = d ? meta_lookup(d, name) : NULL;
		if (k && k->kind != META_DIR)
			return -ENOTDIR;
		if (!k && d && create) {
			int e = meta_create(d, name, META_DIR, &k);
			if (e || (e = made_add(made, k)))
				return e;
		}
		d = k;
		p = slash + 1;
	}
	*dir = d;
	*leaf = p;
	return 0;
}

/* ---- allocations ---- */

int meta_check_allocs(struct meta_store *s, const struct meta_new_alloc *v, size_t n, char *err, size_t errlen)
{
	struct meta_node *root = meta_root(s, META_AREA_ALLOCS);
	for (size_t i = 0; i < n; i++) {
		struct meta_node *d;
		const char *leaf;
		if (!gmsfs_path_valid(v[i].path, strlen(v[i].path)))
			return why_fmt(err, errlen, -EINVAL, "allocs[%zu]: '%s' is not a valid path", i, v[i].path);
		if (v[i].tag && !gmsfs_tag_valid(v[i].tag, strlen(v[i].tag)))
			return why_fmt(err, errlen, -EINVAL, "allocs[%zu] (%s): bad tag", i, v[i].path);
		int e = parents(root, v[i].path, false, NULL, &d, &leaf);
		if (e)
			return why_fmt(err, errlen, e, "allocs[%zu] (%s): a parent is not a directory", i, v[i].path);
		if (d && meta_lookup(d, leaf))
			return why_fmt(err, errlen, -EEXIST, "allocs[%zu] (%s): exists", i, v[i].path);
	}
	return 0;
}

int meta_create_allocs(struct meta_store *s, struct meta_new_alloc *v, size_t n, char *err, size_t errlen)
{
	struct meta_node *root = meta_root(s, META_AREA_ALLOCS);
	int e = meta_check_allocs(s, v, n, err, errlen);
	if (e)
		return e;
	struct made made = {0};
	size_t i;
	for (i = 0; i < n; i++) {
		struct meta_node *d, *a = NULL;
		const char *leaf;
		if ((e = parents(root, v[i].path, true, &made, &d, &leaf)) ||
		    (e = meta_create(d, leaf, META_ALLOC, &a)))
			break;
		if ((e = made_add(&made, a))) {
			meta_remove(a);
			break;
		}
		if ((v[i].tag && (e = meta_set_tag(a, v[i].tag, strlen(v[i].tag)))) ||
		    (e = meta_alloc_size(a, v[i].size, v[i].aligned, v[i].buf)))
			break;
		v[i].node = a;
	}
	if (e) {
		/* The caller keeps every buffer: detach them before the nodes go. */
		for (size_t j = 0; j <= i && j < n; j++)
			if (v[j].node) {
				v[j].node->buf = NULL;
				v[j].node = NULL;
			}
		made_undo(&made);
		if (e == -EEXIST)
			why_fmt(err, errlen, e, "allocs[%zu] (%s): given twice", i, v[i].path);
		else
			why_fmt(err, errlen, e, "allocs[%zu] (%s): %s", i, v[i].path, strerror(-e));
	}
	free(made.v);
	return e;
}

/* A set of allocation paths, to find the entries that name them in one walk. */
struct pathset {
	const char **v;
	size_t cap;
};

static bool pathset_has(const struct pathset *ps, const char *p)
{
	size_t mask = ps->cap - 1;
	for (size_t i = name_hash(p) & mask; ps->v[i]; i = (i + 1) & mask)
		if (!strcmp(ps->v[i], p))
			return true;
	return false;
}

struct doomed {
	struct pathset set;
	struct made entries;
};

static int collect_doomed(struct meta_node *n, void *arg)
{
	struct doomed *d = arg;
	if (n->kind == META_ENTRY && n->alloc && pathset_has(&d->set, n->alloc))
		return made_add(&d->entries, n);
	return 0;
}

int meta_free_allocs(struct meta_store *s, const char *const *paths, size_t n, char *err, size_t errlen)
{
	struct doomed d = {0};
	d.set.cap = 16;
	while (d.set.cap < 2 * n)
		d.set.cap *= 2;
	d.set.v = calloc(d.set.cap, sizeof *d.set.v);
	if (!d.set.v)
		return why_fmt(err, errlen, -ENOMEM, "free: out of memory");
	int e = 0;
	for (size_t i = 0; i < n && !e; i++) {
		if (!gmsfs_path_valid(paths[i], strlen(paths[i]))) {
			e = why_fmt(err, errlen, -EINVAL, "free[%zu]: '%s' is not a valid path", i, paths[i]);
			break;
		}
		struct meta_node *a = meta_resolve(s, META_AREA_ALLOCS, paths[i]);
		if (!a || a->kind != META_ALLOC) {
			e = why_fmt(err, errlen, a ? -EISDIR : -ENOENT, "free[%zu]: allocs/%s %s", i, paths[i],
				 a ? "is a directory" : "does not exist");
			break;
		}
		if (!pathset_has(&d.set, paths[i])) {
			size_t mask = d.set.cap - 1, k = name_hash(paths[i]) & mask;
			while (d.set.v[k])
				k = (k + 1) & mask;
			d.set.v[k] = paths[i];
		}
	}
	if (!e && ((e = meta_walk(meta_root(s, META_AREA_META), collect_doomed, &d)) ||
		   (e = meta_undo_reserve(s, d.entries.n + n))))
		why_fmt(err, errlen, e, "free: out of memory");
	if (!e) {
		/* Nothing below allocates (the undo log has room): it cannot fail half way. */
		for (size_t i = 0; i < d.entries.n; i++)
			meta_remove(d.entries.v[i]);
		for (size_t i = 0; i < n; i++) {
			struct meta_node *a = meta_resolve(s, META_AREA_ALLOCS, paths[i]);
			if (a)
				meta_remove(a);
		}
	}
	free(d.entries.v);
	free(d.set.v);
	return e;
}

/* ---- entries ---- */

/* What a put replaced, to swap back on undo; the new strings are made before anything changes. */
struct put_state {
	struct meta_node *node;
	char *alloc, *value;
	uint32_t value_len;
	uint64_t offset, extent;
	uint32_t flags;
	uint8_t shared; /* META_SHARED_VALUE: the undo log holds the value, which is not freed */
};

static void swap_in(struct put_state *p)
{
	struct meta_node *n = p->node;
	const uint8_t mask = META_SHARED_VALUE;
	struct put_state was = { n, n->alloc, n->value, n->value_len, n->offset, n->extent, n->flags, n->marks & mask };
	n->alloc = p->alloc, n->value = p->value, n->value_len = p->value_len;
	n->offset = p->offset, n->extent = p->extent, n->flags = p->flags;
	n->marks = (uint8_t)((n->marks & ~mask) | p->shared);
	*p = was;
	meta_changed(n);
}

static int check_put(struct meta_store *s, const struct entry_rec *p, size_t i, char *err, size_t errlen)
{
	if (!gmsfs_path_valid(p->key, strlen(p->key)))
		return why_fmt(err, errlen, -EINVAL, "entries[%zu]: '%s' is not a valid key", i, p->key);
	if (!p->alloc || !gmsfs_path_valid(p->alloc, strlen(p->alloc)))
		return why_fmt(err, errlen, -EINVAL, "entries[%zu] (%s): no valid allocation name", i, p->key);
	if (p->flags & ~GMSFS_ENTRY_FLAGS)
		return why_fmt(err, errlen, -EINVAL, "entries[%zu] (%s): unknown flags 0x%x", i, p->key, (unsigned)p->flags);
	if (p->value_len > GMSFS_VALUE_MAX)
		return why_fmt(err, errlen, -EINVAL, "entries[%zu] (%s): value of %zu bytes, more than %u", i, p->key,
			    p->value_len, GMSFS_VALUE_MAX);
	struct meta_node *a = meta_resolve(s, META_AREA_ALLOCS, p->alloc);
	if (!a || a->kind != META_ALLOC || !a->size)
		return why_fmt(err, errlen, -EINVAL, "entries[%zu] (%s): allocation '%s' does not exist", i, p->key,
			    p->alloc);
	if (p->offset >= a->size || p->size > a->size - p->offset)
		return why_fmt(err, errlen, -EINVAL,
			    "entries[%zu] (%s): offset %llu size %llu is not inside '%s' (%llu bytes)", i, p->key,
			    (unsigned long long)p->offset, (unsigned long long)p->size, p->alloc,
			    (unsigned long long)a->size);
	struct meta_node *d;
	const char *leaf;
	if (parents(meta_root(s, META_AREA_META), p->key, false, NULL, &d, &leaf))
		return why_fmt(err, errlen, -EINVAL, "entries[%zu] (%s): a parent is an entry, not a directory", i, p->key);
	struct meta_node *k = d ? meta_lookup(d, leaf) : NULL;
	if (k && k->kind != META_ENTRY)
		return why_fmt(err, errlen, -EINVAL, "entries[%zu] (%s): a directory has that name", i, p->key);
	return 0;
}

int meta_put_entries(struct meta_store *s, const struct entry_rec *v, size_t n, char *err, size_t errlen)
{
	for (size_t i = 0; i < n; i++) {
		int e = check_put(s, &v[i], i, err, errlen);
		if (e)
			return e;
	}
	struct put_state *ps = calloc(n ? n : 1, sizeof *ps);
	/* An item needs one undo record at most: the save of an entry that was there, or the
	 * growth of a committed directory.  With room for n, the saves below cannot fail. */
	if (!ps || meta_undo_reserve(s, n)) {
		free(ps);
		return why_fmt(err, errlen, -ENOMEM, "entries: out of memory");
	}
	int e = 0;
	for (size_t i = 0; i < n && !e; i++) {
		ps[i].alloc = meta_intern(meta_strs(s), v[i].alloc, strlen(v[i].alloc));
		ps[i].value = malloc(v[i].value_len ? v[i].value_len : 1);
		if (!ps[i].alloc || !ps[i].value) {
			e = -ENOMEM;
			break;
		}
		if (v[i].value_len)
			memcpy(ps[i].value, v[i].value, v[i].value_len);
		ps[i].value_len = (uint32_t)v[i].value_len;
		ps[i].offset = v[i].offset;
		ps[i].extent = v[i].size;
		ps[i].flags = v[i].flags;
	}
	struct made made = {0};
	size_t applied = 0;
	for (size_t i = 0; i < n && !e; i++, applied++) {
		struct meta_node *d, *k;
		const char *leaf;
		if ((e = parents(meta_root(s, META_AREA_META), v[i].key, true, &made, &d, &leaf)))
			break;
		if (!(k = meta_lookup(d, leaf))) {
			if ((e = meta_create(d, leaf, META_ENTRY, &k)))
				break;
			if ((e = made_add(&made, k))) {
				meta_remove(k);
				break;
			}
		}
		ps[i].node = k;
		meta_save(k);
		swap_in(&ps[i]);
	}
	if (e) {
		while (applied)
			swap_in(&ps[--applied]); /* back to what each had */
		made_undo(&made);
		why_fmt(err, errlen, e, "entries: %s", strerror(-e));
	}
	for (size_t i = 0; i < n; i++) {
		meta_unref(ps[i].alloc);
		if (!(ps[i].shared & META_SHARED_VALUE))
			free(ps[i].value);
	}
	free(ps);
	free(made.v);
	return e;
}

int meta_delete_entries(struct meta_store *s, const char *const *keys, size_t n, char *err, size_t errlen)
{
	for (size_t i = 0; i < n; i++) {
		if (!gmsfs_path_valid(keys[i], strlen(keys[i])))
			return why_fmt(err, errlen, -EINVAL, "keys[%zu]: '%s' is not a valid key", i, keys[i]);
		struct meta_node *k = meta_resolve(s, META_AREA_META, keys[i]);
		if (!k || k->kind != META_ENTRY)
			return why_fmt(err, errlen, k ? -EISDIR : -ENOENT, "keys[%zu]: meta/%s %s", i, keys[i],
				    k ? "is a directory" : "does not exist");
	}
	if (meta_undo_reserve(s, n)) /* the removals below cannot fail */
		return why_fmt(err, errlen, -ENOMEM, "delete: out of memory");
	for (size_t i = 0; i < n; i++) {
		struct meta_node *k = meta_resolve(s, META_AREA_META, keys[i]);
		if (k) /* a key given twice is gone already */
			meta_remove(k);
	}
	return 0;
}
