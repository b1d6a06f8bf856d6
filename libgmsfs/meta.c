/* meta: the handle's copy of the layout's metadata entries.  Loaded with the bulk
 * import (or by the first get or list), kept current by the handle's own puts and
 * deletes, so that reading metadata costs no request. */
#include "internal.h"
#include "grow.h"
#include "hash.h"
#include "probe.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void entry_free(gmsfs *g, struct entry_rec *x)
{
	free(x->key);
	free(x->alloc);
	free(x->value);
	if (x->copy)
		g->be->private_free(g, x->copy);
	memset(x, 0, sizeof *x);
}

static void sorted_drop(struct mt *t)
{
	free(t->sorted);
	t->sorted = NULL;
}

void mt_free(gmsfs *g)
{
	struct mt *t = &g->meta;
	for (size_t i = 0; i < t->n; i++)
		entry_free(g, &t->v[i]);
	free(t->v);
	free(t->index);
	sorted_drop(t);
	memset(t, 0, sizeof *t);
}

/* The index by key: entry indexes + 1 (common/probe.h), at most half the slots full. */
static uint64_t entry_home(const void *entry, const void *ctx)
{
	const struct mt *t = ctx;
	return name_hash(t->v[(uintptr_t)entry - 1].key);
}

static void index_put(struct mt *t, size_t i)
{
	probe_put(t->index, t->index_cap, (void *)(uintptr_t)(i + 1), entry_home, t);
}

static int index_rebuild(struct mt *t, size_t want)
{
	size_t cap = 64;
	while (cap < 2 * want)
		cap *= 2;
	void **v = calloc(cap, sizeof *v);
	if (!v)
		return -ENOMEM;
	free(t->index);
	t->index = v;
	t->index_cap = cap;
	for (size_t i = 0; i < t->n; i++)
		index_put(t, i);
	return 0;
}

static struct entry_rec *find(const struct mt *t, const char *key)
{
	if (!t->index_cap)
		return NULL;
	size_t mask = t->index_cap - 1;
	for (size_t k = name_hash(key) & mask; t->index[k]; k = (k + 1) & mask) {
		struct entry_rec *e = &t->v[(uintptr_t)t->index[k] - 1];
		if (!strcmp(e->key, key))
			return e;
	}
	return NULL;
}

/* Take e over (its strings become the table's); -ENOMEM leaves e to the caller. */
static int insert(gmsfs *g, struct entry_rec *e)
{
	struct mt *t = &g->meta;
	struct entry_rec *old = find(t, e->key);
	if (old) {
		entry_free(g, old); /* a private copy of the old extent goes too */
		*old = *e;
		memset(e, 0, sizeof *e);
		return 0;
	}
	if (GROW(t->v, t->n, t->cap, 64) || (2 * (t->n + 1) > t->index_cap && index_rebuild(t, t->n + 1)))
		return -ENOMEM;
	t->v[t->n] = *e;
	index_put(t, t->n++);
	memset(e, 0, sizeof *e);
	sorted_drop(t);
	return 0;
}

static void remove_at(gmsfs *g, size_t i)
{
	struct mt *t = &g->meta;
	entry_free(g, &t->v[i]);
	t->v[i] = t->v[--t->n];
	index_rebuild(t, t->n); /* cannot fail in practice: it shrinks or stays */
	sorted_drop(t);
}

/* Takes the manifest's entries over as they are: no copy of a big table. */
void mt_load(gmsfs *g, struct ch_manifest *m)
{
	mt_free(g);
	struct mt *t = &g->meta;
	t->v = m->entries;
	t->n = t->cap = m->nentries;
	if (index_rebuild(t, t->n)) {
		memset(t, 0, sizeof *t); /* the entries are still the manifest's */
		return;
	}
	m->entries = NULL;
	m->nentries = 0;
	t->loaded = true;
}

int mt_ensure(gmsfs *g)
{
	if (g->meta.loaded)
		return 0;
	msgpack_sbuffer sb;
	msgpack_sbuffer_init(&sb);
	struct ch_manifest m = {0};
	int e = wire_pack_export(&sb, NULL, 0, false, true);
	if (e)
		e = gm_error(g, e, "out of memory");
	else if (!(e = gm_call(g, GMSFS_OP_EXPORT, sb.data, sb.size, &m))) {
		mt_load(g, &m);
		ch_manifest_free(&m);
		if (!g->meta.loaded)
			e = gm_error(g, -ENOMEM, "out of memory for the metadata");
	}
	msgpack_sbuffer_destroy(&sb);
	if (!e && g->lock != GMSFS_RW)
		e = mt_privatize(g);
	return e;
}

int mt_privatize(gmsfs *g)
{
	struct mt *t = &g->meta;
	for (size_t i = 0; i < t->n; i++) {
		struct entry_rec *x = &t->v[i];
		if (!(x->flags & GMSFS_ENTRY_PRIVATE) || x->copy || !x->size)
			continue;
		struct gmsfs_mapping *m = mp_find(g, x->alloc);
		if (!m || !g->slots[m - g->maps].mapped || x->offset + x->size > m->size)
			continue;
		int e = g->be->private_alloc(g, x->size, &x->copy);
		if (e)
			return gm_error(g, e, "meta/%s: %llu bytes of private memory: %s", x->key,
					(unsigned long long)x->size, strerror(-e));
		if ((e = g->be->copy(g, x->copy, (char *)m->ptr + x->offset, x->size))) {
			g->be->private_free(g, x->copy);
			x->copy = NULL;
			return gm_error(g, e, "meta/%s: copying its extent: %s", x->key, strerror(-e));
		}
	}
	return 0;
}

void mt_forget_alloc(gmsfs *g, const char *alloc)
{
	struct mt *t = &g->meta;
	for (size_t i = 0; i < t->n;)
		if (t->v[i].alloc && !strcmp(t->v[i].alloc, alloc))
			remove_at(g, i);
		else
			i++;
}

/* ---- the API ---- */

static int check_entry(gmsfs *g, const struct gmsfs_entry *x, size_t i)
{
	if (!x->key || !gmsfs_path_valid(x->key, strlen(x->key)))
		return gm_error(g, -EINVAL, "entries[%zu]: '%s' is not a valid key", i, x->key ? x->key : "(null)");
	if (!x->alloc || !gmsfs_path_valid(x->alloc, strlen(x->alloc)))
		return gm_error(g, -EINVAL, "entries[%zu] (%s): no valid allocation name", i, x->key);
	if (x->value_len && !x->value)
		return gm_error(g, -EINVAL, "entries[%zu] (%s): no value", i, x->key);
	if (x->value_len > GMSFS_VALUE_MAX)
		return gm_error(g, -EINVAL, "entries[%zu] (%s): value of %zu bytes, more than %u", i, x->key,
				x->value_len, GMSFS_VALUE_MAX);
	if (x->flags & ~GMSFS_ENTRY_FLAGS)
		return gm_error(g, -EINVAL, "entries[%zu] (%s): unknown flags 0x%x", i, x->key, (unsigned)x->flags);
	return 0;
}

/* After the daemon took them: the table follows, if it is here. */
static void remember_puts(gmsfs *g, const struct gmsfs_entry *v, size_t n)
{
	for (size_t i = 0; i < n && g->meta.loaded; i++) {
		struct entry_rec e = { .key = strdup(v[i].key), .alloc = strdup(v[i].alloc), .offset = v[i].offset,
				      .size = v[i].size, .flags = v[i].flags, .value = malloc(v[i].value_len ? v[i].value_len : 1),
				      .value_len = v[i].value_len };
		if (e.value && v[i].value_len)
			memcpy(e.value, v[i].value, v[i].value_len);
		if (!e.key || !e.alloc || !e.value || insert(g, &e)) {
			free(e.key);
			free(e.alloc);
			free(e.value);
			mt_free(g); /* out of memory: the next get asks the daemon */
		}
	}
}

int gmsfs_meta_put_many(gmsfs *g, const struct gmsfs_entry *v, size_t n)
{
	if (!g)
		return -EINVAL;
	int e = gm_need_lock(g, GMSFS_RW);
	if (e)
		return e;
	if (!n)
		return 0;
	if (!v)
		return gm_error(g, -EINVAL, "meta_put_many: no entries");
	struct entry_rec *w = calloc(n, sizeof *w);
	if (!w)
		return gm_error(g, -ENOMEM, "out of memory");
	for (size_t i = 0; i < n && !e; i++) {
		if (!(e = check_entry(g, &v[i], i)))
			w[i] = (struct entry_rec){ .key = (char *)v[i].key, .alloc = (char *)v[i].alloc,
						    .offset = v[i].offset, .size = v[i].size, .flags = v[i].flags,
						    .value = (uint8_t *)v[i].value, .value_len = v[i].value_len };
	}
	msgpack_sbuffer sb;
	msgpack_sbuffer_init(&sb);
	if (!e && wire_pack_entries(&sb, w, n))
		e = gm_error(g, -ENOMEM, "out of memory");
	if (!e && sb.size > GMSFS_REQ_BODY_MAX)
		e = gm_error(g, -E2BIG, "meta_put_many: %zu bytes in one batch, more than %u", sb.size, GMSFS_REQ_BODY_MAX);
	if (!e)
		e = gm_call(g, GMSFS_OP_META_PUT, sb.data, sb.size, NULL);
	msgpack_sbuffer_destroy(&sb);
	free(w);
	if (!e)
		remember_puts(g, v, n);
	return e;
}

int gmsfs_meta_put(gmsfs *g, const char *key, const char *alloc, uint64_t offset, const void *value, size_t len)
{
	struct gmsfs_entry x = { .key = key, .alloc = alloc, .offset = offset, .value = value, .value_len = len };
	return gmsfs_meta_put_many(g, &x, 1);
}

int gmsfs_meta_delete(gmsfs *g, const char *key)
{
	if (!g)
		return -EINVAL;
	int e = gm_need_lock(g, GMSFS_RW);
	if (e)
		return e;
	if (!key || !gmsfs_path_valid(key, strlen(key)))
		return gm_error(g, -EINVAL, "%s: not a valid key", key ? key : "(null)");
	const char *keys[1] = { key };
	msgpack_sbuffer sb;
	msgpack_sbuffer_init(&sb);
	if (wire_pack_names(&sb, GMSFS_K_KEYS, keys, 1))
		e = gm_error(g, -ENOMEM, "out of memory");
	else
		e = gm_call(g, GMSFS_OP_META_DELETE, sb.data, sb.size, NULL);
	msgpack_sbuffer_destroy(&sb);
	if (!e && g->meta.loaded) {
		struct entry_rec *x = find(&g->meta, key);
		if (x)
			remove_at(g, (size_t)(x - g->meta.v));
	}
	return e;
}

void *mt_alloc_ptr(const gmsfs *g, const char *alloc)
{
	struct gmsfs_mapping *m = alloc ? mp_find(g, alloc) : NULL;
	return m && g->slots[m - g->maps].mapped ? m->ptr : NULL;
}

void *mt_extent_ptr(const gmsfs *g, const struct entry_rec *x)
{
	if (x->copy)
		return x->copy;
	char *base = mt_alloc_ptr(g, x->alloc);
	return base ? base + x->offset : NULL;
}

int gmsfs_meta_get(gmsfs *g, const char *key, struct gmsfs_meta *out)
{
	if (!g || !out)
		return g ? gm_error(g, -EINVAL, "meta_get: no place for the entry") : -EINVAL;
	*out = (struct gmsfs_meta){0};
	int e = gm_need_lock(g, GMSFS_RO);
	if (e || (e = mt_ensure(g)))
		return e;
	if (!key || !gmsfs_path_valid(key, strlen(key)))
		return gm_error(g, -EINVAL, "%s: not a valid key", key ? key : "(null)");
	struct entry_rec *x = find(&g->meta, key);
	if (!x)
		return gm_error(g, -ENOENT, "meta/%s: no such entry", key);
	out->alloc = x->alloc && x->alloc[0] ? strdup(x->alloc) : NULL;
	out->value = malloc(x->value_len ? x->value_len : 1);
	if ((x->alloc && x->alloc[0] && !out->alloc) || !out->value) {
		gmsfs_meta_free(out);
		return gm_error(g, -ENOMEM, "out of memory");
	}
	memcpy(out->value, x->value, x->value_len);
	out->value_len = x->value_len;
	out->offset = x->offset;
	out->size = x->size;
	out->flags = x->flags;
	out->ptr = mt_extent_ptr(g, x);
	return 0;
}

void gmsfs_meta_free(struct gmsfs_meta *m)
{
	if (!m)
		return;
	free(m->alloc);
	free(m->value);
	*m = (struct gmsfs_meta){0};
}

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

int gmsfs_meta_list(gmsfs *g, const char *prefix, char ***keys, size_t *count)
{
	if (!g || !keys || !count)
		return g ? gm_error(g, -EINVAL, "meta_list: no place for the keys") : -EINVAL;
	*keys = NULL;
	*count = 0;
	int e = gm_need_lock(g, GMSFS_RO);
	if (e || (e = mt_ensure(g)))
		return e;
	struct mt *t = &g->meta;
	if (!t->sorted) {
		if (!(t->sorted = malloc((t->n ? t->n : 1) * sizeof *t->sorted)))
			return gm_error(g, -ENOMEM, "out of memory");
		for (size_t i = 0; i < t->n; i++)
			t->sorted[i] = t->v[i].key;
		qsort(t->sorted, t->n, sizeof *t->sorted, cmp_str);
	}
	size_t plen = prefix ? strlen(prefix) : 0, lo = 0, hi = t->n;
	/* The first key >= prefix, then every key that starts with it. */
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		if (strncmp(t->sorted[mid], prefix ? prefix : "", plen) < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	size_t end = lo;
	while (end < t->n && !strncmp(t->sorted[end], prefix ? prefix : "", plen))
		end++;
	char **v = calloc(end - lo ? end - lo : 1, sizeof *v);
	if (!v)
		return gm_error(g, -ENOMEM, "out of memory");
	for (size_t i = lo; i < end; i++)
		if (!(v[i - lo] = strdup(t->sorted[i]))) {
			gmsfs_list_free(v, i - lo);
			return gm_error(g, -ENOMEM, "out of memory");
		}
	*keys = v;
	*count = end - lo;
	return 0;
}

void gmsfs_list_free(char **keys, size_t count)
{
	for (size_t i = 0; keys && i < count; i++)
		free(keys[i]);
	free(keys);
}

int gmsfs_meta_get_all(gmsfs *g, const char *prefix, char ***keys, struct gmsfs_meta **entries, size_t *count)
{
	if (!g || !keys || !entries || !count)
		return g ? gm_error(g, -EINVAL, "meta_get_all: no place for the entries") : -EINVAL;
	*entries = NULL;
	int e = gmsfs_meta_list(g, prefix, keys, count);
	if (e)
		return e;
	struct gmsfs_meta *v = calloc(*count ? *count : 1, sizeof *v);
	if (!v)
		e = gm_error(g, -ENOMEM, "out of memory");
	for (size_t i = 0; !e && i < *count; i++)
		e = gmsfs_meta_get(g, (*keys)[i], &v[i]);
	if (e) {
		gmsfs_meta_free_all(*keys, v, *count);
		*keys = NULL;
		*count = 0;
		return e;
	}
	*entries = v;
	return 0;
}

void gmsfs_meta_free_all(char **keys, struct gmsfs_meta *entries, size_t count)
{
	for (size_t i = 0; entries && i < count; i++)
		gmsfs_meta_free(&entries[i]);
	free(entries);
	gmsfs_list_free(keys, count);
}
