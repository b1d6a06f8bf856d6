/* tier_move: a store's move between the tiers and what moves share (tier_move.h): the
 * bottom of the tier module, under tier.c (the mover thread) and tier_room.c (room). */
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

/* Nobody holds it, waits for it, or writes it, and something is committed: it may move. */
bool tier_idle(const struct store *st)
{
	const struct fsm *f = &store_lock(st)->fsm;
	return !st->removed && st->meta && f->committed && !f->leader && !f->readers && !f->paused &&
	       !f->waiting_writers && !f->waiting_readers;
}

int tier_collect(struct meta_node *n, void *arg)
{
	if (n->kind != META_ALLOC || !n->buf)
		return 0;
	int e = 0;
	for (size_t i = 0; i < vmm_npieces(n->buf) && !e; i++) { /* memory moves piece by piece */
		struct vmm_buf *b = vmm_piece(n->buf, i);
		if (!(e = vmm_bufs_push(arg, b)))
			vmm_buf_get(b);
	}
	return e;
}

/* The host memory each allocation has on standby, taken off it (the list owns it). */
static int collect_standby(struct meta_node *n, void *arg)
{
	if (n->kind != META_ALLOC || !n->buf)
		return 0;
	int e = 0;
	for (size_t i = 0; i < vmm_npieces(n->buf) && !e; i++) {
		struct vmm_buf *b = vmm_piece(n->buf, i);
		if (b->standby && !(e = vmm_bufs_push(arg, b->standby)))
			vmm_take_standby(b);
	}
	return e;
}

bool tier_gives_way_before(const struct store *a, const struct store *b)
{
	return a->tier.priority < b->tier.priority ||
	       (a->tier.priority == b->tier.priority && a->tier.last_used < b->tier.last_used);
}

void tier_host_room(struct fs *fs, const struct store *self, uint64_t bytes, struct vmm_bufs *out)
{
	struct vmm *v = fs->vmm;
	uint64_t taken = 0;
	for (;;) {
		uint64_t used = atomic_load(&v->host_used) - taken;
		if (used <= v->host_bytes && bytes <= v->host_bytes - used)
			return;
		struct store *best = NULL;
		for (size_t i = 0; i < fs->stores->n; i++) {
			struct store *st = fs->stores->v[i];
			bool has = st != self && st->tier.standby && st->tier.at == TIER_DEVICE;
			if (has && (!best || tier_gives_way_before(st, best)))
				best = st;
		}
		if (!best)
			return;
		size_t had = out->n;
		best->tier.standby = false;
		/* Short of memory for the list: less is given up, nothing is lost. */
		(void)meta_walk(meta_root(best->meta, META_AREA_ALLOCS), collect_standby, out);
		for (size_t i = had; i < out->n; i++)
			taken += out->v[i]->size;
		/* A state file named it: written again without it, so that the service manager
		 * lets it go with the daemon (a failure keeps it there until the next image). */
		store_changed(best, "standby");
	}
}

int tier_move(struct fs *fs, struct store *st, bool to_host, const char *what)
{
	if (fs->handing_over)
		return -EAGAIN; /* the successor has the store as it is */
	struct vmm_bufs c = {0}, given_up = {0};
	int e = meta_walk(meta_root(st->meta, META_AREA_ALLOCS), tier_collect, &c);
	uint64_t bytes = 0, new_host = 0;
	for (size_t i = 0; i < c.n; i++) {
		if (c.v[i]->host == to_host)
			continue; /* there already: a switch that stopped mid-way */
		bytes += c.v[i]->size;
		new_host += c.v[i]->standby ? 0 : c.v[i]->size;
	}
	if (!e && to_host)
		tier_host_room(fs, st, new_host, &given_up);
	char why[300] = "";
	st->tier.at = to_host ? TIER_TO_HOST : TIER_TO_DEVICE;
	store_notify(st);
	uint64_t t0 = clock_mono_ns();
	struct vmm_buf **old = NULL;
	uint64_t ns[2] = {0, 0};
	if (!e) {
		pthread_mutex_unlock(&fs->mu);
		vmm_bufs_release(&given_up); /* what others had on standby for their next move out: no image names it now */
		e = vmm_move(c.v, c.n, to_host, &old, ns, why, sizeof why);
		if (!e && !to_host) { /* host memory: on standby for the next move out (host_room gives it up) */
			vmm_set_standby(c.v, old, c.n);
			old = NULL;
		}
		pthread_mutex_lock(&fs->mu);
	} else {
		vmm_bufs_release(&given_up);
	}
	double s = (double)(clock_mono_ns() - t0) / 1e9;
	st->tier.standby = !to_host && !e; /* a move out used what was on standby, or gave it back */
	st->tier.ahead_tried = 0;
	struct tier_stats *k = &fs->tier->stats;
	if (e) {
		/* Where it is: on the device only if nothing of it is on the host (a move in that
		 * failed, or a switch stopped mid-way, is tried again from here). */
		bool some_host = false;
		for (size_t i = 0; i < c.n; i++)
			some_host |= c.v[i]->host;
		st->tier.at = some_host ? TIER_HOST : TIER_DEVICE;
		k->failures++;
		store_error(st, "moving to the %s tier: %s", to_host ? "host" : "device", why[0] ? why : strerror(-e));
		fuse_log(FUSE_LOG_WARNING, "gmsfs: %s: %s\n", st->name, st->last_error);
	} else {
		st->tier.at = to_host ? TIER_HOST : TIER_DEVICE;
		*(to_host ? &st->tier.moves_out : &st->tier.moves_in) += 1;
		*(to_host ? &k->moves_out : &k->moves_in) += 1;
		*(to_host ? &k->bytes_out : &k->bytes_in) += bytes;
		fuse_log(FUSE_LOG_INFO,
			 "gmsfs: %s: %" PRIu64 " bytes in %zu allocations moved to the %s tier in %.3f ms "
			 "(new memory %.3f ms, copy %.3f ms)\n",
			 st->name, bytes, c.n, to_host ? "host" : "device", s * 1e3, (double)ns[0] / 1e6, (double)ns[1] / 1e6);
		/* The device memory it left goes once the image names the host memory (a crash
		 * before brings the store back from its old image, whose memory is all there),
		 * and before fs->mu goes: whoever sees the store on the host tier sees that
		 * memory free (device: used_bytes). */
		for (size_t i = 0; old && i < c.n; i++)
			store_give_back(st, old[i]);
		free(old);
		old = NULL;
		store_changed(st, what);
		wait_unblock(st);
		store_room_changed(fs);
	}
	lock_changed(st); /* the waiters for a move in are granted now (or go on waiting) */
	pthread_mutex_unlock(&fs->mu);
	vmm_bufs_release(&c);
	pthread_mutex_lock(&fs->mu);
	return e;
}

