/* manifest: a store's tensor entries for gmsfs.torch.materialize, as one JSON text:
 * each distinct value and allocation once, and rows in groups of those that lie side by
 * side at one step (a layer's tensors, layer after layer), so that a binding makes a
 * group's views with one call (gmsfs(5), "Tensors").  Made once per materialize, in a
 * fresh process: the cost is C's, so it is kept to a pass or two over the entries. */
#include "internal.h"
#include "grow.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define XXH_INLINE_ALL /* header only: libgmsfs links nothing more */
#include <xxhash.h>

#include <gmsfs/torch.h>

/* The manifest's text, made without stdio (a model has hundreds of rows, and a FILE's
 * locked putc per character cost more than the rest of materialize's parse). */
struct text {
	char *p;
	size_t n, cap;
	bool oom;
};

static void tx_put(struct text *t, const char *s, size_t len)
{
	if (t->oom || ROOM(t->p, t->n + len + 1, t->cap, 4096)) {
		t->oom = true;
		return;
	}
	memcpy(t->p + t->n, s, len);
	t->n += len;
	t->p[t->n] = '\0';
}

static void tx_u64(struct text *t, unsigned long long v)
{
	char d[24], *e = d + sizeof d, *q = e;
	do
		*--q = (char)('0' + v % 10);
	while (v /= 10);
	tx_put(t, q, (size_t)(e - q));
}

/* Bytes a JSON string must escape: quotes, backslashes, control characters. */
static bool escapes(unsigned char c)
{
	return c == '"' || c == '\\' || c < 0x20;
}

/* One JSON string (names are paths: runs of plain bytes, copied whole). */
static void tx_json_string(struct text *t, const char *s)
{
	tx_put(t, "\"", 1);
	for (;;) {
		size_t run = 0;
		while (s[run] && !escapes((unsigned char)s[run]))
			run++;
		tx_put(t, s, run);
		s += run;
		if (!*s)
			break;
		char esc[8];
		unsigned char c = (unsigned char)*s++;
		int k = c == '"' || c == '\\' ? snprintf(esc, sizeof esc, "\\%c", c)
					       : snprintf(esc, sizeof esc, "\\u%04x", c);
		tx_put(t, esc, (size_t)k);
	}
	tx_put(t, "\"", 1);
}

/* Distinct strings by index, in the order first seen, each written to out once as JSON
 * (open addressing over row indices + 1; cap a power of two > 2 * rows). */
struct distinct {
	size_t *table, cap, n;
	size_t *index; /* of each row, once seen */
	struct text out;
};

static int distinct_init(struct distinct *d, size_t rows)
{
	*d = (struct distinct){ .cap = 16 };
	while (d->cap <= 2 * rows)
		d->cap *= 2;
	d->table = calloc(d->cap, sizeof *d->table);
	d->index = calloc(rows + 1, sizeof *d->index);
	return d->table && d->index ? 0 : -ENOMEM;
}

static void distinct_free(struct distinct *d)
{
	free(d->table);
	free(d->index);
	free(d->out.p);
}

/* The index of row i's string s (n bytes) among those so far; new ones are written out,
 * raw (a value, a JSON object already) or as a JSON string. */
static size_t distinct_index(struct distinct *d, size_t i, const char *s, size_t n, bool raw,
			     const char *(*of)(const gmsfs *, size_t, size_t *), const gmsfs *g)
{
	for (size_t k = (size_t)XXH3_64bits(s, n) & (d->cap - 1);; k = (k + 1) & (d->cap - 1)) {
		if (!d->table[k]) {
			d->table[k] = i + 1;
			tx_put(&d->out, d->n ? ",\n" : "\n", d->n ? 2 : 1);
			if (raw)
				tx_put(&d->out, s, n);
			else
				tx_json_string(&d->out, s);
			return d->index[i] = d->n++;
		}
		size_t m;
		const char *t = of(g, d->table[k] - 1, &m);
		if (m == n && !memcmp(t, s, n))
			return d->index[d->table[k] - 1];
	}
}

static const char *value_of(const gmsfs *g, size_t i, size_t *n)
{
	*n = g->meta.v[i].value_len;
	return g->meta.v[i].value;
}

static const char *alloc_of(const gmsfs *g, size_t i, size_t *n)
{
	*n = strlen(g->meta.v[i].alloc);
	return g->meta.v[i].alloc;
}

/* A tensor row of the manifest: its value's and allocation's indices, and where it is
 * in this process (region: the index of the mapped range it lies in, SIZE_MAX where it
 * has memory of its own, a private copy, or none mapped). */
struct mrow {
	const struct entry_rec *x;
	size_t alloc; /* SIZE_MAX: none */
	size_t value;
	size_t region;
	uintptr_t ptr; /* 0: not mapped */
};

/* A range of this process's address space that mappings fill side by side (an import
 * maps a message's allocations so): one base tensor views all of it. */
struct region {
	uintptr_t start, end;
};

static int region_cmp(const void *pa, const void *pb)
{
	const struct region *a = pa, *b = pb;
	return a->start < b->start ? -1 : a->start > b->start;
}

/* The handle's mapped ranges, adjacent mappings merged, by address. */
static size_t regions_of(const gmsfs *g, struct region *r)
{
	size_t n = 0;
	for (size_t i = 0; i < g->nmaps; i++)
		if (g->slots[i].mapped && g->maps[i].aligned)
			r[n++] = (struct region){ (uintptr_t)g->maps[i].ptr,
						  (uintptr_t)g->maps[i].ptr + g->maps[i].aligned };
	qsort(r, n, sizeof *r, region_cmp);
	size_t k = 0;
	for (size_t i = 0; i < n; i++) {
		if (k && r[k - 1].end == r[i].start)
			r[k - 1].end = r[i].end;
		else
			r[k++] = r[i];
	}
	return k;
}

static size_t region_find(const struct region *r, size_t n, uintptr_t p, uint64_t len)
{
	size_t lo = 0, hi = n;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		if (r[mid].end <= p)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo < n && r[lo].start <= p && len <= r[lo].end - p ? lo : SIZE_MAX;
}

/* Rows that can share one strided view side by side: in one region, with the same value
 * and extent, by address. */
static int mrow_cmp(const void *pa, const void *pb)
{
	const struct mrow *a = pa, *b = pb;
#define CMP(u, v) if ((u) != (v)) return (u) < (v) ? -1 : 1
	CMP(a->region, b->region);
	CMP(a->value, b->value);
	CMP(a->x->size, b->x->size);
	CMP(a->ptr, b->ptr);
#undef CMP
	return 0;
}

static bool same_kind(const struct mrow *a, const struct mrow *b)
{
	return a->region != SIZE_MAX && a->region == b->region && a->value == b->value && a->x->size == b->x->size;
}

/* The row of r[from, to) (sorted by address) at address p, or SIZE_MAX. */
static size_t row_at(const struct mrow *r, size_t from, size_t to, uintptr_t p)
{
	size_t lo = from, hi = to;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		if (r[mid].ptr < p)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo < to && r[lo].ptr == p ? lo : SIZE_MAX;
}

/* How many rows of r[i, end) not yet taken lie at i, i + gap, i + 2 gap, ... */
static size_t steps(const struct mrow *r, const bool *taken, size_t i, size_t end, uint64_t gap)
{
	size_t n = 1;
	for (size_t k = i; (k = row_at(r, k + 1, end, r[k].ptr + gap)) != SIZE_MAX && !taken[k];)
		n++;
	return n;
}

/* Rows of one kind lie interleaved with others (a layer's q, k, v and o projections,
 * then the next layer's): the longest progression from each row not yet taken, its step
 * the distance to one of the next CANDIDATES rows, makes a group (one per projection). */
#define CANDIDATES 16

static size_t best_gap(const struct mrow *r, const bool *taken, size_t i, size_t end, uint64_t *gap)
{
	size_t best = 1, tried = 0;
	*gap = 0;
	uint64_t span = r[end - 1].ptr - r[i].ptr;
	for (size_t j = i + 1; j < end && tried < CANDIDATES; j++) {
		if (taken[j] || r[j].ptr == r[i].ptr)
			continue;
		if (span / (r[j].ptr - r[i].ptr) + 1 <= best)
			break; /* the gaps only grow: no later candidate can make a longer one */
		tried++;
		size_t n = steps(r, taken, i, end, r[j].ptr - r[i].ptr);
		if (n > best)
			best = n, *gap = r[j].ptr - r[i].ptr;
	}
	return best;
}

static void tx_index(struct text *t, size_t i)
{
	if (i == SIZE_MAX)
		tx_put(t, "-1", 2);
	else
		tx_u64(t, i);
}

/* The tensor rows of g's entries, each value checked to be a JSON object: *n of them. */
static int manifest_rows(gmsfs *g, struct mrow *rows, size_t *n, struct distinct *vals, struct distinct *allocs,
			 char **base, const struct region *reg, size_t nreg)
{
	const size_t plen = strlen(GMSFS_TORCH_PREFIX);
	*n = 0;
	for (size_t i = 0; i < g->meta.n; i++) {
		const struct entry_rec *x = &g->meta.v[i];
		if (strncmp(x->key, GMSFS_TORCH_PREFIX, plen))
			continue;
		const char *v = x->value;
		size_t k = 0;
		while (k < x->value_len && (v[k] == ' ' || v[k] == '\n' || v[k] == '\t' || v[k] == '\r'))
			k++;
		if (k == x->value_len || v[k] != '{' || memchr(v, '\0', x->value_len))
			return gm_error(g, -EINVAL, "meta/%s: its value is not a JSON object (gmsfs(5), \"Tensors\")",
					x->key);
		struct mrow *r = &rows[(*n)++];
		size_t seen = allocs->n;
		*r = (struct mrow){
			.x = x,
			.alloc = x->alloc ? distinct_index(allocs, i, x->alloc, strlen(x->alloc), false, alloc_of, g)
					  : SIZE_MAX,
			.value = distinct_index(vals, i, x->value, x->value_len, true, value_of, g),
			.region = SIZE_MAX,
		};
		if (allocs->n > seen) /* a new allocation: where it is mapped, found once */
			base[r->alloc] = mt_alloc_ptr(g, x->alloc);
		if (x->copy || r->alloc == SIZE_MAX) /* as mt_extent_ptr, from the allocations found */
			r->ptr = (uintptr_t)mt_extent_ptr(g, x);
		else if (base[r->alloc])
			r->ptr = (uintptr_t)base[r->alloc] + x->offset;
		if (r->ptr && x->size && !(x->flags & GMSFS_ENTRY_PRIVATE))
			r->region = region_find(reg, nreg, r->ptr, x->size);
	}
	return 0;
}

/* One group: rows[i] and the m - 1 rows of its kind (rows[i, end)) gap bytes apart. */
static void put_group(struct text *out, const struct mrow *rows, bool *taken, size_t i, size_t end, size_t m,
		      uint64_t gap, const struct region *reg)
{
	const struct mrow *r = &rows[i];
	tx_put(out, "[", 1);
	tx_index(out, r->region);
	tx_put(out, ",", 1);
	tx_u64(out, r->value);
	tx_put(out, ",", 1);
	tx_u64(out, r->region == SIZE_MAX ? r->x->offset : r->ptr - reg[r->region].start);
	tx_put(out, ",", 1);
	tx_u64(out, gap);
	tx_put(out, (r->x->flags & GMSFS_ENTRY_PRIVATE) ? ",1," : ",0,", 3);
	tx_u64(out, r->x->size);
	tx_put(out, ",", 1);
	if (r->ptr)
		tx_u64(out, r->ptr);
	else
		tx_put(out, "null", 4);
	tx_put(out, ",", 1);
	tx_index(out, r->alloc);
	tx_put(out, ",[", 2);
	for (size_t j = 0, k = i; j < m; j++) {
		if (j) { /* the next in the progression: steps() counted it */
			k = row_at(rows, k + 1, end, rows[k].ptr + gap);
			tx_put(out, ",", 1);
		}
		taken[k] = true;
		tx_json_string(out, rows[k].x->key + strlen(GMSFS_TORCH_PREFIX));
	}
	tx_put(out, "]]", 2);
}

/* Every row in a group: rows sorted by kind, then address (mrow_cmp). */
static void put_groups(struct text *out, const struct mrow *rows, size_t n, bool *taken, const struct region *reg)
{
	for (size_t i = 0, end = 0; i < n; i++) {
		if (i == end) /* a new kind: rows [i, end) */
			for (end = i + 1; end < n && same_kind(&rows[i], &rows[end]);)
				end++;
		if (taken[i])
			continue;
		uint64_t gap = 0;
		size_t m = same_kind(&rows[i], &rows[i]) ? best_gap(rows, taken, i, end, &gap) : 1;
		tx_put(out, i ? ",\n" : "\n", i ? 2 : 1);
		put_group(out, rows, taken, i, end, m, gap, reg);
	}
}

int gmsfs_torch_manifest(gmsfs *g, char **json, size_t *len)
{
	if (!g || !json || !len)
		return g ? gm_error(g, -EINVAL, "torch_manifest: no place for the text") : -EINVAL;
	*json = NULL;
	*len = 0;
	int e = gm_need_lock(g, GMSFS_RO);
	if (e || (e = mt_ensure(g)))
		return e;
	/* Shapes repeat layer after layer, and rows share a few allocations: each distinct
	 * value and allocation once, and rows in groups of those that lie side by side at
	 * one step (a layer's tensors, layer after layer), so that a binding makes a group's
	 * views with one call. */
	struct text out = {0};
	struct distinct vals, allocs;
	struct mrow *rows = calloc(g->meta.n + 1, sizeof *rows);
	struct region *reg = calloc(g->nmaps + 1, sizeof *reg);
	bool *taken = calloc(g->meta.n + 1, sizeof *taken);
	char **base = calloc(g->meta.n + 1, sizeof *base); /* of each distinct allocation */
	size_t n = 0, nreg = 0;
	if ((distinct_init(&vals, g->meta.n) | distinct_init(&allocs, g->meta.n)) || !rows || !reg || !taken || !base)
		e = gm_error(g, -ENOMEM, "out of memory");
	else if (!(e = manifest_rows(g, rows, &n, &vals, &allocs, base, reg, nreg = regions_of(g, reg)))) {
		qsort(rows, n, sizeof *rows, mrow_cmp);
		tx_put(&out, "{\"groups\": [", 12);
		put_groups(&out, rows, n, taken, reg);
		tx_put(&out, "],\n\"regions\": [", 15);
		for (size_t i = 0; i < nreg; i++) {
			tx_put(&out, i ? ",[" : "[", i ? 2 : 1);
			tx_u64(&out, reg[i].start);
			tx_put(&out, ",", 1);
			tx_u64(&out, reg[i].end - reg[i].start);
			tx_put(&out, "]", 1);
		}
		tx_put(&out, "],\n\"allocs\": [", 14);
		tx_put(&out, allocs.out.p ? allocs.out.p : "", allocs.out.n);
		tx_put(&out, "],\n\"values\": [", 14);
		tx_put(&out, vals.out.p ? vals.out.p : "", vals.out.n);
		tx_put(&out, "]}\n", 3);
		if (out.oom || vals.out.oom || allocs.out.oom)
			e = gm_error(g, -ENOMEM, "out of memory");
	}
	distinct_free(&vals);
	distinct_free(&allocs);
	free(rows);
	free(reg);
	free(taken);
	free(base);
	if (e) {
		free(out.p);
		return e;
	}
	*json = out.p;
	*len = out.n;
	return 0;
}

void gmsfs_text_free(char *text)
{
	free(text);
}

