/* maps: the handle's table of mappings (by name, and in order), and what fills it:
 * create, import.  Below the entries and spaces (meta.c, space.c); a free, which
 * must ask them, is layout.c. */
#include "internal.h"
#include "grow.h"
#include "hash.h"
#include "probe.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the name index: imports check every name, so it must not be a scan ----
 * Entries are map indexes + 1 (common/probe.h), at most half the slots full. */

static uint64_t map_home(const void *entry, const void *ctx)
{
	const gmsfs *g = ctx;
	return name_hash(g->maps[(uintptr_t)entry - 1].name);
}

static void index_put(gmsfs *g, size_t i)
{
	probe_put(g->index, g->index_cap, (void *)(uintptr_t)(i + 1), map_home, g);
}

static int index_rebuild(gmsfs *g, size_t want)
{
	size_t cap = 64;
	while (cap < 2 * want)
		cap *= 2;
	void **v = calloc(cap, sizeof *v);
	if (!v) {
		if (g->index_cap < 2 * want)
			return -ENOMEM;
		/* Shrinking: the old table is big enough, refill it in place. */
		v = g->index;
		cap = g->index_cap;
		memset(v, 0, cap * sizeof *v);
	} else {
		free(g->index);
	}
	g->index = v;
	g->index_cap = cap;
	for (size_t i = 0; i < g->nmaps; i++)
		index_put(g, i);
	return 0;
}

struct gmsfs_mapping *mp_find(const gmsfs *g, const char *name)
{
	if (!g->index_cap)
		return NULL;
	size_t mask = g->index_cap - 1;
	for (size_t k = name_hash(name) & mask; g->index[k]; k = (k + 1) & mask) {
		struct gmsfs_mapping *m = &g->maps[(uintptr_t)g->index[k] - 1];
		if (!strcmp(m->name, name))
			return m;
	}
	return NULL;
}

static void res_put(gmsfs *g, struct mp_res *r)
{
	if (--r->refs)
		return;
	g->be->unreserve(g, r->base, r->len);
	free(r);
}

/* Unmap, give the range back with its last mapping, forget the names. */
static void release_map(gmsfs *g, size_t i)
{
	struct gmsfs_mapping *m = &g->maps[i];
	if (g->slots[i].mapped)
		mp_unmap_alloc(g, m->ptr, m->aligned, g->slots[i].piece);
	res_put(g, g->slots[i].res);
	free((char *)m->name);
	free((char *)m->tag);
}

void mp_drop(gmsfs *g, size_t i)
{
	release_map(g, i);
	g->nmaps--;
	g->maps[i] = g->maps[g->nmaps];
	g->slots[i] = g->slots[g->nmaps];
	index_rebuild(g, g->nmaps); /* cannot fail: it shrinks */
}

void mp_release_all(gmsfs *g)
{
	for (size_t i = 0; i < g->nmaps; i++)
		release_map(g, i);
	free(g->maps);
	free(g->slots);
	free(g->index);
	g->maps = NULL;
	g->slots = NULL;
	g->index = NULL;
	g->nmaps = g->cap = g->index_cap = 0;
}

void mp_unmap_mapped(gmsfs *g)
{
	for (size_t i = 0; i < g->nmaps; i++)
		if (g->slots[i].mapped) {
			mp_unmap_alloc(g, g->maps[i].ptr, g->maps[i].aligned, g->slots[i].piece);
			g->slots[i].mapped = false;
		}
}

/* Room in the table for n more, so that adding them cannot fail. */
static int table_room(gmsfs *g, size_t n)
{
	if (g->nmaps + n > g->cap) {
		size_t cap = g->cap ? g->cap : 64;
		while (cap < g->nmaps + n)
			cap *= 2;
		struct gmsfs_mapping *m = realloc(g->maps, cap * sizeof *m);
		if (!m)
			return -ENOMEM;
		g->maps = m; /* cap is raised only when slots[] has grown too */
		struct mp_slot *s = realloc(g->slots, cap * sizeof *s);
		if (!s)
			return -ENOMEM;
		g->slots = s;
		g->cap = cap;
	}
	return 2 * (g->nmaps + n) > g->index_cap ? index_rebuild(g, g->nmaps + n) : 0;
}

static void unmap_first(gmsfs *g, struct wire_alloc *a, size_t n, void *base)
{
	for (size_t k = 0; k < n; k++) {
		mp_unmap_alloc(g, base, a[k].aligned, a[k].piece);
		base = (char *)base + a[k].aligned;
	}
}

uint64_t mp_align(uint64_t size)
{
	uint64_t a = 1;
	while (a < (1ull << 30) && 2 * a <= size)
		a *= 2;
	return a < (2ull << 20) ? 0 : a;
}

/* Piece k of an allocation of aligned bytes in pieces of piece bytes: its size. */
static uint64_t piece_len(uint64_t aligned, uint64_t piece, size_t k)
{
	return aligned - piece * k < piece ? aligned - piece * k : piece;
}

int mp_map_alloc(gmsfs *g, void *va, const struct wire_alloc *a, int fd, bool writable, char *why, size_t whylen)
{
	if (!a->npieces)
		return g->be->map(g, va, a->aligned, fd, a->fd_offset, writable, why, whylen);
	for (uint32_t k = 0; k < a->npieces; k++) {
		int e = a->pieces[k].fd == UINT32_MAX ? -EPROTO : 0;
		if (e)
			snprintf(why, whylen, "no descriptor came for its piece %u", (unsigned)k);
		else
			e = g->be->map(g, (char *)va + a->piece * k, piece_len(a->aligned, a->piece, k),
				       (int)a->pieces[k].fd, a->pieces[k].fd_offset, writable, why, whylen);
		if (e) {
			mp_unmap_alloc(g, va, a->piece * k, a->piece);
			return e;
		}
	}
	return 0;
}

int mp_unmap_alloc(gmsfs *g, void *va, uint64_t aligned, uint64_t piece)
{
	/* CUDA unmaps what one cuMemMap mapped, whole: a piece at a time. */
	int first = 0;
	for (uint64_t off = 0; off < aligned; off += piece ? piece : aligned) {
		int e = g->be->unmap(g, (char *)va + off, piece ? piece_len(aligned - off, piece, 0) : aligned);
		first = first ? first : e;
	}
	return first;
}

int mp_alias_alloc(gmsfs *g, void *src, void *dst, uint64_t aligned, uint64_t piece, bool writable, char *why,
		   size_t whylen)
{
	uint64_t off = 0;
	int e = 0;
	for (; off < aligned && !e; off += piece ? piece : aligned)
		e = g->be->alias(g, (char *)src + off, (char *)dst + off, piece ? piece_len(aligned - off, piece, 0) : aligned,
				 writable, why, whylen);
	if (e && off > (piece ? piece : aligned))
		mp_unmap_alloc(g, dst, off - (piece ? piece : aligned), piece);
	return e;
}

int mp_map(gmsfs *g, struct wire_alloc *a, const int *fd, size_t n, bool writable, void **ptr)
{
	uint64_t total = 0;
	for (size_t k = 0; k < n; k++) {
		if (fd[k] < 0)
			return gm_error(g, -EPROTO, "%s: no descriptor came for it", a[k].path);
		if (!a[k].aligned || a[k].aligned > UINT64_MAX - total)
			return gm_error(g, -EPROTO, "%s: the daemon sent a size of %llu", a[k].path,
					(unsigned long long)a[k].aligned);
		total += a[k].aligned;
	}
	struct mp_res *r = malloc(sizeof *r);
	if (!r || table_room(g, n)) {
		free(r);
		return gm_error(g, -ENOMEM, "out of memory");
	}
	uint64_t most = 0; /* the largest allocation (or piece): the range is aligned as for it alone */
	for (size_t k = 0; k < n; k++)
		most = a[k].npieces && a[k].piece > most ? a[k].piece : !a[k].npieces && a[k].aligned > most ? a[k].aligned : most;
	int e = g->be->reserve(g, total, mp_align(most), &r->base);
	if (e) {
		free(r);
		return gm_error(g, e, "%s: reserving %llu bytes: %s", a[0].path, (unsigned long long)total, strerror(-e));
	}
	r->len = total;
	r->refs = n;
	char why[256] = "", *va = r->base;
	size_t done = 0;
	/* The last commit's allocations come read-only to their writer (ro): its session
	 * writes them only once it says so (gmsfs_protect). */
	for (; done < n; va += a[done++].aligned)
		if ((e = mp_map_alloc(g, va, &a[done], fd[done], writable && !a[done].ro, why, sizeof why))) {
			gm_error(g, e, "%s: %s", a[done].path, why[0] ? why : strerror(-e));
			break;
		}
	/* The access, neighbours alike in one call (on CUDA one costs what sixteen do). */
	va = r->base;
	for (size_t k = 0, end; !e && k < n; k = end) {
		uint64_t len = 0;
		bool w = writable && !a[k].ro;
		for (end = k; end < n && (writable && !a[end].ro) == w; end++)
			len += a[end].aligned;
		if ((e = g->be->allow(g, va, len, w)))
			gm_error(g, e, "%s%s: setting its access: %s", a[k].path, end - k > 1 ? " and its neighbours" : "",
				 strerror(-e));
		va += len;
	}
	if (e) {
		unmap_first(g, a, done, r->base);
		g->be->unreserve(g, r->base, total);
		free(r);
		return e;
	}
	va = r->base;
	for (size_t k = 0; k < n; va += a[k++].aligned) {
		bool w = writable && !a[k].ro;
		g->slots[g->nmaps] = (struct mp_slot){ .mapped = true, .res = r, .piece = a[k].npieces ? a[k].piece : 0,
						       .ro = !w };
		g->maps[g->nmaps++] = (struct gmsfs_mapping){ .name = a[k].path, .tag = a[k].tag, .ptr = va,
							      .size = a[k].size, .aligned = a[k].aligned,
							      .writable = w };
		a[k].path = a[k].tag = NULL; /* the table owns them now */
		index_put(g, g->nmaps - 1);
	}
	if (ptr)
		*ptr = r->base;
	return 0;
}

int mp_import(void *ctx, struct ch_manifest *m, size_t from, size_t to)
{
	gmsfs *g = ctx;
	while (from < to) {
		while (from < to && mp_find(g, m->allocs[from].path))
			from++; /* mapped already */
		size_t end = from;
		while (end < to && !mp_find(g, m->allocs[end].path))
			end++;
		int e = end > from ? mp_map(g, &m->allocs[from], &m->fd[from], end - from, g->lock == GMSFS_RW, NULL) : 0;
		if (e)
			return e;
		from = end;
	}
	return 0;
}

/* Mapped, and (only_writable) writable now; made writable, not one that came read-only
 * (ro: the daemon is told first, sp_write_in_place). */
static bool chosen(const gmsfs *g, size_t i, bool only_writable, bool writable)
{
	return g->slots[i].mapped && (!only_writable || g->maps[i].writable) && !(writable && g->slots[i].ro);
}

int mp_allow_all(gmsfs *g, bool only_writable, bool writable)
{
	for (size_t i = 0; i < g->nmaps;) {
		if (!chosen(g, i, only_writable, writable)) {
			i++;
			continue;
		}
		char *start = g->maps[i].ptr, *end = start + g->maps[i].aligned;
		struct mp_res *r = g->slots[i].res;
		for (i++; i < g->nmaps && chosen(g, i, only_writable, writable) && g->slots[i].res == r && g->maps[i].ptr == end; i++)
			end += g->maps[i].aligned;
		int e = g->be->allow(g, start, (uint64_t)(end - start), writable);
		if (e)
			return e;
	}
	return 0;
}

/* ---- the API ---- */

size_t gmsfs_mappings(const gmsfs *g, const struct gmsfs_mapping **list)
{
	if (!g || !list)
		return 0;
	*list = g->maps;
	return g->nmaps;
}

int gmsfs_find(const gmsfs *g, const char *name, struct gmsfs_mapping *out)
{
	if (!g || !name || !out)
		return -EINVAL;
	struct gmsfs_mapping *m = mp_find(g, name);
	if (!m)
		return -ENOENT;
	*out = *m;
	return 0;
}

int gmsfs_find_ptr(const gmsfs *g, const void *ptr, struct gmsfs_mapping *out, uint64_t *offset)
{
	if (!g || !out || !offset)
		return -EINVAL;
	uintptr_t p = (uintptr_t)ptr;
	for (size_t i = 0; i < g->nmaps; i++) {
		uintptr_t base = (uintptr_t)g->maps[i].ptr;
		if (p >= base && p - base < g->maps[i].aligned) {
			*out = g->maps[i];
			*offset = p - base;
			return 0;
		}
	}
	return -ENOENT;
}

uint64_t gmsfs_total_bytes(const gmsfs *g)
{
	uint64_t t = 0;
	for (size_t i = 0; g && i < g->nmaps; i++)
		t += g->maps[i].aligned;
	return t;
}

static bool name_ok(gmsfs *g, const char *what, const char *name)
{
	if (name && gmsfs_path_valid(name, strlen(name)))
		return true;
	gm_error(g, -EINVAL, "%s %s: not a valid name (components of 1..%d bytes, no . or .., no leading, trailing or "
			     "doubled /)", what, name ? name : "(null)", GMSFS_NAME_MAX);
	return false;
}

static int check_new(gmsfs *g, const struct gmsfs_new *v)
{
	if (!name_ok(g, "create", v->name))
		return -EINVAL;
	if (!v->size)
		return gm_error(g, -EINVAL, "%s: size 0", v->name);
	if (v->tag && !gmsfs_tag_valid(v->tag, strlen(v->tag)))
		return gm_error(g, -EINVAL, "%s: a tag has 1..%d bytes and no control characters", v->name, GMSFS_TAG_MAX);
	if (mp_find(g, v->name))
		return gm_error(g, -EEXIST, "%s: exists", v->name);
	return 0;
}

/* The consume of a create: the first message means the daemon made them all. */
struct creating {
	gmsfs *g;
	bool made;
};

static int map_created(void *ctx, struct ch_manifest *m, size_t from, size_t to)
{
	struct creating *c = ctx;
	c->made = true;
	return mp_map(c->g, &m->allocs[from], &m->fd[from], to - from, true, NULL);
}

/* A create that failed after the daemon made the allocations: nothing half made stays. */
static void unmake(gmsfs *g, const struct gmsfs_new *v, size_t n)
{
	char keep[sizeof g->err];
	memcpy(keep, g->err, sizeof keep);
	const char **names = calloc(n, sizeof *names);
	msgpack_sbuffer sb;
	msgpack_sbuffer_init(&sb);
	for (size_t i = 0; names && i < n; i++) {
		names[i] = v[i].name;
		struct gmsfs_mapping *m = mp_find(g, v[i].name);
		if (m)
			mp_drop(g, (size_t)(m - g->maps));
	}
	if (names && !wire_pack_names(&sb, GMSFS_K_PATHS, names, n))
		gm_call(g, GMSFS_OP_FREE, sb.data, sb.size, NULL);
	msgpack_sbuffer_destroy(&sb);
	free(names);
	memcpy(g->err, keep, sizeof keep);
}

int gmsfs_create_many(gmsfs *g, struct gmsfs_new *v, size_t n)
{
	if (!g || (!v && n))
		return g ? gm_error(g, -EINVAL, "create_many: no list") : -EINVAL;
	int e = gm_need_lock(g, GMSFS_RW);
	if (e || !n)
		return e;
	struct wire_alloc *a = calloc(n, sizeof *a);
	if (!a)
		return gm_error(g, -ENOMEM, "out of memory");
	for (size_t i = 0; i < n && !e; i++) {
		e = check_new(g, &v[i]);
		a[i] = (struct wire_alloc){ .path = (char *)v[i].name, .tag = (char *)v[i].tag, .size = v[i].size };
	}
	msgpack_sbuffer sb;
	msgpack_sbuffer_init(&sb);
	struct creating c = { .g = g };
	struct ch_manifest m = { .consume = map_created, .ctx = &c }; /* mapped as each message comes */
	if (!e && (e = wire_pack_create(&sb, a, n)))
		e = gm_error(g, e, "out of memory");
	else if (!e && !(e = gm_call(g, GMSFS_OP_CREATE, sb.data, sb.size, &m)))
		ch_manifest_free(&m);
	for (size_t i = 0; i < n && !e; i++) {
		struct gmsfs_mapping *p = mp_find(g, v[i].name);
		if (!p)
			e = gm_error(g, -EPROTO, "%s: the daemon made no such allocation", v[i].name);
		else
			v[i].ptr = p->ptr;
	}
	if (e && c.made)
		unmake(g, v, n);
	msgpack_sbuffer_destroy(&sb);
	free(a);
	return e;
}

int gmsfs_create(gmsfs *g, const char *name, uint64_t size, const char *tag, void **ptr)
{
	if (!g)
		return -EINVAL;
	struct gmsfs_new v = { .name = name, .size = size, .tag = tag };
	int e = gmsfs_create_many(g, &v, 1);
	if (!e && ptr)
		*ptr = v.ptr;
	return e;
}

int gmsfs_import_overwrite(gmsfs *g, const char *const *names, size_t n)
{
	if (!g || (!names && n))
		return g ? gm_error(g, -EINVAL, "import_overwrite: no list of names") : -EINVAL;
	int e = gm_need_lock(g, GMSFS_RW);
	for (size_t i = 0; !e && names && i < n; i++)
		if (!names[i] || !gmsfs_path_valid(names[i], strlen(names[i])))
			e = gm_error(g, -EINVAL, "import_overwrite %s: not a valid name", names[i] ? names[i] : "(null)");
	if (e || (names && !n))
		return e;
	msgpack_sbuffer sb;
	msgpack_sbuffer_init(&sb);
	/* Those mapped already keep their memory (mp_import skips them): the first import of
	 * an allocation in a session decides whether its next version is a copy. */
	struct ch_manifest m = { .consume = mp_import, .ctx = g };
	if ((e = wire_pack_export_overwrite(&sb, names, n)))
		e = gm_error(g, e, "out of memory");
	else if (!(e = gm_call(g, GMSFS_OP_EXPORT, sb.data, sb.size, &m)))
		ch_manifest_free(&m);
	for (size_t i = 0; !e && names && i < n; i++)
		if (!mp_find(g, names[i]))
			e = gm_error(g, -EPROTO, "import_overwrite: the daemon sent no %s", names[i]);
	msgpack_sbuffer_destroy(&sb);
	return e;
}

int gmsfs_import(gmsfs *g, const char *name, void **ptr)
{
	if (!g || !ptr)
		return g ? gm_error(g, -EINVAL, "import: no place for the pointer") : -EINVAL;
	int e = gm_need_lock(g, GMSFS_RO);
	if (e)
		return e;
	if (!name_ok(g, "import", name))
		return -EINVAL;
	struct gmsfs_mapping *have = mp_find(g, name);
	if (have) {
		*ptr = have->ptr;
		return 0;
	}
	const char *names[1] = { name };
	msgpack_sbuffer sb;
	msgpack_sbuffer_init(&sb);
	struct ch_manifest m = {0};
	if ((e = wire_pack_export(&sb, names, 1, true, false)))
		e = gm_error(g, e, "out of memory");
	else if (!(e = gm_call(g, GMSFS_OP_EXPORT, sb.data, sb.size, &m))) {
		if (m.nallocs != 1 || strcmp(m.allocs[0].path, name))
			e = gm_error(g, -EPROTO, "%s: the daemon sent %zu allocations", name, m.nallocs);
		else
			e = mp_map(g, &m.allocs[0], &m.fd[0], 1, g->lock == GMSFS_RW, ptr);
		ch_manifest_free(&m);
	}
	msgpack_sbuffer_destroy(&sb);
	return e;
}
