/* torch: an allocator that PyTorch's CUDAPluggableAllocator calls, in C: no Python
 * callback, no GIL.  Tensors (PyTorch asks for its segments) are carved out of slabs,
 * large allocations of the store the caller chose with gmsfs_torch_use, so that a
 * model of hundreds of tensors is a handful of allocations to import.  Each slab keeps
 * a list of free ranges, first fit, coalesced on free, 512-byte aligned as PyTorch's
 * own allocator aligns.
 *
 * The one piece of global state in libgmsfs: the pluggable allocator's entry points
 * carry no context, so the store they serve is set here, under a mutex. */
#include "internal.h"
#include "grow.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <gmsfs/torch.h>

#define TORCH_ALIGN GMSFS_TORCH_ALIGN

struct range {
	uint64_t off, len;
};

struct slab {
	char *name;
	uintptr_t base;
	uint64_t size;
	struct range *free; /* sorted by offset */
	size_t nfree, cap;
};

static struct {
	pthread_mutex_t mu;
	gmsfs *g;
	uint64_t slab_bytes;
	unsigned next;      /* the next slab's number */
	struct slab *slabs;
	size_t n, cap;
} ta = { .mu = PTHREAD_MUTEX_INITIALIZER };

static uint64_t align_up(uint64_t v, uint64_t a)
{
	return (v + a - 1) / a * a;
}

static void slabs_forget(void)
{
	for (size_t i = 0; i < ta.n; i++) {
		free(ta.slabs[i].name);
		free(ta.slabs[i].free);
	}
	free(ta.slabs);
	ta.slabs = NULL;
	ta.n = ta.cap = 0;
}

int gmsfs_torch_use(gmsfs *g, uint64_t slab_bytes)
{
	if (g && gmsfs_lock_mode(g) != GMSFS_RW)
		return gm_error(g, -EPERM, "torch allocator: the handle must hold the write lock");
	pthread_mutex_lock(&ta.mu);
	if (g != ta.g)
		slabs_forget(); /* slabs of another handle are not ours to carve */
	ta.g = g;
	ta.slab_bytes = slab_bytes ? slab_bytes : GMSFS_TORCH_SLAB_BYTES;
	pthread_mutex_unlock(&ta.mu);
	return 0;
}

/* First fit in s; UINTPTR_MAX when nothing fits. */
static uintptr_t carve(struct slab *s, uint64_t len)
{
	for (size_t i = 0; i < s->nfree; i++) {
		struct range *r = &s->free[i];
		if (r->len < len)
			continue;
		uint64_t off = r->off;
		r->off += len;
		r->len -= len;
		if (!r->len) {
			memmove(r, r + 1, (s->nfree - i - 1) * sizeof *r);
			s->nfree--;
		}
		return s->base + off;
	}
	return UINTPTR_MAX;
}

/* A new slab of at least len bytes (fs->mu not involved: ta.mu held). */
static struct slab *grow(uint64_t len)
{
	if (GROW(ta.slabs, ta.n, ta.cap, 8))
		return NULL;
	uint64_t size = len > ta.slab_bytes ? align_up(len, 2ull << 20) : ta.slab_bytes;
	char name[48];
	void *p = NULL;
	int e;
	/* The store may hold slabs already (a writer starts from the committed layout). */
	do {
		snprintf(name, sizeof name, GMSFS_TORCH_PREFIX "slab%05u", ta.next++);
		e = gmsfs_create(ta.g, name, size, GMSFS_TORCH_TAG, &p);
	} while (e == -EEXIST);
	if (e)
		return NULL;
	struct slab *s = &ta.slabs[ta.n];
	*s = (struct slab){ .name = strdup(name), .base = (uintptr_t)p, .size = size };
	if (!s->name || GROW(s->free, s->nfree, s->cap, 8)) {
		free(s->name);
		return NULL; /* the allocation stays in the store, unused: freed with the session */
	}
	s->free[s->nfree++] = (struct range){ 0, size };
	ta.n++;
	return s;
}

void *gmsfs_torch_alloc(ssize_t size, int device, void *stream)
{
	(void)stream; /* memory is the device's, for every stream */
	if (size < 0)
		return NULL;
	uint64_t len = align_up(size ? (uint64_t)size : 1, TORCH_ALIGN);
	pthread_mutex_lock(&ta.mu);
	uintptr_t p = UINTPTR_MAX;
	if (ta.g && gm_device_ok(ta.g, device)) {
		for (size_t i = 0; i < ta.n && p == UINTPTR_MAX; i++)
			p = carve(&ta.slabs[i], len);
		struct slab *s = p == UINTPTR_MAX ? grow(len) : NULL;
		if (s)
			p = carve(s, len);
	}
	pthread_mutex_unlock(&ta.mu);
	return p == UINTPTR_MAX ? NULL : (void *)p; /* NULL: PyTorch reports out of memory */
}

/* Give [off, off + len) back to s, merged with its neighbours. */
static void give_back(struct slab *s, uint64_t off, uint64_t len)
{
	size_t i = 0;
	while (i < s->nfree && s->free[i].off < off)
		i++;
	bool left = i > 0 && s->free[i - 1].off + s->free[i - 1].len == off;
	bool right = i < s->nfree && off + len == s->free[i].off;
	if (left && right) {
		s->free[i - 1].len += len + s->free[i].len;
		memmove(&s->free[i], &s->free[i + 1], (s->nfree - i - 1) * sizeof *s->free);
		s->nfree--;
	} else if (left) {
		s->free[i - 1].len += len;
	} else if (right) {
		s->free[i].off = off;
		s->free[i].len += len;
	} else if (!GROW(s->free, s->nfree, s->cap, 8)) {
		memmove(&s->free[i + 1], &s->free[i], (s->nfree - i) * sizeof *s->free);
		s->free[i] = (struct range){ off, len };
		s->nfree++;
	} /* else: out of memory for the list; the range stays used until the slab goes */
}

void gmsfs_torch_free(void *ptr, ssize_t size, int device, void *stream)
{
	(void)device, (void)stream;
	uintptr_t p = (uintptr_t)ptr;
	uint64_t len = align_up(size > 0 ? (uint64_t)size : 1, TORCH_ALIGN);
	pthread_mutex_lock(&ta.mu);
	for (size_t i = 0; i < ta.n; i++) {
		struct slab *s = &ta.slabs[i];
		if (p >= s->base && p - s->base < s->size) {
			give_back(s, p - s->base, len);
			break;
		}
	}
	/* Not in a slab of the current handle (it changed, or the tensor outlived it): a no-op. */
	pthread_mutex_unlock(&ta.mu);
}

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

/* One JSON string: quotes, backslashes and control characters escaped (names are paths). */
static void tx_json_string(struct text *t, const char *s)
{
	tx_put(t, "\"", 1);
	for (const char *run = s;; s++) {
		unsigned char c = (unsigned char)*s;
		if (c && c != '"' && c != '\\' && c >= 0x20)
			continue;
		tx_put(t, run, (size_t)(s - run));
		if (!c)
			break;
		char esc[8];
		int k = c == '"' || c == '\\' ? snprintf(esc, sizeof esc, "\\%c", c) : snprintf(esc, sizeof esc, "\\u%04x", c);
		tx_put(t, esc, (size_t)k);
		run = s + 1;
	}
	tx_put(t, "\"", 1);
}

/* FNV-1a of n bytes: the manifest names each distinct value and allocation once. */
static uint64_t fnv(const char *v, size_t n)
{
	uint64_t h = 1469598103934665603ull;
	for (size_t i = 0; i < n; i++)
		h = (h ^ (unsigned char)v[i]) * 1099511628211ull;
	return h;
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
	for (size_t k = fnv(s, n) & (d->cap - 1);; k = (k + 1) & (d->cap - 1)) {
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
	for (size_t j = i + 1; j < end && tried < CANDIDATES; j++) {
		if (taken[j] || r[j].ptr == r[i].ptr)
			continue;
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
			 const struct region *reg, size_t nreg)
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
		*r = (struct mrow){
			.x = x,
			.alloc = x->alloc ? distinct_index(allocs, i, x->alloc, strlen(x->alloc), false, alloc_of, g)
					  : SIZE_MAX,
			.value = distinct_index(vals, i, x->value, x->value_len, true, value_of, g),
			.ptr = (uintptr_t)mt_extent_ptr(g, x),
			.region = SIZE_MAX,
		};
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
	size_t n = 0, nreg = 0;
	if ((distinct_init(&vals, g->meta.n) | distinct_init(&allocs, g->meta.n)) || !rows || !reg || !taken)
		e = gm_error(g, -ENOMEM, "out of memory");
	else if (!(e = manifest_rows(g, rows, &n, &vals, &allocs, reg, nreg = regions_of(g, reg)))) {
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

size_t gmsfs_torch_slabs(void)
{
	pthread_mutex_lock(&ta.mu);
	size_t n = ta.n;
	pthread_mutex_unlock(&ta.mu);
	return n;
}
