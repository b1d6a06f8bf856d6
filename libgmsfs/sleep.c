/* sleep: unmap_all keeps every address range, remap_all puts the same layout back
 * at the same addresses, reallocate_all puts fresh memory behind them for a writer;
 * the handle's spaces (space.c) follow. */
#include "internal.h"
#include "hash.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

int gmsfs_unmap_all(gmsfs *g)
{
	if (!g)
		return -EINVAL;
	if (pg_live(g)) /* pages are a writer's working memory, not a layout to sleep with */
		return gm_error(g, -EBUSY, "unmap_all: free the handle's pages ranges first (gmsfs_pages_free)");
	/* The hash to compare at remap_all: a read lock's, granted with it (its layout cannot
	 * change while it is held: no round trip); a writer's, the daemon's word now, or, if
	 * the daemon that granted the lock is gone (ENOTCONN: killed, or replaced by gmsfs -o
	 * takeover) or the store was removed (ENOENT: its memory goes with its last reader),
	 * the last one it gave; the mappings are this process's to undo either way. */
	int e = g->lock == GMSFS_RO && g->info.has_hash ? 0 : gm_refresh(g);
	if (e && !gm_gone(-e) && e != -ENOENT)
		return e;
	double t0 = gm_tracing() ? gm_us() : 0;
	/* A reader's lock goes back while its mappings go, its answer read after them: the
	 * round trip is off the caller's time (the mappings are read-only, and the memory
	 * stays until the last of them goes).  A writer's after them, by the ioctl. */
	int sent = gm_unlock_send(g);
	for (size_t i = 0; i < g->nmaps; i++) {
		struct gmsfs_mapping *m = &g->maps[i];
		if (g->slots[i].mapped && (e = mp_unmap_alloc(g, m->ptr, m->aligned, g->slots[i].piece))) {
			if (!sent) /* the lock is going: the handle is given up, as a failed remap's */
				gm_unlock_done(g, sent);
			return gm_error(g, e, "%s: unmap: %s", m->name, strerror(-e));
		}
		g->slots[i].mapped = false;
	}
	sp_unmap_all(g); /* a space's mapping would keep the memory past the lock */
	g->saved_has_hash = g->info.has_hash;
	memcpy(g->saved_hash, g->info.layout_hash, sizeof g->saved_hash);
	/* A committed session's lock is a read lock, whether or not the handle heard so (a
	 * daemon gone after the commit's answer): remap_all takes a read lock then. */
	g->unmapped_lock = g->lock == GMSFS_RW && g->committed ? GMSFS_RO : g->lock;
	double t1 = t0 ? gm_us() : 0;
	gm_unlock_done(g, sent); /* a writer that did not commit rolls back */
	if (t0)
		fprintf(stderr, "gmsfs_unmap_all: %.0f us: unmapping %.0f us, the lock given back %.0f us (from %.0f)\n",
			gm_us() - t0, t1 - t0, gm_us() - t1, gm_trace_clock(t1));
	return 0;
}

int gm_unmap_committed(gmsfs *g)
{
	/* Committed: the mappings go whatever else fails (they are still writable). */
	int e = g->meta.loaded ? mt_privatize(g) : 0; /* from the mappings, before they go */
	int u = gmsfs_unmap_all(g);
	return e ? e : u;
}

int gmsfs_commit_unmap_all(gmsfs *g)
{
	if (!g)
		return -EINVAL;
	int e = gm_commit(g, true);
	return e ? e : gm_unmap_committed(g); /* a failed commit unmaps nothing */
}

/* The whole layout's descriptors, each message's handed to consume. */
static int export_all(gmsfs *g, struct ch_manifest *m)
{
	msgpack_sbuffer sb;
	msgpack_sbuffer_init(&sb);
	int e = wire_pack_export(&sb, NULL, 0, true, false);
	if (e)
		e = gm_error(g, e, "out of memory");
	else
		e = gm_call(g, GMSFS_OP_EXPORT, sb.data, sb.size, m);
	msgpack_sbuffer_destroy(&sb);
	return e;
}

/* Map allocations [from, to) of m over the same names' reserved ranges (usable once
 * allow_again has set their access, all at once). */
static int map_again(gmsfs *g, struct ch_manifest *m, size_t from, size_t to, bool writable, int stale)
{
	int e = 0;
	for (size_t i = from; i < to && !e; i++) {
		struct gmsfs_mapping *p = mp_find(g, m->allocs[i].path);
		char why[256] = "";
		if (!p || p->aligned != m->allocs[i].aligned || g->slots[p - g->maps].mapped)
			e = gm_error(g, stale, "%s is not what was unmapped", m->allocs[i].path);
		else if (m->fd[i] < 0)
			e = gm_error(g, -EPROTO, "no descriptor came for %s", m->allocs[i].path);
		else if ((e = mp_map_alloc(g, p->ptr, &m->allocs[i], m->fd[i], writable && !m->allocs[i].ro, why,
					   sizeof why)))
			gm_error(g, e, "%s: %s", m->allocs[i].path, why[0] ? why : strerror(-e));
		else {
			g->slots[p - g->maps].mapped = true;
			g->slots[p - g->maps].piece = m->allocs[i].npieces ? m->allocs[i].piece : 0;
			g->slots[p - g->maps].ro = !writable || m->allocs[i].ro;
			p->writable = writable && !m->allocs[i].ro;
		}
	}
	return e;
}

static int allow_again(gmsfs *g, bool writable)
{
	int e = mp_allow_all(g, false, writable);
	return e ? gm_error(g, e, "setting the access of the mapped memory: %s", strerror(-e)) : 0;
}

static int remap_batch(void *ctx, struct ch_manifest *m, size_t from, size_t to)
{
	gmsfs *g = ctx;
	return map_again(g, m, from, to, g->lock == GMSFS_RW, -ESTALE);
}

static int reallocate_batch(void *ctx, struct ch_manifest *m, size_t from, size_t to)
{
	return map_again(ctx, m, from, to, true, -EPROTO);
}

int gmsfs_remap_all(gmsfs *g, int timeout_ms)
{
	if (!g)
		return -EINVAL;
	if (g->lock || g->paused)
		return gm_error(g, -EINVAL, "remap_all: the handle is mapped (%s first)", g->paused ? "resume" : "unmap_all");
	double t0 = gm_tracing() ? gm_us() : 0; /* GMSFS_TRACE_IMPORT, as import_all's */
	int e = gm_take_lock(g, g->unmapped_lock ? g->unmapped_lock : g->mode, timeout_ms);
	if (e)
		return e;
	double t1 = t0 ? gm_us() : 0;
	if (g->info.has_hash != g->saved_has_hash || memcmp(g->info.layout_hash, g->saved_hash, GMSFS_HASH_LEN)) {
		char a[33] = "", b[33] = "";
		if (g->saved_has_hash)
			hex_of(g->saved_hash, GMSFS_HASH_LEN, a);
		if (g->info.has_hash)
			hex_of(g->info.layout_hash, GMSFS_HASH_LEN, b);
		gm_release_lock(g);
		return gm_error(g, -ESTALE, "remap_all: layout hash was %s, is %s now", a[0] ? a : "(none)",
				b[0] ? b : "(none)");
	}
	struct gm_timed timed = { .consume = remap_batch, .ctx = g };
	struct ch_manifest m = { .consume = t0 ? gm_timed_consume : remap_batch, .ctx = t0 ? (void *)&timed : g };
	e = export_all(g, &m);
	if (!e)
		ch_manifest_free(&m);
	for (size_t i = 0; i < g->nmaps && !e; i++)
		if (!g->slots[i].mapped)
			e = gm_error(g, -ESTALE, "remap_all: %s is gone", g->maps[i].name);
	double t2 = t0 ? gm_us() : 0;
	if (!e)
		e = allow_again(g, g->lock == GMSFS_RW);
	if (!e)
		e = sp_remap_all(g, g->lock == GMSFS_RW);
	if (e) {
		mp_unmap_mapped(g);
		gm_release_lock(g);
	}
	if (t0)
		fprintf(stderr, "gmsfs_remap_all: %.0f us: the lock %.0f us, first reply after %.0f us, mapping %.0f us, "
			"access %.0f us (from %.0f)\n", gm_us() - t0, t1 - t0, timed.first ? timed.first - t1 : 0, timed.busy,
			gm_us() - t2, gm_trace_clock(t0));
	return e;
}

/* Free the old allocations and create the same names, sizes and tags again, keeping
 * the metadata entries that named them: three requests. */
/* A FREE of the names that the layout has now: a writer's unmap_all of a session it did
 * not commit rolled back what it made (GMS's abort), and a reallocation makes them anew.
 * (All at once first: one lookup a name only where that was refused.) */
static int free_those_there(gmsfs *g, const char **names, size_t n, msgpack_sbuffer *sb)
{
	const char **there = calloc(n ? n : 1, sizeof *there);
	size_t k = 0;
	char path[8192];
	if (!there)
		return gm_error(g, -ENOMEM, "out of memory");
	for (size_t i = 0; i < n; i++) /* a member sees its session's layout */
		if (snprintf(path, sizeof path, "%s/allocs/%s", g->dir, names[i]) < (int)sizeof path && !access(path, F_OK))
			there[k++] = names[i];
	msgpack_sbuffer_clear(sb);
	int e = k && wire_pack_names(sb, GMSFS_K_PATHS, there, k) ? gm_error(g, -ENOMEM, "out of memory") : 0;
	if (!e && k)
		e = gm_call(g, GMSFS_OP_FREE, sb->data, sb->size, NULL);
	free(there);
	return e;
}

static int recreate(gmsfs *g, struct ch_manifest *made)
{
	msgpack_sbuffer sb;
	msgpack_sbuffer_init(&sb);
	const char **names = calloc(g->nmaps ? g->nmaps : 1, sizeof *names);
	struct wire_alloc *a = calloc(g->nmaps ? g->nmaps : 1, sizeof *a);
	struct entry_rec *w = NULL;
	int e = names && a ? mt_ensure(g) : gm_error(g, -ENOMEM, "out of memory");
	struct mt *t = &g->meta;
	if (!e && t->n && !(w = calloc(t->n, sizeof *w)))
		e = gm_error(g, -ENOMEM, "out of memory");
	for (size_t i = 0; !e && i < g->nmaps; i++) {
		names[i] = g->maps[i].name;
		a[i] = (struct wire_alloc){ .path = (char *)g->maps[i].name, .tag = (char *)g->maps[i].tag,
					    .size = g->maps[i].size };
	}
	size_t nw = 0;
	for (size_t i = 0; !e && i < t->n; i++)
		if (t->v[i].alloc && mp_find(g, t->v[i].alloc))
			w[nw++] = (struct entry_rec){ .key = t->v[i].key, .alloc = t->v[i].alloc,
						       .offset = t->v[i].offset, .size = t->v[i].size,
						       .flags = t->v[i].flags, .value = t->v[i].value,
						       .value_len = t->v[i].value_len };
	if (!e && g->nmaps && wire_pack_names(&sb, GMSFS_K_PATHS, names, g->nmaps))
		e = gm_error(g, -ENOMEM, "out of memory");
	if (!e && g->nmaps)
		e = gm_call(g, GMSFS_OP_FREE, sb.data, sb.size, NULL);
	if (e == -ENOENT) /* some went with the session that made them (unmapped uncommitted): the others */
		e = free_those_there(g, names, g->nmaps, &sb);
	msgpack_sbuffer_clear(&sb);
	if (!e && g->nmaps && wire_pack_create(&sb, a, g->nmaps))
		e = gm_error(g, -ENOMEM, "out of memory");
	if (!e && g->nmaps)
		e = gm_call(g, GMSFS_OP_CREATE, sb.data, sb.size, made);
	msgpack_sbuffer_clear(&sb);
	if (!e && nw && wire_pack_entries(&sb, w, nw))
		e = gm_error(g, -ENOMEM, "out of memory");
	if (!e && nw && (e = gm_call(g, GMSFS_OP_META_PUT, sb.data, sb.size, NULL)))
		ch_manifest_free(made);
	msgpack_sbuffer_destroy(&sb);
	free(names);
	free(a);
	free(w);
	return e;
}

int gmsfs_reallocate_all(gmsfs *g, int timeout_ms)
{
	if (!g)
		return -EINVAL;
	if (g->lock)
		return gm_error(g, -EINVAL, "reallocate_all: the handle is mapped (unmap_all first)");
	if (!g->granted_rw)
		return gm_error(g, -EPERM, "reallocate_all: this handle was never granted the write lock");
	int e = gm_take_lock(g, GMSFS_RW, timeout_ms);
	if (e)
		return e;
	struct ch_manifest m = { .consume = reallocate_batch, .ctx = g };
	if (!(e = recreate(g, &m)))
		ch_manifest_free(&m);
	for (size_t i = 0; i < g->nmaps && !e; i++)
		if (!g->slots[i].mapped)
			e = gm_error(g, -EPROTO, "reallocate_all: %s came back in no manifest", g->maps[i].name);
	if (!e)
		e = allow_again(g, true);
	if (!e)
		e = sp_remap_all(g, true);
	if (e) {
		mp_unmap_mapped(g);
		gm_release_lock(g);
	}
	return e;
}

/* ---- flip: a reader of a store with versions moves to the last commit ---- */

struct flip {
	gmsfs *g;
	size_t n;
	bool drained;
	double first, busy; /* GMSFS_TRACE_IMPORT: the first batch's arrival, the time in the driver */
};

/* The manifest's allocations that this handle maps, mapped again at their addresses
 * (usable once their access is set, all at once). */
static int flip_batch(void *ctx, struct ch_manifest *m, size_t from, size_t to)
{
	struct flip *f = ctx;
	gmsfs *g = f->g;
	int e = 0;
	double t = gm_tracing() ? gm_us() : 0;
	if (t && !f->first)
		f->first = t;
	for (size_t i = from; i < to && !e; i++) {
		struct gmsfs_mapping *p = mp_find(g, m->allocs[i].path);
		struct mp_slot *slot = p ? &g->slots[p - g->maps] : NULL;
		char why[256] = "";
		if (!p || !slot->mapped)
			continue; /* not imported here: nothing of it to change */
		if (p->aligned != m->allocs[i].aligned || m->fd[i] < 0)
			return gm_error(g, -EPROTO, "flip: %s came with another size or no descriptor", p->name);
		if (sp_uses(g, p->name))
			return gm_error(g, -EBUSY, "flip: %s is mapped in a space too: free the space first", p->name);
		/* Work queued on the old memory is done before it goes (a kernel reading it would fault). */
		if (!f->drained && g->be->drain && (e = g->be->drain(g)))
			return gm_error(g, e, "flip: waiting for the work queued: %s", strerror(-e));
		f->drained = true;
		if ((e = mp_unmap_alloc(g, p->ptr, p->aligned, slot->piece)))
			return gm_error(g, e, "flip: %s: unmap: %s", p->name, strerror(-e));
		slot->mapped = false;
		if ((e = mp_map_alloc(g, p->ptr, &m->allocs[i], m->fd[i], false, why, sizeof why)))
			return gm_error(g, e, "flip: %s: %s", p->name, why[0] ? why : strerror(-e));
		slot->mapped = true;
		slot->piece = m->allocs[i].npieces ? m->allocs[i].piece : 0;
		slot->ro = g->lock != GMSFS_RW || m->allocs[i].ro;
		f->n++;
	}
	if (t)
		f->busy += gm_us() - t;
	return e;
}

int gmsfs_flip(gmsfs *g, size_t *changed)
{
	if (changed)
		*changed = 0;
	if (!g)
		return -EINVAL;
	if (g->lock != GMSFS_RO)
		return gm_error(g, -EINVAL, "flip: a reader's call (the handle %s)", g->lock ? "writes" : "holds no lock");
	struct flip f = { .g = g };
	struct ch_manifest m = { .consume = flip_batch, .ctx = &f };
	double t0 = gm_tracing() ? gm_us() : 0;
	int e = gm_call(g, GMSFS_OP_FLIP, NULL, 0, &m);
	if (e)
		return e;
	double t1 = t0 ? gm_us() : 0;
	bool told = m.has_gen, none = !m.nallocs;
	uint64_t gen = m.gen;
	ch_manifest_free(&m);
	/* Behind, yet told of no change: the daemon did not know what this handle maps (it
	 * was started again since): every allocation is mapped again. */
	if (told && none && gen > g->info.generation) {
		msgpack_sbuffer sb;
		msgpack_sbuffer_init(&sb);
		m = (struct ch_manifest){ .consume = flip_batch, .ctx = &f };
		e = wire_pack_export(&sb, NULL, 0, true, false) ? gm_error(g, -ENOMEM, "out of memory")
								: gm_call(g, GMSFS_OP_EXPORT, sb.data, sb.size, &m);
		msgpack_sbuffer_destroy(&sb);
		if (!e)
			ch_manifest_free(&m);
	}
	/* Their access at the end, neighbours in one call (on CUDA one costs what sixteen do). */
	if (!e && f.n && (e = mp_allow_all(g, false, false)))
		gm_error(g, e, "flip: setting the access of the mapped memory: %s", strerror(-e));
	if (!e && told)
		g->info.generation = gen;
	if (changed)
		*changed = f.n;
	if (t0)
		fprintf(stderr, "gmsfs_flip: %.0f us: first reply after %.0f us, %zu unmapped and mapped again %.0f us, "
			"the rest of the reply %.0f us, access set %.0f us (from %.0f)\n", gm_us() - t0,
			f.first ? f.first - t0 : 0, f.n, f.busy, t1 - (f.first ? f.first : t0) - f.busy, gm_us() - t1,
			gm_trace_clock(t0));
	return e;
}

/* ---- pause: the lock given back, the mappings kept ---- */

int gmsfs_pause(gmsfs *g)
{
	if (!g)
		return -EINVAL;
	if (g->lock != GMSFS_RO)
		return gm_error(g, -EINVAL, "pause: the handle %s", g->paused ? "is paused already" : g->lock ? "writes (commit first)" : "holds no lock");
	/* The work queued on the memory is done before a writer may change it in place. */
	int e = g->be->drain ? g->be->drain(g) : 0;
	if (e)
		return gm_error(g, e, "pause: waiting for the work queued: %s", strerror(-e));
	/* A bind still on its way could reach the daemon after the pause, which refuses it:
	 * that channel goes, and the resume's ticket binds one. */
	if (g->ch.bind_pending)
		ch_close(&g->ch);
	struct gmsfs_ioc io = { .size = sizeof io };
	if (ioctl(g->dirfd, GMSFS_IOC_PAUSE, &io))
		return gm_error(g, -errno, "%s: pause: %s", g->dir, strerror(errno));
	if (g->lockfd >= 0) { /* a committed writer's STORE/lock reads too: its hold goes */
		struct gmsfs_ioc unlock = { .size = sizeof unlock };
		ioctl(g->lockfd, GMSFS_IOC_UNLOCK, &unlock);
		close(g->lockfd);
		g->lockfd = -1;
	}
	g->lock = 0;
	g->committed = false; /* its read hold is given back */
	g->paused = true;
	g->imported_all = false;
	g->said_in_place = false;
	return 0;
}

/* The paused handle is gone with its daemon (killed, replaced): the mappings go, and come
 * back as remap_all puts them, under a lock of mode. */
static int resume_anew(gmsfs *g, int mode, int timeout_ms)
{
	close(g->dirfd);
	g->dirfd = -1;
	g->paused = false;
	for (size_t i = 0; i < g->nmaps; i++)
		if (g->slots[i].mapped && !mp_unmap_alloc(g, g->maps[i].ptr, g->maps[i].aligned, g->slots[i].piece))
			g->slots[i].mapped = false;
	sp_unmap_all(g);
	g->saved_has_hash = g->info.has_hash;
	memcpy(g->saved_hash, g->info.layout_hash, sizeof g->saved_hash);
	g->unmapped_lock = mode;
	return gmsfs_remap_all(g, timeout_ms);
}

int gmsfs_paused(const gmsfs *g)
{
	return g && g->paused;
}

int gmsfs_resume(gmsfs *g, int mode, int timeout_ms)
{
	if (!g)
		return -EINVAL;
	if (!g->paused)
		return gm_error(g, -EINVAL, "resume: the handle is not paused");
	bool keep_read_only = mode == (GMSFS_RW_DATA | GMSFS_KEEP_READ_ONLY);
	if (keep_read_only)
		mode = GMSFS_RW_DATA;
	if (mode != GMSFS_RO && mode != GMSFS_RW_DATA)
		return gm_error(g, -EINVAL, "resume: mode %d: GMSFS_RO, GMSFS_RW_DATA or GMSFS_RW_DATA | "
				"GMSFS_KEEP_READ_ONLY", mode);
	int64_t deadline = timeout_ms > 0 ? gm_now_ms() + timeout_ms : 0;
	double t0 = gm_tracing() ? gm_us() : 0;
	struct gmsfs_ioc io;
	for (;;) {
		int left = timeout_ms > 0 ? (int)(deadline - gm_now_ms()) : timeout_ms;
		if (timeout_ms > 0 && left <= 0)
			return gm_error(g, -ETIMEDOUT, "%s: resume: not granted within %d ms", g->dir, timeout_ms);
		/* Its mappings are made writable below, or by gmsfs_protect, each after the daemon
		 * is told (sp_write_in_place): the grant itself writes nothing in place. */
		io = (struct gmsfs_ioc){ .size = sizeof io, .flags = GMSFS_LOCK_ASKS_IN_PLACE | (g->own ? GMSFS_LOCK_OWN : 0),
					 .mode = (uint32_t)mode, .timeout_ms = left };
		if (!ioctl(g->dirfd, GMSFS_IOC_LOCK, &io))
			break;
		int e = errno;
		if (e == ENOTCONN || e == ECONNABORTED || e == ESTALE || e == ENOENT)
			return resume_anew(g, mode, timeout_ms);
		if (e != EINTR || g->eintr) /* still paused: EAGAIN, ETIMEDOUT, EUCLEAN (torn) */
			return gm_error(g, -e, "%s: resume: %s", g->dir, e == EUCLEAN ? "the store is torn (see its state)"
										: strerror(e));
	}
	double t1 = t0 ? gm_us() : 0;
	g->paused = false;
	g->info = io;
	g->lock = (int)io.lock;
	/* A resumed writer's session is held by this handle (its process the leader): no
	 * STORE/lock is opened for children, as connect opens one (a round trip and, at the
	 * pause, two more, on a refit's path).  A child it starts joins by opening lock. */
	g->granted_rw |= g->lock == GMSFS_RW;
	/* The channel is bound to this very handle still: kept (a round trip less for the
	 * commit); the new ticket binds one only where it went meanwhile. */
	memcpy(g->ticket, io.ticket, sizeof g->ticket);
	g->have_ticket = g->ch.sock < 0;
	int e = 0;
	if (io.remap) { /* a version was committed beside it: every mapping over the last commit */
		struct flip f = { .g = g };
		struct ch_manifest m = { .consume = flip_batch, .ctx = &f };
		if (!(e = export_all(g, &m)))
			ch_manifest_free(&m);
	}
	/* Paused, the mappings were read-only: a writer's become writable (or stay read-only,
	 * made writable one by one with gmsfs_protect), and say so, that its commit may make
	 * them read-only again. */
	bool writable = g->lock == GMSFS_RW && !keep_read_only;
	if (!e && writable)
		e = sp_write_in_place(g, NULL, 0);
	if (!e && (writable || io.remap) && (e = mp_allow_all(g, false, writable)))
		gm_error(g, e, "resume: setting the access of the mapped memory: %s", strerror(-e));
	if (!e && writable) {
		sp_allow_all(g, true);
		for (size_t i = 0; i < g->nmaps; i++)
			g->maps[i].writable = g->slots[i].mapped;
	}
	if (t0)
		fprintf(stderr, "gmsfs resume: %.0f us: granted after %.0f us, "
			"remapped and access set %.0f us (from %.0f)\n",
			gm_us() - t0, t1 - t0, gm_us() - t1, gm_trace_clock(t0));
	if (e) { /* after the grant: the lock goes back untouched (nothing was written in place
		  * by this call: the store stays as it was), the mappings with it, as
		  * unmap_all leaves them: remap_all maps them again, under a read lock */
		char why[sizeof g->err];
		memcpy(why, g->err, sizeof why);
		gmsfs_unmap_all(g);
		g->unmapped_lock = GMSFS_RO;
		memcpy(g->err, why, sizeof why);
	}
	return e;
}
