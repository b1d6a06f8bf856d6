/* maps: the handle's table of mappings (by name, and in order), and what fills it:
 * create, import, free. */
#include "internal.h"
#include "grow.h"
#include "hash.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the name index: imports check every name, so it must not be a scan ---- */

static void index_put(gmsfs *g, size_t i)
{
	size_t mask = g->index_cap - 1, k = name_hash(g->maps[i].name) & mask;
	while (g->index[k])
		k = (k + 1) & mask;
	g->index[k] = i + 1;
}

static int index_rebuild(gmsfs *g, size_t want)
{
	size_t cap = 64;
	while (cap < 2 * want)
		cap *= 2;
	size_t *v = calloc(cap, sizeof *v);
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
	for (size_t k = name_hash(name) & mask; g->index[k]; k = (k + 1) & mask)
		if (!strcmp(g->maps[g->index[k] - 1].name, name))
			return &g->maps[g->index[k] - 1];
	return NULL;
}

/* Unmap, give the range back, forget the names. */
static void release_map(gmsfs *g, size_t i)
{
	struct gmsfs_mapping *m = &g->maps[i];
	g->be->unreserve(g, m->ptr, m->aligned, g->mapped[i]);
	free((char *)m->name);
	free((char *)m->tag);
}

static void drop_map(gmsfs *g, size_t i)
{
	release_map(g, i);
	g->nmaps--;
	g->maps[i] = g->maps[g->nmaps];
	g->mapped[i] = g->mapped[g->nmaps];
	index_rebuild(g, g->nmaps); /* cannot fail: it shrinks */
}

void mp_release_all(gmsfs *g)
{
	for (size_t i = 0; i < g->nmaps; i++)
		release_map(g, i);
	free(g->maps);
	free(g->mapped);
	free(g->index);
	g->maps = NULL;
	g->mapped = NULL;
	g->index = NULL;
	g->nmaps = g->cap = g->index_cap = 0;
}

void mp_unmap_mapped(gmsfs *g)
{
	for (size_t i = 0; i < g->nmaps; i++)
		if (g->mapped[i]) {
			g->be->unmap(g, g->maps[i].ptr, g->maps[i].aligned);
			g->mapped[i] = false;
		}
}

int mp_add(gmsfs *g, struct wire_alloc *a, int fd, bool writable, void **ptr)
{
	size_t cap = g->cap;
	if (GROW(g->maps, g->nmaps, g->cap, 64))
		return gm_error(g, -ENOMEM, "out of memory");
	if (cap != g->cap) { /* mapped[] follows maps[] */
		bool *v = realloc(g->mapped, g->cap * sizeof *v);
		if (!v) {
			g->cap = cap; /* maps[] grew; the next call tries mapped[] again */
			return gm_error(g, -ENOMEM, "out of memory");
		}
		g->mapped = v;
	}
	if (2 * (g->nmaps + 1) > g->index_cap && index_rebuild(g, g->nmaps + 1))
		return gm_error(g, -ENOMEM, "out of memory");
	if (fd < 0)
		return gm_error(g, -EPROTO, "%s: no descriptor came for it", a->path);
	void *va;
	int e = g->be->reserve(g, a->aligned, &va);
	if (e)
		return gm_error(g, e, "%s: reserving %llu bytes: %s", a->path, (unsigned long long)a->aligned, strerror(-e));
	char why[256] = "";
	if ((e = g->be->map(g, va, a->aligned, fd, a->fd_offset, writable, why, sizeof why))) {
		g->be->unreserve(g, va, a->aligned, false);
		return gm_error(g, e, "%s: %s", a->path, why[0] ? why : strerror(-e));
	}
	g->mapped[g->nmaps] = true;
	g->maps[g->nmaps++] = (struct gmsfs_mapping){ .name = a->path, .tag = a->tag, .ptr = va, .size = a->size,
						      .aligned = a->aligned, .writable = writable };
	a->path = a->tag = NULL; /* the table owns them now */
	index_put(g, g->nmaps - 1);
	if (ptr)
		*ptr = va;
	return 0;
}

int mp_import(void *ctx, struct ch_manifest *m, size_t from, size_t to)
{
	gmsfs *g = ctx;
	for (size_t i = from; i < to; i++) {
		if (mp_find(g, m->allocs[i].path))
			continue; /* mapped already */
		int e = mp_add(g, &m->allocs[i], m->fd[i], g->lock == GMSFS_RW, NULL);
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

int gmsfs_create(gmsfs *g, const char *name, uint64_t size, const char *tag, void **ptr)
{
	if (!g || !ptr)
		return g ? gm_error(g, -EINVAL, "create: no place for the pointer") : -EINVAL;
	int e = gm_need_lock(g, GMSFS_RW);
	if (e)
		return e;
	if (!name_ok(g, "create", name))
		return -EINVAL;
	if (!size)
		return gm_error(g, -EINVAL, "%s: size 0", name);
	if (tag && !gmsfs_tag_valid(tag, strlen(tag)))
		return gm_error(g, -EINVAL, "%s: a tag has 1..%d bytes and no control characters", name, GMSFS_TAG_MAX);
	if (mp_find(g, name))
		return gm_error(g, -EEXIST, "%s: exists", name);
	struct wire_alloc a = { .path = (char *)name, .tag = (char *)tag, .size = size };
	msgpack_sbuffer sb;
	msgpack_sbuffer_init(&sb);
	struct ch_manifest m = {0};
	if ((e = wire_pack_create(&sb, &a, 1)))
		e = gm_error(g, e, "out of memory");
	else if (!(e = gm_call(g, GMSFS_OP_CREATE, sb.data, sb.size, &m))) {
		if (m.nallocs != 1 || strcmp(m.allocs[0].path, name))
			e = gm_error(g, -EPROTO, "%s: the daemon sent %zu allocations", name, m.nallocs);
		else
			e = mp_add(g, &m.allocs[0], m.fd[0], true, ptr);
		ch_manifest_free(&m);
		if (e) { /* nothing half made is left behind */
			const char *names[1] = { name };
			msgpack_sbuffer_clear(&sb);
			if (!wire_pack_names(&sb, GMSFS_K_PATHS, names, 1)) {
				char keep[sizeof g->err];
				memcpy(keep, g->err, sizeof keep);
				gm_call(g, GMSFS_OP_FREE, sb.data, sb.size, NULL);
				memcpy(g->err, keep, sizeof keep);
			}
		}
	}
	msgpack_sbuffer_destroy(&sb);
	return e;
}

int gmsfs_free(gmsfs *g, void *ptr)
{
	if (!g)
		return -EINVAL;
	int e = gm_need_lock(g, GMSFS_RW);
	if (e)
		return e;
	size_t i = 0;
	while (i < g->nmaps && g->maps[i].ptr != ptr)
		i++;
	if (i == g->nmaps)
		return gm_error(g, -ENOENT, "%p: not a mapping of this handle", ptr);
	const char *names[1] = { g->maps[i].name };
	msgpack_sbuffer sb;
	msgpack_sbuffer_init(&sb);
	if ((e = wire_pack_names(&sb, GMSFS_K_PATHS, names, 1)))
		e = gm_error(g, e, "out of memory");
	else
		e = gm_call(g, GMSFS_OP_FREE, sb.data, sb.size, NULL);
	msgpack_sbuffer_destroy(&sb);
	if (e)
		return e;
	mt_forget_alloc(g, g->maps[i].name);
	drop_map(g, i);
	return 0;
}

int gmsfs_import_all(gmsfs *g)
{
	if (!g)
		return -EINVAL;
	int e = gm_need_lock(g, GMSFS_RO);
	if (e)
		return e;
	msgpack_sbuffer sb;
	msgpack_sbuffer_init(&sb);
	struct ch_manifest m = { .consume = mp_import, .ctx = g }; /* mapped as each message comes */
	if ((e = wire_pack_export(&sb, NULL, 0, true, true)))
		e = gm_error(g, e, "out of memory");
	else if (!(e = gm_call(g, GMSFS_OP_EXPORT, sb.data, sb.size, &m))) {
		mt_load(g, &m);
		if (g->lock != GMSFS_RW)
			e = mt_privatize(g);
		ch_manifest_free(&m);
	}
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
			e = mp_add(g, &m.allocs[0], m.fd[0], g->lock == GMSFS_RW, ptr);
		ch_manifest_free(&m);
	}
	msgpack_sbuffer_destroy(&sb);
	return e;
}
