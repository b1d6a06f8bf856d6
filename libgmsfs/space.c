/* space: virtual spaces (sp_), the handle's allocations at other addresses.  Each
 * mapping of a space has a reservation of its own; the backend maps the memory of the
 * handle's mapping of the same name there again (alias).  A range space (new_range) has
 * one reservation instead, its mappings side by side in the order they come, so that a
 * run of allocations is one run of addresses (a graph pool's chunks, graph.c).  The
 * handle keeps every space it made in a list, freed ones too (a freed one is a small
 * record with nothing in it), so that a second free is an error, not a crash. */
#include "internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

struct sp_map {
	char *name;             /* the handle's allocation */
	void *ptr;              /* its address in the space: a reservation of aligned bytes */
	uint64_t aligned;
	uint64_t piece;         /* its pieces' size (mp_slot's); 0: one */
	bool mapped;            /* else only reserved (the handle is asleep) */
};

struct gmsfs_space {
	gmsfs *g;
	bool freed;
	void *base;             /* a range space's reservation of span bytes; NULL: none */
	uint64_t span, used;    /* and how much of it its mappings take */
	struct sp_map *v;
	size_t n, cap;
	struct gmsfs_space *next;
};

int gmsfs_space_new(gmsfs *g, gmsfs_space **out)
{
	if (!g || !out)
		return -EINVAL;
	*out = NULL;
	if (!g->lock)
		return gm_error(g, -EINVAL, "space_new: the handle holds no lock (remap_all first)");
	gmsfs_space *s = calloc(1, sizeof *s);
	if (!s)
		return gm_error(g, -ENOMEM, "out of memory");
	s->g = g;
	s->next = g->spaces;
	g->spaces = s;
	*out = s;
	return 0;
}

int gmsfs_space_new_range(gmsfs *g, uint64_t span, gmsfs_space **out)
{
	if (!g || !out)
		return -EINVAL;
	if (!span)
		return gm_error(g, -EINVAL, "space: a span of 0 bytes: give the bytes the space reserves (more than 0)");
	int e = gmsfs_space_new(g, out);
	if (e)
		return e;
	if ((e = g->be->reserve(g, span, 0, &(*out)->base))) {
		(*out)->base = NULL;
		(*out)->freed = true; /* its record stays, as a freed space's */
		*out = NULL;
		return gm_error(g, e, "space: reserving %llu bytes: %s", (unsigned long long)span, strerror(-e));
	}
	(*out)->span = span;
	return 0;
}

gmsfs *gmsfs_space_handle(const gmsfs_space *s)
{
	return s ? s->g : NULL;
}

static struct sp_map *find(gmsfs_space *s, const char *name)
{
	for (size_t i = 0; i < s->n; i++)
		if (!strcmp(s->v[i].name, name))
			return &s->v[i];
	return NULL;
}

/* The handle's mapping of name, mapped now; NULL with the reason in the handle. */
static struct gmsfs_mapping *source(gmsfs *g, const char *name, int *e)
{
	struct gmsfs_mapping *m = mp_find(g, name);
	if (!m || !g->slots[m - g->maps].mapped) {
		*e = gm_error(g, -ENOENT, "space: %s is not imported by this handle", name);
		return NULL;
	}
	return m;
}

static int alias(gmsfs *g, struct gmsfs_mapping *m, struct sp_map *x, bool writable)
{
	char why[256] = "";
	x->piece = g->slots[m - g->maps].piece;
	int e = mp_alias_alloc(g, m->ptr, x->ptr, x->aligned, x->piece, writable, why, sizeof why);
	if (e)
		return gm_error(g, e, "space: %s at %p: %s", m->name, x->ptr, why[0] ? why : strerror(-e));
	x->mapped = true;
	return 0;
}

int gmsfs_space_map(gmsfs_space *s, const char *name, void **ptr)
{
	if (!s || !name || !ptr)
		return -EINVAL;
	gmsfs *g = s->g;
	if (s->freed)
		return gm_error(g, -EINVAL, "space_map: the space was freed");
	if (!g->lock)
		return gm_error(g, -EINVAL, "space_map: the handle holds no lock (remap_all first)");
	struct sp_map *x = find(s, name);
	if (x) { /* once per space */
		*ptr = x->ptr;
		return 0;
	}
	int e = 0;
	struct gmsfs_mapping *m = source(g, name, &e);
	if (!m)
		return e;
	if (s->n == s->cap) {
		size_t cap = s->cap ? 2 * s->cap : 8;
		struct sp_map *v = realloc(s->v, cap * sizeof *v);
		if (!v)
			return gm_error(g, -ENOMEM, "out of memory");
		s->v = v, s->cap = cap;
	}
	x = &s->v[s->n];
	*x = (struct sp_map){ .name = strdup(name), .aligned = m->aligned };
	if (!x->name)
		return gm_error(g, -ENOMEM, "out of memory");
	if (s->base && m->aligned > s->span - s->used) {
		free(x->name);
		return gm_error(g, -ENOSPC, "space: %s (%llu bytes) does not fit in the %llu left of the range", name,
				(unsigned long long)m->aligned, (unsigned long long)(s->span - s->used));
	}
	if (s->base)
		x->ptr = (char *)s->base + s->used;
	else if ((e = g->be->reserve(g, x->aligned, mp_align(x->aligned), &x->ptr))) {
		free(x->name);
		return gm_error(g, e, "space: reserving %llu bytes: %s", (unsigned long long)x->aligned, strerror(-e));
	}
	if ((e = alias(g, m, x, m->writable))) {
		if (!s->base)
			g->be->unreserve(g, x->ptr, x->aligned);
		free(x->name);
		return e;
	}
	s->used += s->base ? x->aligned : 0;
	s->n++;
	*ptr = x->ptr;
	return 0;
}

static void empty(gmsfs_space *s)
{
	for (size_t i = 0; i < s->n; i++) {
		struct sp_map *x = &s->v[i];
		if (x->mapped)
			mp_unmap_alloc(s->g, x->ptr, x->aligned, x->piece);
		if (!s->base)
			s->g->be->unreserve(s->g, x->ptr, x->aligned);
		free(x->name);
	}
	if (s->base)
		s->g->be->unreserve(s->g, s->base, s->span);
	s->base = NULL;
	free(s->v);
	s->v = NULL;
	s->n = s->cap = 0;
}

int gmsfs_space_free(gmsfs_space *s)
{
	if (!s)
		return -EINVAL;
	if (s->freed)
		return gm_error(s->g, -EINVAL, "space_free: the space was freed already");
	empty(s);
	s->freed = true;
	return 0;
}

void sp_unmap_all(gmsfs *g)
{
	for (gmsfs_space *s = g->spaces; s; s = s->next)
		for (size_t i = 0; i < s->n; i++)
			if (s->v[i].mapped && !mp_unmap_alloc(g, s->v[i].ptr, s->v[i].aligned, s->v[i].piece))
				s->v[i].mapped = false;
}

int sp_remap_all(gmsfs *g, bool writable)
{
	int e = 0;
	for (gmsfs_space *s = g->spaces; s && !e; s = s->next)
		for (size_t i = 0; i < s->n && !e; i++) {
			struct sp_map *x = &s->v[i];
			struct gmsfs_mapping *m = x->mapped ? NULL : source(g, x->name, &e);
			if (m)
				e = alias(g, m, x, writable);
		}
	if (e)
		sp_unmap_all(g); /* the caller unmaps the handle's and lets the lock go */
	return e;
}

void sp_allow_all(gmsfs *g, bool writable)
{
	for (gmsfs_space *s = g->spaces; s; s = s->next)
		for (size_t i = 0; i < s->n; i++)
			if (s->v[i].mapped)
				g->be->allow(g, s->v[i].ptr, s->v[i].aligned, writable);
}

static void allow_one(gmsfs *g, const char *name, bool writable)
{
	for (gmsfs_space *s = g->spaces; s; s = s->next) {
		struct sp_map *x = find(s, name);
		if (x && x->mapped)
			g->be->allow(g, x->ptr, x->aligned, writable);
	}
}

/* The spaces' mappings of name made again from its mapping (mapped anew at its address). */
static int realias(gmsfs *g, struct gmsfs_mapping *m, bool writable)
{
	int e = 0;
	for (gmsfs_space *s = g->spaces; s && !e; s = s->next) {
		struct sp_map *x = find(s, m->name);
		if (!x || !x->mapped)
			continue;
		if ((e = mp_unmap_alloc(g, x->ptr, x->aligned, x->piece)))
			return e;
		x->mapped = false;
		e = alias(g, m, x, writable);
	}
	return e;
}

/* The consume of an in-place ask with descriptors: each mapping that came read-only
 * mapped again, writable, over itself (its address stays). */
static int map_writable(void *ctx, struct ch_manifest *m, size_t from, size_t to)
{
	gmsfs *g = ctx;
	for (size_t i = from; i < to; i++) {
		struct gmsfs_mapping *x = mp_find(g, m->allocs[i].path);
		struct mp_slot *slot = x ? &g->slots[x - g->maps] : NULL;
		if (!x || !slot->mapped || !slot->ro)
			continue;
		char why[256] = "";
		int e = x->aligned != m->allocs[i].aligned || m->fd[i] < 0 || m->allocs[i].ro ? -EPROTO : 0;
		if (!e && !(e = mp_map_alloc(g, x->ptr, &m->allocs[i], m->fd[i], true, why, sizeof why))) {
			slot->ro = false;
			x->writable = true;
			e = realias(g, x, true);
		}
		if (e)
			return gm_error(g, e, "%s: mapping it writable: %s", x->name, why[0] ? why : strerror(-e));
	}
	return 0;
}

static bool needs_descriptor(const gmsfs *g, const char *const *names, size_t n)
{
	if (!g->be->fd_has_access)
		return false;
	for (size_t i = 0; i < (names ? n : g->nmaps); i++) {
		const struct gmsfs_mapping *m = names ? mp_find((gmsfs *)g, names[i]) : &g->maps[i];
		if (m && g->slots[m - g->maps].mapped && g->slots[m - g->maps].ro)
			return true;
	}
	return false;
}

int sp_write_in_place(gmsfs *g, const char *const *names, size_t n)
{
	bool fds = needs_descriptor(g, names, n);
	if (!fds && g->said_in_place)
		return 0; /* said for this session: the daemon's mark is the session's */
	msgpack_sbuffer sb;
	msgpack_sbuffer_init(&sb);
	struct ch_manifest m = { .consume = fds ? map_writable : NULL, .ctx = g };
	int e = wire_pack_export_in_place(&sb, names, n, fds) ? gm_error(g, -ENOMEM, "out of memory")
							       : gm_call(g, GMSFS_OP_EXPORT, sb.data, sb.size, &m);
	msgpack_sbuffer_destroy(&sb);
	if (e)
		return e;
	ch_manifest_free(&m);
	g->said_in_place = true;
	/* Without descriptors (cuda) the mappings it has are made writable by allow. */
	for (size_t i = 0; i < (names ? n : g->nmaps); i++) {
		struct gmsfs_mapping *x = names ? mp_find(g, names[i]) : &g->maps[i];
		if (x && g->slots[x - g->maps].mapped && !fds)
			g->slots[x - g->maps].ro = false;
	}
	return 0;
}

/* One mapping's access and its spaces' mappings', as a commit sets all of them. */
int gmsfs_protect(gmsfs *g, const char *name, int writable)
{
	if (!g || !name)
		return g ? gm_error(g, -EINVAL, "protect: no name") : -EINVAL;
	if (writable != 0 && writable != 1)
		return gm_error(g, -EINVAL, "protect: %s: writable is 0 or 1, not %d", name, writable);
	struct gmsfs_mapping *m = mp_find(g, name);
	if (!m || !g->slots[m - g->maps].mapped)
		return gm_error(g, -ENOENT, "protect: %s: the handle maps no such allocation", name);
	if (writable && g->lock != GMSFS_RW)
		return gm_error(g, -EPERM, "protect: %s: only a writer's session makes memory writable", name);
	if (m->writable == writable)
		return 0; /* as asked already: no driver call */
	/* The last commit's bytes, or a reader's mapping resumed: the daemon is told first. */
	int e = writable ? sp_write_in_place(g, &name, 1) : 0;
	if (e)
		return e;
	if (m->writable == writable)
		return 0; /* mapped writable again */
	e = g->be->allow(g, m->ptr, m->aligned, writable);
	if (e)
		return gm_error(g, e, "protect: %s: setting its access: %s", name, strerror(-e));
	allow_one(g, name, writable);
	m->writable = writable;
	return 0;
}

bool sp_uses(const gmsfs *g, const char *name)
{
	for (gmsfs_space *s = g->spaces; s; s = s->next)
		if (find(s, name))
			return true;
	return false;
}

void sp_release_all(gmsfs *g)
{
	while (g->spaces) {
		gmsfs_space *s = g->spaces;
		g->spaces = s->next;
		empty(s);
		free(s);
	}
}
