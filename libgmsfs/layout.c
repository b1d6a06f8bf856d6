/* layout: what acts on a handle's mappings, entries and spaces together, above all
 * three: a free (refused while a space maps it; its entries go), import_all (the
 * mappings and the entries in one reply), commit (the access of mappings and spaces
 * follows the lock down) and disconnect (all of it given back). */
#include "internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* FREE of one allocation; the handle forgets its entries and mapping i (-1: none). */
static int free_one(gmsfs *g, const char *name, ssize_t i)
{
	const char *names[1] = { name };
	msgpack_sbuffer sb;
	msgpack_sbuffer_init(&sb);
	int e = wire_pack_names(&sb, GMSFS_K_PATHS, names, 1);
	if (e)
		e = gm_error(g, e, "out of memory");
	else
		e = gm_call(g, GMSFS_OP_FREE, sb.data, sb.size, NULL);
	msgpack_sbuffer_destroy(&sb);
	if (e)
		return e;
	mt_forget_alloc(g, name);
	if (i >= 0)
		mp_drop(g, (size_t)i);
	return 0;
}

static int may_free(gmsfs *g, size_t i)
{
	if (sp_uses(g, g->maps[i].name))
		return gm_error(g, -EBUSY, "%s is mapped in a space: free the space first", g->maps[i].name);
	return 0;
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
	return (e = may_free(g, i)) ? e : free_one(g, g->maps[i].name, (ssize_t)i);
}

int gmsfs_free_name(gmsfs *g, const char *name)
{
	if (!g)
		return -EINVAL;
	int e = gm_need_lock(g, GMSFS_RW);
	if (e)
		return e;
	if (!name || !gmsfs_path_valid(name, strlen(name)))
		return gm_error(g, -EINVAL, "free %s: not a valid name", name ? name : "(null)");
	struct gmsfs_mapping *m = mp_find(g, name);
	size_t i = m ? (size_t)(m - g->maps) : 0;
	return m && (e = may_free(g, i)) ? e : free_one(g, name, m ? (ssize_t)i : -1);
}

/* A private entry of allocation alloc whose copy is not made yet: a writer's is made at
 * its commit, from the mapping. */
static const char *private_uncopied(const gmsfs *g, const char *alloc)
{
	for (size_t i = 0; g->meta.loaded && i < g->meta.n; i++) {
		const struct entry_rec *x = &g->meta.v[i];
		if ((x->flags & GMSFS_ENTRY_PRIVATE) && !x->copy && x->size && x->alloc && !strcmp(x->alloc, alloc))
			return x->key;
	}
	return NULL;
}

int gmsfs_unmap(gmsfs *g, const char *name)
{
	if (!g)
		return -EINVAL;
	if (!name || !gmsfs_path_valid(name, strlen(name)))
		return gm_error(g, -EINVAL, "unmap %s: not a valid name", name ? name : "(null)");
	struct gmsfs_mapping *m = mp_find(g, name);
	if (!m)
		return gm_error(g, -ENOENT, "unmap %s: the handle maps no such allocation", name);
	size_t i = (size_t)(m - g->maps);
	if (!g->slots[i].mapped) /* between unmap_all and remap_all: its range is remap_all's */
		return gm_error(g, -EINVAL, "unmap %s: the handle is unmapped (remap_all first)", name);
	if (sp_uses(g, name))
		return gm_error(g, -EBUSY, "unmap %s: it is mapped in a space: free the space first", name);
	const char *key = g->lock == GMSFS_RW ? private_uncopied(g, name) : NULL;
	if (key)
		return gm_error(g, -EBUSY, "unmap %s: meta/%s is private, copied from the mapping at the commit", name, key);
	mp_drop(g, i);
	g->imported_all = false;
	return 0;
}

int gmsfs_import_all(gmsfs *g)
{
	if (!g)
		return -EINVAL;
	int e = gm_need_lock(g, GMSFS_RO);
	if (e)
		return e;
	if (g->lock == GMSFS_RO && g->imported_all)
		return 0; /* everything is here, and nothing can have changed: no round trip */
	msgpack_sbuffer sb;
	msgpack_sbuffer_init(&sb);
	/* Mapped as each message comes; GMSFS_TRACE_IMPORT: where the time went, on stderr
	 * (until the first reply message, mapping, the rest). */
	double t0 = gm_tracing() ? gm_us() : 0;
	struct gm_timed timed = { .consume = mp_import, .ctx = g };
	struct ch_manifest m = { .consume = t0 ? gm_timed_consume : mp_import, .ctx = t0 ? (void *)&timed : g };
	if ((e = wire_pack_export(&sb, NULL, 0, true, true)))
		e = gm_error(g, e, "out of memory");
	else if (!(e = gm_call(g, GMSFS_OP_EXPORT, sb.data, sb.size, &m))) {
		mt_load(g, &m);
		if (g->lock != GMSFS_RW)
			e = mt_privatize(g);
		g->imported_all = !e && g->lock == GMSFS_RO;
		ch_manifest_free(&m);
	}
	msgpack_sbuffer_destroy(&sb);
	if (t0)
		fprintf(stderr, "gmsfs_import_all: %.0f us: first reply after %.0f us, mapping %.0f us, the rest %.0f us "
			"(from %.0f)\n", gm_us() - t0, timed.first ? timed.first - t0 : 0, timed.busy,
			gm_us() - (timed.first ? timed.first : t0) - timed.busy, gm_trace_clock(t0));
	return e;
}

int gm_commit(gmsfs *g, bool unmapping)
{
	return gm_commit_named(g, unmapping, NULL);
}

/* The commit's request: COMMIT; COMMIT_NAMED with a name; COMMIT_LEAVE, with a name or
 * not, where the writer disconnects after it.  The bytes it publishes have landed first:
 * the work its context queued (a copy from pageable memory returns before its DMA is
 * done) would otherwise write after the commit, and into a mapping made read-only, where
 * it faults. */
int gm_commit_request(gmsfs *g, const char *name, bool leave, double *t0, double *t1)
{
	*t0 = gm_tracing() ? gm_us() : 0;
	if (g->be->drain)
		ch_soon(&g->ch); /* the drain may wait for copies: the daemon is awake when it ends */
	int e = g->be->drain ? g->be->drain(g) : 0;
	if (e)
		return gm_error(g, e, "commit: waiting for the work queued: %s", strerror(-e));
	*t1 = *t0 ? gm_us() : 0;
	/* Asked: from here the daemon may hold read locks for this handle, whether or not
	 * its answer comes (a daemon killed after the commit, before its reply). */
	g->committed |= !leave;
	if (!name && !leave) {
		e = gm_call(g, GMSFS_OP_COMMIT, NULL, 0, NULL);
	} else {
		msgpack_sbuffer sb; /* the name with the commit: one round trip */
		msgpack_sbuffer_init(&sb);
		e = wire_pack_commit_named(&sb, name) ? gm_error(g, -ENOMEM, "out of memory")
						      : gm_call(g, leave ? GMSFS_OP_COMMIT_LEAVE : GMSFS_OP_COMMIT_NAMED,
								sb.data, sb.size, NULL);
		msgpack_sbuffer_destroy(&sb);
	}
	return e;
}

int gm_commit_named(gmsfs *g, bool unmapping, const char *name)
{
	int e = gm_need_lock(g, GMSFS_RW);
	if (e)
		return e;
	double t0, t1;
	if ((e = gm_commit_request(g, name, false, &t0, &t1)))
		return e;
	g->said_in_place = false; /* the session ended */
	double t2 = t0 ? gm_us() : 0;
	/* The daemon downgraded the lock; the mappings follow (best effort: the daemon
	 * hands readers read-only memory whatever this process keeps), unless they are
	 * about to go: a cuMemSetAccess each costs about what its unmap does (H100, 1000
	 * x 2 MiB: 38 ms against 32). */
	if (!unmapping) {
		mp_allow_all(g, true, false);
		sp_allow_all(g, false);
		pg_allow_all(g, false);
	}
	for (size_t i = 0; i < g->nmaps; i++)
		g->maps[i].writable = 0;
	if (unmapping) {
		if (t0)
			fprintf(stderr, "gmsfs commit: %.0f us: queued work drained %.0f us, committed %.0f us (from %.0f)\n",
				gm_us() - t0, t1 - t0, t2 - t1, gm_trace_clock(t0));
		return 0; /* gmsfs_commit_unmap_all copies the private entries and unmaps */
	}
	double t3 = t0 ? gm_us() : 0;
	/* A daemon gone since it took the commit (killed, or replaced by a takeover) leaves
	 * the commit standing: its successor serves it. */
	if ((e = gm_refresh(g)) && !gm_gone(-e))
		return e;
	e = g->meta.loaded ? mt_privatize(g) : 0;
	if (t0)
		fprintf(stderr, "gmsfs commit: %.0f us: queued work drained %.0f us, committed %.0f us, access set "
			"%.0f us, refreshed %.0f us (from %.0f)\n", gm_us() - t0, t1 - t0, t2 - t1, t3 - t2,
			gm_us() - t3, gm_trace_clock(t0));
	return e;
}

int gmsfs_commit_soon(gmsfs *g)
{
	if (!g)
		return -EINVAL;
	int e = gm_need_lock(g, GMSFS_RW);
	if (!e)
		ch_soon(&g->ch);
	return e;
}

int gmsfs_commit(gmsfs *g)
{
	return g ? gm_commit(g, false) : -EINVAL;
}

void gmsfs_disconnect(gmsfs *g)
{
	if (!g)
		return;
	pg_release_all(g);
	sp_release_all(g);
	mp_release_all(g);
	mt_free(g);
	gm_release_lock(g);
	gm_forget_dir(g);
	free(g->tie);
	free(g->dir);
	free(g);
}
