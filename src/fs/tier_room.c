/* tier_room: room on the device for a create or a move in (tier.h, tier_move.h): idle
 * stores give way, lowest priority first, least recently used within a priority; for a
 * move in, they go out while the store comes in, both ways at once (vmm_switch). */
#include "tier.h"
#include "tier_move.h"
#include "lock.h"
#include "wait.h"
#include "store.h"
#include "clock.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The device bytes st would give back by moving out for self: 0 when it may not (in
 * use, self, not on the device). */
static uint64_t may_give(struct store *st, const struct store *self)
{
	if (st == self || st->tier.at != TIER_DEVICE || !tier_idle(st))
		return 0;
	struct meta_stats ms;
	meta_stats(st->meta, &ms);
	return ms.aligned_bytes;
}

/* The store to give way next: lowest priority, then least recently used. */
static struct store *victim(struct fs *fs, struct store *self)
{
	struct store_table *t = fs->stores;
	struct store *best = NULL;
	for (size_t i = 0; i < t->n; i++) {
		struct store *st = t->v[i];
		if (!may_give(st, self))
			continue;
		if (!best || tier_gives_way_before(st, best))
			best = st;
	}
	return best;
}

/* Why nothing more can move: the stores that hold device memory and why they stay. */
static void holders(struct fs *fs, char *why, size_t whylen, uint64_t bytes)
{
	struct vmm *v = fs->vmm;
	size_t n = (size_t)snprintf(why, whylen, "%llu bytes more do not fit (used %llu of %llu; host tier %llu of %llu)",
				    (unsigned long long)bytes, (unsigned long long)atomic_load(&v->used_bytes),
				    (unsigned long long)v->max_bytes, (unsigned long long)atomic_load(&v->host_used),
				    (unsigned long long)v->host_bytes);
	struct store_table *t = fs->stores;
	for (size_t i = 0; i < t->n && n < whylen; i++) {
		struct store *st = t->v[i];
		struct meta_stats ms;
		meta_stats(st->meta, &ms);
		if (st->tier.at == TIER_HOST || !ms.aligned_bytes)
			continue;
		const struct fsm *f = &store_lock(st)->fsm;
		n += (size_t)snprintf(why + n, whylen - n, "; %s holds %llu (%s)", st->name,
				      (unsigned long long)ms.aligned_bytes,
				      f->leader ? "writer" : f->readers ? "in use" : !f->committed ? "not committed" :
				      st->tier.at != TIER_DEVICE ? "moving" : "idle");
	}
}

int tier_make_room(struct fs *fs, struct store *self, uint64_t bytes, char *why, size_t whylen)
{
	struct vmm *v = fs->vmm;
	uint64_t used = atomic_load(&v->used_bytes);
	uint64_t free_now = used < v->max_bytes ? v->max_bytes - used : 0;
	/* Called after a create failed: past the budget, what it lacks; within it (the
	 * device itself is full), as much as asked. */
	uint64_t need = bytes > free_now ? bytes - free_now : bytes, freed = 0;
	/* Nothing moves unless enough can: idle stores enough, and room for them on the host
	 * (what stores have on standby for their next move out is room: host_room gives it up). */
	uint64_t movable = 0, host_used = atomic_load(&v->host_used) - atomic_load(&v->host_standby);
	struct store_table *t = fs->stores;
	for (size_t i = 0; i < t->n && !fs->handing_over; i++)
		movable += may_give(t->v[i], self);
	if (movable < need || host_used > v->host_bytes || need > v->host_bytes - host_used)
		need = UINT64_MAX; /* then the loop below moves nothing */
	while (freed < need && need != UINT64_MAX) {
		struct store *st = victim(fs, self);
		if (!st)
			break;
		uint64_t bytes = may_give(st, self);
		store_get(st);
		int e = tier_move(fs, st, true, "evict");
		if (!e) {
			fs->tier->stats.evictions++;
			fuse_log(FUSE_LOG_INFO, "gmsfs: %s (priority %d) gave way for %s\n", st->name, st->tier.priority,
				 self ? self->name : "another store");
			freed += bytes;
		}
		store_put(st, 1);
		if (e)
			break;
	}
	if (freed >= need)
		return 0;
	holders(fs, why, whylen, bytes);
	return -ENOSPC;
}


/* ---- a switch: the stores that give way go out while st comes in ---- */

struct switch_run {
	struct fs *fs;
	struct store *in;              /* the store coming in */
	struct store **gone;           /* those that give way, ngone of them, a reference each */
	size_t ngone;
	struct vmm_bufs outs, ins;     /* their buffers, and its on the host tier */
	struct store **owner;          /* of each buffer going out */
	uint64_t out_bytes, in_bytes, new_host;
};

/* vmm_switch's: a piece has gone out.  Its stores take the host memory and name it in their
 * images; then the device memory it left is given back: the room the next ins come into.
 * A crash between the two brings each store back from an image whose memory is all there. */
static void switch_out_done(void *arg, struct vmm_buf *const *outs, struct vmm_buf **twins, size_t n)
{
	struct switch_run *r = arg;
	struct fs *fs = r->fs;
	size_t first = (size_t)(outs - r->outs.v);
	pthread_mutex_lock(&fs->mu);
	vmm_take(outs, twins, n);
	for (size_t i = 0; i < n; i++)
		if (i == 0 || r->owner[first + i] != r->owner[first + i - 1])
			store_changed(r->owner[first + i], "switch");
	for (size_t i = 0; i < n; i++)
		store_give_back(r->owner[first + i], twins[i]);
	pthread_mutex_unlock(&fs->mu);
}

/* The stores that give way for bytes more on the device: idle, the first to give way
 * first, enough of them or none (*n 0). */
static struct store **pick(struct fs *fs, struct store *self, uint64_t bytes, size_t *n)
{
	struct vmm *v = fs->vmm;
	uint64_t used = atomic_load(&v->used_bytes), freed = 0;
	uint64_t need = used > v->max_bytes ? used - v->max_bytes + bytes : bytes > v->max_bytes - used ? bytes - (v->max_bytes - used) : 0;
	uint64_t movable = 0, host_used = atomic_load(&v->host_used) - atomic_load(&v->host_standby);
	struct store_table *t = fs->stores;
	for (size_t i = 0; i < t->n; i++)
		movable += may_give(t->v[i], self);
	*n = 0;
	if (!need || movable < need || host_used > v->host_bytes || need > v->host_bytes - host_used)
		return NULL;
	struct store **out = calloc(t->n + 1, sizeof *out);
	while (out && freed < need) {
		struct store *st = victim(fs, self);
		if (!st)
			break; /* not expected: movable said enough */
		freed += may_give(st, self);
		st->tier.at = TIER_TO_HOST; /* nobody is granted it now, and victim looks past it */
		out[(*n)++] = st;
		store_get(st);
	}
	return out;
}

/* The buffers of the switch: the store's on the host tier (all of it, or what a switch
 * that stopped mid-way left there), and those of the stores that give way. */
static int gather(struct switch_run *r)
{
	int e = meta_walk(meta_root(r->in->meta, META_AREA_ALLOCS), tier_collect, &r->ins);
	size_t n = 0;
	for (size_t i = 0; i < r->ins.n; i++) {
		if (r->ins.v[i]->host)
			r->ins.v[n++] = r->ins.v[i], r->in_bytes += r->ins.v[i]->size;
		else
			vmm_buf_put(r->ins.v[i]);
	}
	r->ins.n = n;
	for (size_t k = 0; !e && k < r->ngone; k++) {
		size_t had = r->outs.n;
		e = meta_walk(meta_root(r->gone[k]->meta, META_AREA_ALLOCS), tier_collect, &r->outs);
		struct store **o = e ? NULL : realloc(r->owner, (r->outs.n + 1) * sizeof *o);
		e = e ? e : o ? 0 : -ENOMEM;
		for (size_t i = had; o && i < r->outs.n; i++) {
			o[i] = r->gone[k];
			r->out_bytes += r->outs.v[i]->size;
			r->new_host += r->outs.v[i]->standby ? 0 : r->outs.v[i]->size;
		}
		r->owner = o ? o : r->owner;
	}
	return e;
}

/* After the switch, each store that gave way ends on one tier: wholly on the host; or,
 * where a failure stopped it mid-way, moved on (else back); or on the device, untouched. */
static void settle(struct switch_run *r)
{
	struct tier_stats *k = &r->fs->tier->stats;
	for (size_t i = 0; i < r->ngone; i++) {
		struct store *g = r->gone[i];
		uint64_t moved = 0, stayed = 0;
		for (size_t j = 0; j < r->outs.n; j++)
			if (r->owner[j] == g)
				*(r->outs.v[j]->host ? &moved : &stayed) += r->outs.v[j]->size;
		g->tier.at = moved ? TIER_HOST : TIER_DEVICE;
		g->tier.standby = false;
		g->tier.ahead_tried = 0;
		if (moved && stayed && tier_move(r->fs, g, true, "evict") && tier_move(r->fs, g, false, "evict"))
			fuse_log(FUSE_LOG_ERR, "gmsfs: %s: left on both tiers: a move in moves the rest\n", g->name);
		if (moved && !stayed) {
			g->tier.moves_out++;
			k->moves_out++, k->bytes_out += moved, k->evictions++;
			fuse_log(FUSE_LOG_INFO, "gmsfs: %s (priority %d) gave way for %s\n", g->name, g->tier.priority,
				 r->in->name);
		}
		store_changed(g, "evict");
		wait_unblock(g);
		lock_changed(g);
		store_put(g, 1);
	}
}

int tier_switch_in(struct fs *fs, struct store *st, uint64_t bytes, char *why, size_t whylen)
{
	struct switch_run r = { .fs = fs, .in = st };
	r.gone = fs->handing_over ? NULL : pick(fs, st, bytes, &r.ngone);
	if (!r.ngone) {
		free(r.gone);
		holders(fs, why, whylen, bytes);
		return -ENOSPC;
	}
	struct vmm_bufs given_up = {0};
	int e = gather(&r);
	if (!e)
		tier_host_room(fs, NULL, r.new_host, &given_up);
	st->tier.at = TIER_TO_DEVICE;
	for (size_t k = 0; k < r.ngone; k++)
		store_notify(r.gone[k]);
	store_notify(st);
	uint64_t t0 = clock_mono_ns();
	struct vmm_buf **in_twins = NULL;
	pthread_mutex_unlock(&fs->mu);
	vmm_bufs_release(&given_up);
	struct vmm_switch_ops ops = { .out_done = switch_out_done, .arg = &r };
	if (!e)
		e = vmm_switch(r.outs.v, r.outs.n, r.ins.v, r.ins.n, &ops, &in_twins, why, whylen);
	pthread_mutex_lock(&fs->mu);
	if (!e) { /* st takes its device memory; the host memory it had is on standby for its next move out */
		vmm_take(r.ins.v, in_twins, r.ins.n);
		vmm_set_standby(r.ins.v, in_twins, r.ins.n);
		st->tier.at = TIER_DEVICE;
		st->tier.standby = true;
		st->tier.ahead_tried = 0;
		st->tier.moves_in++;
		fs->tier->stats.moves_in++, fs->tier->stats.bytes_in += r.in_bytes;
		store_changed(st, "switch");
		wait_unblock(st);
		fuse_log(FUSE_LOG_INFO, "gmsfs: %s: switched in, %" PRIu64 " bytes in and %" PRIu64 " out (%s%s) at once "
					"in %.3f ms: %" PRIu64 " rounds, copies %.3f ms, new memory %.3f ms, given back "
					"%.3f ms\n", st->name, r.in_bytes, r.out_bytes, r.gone[0]->name,
			 r.ngone > 1 ? " and others" : "", (double)(clock_mono_ns() - t0) / 1e6, ops.rounds,
			 (double)ops.ns_copy / 1e6, (double)ops.ns_memory / 1e6, (double)ops.ns_done / 1e6);
	} else {
		st->tier.at = TIER_HOST; /* its new memory went back: the caller says why */
	}
	settle(&r);
	store_room_changed(fs);
	lock_changed(st);
	free(r.gone);
	free(r.owner);
	pthread_mutex_unlock(&fs->mu);
	vmm_bufs_release(&r.outs);
	vmm_bufs_release(&r.ins);
	pthread_mutex_lock(&fs->mu);
	return e;
}
