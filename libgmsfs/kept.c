/* kept: an elastic store's pages kept past their engine (libgmsfs(3), KEPT).  A keep
 * commits the layout while the engine goes on writing: every mapped page has an entry,
 * meta/pages/<range>/<index>, naming the allocation mapped at that index, its value the
 * engine's record of what the page holds (empty: nothing to trust); the session stays
 * the engine's, kept (its end rolls back to the last keep, never torn).  The next writer
 * adopts: the same pages mapped at the same indices of a range of its own, their
 * records read back.  A page's bytes are as trustworthy as its record says: the engine
 * clears a record (a keep) before it writes a page again. */
#include "pages_held.h"
#include "tie.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grow.h"

#define PUT_BATCH 4096 /* entries in one META_PUT */

static const char *range_id(const gmsfs_pages *p)
{
	return p->prefix + strlen(GMSFS_PAGES_PREFIX);
}

/* Entries to put: keys and allocation names owned here. */
struct puts {
	struct gmsfs_entry *v;
	gmsfs_pages **of; /* the range of each */
	uint64_t *idx;
	size_t n, cap;
};

static void puts_free(struct puts *u)
{
	for (size_t i = 0; i < u->n; i++) {
		free((char *)u->v[i].key);
		free((char *)u->v[i].alloc);
	}
	free(u->v);
	free(u->of);
	free(u->idx);
}

static int add_put(struct puts *u, gmsfs_pages *p, uint64_t i, const void *data, size_t len)
{
	if (u->n == u->cap) {
		size_t cap = u->cap ? u->cap * 2 : 64;
		struct gmsfs_entry *v = realloc(u->v, cap * sizeof *v);
		if (v)
			u->v = v;
		gmsfs_pages **of = v ? realloc(u->of, cap * sizeof *of) : NULL;
		if (of)
			u->of = of;
		uint64_t *idx = of ? realloc(u->idx, cap * sizeof *idx) : NULL;
		if (!idx)
			return -ENOMEM;
		u->idx = idx;
		u->cap = cap;
	}
	char *key = NULL, *alloc = NULL;
	if (asprintf(&key, GMSFS_PAGES_PREFIX "%s/%" PRIu64, range_id(p), i) < 0)
		return -ENOMEM;
	if (asprintf(&alloc, "%s/%" PRIu64, p->prefix, p->name[i]) < 0) {
		free(key);
		return -ENOMEM;
	}
	u->v[u->n] = (struct gmsfs_entry){ .key = key, .alloc = alloc, .size = p->page, .value = data, .value_len = len };
	u->of[u->n] = p;
	u->idx[u->n++] = i;
	return 0;
}

/* rec[0..n) for p: each index in the range, mapped, named once, a value not too long. */
static int check_records(gmsfs_pages *p, const struct gmsfs_page_record *rec, size_t n)
{
	int e = 0;
	size_t i = 0;
	for (; i < n && !e; i++) {
		uint64_t k = rec[i].idx;
		if (k >= p->count)
			e = gm_error(p->g, -EINVAL, "pages_keep: index %" PRIu64 " is past the range's %" PRIu64 " pages", k,
				     p->count);
		else if (!(p->mapped[k] & PG_MAPPED))
			e = gm_error(p->g, -ENOENT, "pages_keep: page %" PRIu64 " is not mapped", k);
		else if (p->mapped[k] & PG_ASKED)
			e = gm_error(p->g, -EINVAL, "pages_keep: index %" PRIu64 " twice in one call", k);
		else if (rec[i].len > GMSFS_VALUE_MAX || (rec[i].len && !rec[i].data))
			e = gm_error(p->g, -EINVAL, "pages_keep: page %" PRIu64 ": a record of %zu bytes (at most %u)", k,
				     rec[i].len, GMSFS_VALUE_MAX);
		else
			p->mapped[k] |= PG_ASKED;
	}
	if (e)
		for (size_t k = 0; k < i; k++)
			if (rec[k].idx < p->count)
				p->mapped[rec[k].idx] &= (uint8_t)~PG_ASKED;
	return e;
}

static int ensure_records(gmsfs *g)
{
	for (gmsfs_pages *q = g->pages; q; q = q->next)
		if (!q->freed && !q->rec && !(q->rec = calloc(q->count, sizeof *q->rec)))
			return gm_error(g, -ENOMEM, "out of memory");
	return 0;
}

/* The bytes a commit vouches for have landed: the work this thread's context queued (the
 * kernels that wrote them) is waited for first, as gmsfs_commit does. */
int gmsfs_commit_layout(gmsfs *g)
{
	if (!g)
		return -EINVAL;
	int e = gm_need_lock(g, GMSFS_RW);
	if (e)
		return e;
	if (g->be->drain && (e = g->be->drain(g)))
		return gm_error(g, e, "commit_layout: the context's queued work failed: %s", strerror(-e));
	return gm_call(g, GMSFS_OP_KEEP, NULL, 0, NULL);
}

int gmsfs_pages_keep(gmsfs_pages *p, const struct gmsfs_page_record *rec, size_t n)
{
	if (!p)
		return -EINVAL;
	gmsfs *g = p->g;
	if (p->freed)
		return gm_error(g, -EINVAL, "pages_keep: the range was freed");
	int e = gm_need_lock(g, GMSFS_RW);
	if (e || (n && !rec && (e = gm_error(g, -EINVAL, "pages_keep: no records"))))
		return e;
	if ((e = ensure_records(g)) || (e = check_records(p, rec, n)))
		return e;
	struct puts u = {0};
	void **copy = calloc(n ? n : 1, sizeof *copy);
	for (size_t i = 0; copy && i < n && !e; i++)
		if (rec[i].len && !(copy[i] = malloc(rec[i].len)))
			e = -ENOMEM;
		else if (rec[i].len)
			memcpy(copy[i], rec[i].data, rec[i].len);
	e = copy ? e : -ENOMEM;
	/* The records given, then every other page mapped since the last keep (its record
	 * as it was: none for a new one), of every range: the layout is the store's. */
	for (size_t i = 0; i < n && !e; i++)
		e = add_put(&u, p, rec[i].idx, copy[i], rec[i].len);
	for (gmsfs_pages *q = g->pages; q && !e; q = q->next)
		for (uint64_t i = 0; !q->freed && i < q->count && !e; i++)
			if ((q->mapped[i] & (PG_MAPPED | PG_ENTRY | PG_ASKED)) == PG_MAPPED)
				e = add_put(&u, q, i, q->rec[i].data, q->rec[i].len);
	for (size_t i = 0; i < n; i++)
		p->mapped[rec[i].idx] &= (uint8_t)~PG_ASKED;
	if (e)
		e = gm_error(g, -ENOMEM, "out of memory");
	if (!e)
		e = pg_give_back_held(g, 0); /* a kept layout names pages by index: a held one has none */
	for (size_t at = 0; !e && at < u.n; at += PUT_BATCH)
		e = gmsfs_meta_put_many(g, u.v + at, u.n - at < PUT_BATCH ? u.n - at : PUT_BATCH);
	if (!e) /* the weights the pages are computed with, where the engine said */
		e = tie_put(g, u.n ? u.v[0].alloc : NULL);
	if (!e)
		e = gmsfs_commit_layout(g); /* the kernels that wrote what the records vouch for first */
	if (!e) {
		for (gmsfs_pages *q = g->pages; q; q = q->next)
			q->kept = !q->freed;
		for (size_t i = 0; i < u.n; i++)
			u.of[i]->mapped[u.idx[i]] |= PG_ENTRY;
		for (size_t i = 0; i < n; i++) { /* the record is the page's now: new, never old */
			p->mapped[rec[i].idx] &= (uint8_t)~PG_OLD;
			free(p->rec[rec[i].idx].data);
			p->rec[rec[i].idx] = (struct pg_record){ .data = copy[i], .len = rec[i].len };
			copy[i] = NULL;
		}
	}
	for (size_t i = 0; copy && i < n; i++)
		free(copy[i]);
	free(copy);
	puts_free(&u);
	return e;
}

/* ---- adoption ---- */

struct kept_page {
	const char *alloc; /* the entry's, in the handle's metadata */
	uint64_t idx, num;
	const struct entry_rec *x;
};

static int by_alloc(const void *a, const void *b)
{
	return strcmp(((const struct kept_page *)a)->alloc, ((const struct kept_page *)b)->alloc);
}

/* Which kept range to adopt: the first by name whose pages no range of this handle has. */
static int pick_range(gmsfs *g, char *id, size_t idlen)
{
	size_t plen = strlen(GMSFS_PAGES_PREFIX);
	id[0] = '\0';
	for (size_t i = 0; i < g->meta.n; i++) {
		const char *key = g->meta.v[i].key, *slash;
		if (strncmp(key, GMSFS_PAGES_PREFIX, plen) || !(slash = strchr(key + plen, '/')))
			continue;
		size_t len = (size_t)(slash - key - plen);
		if (len >= idlen)
			continue; /* not a name this library gives */
		char cand[64];
		memcpy(cand, key + plen, len);
		cand[len] = '\0';
		bool mine = false;
		for (gmsfs_pages *q = g->pages; q && !mine; q = q->next)
			mine = !q->freed && !strcmp(range_id(q), cand);
		if (!mine && (!id[0] || strcmp(cand, id) < 0))
			memcpy(id, cand, len + 1);
	}
	return id[0] ? 0 : -ENOENT;
}

/* The kept range id's pages, from the entries: each index and allocation checked. */
static int kept_pages(gmsfs *g, const char *id, uint64_t page, uint64_t count, struct kept_page **out, size_t *n)
{
	char key0[64], alloc0[64];
	snprintf(key0, sizeof key0, GMSFS_PAGES_PREFIX "%s/", id);
	snprintf(alloc0, sizeof alloc0, GMSFS_PAGES_PREFIX "%s/", id);
	size_t klen = strlen(key0), alen = strlen(alloc0), cap = 0;
	*out = NULL;
	*n = 0;
	for (size_t i = 0; i < g->meta.n; i++) {
		const struct entry_rec *x = &g->meta.v[i];
		if (strncmp(x->key, key0, klen))
			continue;
		char *end1 = NULL, *end2 = NULL;
		uint64_t idx = strtoull(x->key + klen, &end1, 10);
		uint64_t num = x->alloc && !strncmp(x->alloc, alloc0, alen) ? strtoull(x->alloc + alen, &end2, 10) : 0;
		if (!end1 || *end1 || !end2 || *end2 || x->offset || x->size != page)
			return gm_error(g, -EINVAL, "pages_adopt: meta/%s (allocation %s, %" PRIu64 " bytes): not a kept page of %"
				      PRIu64 " bytes", x->key, x->alloc ? x->alloc : "none", x->size, page);
		if (idx >= count)
			return gm_error(g, -EINVAL, "pages_adopt: meta/%s: page %" PRIu64 " is past a span of %" PRIu64
				      " pages: adopt with the span it was kept with", x->key, idx, count);
		if (ROOM(*out, *n + 1, cap, 64))
			return gm_error(g, -ENOMEM, "out of memory");
		(*out)[(*n)++] = (struct kept_page){ .alloc = x->alloc, .idx = idx, .num = num, .x = x };
	}
	qsort(*out, *n, sizeof **out, by_alloc);
	return 0;
}

struct adopting {
	gmsfs_pages *p;
	struct kept_page *v;
	size_t n, placed;
};

/* The export's allocations, message by message: each kept page at its index. */
static int adopted(void *ctx, struct ch_manifest *m, size_t from, size_t to)
{
	struct adopting *c = ctx;
	gmsfs_pages *p = c->p;
	gmsfs *g = p->g;
	for (size_t k = from; k < to; k++) {
		struct kept_page key = { .alloc = m->allocs[k].path };
		struct kept_page *kp = bsearch(&key, c->v, c->n, sizeof *c->v, by_alloc);
		if (!kp || m->allocs[k].aligned != p->page || m->fd[k] < 0 || m->allocs[k].npieces ||
		    (p->mapped[kp->idx] & PG_MAPPED))
			return gm_error(g, -EPROTO, "%s: not a kept page of this range", m->allocs[k].path);
		char why[200] = "";
		int e = g->be->map(g, (char *)p->base + kp->idx * p->page, p->page, m->fd[k], m->allocs[k].fd_offset, true,
				   why, sizeof why);
		if (e)
			return gm_error(g, e, "%s: %s", m->allocs[k].path, why[0] ? why : strerror(-e));
		p->mapped[kp->idx] = PG_MAPPED | PG_ENTRY;
		p->name[kp->idx] = kp->num;
		p->nmapped++;
		c->placed++;
	}
	return 0;
}

static int by_idx(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

/* Map the kept pages v[0..n) into p, their access set, their records copied. */
static int take_pages(gmsfs_pages *p, struct kept_page *v, size_t n)
{
	gmsfs *g = p->g;
	const char **names = malloc((n ? n : 1) * sizeof *names);
	uint64_t *idx = malloc((n ? n : 1) * sizeof *idx);
	int e = names && idx ? 0 : gm_error(g, -ENOMEM, "out of memory");
	for (size_t i = 0; !e && i < n; i++) {
		names[i] = v[i].alloc;
		idx[i] = v[i].idx;
		if (v[i].num >= p->next_name)
			p->next_name = v[i].num + 1; /* new pages after the kept ones */
	}
	msgpack_sbuffer sb;
	msgpack_sbuffer_init(&sb);
	struct adopting c = { .p = p, .v = v, .n = n };
	struct ch_manifest m = { .consume = adopted, .ctx = &c };
	if (!e && n && wire_pack_export(&sb, names, n, true, false))
		e = gm_error(g, -ENOMEM, "out of memory");
	else if (!e && n && !(e = gm_call(g, GMSFS_OP_EXPORT, sb.data, sb.size, &m)))
		ch_manifest_free(&m);
	msgpack_sbuffer_destroy(&sb);
	if (!e && c.placed != n)
		e = gm_error(g, -EPROTO, "pages_adopt: %zu of %zu kept pages came", c.placed, n);
	if (!e) {
		qsort(idx, n, sizeof *idx, by_idx);
		e = pg_allow_runs(p, idx, n);
	}
	for (size_t i = 0; !e && i < n; i++) {
		const struct entry_rec *x = v[i].x;
		struct pg_record *r = &p->rec[v[i].idx];
		if (x->value_len && !(r->data = malloc(x->value_len)))
			e = gm_error(g, -ENOMEM, "out of memory");
		else if (x->value_len)
			memcpy(r->data, x->value, r->len = x->value_len);
	}
	free(names);
	free(idx);
	return e;
}

int gmsfs_pages_adopt(gmsfs *g, uint64_t span, uint64_t page_size, gmsfs_pages **out, uint64_t *adopted_pages)
{
	if (!g || !out)
		return g ? gm_error(g, -EINVAL, "pages_adopt: no place for the range") : -EINVAL;
	*out = NULL;
	if (adopted_pages)
		*adopted_pages = 0;
	int e = gm_need_lock(g, GMSFS_RW);
	if (e)
		return e;
	/* Kept first: the pages about to be mapped writable are the last keep's, and a death
	 * from here on rolls back to it, never tears it. */
	if ((e = gm_call(g, GMSFS_OP_KEEP, NULL, 0, NULL)))
		return e;
	mt_free(g); /* the daemon's entries, as kept */
	if ((e = mt_ensure(g)))
		return e;
	char id[40], prefix[64]; /* a range's name: <pid>.<serial>.<salt> */
	struct kept_page *v = NULL;
	size_t n = 0;
	bool found = pick_range(g, id, sizeof id) == 0;
	if (found && !page_size) /* the kept pages' size */
		for (size_t i = 0; i < g->meta.n && !page_size; i++)
			if (!strncmp(g->meta.v[i].key, GMSFS_PAGES_PREFIX, strlen(GMSFS_PAGES_PREFIX)) &&
			    !strncmp(g->meta.v[i].key + strlen(GMSFS_PAGES_PREFIX), id, strlen(id)))
				page_size = g->meta.v[i].size;
	gmsfs_pages *p = NULL;
	snprintf(prefix, sizeof prefix, GMSFS_PAGES_PREFIX "%s", id);
	if ((e = pg_new(g, span, page_size, found ? prefix : NULL, &p)))
		return e;
	if ((e = ensure_records(g)) || (found && (e = kept_pages(g, id, p->page, p->count, &v, &n))) ||
	    (e = take_pages(p, v, n))) {
		char keep[sizeof g->err];
		memcpy(keep, g->err, sizeof keep);
		pg_release(p, false); /* the kept pages stay the store's */
		memcpy(g->err, keep, sizeof keep);
	} else {
		p->kept = true;
		*out = p;
		if (adopted_pages)
			*adopted_pages = n;
	}
	free(v);
	return e;
}

int gmsfs_pages_record(const gmsfs_pages *p, uint64_t idx, const void **data, size_t *len)
{
	if (!p || !data || !len)
		return -EINVAL;
	*data = NULL;
	*len = 0;
	if (p->freed || idx >= p->count)
		return gm_error(p->g, -EINVAL, "pages_record: index %" PRIu64 " of a range of %" PRIu64 " pages", idx,
				p->freed ? 0 : p->count);
	if (!(p->mapped[idx] & PG_MAPPED))
		return gm_error(p->g, -ENOENT, "pages_record: page %" PRIu64 " is not mapped", idx);
	if (p->rec) {
		*data = p->rec[idx].data;
		*len = p->rec[idx].len;
	}
	return 0;
}

const char *gmsfs_pages_name(const gmsfs_pages *p)
{
	return p ? range_id(p) : NULL;
}
