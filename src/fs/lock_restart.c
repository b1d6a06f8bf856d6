/* lock_restart: readers across a restart (gmsfs(5), RESTART): the holds a daemon before
 * this one granted, kept for the processes that still live, given back as they let go
 * or end; a store brought back from its image.  Part of lock (lock.h); under fs->mu. */
#include "lock.h"
#include "caller.h"
#include "clock.h"
#include "grow.h"
#include "handle.h"
#include "store.h"

#include <assert.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* ---- readers across a restart ---- */

int lock_readers(struct store *st, struct lock_reader **out, size_t *n)
{
	struct lock *l = &st->lock;
	*out = NULL;
	*n = 0;
	/* A kept cache's engine (gmsfs(5), Kept caches): after a restart no other writer may
	 * map its pages while it lives, so it is kept as a reader that may take them back. */
	bool keeper = l->fsm.kept && l->fsm.leader && !l->fsm.in_place;
	if (!l->nreaders && !keeper)
		return 0;
	struct lock_reader *v = malloc((l->nreaders + 1) * sizeof *v);
	if (!v)
		return -ENOMEM;
	if (keeper && !caller_start_time(l->fsm.leader, &v[0].start)) {
		v[0] = (struct lock_reader){ .pid = l->fsm.leader, .start = v[0].start, .handles = 1, .writer = true };
		(*n)++;
	}
	for (size_t i = 0; i < l->nreaders; i++) {
		struct lock_reader *r = &l->readers[i];
		if (!r->start && caller_start_time(r->pid, &r->start))
			continue; /* gone: its release is on its way */
		v[(*n)++] = *r;
	}
	*out = v;
	return 0;
}

void lock_inherit(struct store *st, const struct lock_reader *v, size_t n)
{
	struct lock *l = &st->lock;
	for (size_t i = 0; i < n; i++) {
		uint64_t start;
		unsigned holds = v[i].handles + v[i].inherited;
		if (!holds || caller_start_time(v[i].pid, &start) || start != v[i].start)
			continue; /* ended meanwhile (or its pid is another process's now) */
		if (lock_reader_find(l, v[i].pid) || GROW(l->readers, l->nreaders, l->readers_cap, 8))
			continue;
		l->readers[l->nreaders++] = (struct lock_reader){ .pid = v[i].pid, .start = start, .inherited = holds,
								  .writer = v[i].writer };
		l->fsm.readers += holds;
		l->inherited += holds;
		store_get(st); /* as a handle would: a removed store lives while it is read */
		fuse_log(FUSE_LOG_INFO, "gmsfs: %s: pid %d read it before the restart: it keeps %u read lock%s\n",
			 st->name, (int)v[i].pid, holds, holds == 1 ? "" : "s");
	}
}

static void inherited_go(struct store *st, struct lock_reader *r, unsigned k)
{
	lock_inherited_go(st, r, k, true);
}

int lock_let_go(struct store *st, pid_t tgid)
{
	struct lock_reader *r = st->lock.inherited ? lock_reader_find(&st->lock, tgid) : NULL;
	if (!r || !r->inherited)
		return -ENOLCK;
	inherited_go(st, r, 1);
	return 0;
}

int lock_let_go_removed(struct fs *fs, pid_t tgid, const uint8_t hash[GMSFS_HASH_LEN])
{
	struct store_table *t = fs->stores;
	for (size_t i = 0; i < t->nremoved; i++) {
		struct store *st = t->removed[i];
		uint8_t h[GMSFS_HASH_LEN];
		struct lock_reader *r = st->lock.inherited ? lock_reader_find(&st->lock, tgid) : NULL;
		if (!r || !r->inherited || !st->meta || !meta_hash(st->meta, h) || memcmp(h, hash, sizeof h))
			continue;
		store_get(st);
		inherited_go(st, r, 1);
		store_put(st, 1); /* its memory goes with this, if it was the last */
		return 0;
	}
	return -ENOLCK;
}

void lock_bridge(struct store *st, pid_t tgid)
{
	struct lock *l = &st->lock;
	struct lock_reader *r = lock_reader_find(l, tgid);
	if (!r && !GROW(l->readers, l->nreaders, l->readers_cap, 8)) {
		r = &l->readers[l->nreaders++];
		*r = (struct lock_reader){ .pid = tgid };
	}
	if (!r || (!r->start && caller_start_time(tgid, &r->start)))
		return; /* no bridge: the open made again waits as any */
	if (!r->inherited)
		store_get(st); /* as lock_inherit's */
	r->inherited++;
	r->bridged++;
	r->bridge_until = clock_mono_ns() + 5000000000ull;
	l->inherited++;
	l->fsm.readers++;
	store_readers_changed(st);
}

void lock_reap(struct store *st)
{
	struct lock *l = &st->lock;
	uint64_t now = clock_mono_ns();
	store_get(st); /* the last inherited hold of a removed store may be its last reference */
	for (size_t i = 0; l->inherited && i < l->nreaders;) {
		struct lock_reader *r = &l->readers[i];
		uint64_t start;
		unsigned k = 0;
		if (r->inherited && (caller_start_time(r->pid, &start) || start != r->start)) {
			k = r->inherited;
			fuse_log(FUSE_LOG_INFO, "gmsfs: %s: pid %d, which kept a read lock, ended\n", st->name, (int)r->pid);
		} else if (r->bridged && now > r->bridge_until) {
			k = r->bridged; /* its open was not made again */
		}
		if (!k) {
			i++;
			continue;
		}
		r->bridged = 0;
		size_t had = l->nreaders;
		inherited_go(st, r, k);
		if (l->nreaders == had)
			i++; /* it holds handles too: it stays */
	}
	store_put(st, 1);
}

void lock_restore(struct store *st, uint64_t generation, bool torn, uint64_t commits)
{
	st->lock.fsm.committed = generation != 0;
	st->lock.fsm.generation = generation;
	st->lock.fsm.torn = torn;
	st->lock.commits = commits;
}
