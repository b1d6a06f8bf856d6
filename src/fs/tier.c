/* tier: the host tier (tier.h): moves asked for and the mover thread that does them, host
 * memory made ahead, quotas and priorities; tier_move.c moves a store, tier_room.c makes
 * room (evictions, switches). */
#include "tier.h"
#include "tier_move.h"
#include "lock.h"
#include "wait.h"
#include "store.h"
#include "size.h"
#include "clock.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int tier_request(struct store *st, const char *text, size_t len)
{
	while (len && (text[len - 1] == '\n' || text[len - 1] == ' '))
		len--;
	bool host = len == 4 && !memcmp(text, "host", 4), device = len == 6 && !memcmp(text, "device", 6);
	if (!host && !device) {
		store_error(st, "tier: write host or device");
		return -EINVAL;
	}
	if (st->fs->handing_over)
		return -EAGAIN;
	if (host && st->tier.at == TIER_DEVICE) {
		const struct fsm *f = &store_lock(st)->fsm;
		if (!f->committed) {
			store_error(st, "tier: nothing committed to move");
			return -EINVAL;
		}
		if (!tier_idle(st)) {
			store_error(st, "tier: in use (%s): a store moves only when nobody holds or waits for it",
				    f->leader ? "a writer session" : f->readers ? "readers" : "waiting opens");
			return -EBUSY;
		}
		st->tier.want_host = true;
	} else if (device && st->tier.at != TIER_DEVICE) {
		st->tier.want_device = true;
		st->tier.failed = false;
	}
	pthread_cond_signal(&st->fs->tier_wake);
	return 0;
}

/* The next move asked for, under fs->mu: a store to bring back first (someone waits). */
static struct store *next_job(struct fs *fs, bool *to_host)
{
	struct store_table *t = fs->stores;
	if (fs->handing_over)
		return NULL; /* asked again when the handover fails */
	for (size_t i = 0; i < t->n; i++) {
		struct store *st = t->v[i];
		/* A move in that failed for room is tried again once room may have come free,
		 * while an open waits for it (a request alone is not asked again). */
		bool again = st->tier.failed && st->tier.failed_room != fs->room_gen && store_lock(st)->waiters;
		if (st->tier.want_device && st->tier.at == TIER_HOST && (!st->tier.failed || again)) {
			*to_host = false;
			return st;
		}
	}
	for (size_t i = 0; i < t->n; i++) {
		struct store *st = t->v[i];
		if (st->tier.want_host) {
			st->tier.want_host = false;
			if (st->tier.at == TIER_DEVICE && tier_idle(st) && !st->tier.want_device) {
				*to_host = true;
				return st;
			}
		}
	}
	return NULL;
}

/* host_ahead's next store: committed, on the device, not tried since it last moved or
 * committed (make_ahead skips what has host memory on standby already); the one that would give
 * way first.  In use or not: making its host memory touches nothing of it, and an
 * engine that sleeps is moved out at once when another wakes.  NULL: none. */
static struct store *ahead_next(struct fs *fs)
{
	struct store *best = NULL;
	for (size_t i = 0; i < fs->stores->n && !fs->handing_over; i++) {
		struct store *st = fs->stores->v[i];
		if (st->tier.at == TIER_DEVICE && st->tier.ahead_tried != store_lock(st)->fsm.generation + 1 &&
		    st->meta && !st->removed &&
		    store_lock(st)->fsm.committed &&
		    (!best || tier_gives_way_before(st, best)))
			best = st;
	}
	return best;
}

/* Host memory is made ahead while the mount is quiet: pinning gigabytes holds the driver
 * while it runs, and an engine that maps or commits meanwhile waits behind it (H100: a
 * cold from_pretrained of 8 GB took 2.2 s beside it, 0.25 s without).  Quiet: no request
 * that maps, makes or commits for a second (fs_busy); after 10 s of waiting it is made
 * anyway, so that a mount never quiet still has it.  Its first use by the copier (the
 * touch: the helper's start, its mappings and a copy) is what fresh readers felt (H200,
 * 16 GiB, a reader every 0.2 s: the pinning left their imports as they were, the touch's
 * start made two of them 8x and 15x slower): it waits for a quiet mount for 60 s, and
 * goes in groups of at most AHEAD_TOUCH_BYTES, each after a quiet second. */
#define AHEAD_QUIET_NS 1000000000ull
#define AHEAD_WAIT_MAX_NS 10000000000ull
#define AHEAD_TOUCH_WAIT_MAX_NS 60000000000ull
#define AHEAD_TOUCH_BYTES (256ull << 20)

/* Under fs->mu: may host memory be made (touch: used by the copier) now? */
static bool ahead_may(struct fs *fs, bool touch)
{
	struct tier *tr = fs->tier;
	uint64_t now = clock_mono_ns(), busy = atomic_load_explicit(&fs->busy_ns, memory_order_relaxed);
	uint64_t quiet = now > busy ? now - busy : 0, waited = tr->ahead_since ? now - tr->ahead_since : 0;
	if (quiet >= AHEAD_QUIET_NS || waited >= (touch ? AHEAD_TOUCH_WAIT_MAX_NS : AHEAD_WAIT_MAX_NS))
		return true;
	if (!tr->ahead_since)
		tr->ahead_since = now;
	return false;
}

/* A move asked for (next_job's): the making waits no longer for quiet. */
static bool move_asked(struct fs *fs)
{
	for (size_t i = 0; i < fs->stores->n; i++)
		if (fs->stores->v[i]->tier.want_host || fs->stores->v[i]->tier.want_device)
			return true;
	return false;
}

/* The mover thread sleeps on tier_wake (fs->mu held) for ms at most. */
static void tier_nap(struct fs *fs, long ms)
{
	struct timespec t = clock_after_ms(CLOCK_REALTIME, ms);
	pthread_cond_timedwait(&fs->tier_wake, &fs->mu, &t);
}

/* Without fs->mu: between two pieces of host memory, wait while the mount is busy.
 * Returns the nanoseconds waited. */
static uint64_t ahead_pause(struct fs *fs, bool touch)
{
	uint64_t t0 = clock_mono_ns();
	pthread_mutex_lock(&fs->mu);
	while (!fs->tier->stop && !ahead_may(fs, touch) && !move_asked(fs))
		tier_nap(fs, 100);
	pthread_mutex_unlock(&fs->mu);
	return clock_mono_ns() - t0;
}

/* The first use of made[0..n) by the copier, in groups of AHEAD_TOUCH_BYTES (a larger
 * buffer alone), each after a quiet second (ahead_may).  Only slower without: a failure is
 * said, not returned.  Returns the nanoseconds waited. */
static uint64_t touch_ahead(struct fs *fs, const struct store *st, struct vmm_buf **made, size_t n)
{
	uint64_t paused = 0;
	for (size_t i = 0; vmm_touches(fs->vmm) && i < n;) {
		if (!made[i]) {
			i++; /* none made for it (it had some on standby): nothing to wait for */
			continue;
		}
		size_t end = i;
		uint64_t bytes = 0;
		while (end < n && (end == i || !made[end] || bytes + made[end]->size <= AHEAD_TOUCH_BYTES))
			bytes += made[end] ? made[end]->size : 0, end++;
		paused += ahead_pause(fs, true);
		char err[300] = "";
		if (vmm_touch_host(made + i, end - i, err, sizeof err)) {
			fuse_log(FUSE_LOG_WARNING, "gmsfs: %s: host memory ahead, its first use: %s\n", st->name, err);
			break;
		}
		i = end;
	}
	return paused;
}

/* A store whose host memory on standby all came from the daemon before (a takeover or a
 * restart: image.c): used once by this daemon's copier, as memory made here is.  Under
 * fs->mu, released meanwhile. */
static void touch_taken_over(struct fs *fs, struct store *st, const struct vmm_bufs *c)
{
	struct vmm_buf **k = vmm_touches(fs->vmm) ? calloc(c->n + 1, sizeof *k) : NULL;
	if (!k) {
		st->tier.standby_untouched = false;
		return;
	}
	for (size_t i = 0; i < c->n; i++)
		if ((k[i] = c->v[i]->standby))
			vmm_buf_get(k[i]); /* given up for room meanwhile, it lives until touched */
	store_get(st);
	pthread_mutex_unlock(&fs->mu);
	uint64_t t0 = clock_mono_ns(), paused = touch_ahead(fs, st, k, c->n);
	fuse_log(FUSE_LOG_INFO, "gmsfs: %s: host memory on standby from the daemon before, first used by this "
				"daemon's copier in %.3f s (and %.3f s waiting for a quiet mount)\n",
		 st->name, (double)(clock_mono_ns() - t0 - paused) / 1e9, (double)paused / 1e9);
	vmm_copies_ready(fs->vmm);
	vmm_release_all(k, c->n);
	pthread_mutex_lock(&fs->mu);
	st->tier.standby_untouched = false; /* once used (tier_standby_unused says so till then) */
	store_put(st, 1);
}

/* Make one store's host memory ahead of its first move out (pinning gigabytes takes
 * seconds: a first move out would otherwise wait for it), within the room host_bytes
 * leaves; nothing others have on standby is given up for it.  Under fs->mu, released while the
 * memory is made.  False: nothing to do now (nothing to make, or the mount is busy). */
static bool make_ahead(struct fs *fs)
{
	struct store *st = ahead_next(fs);
	if (!st)
		fs->tier->ahead_since = 0; /* nothing waits */
	if (!st || !ahead_may(fs, false))
		return false;
	st->tier.ahead_tried = store_lock(st)->fsm.generation + 1;
	struct vmm_bufs c = {0};
	uint64_t bytes = 0, generation = store_lock(st)->fsm.generation;
	int e = meta_walk(meta_root(st->meta, META_AREA_ALLOCS), tier_collect, &c);
	bool *need = e ? NULL : calloc(c.n + 1, sizeof *need); /* decided here, under fs->mu */
	for (size_t i = 0; need && i < c.n; i++)
		bytes += (need[i] = !c.v[i]->standby) ? c.v[i]->size : 0;
	struct vmm *v = fs->vmm;
	uint64_t used = atomic_load(&v->host_used);
	if (!need || !bytes || used > v->host_bytes || bytes > v->host_bytes - used) {
		if (need && !bytes && st->tier.standby_untouched)
			touch_taken_over(fs, st, &c);
		fs->tier->ahead_since = 0;
		free(need);
		pthread_mutex_unlock(&fs->mu);
		vmm_bufs_release(&c);
		pthread_mutex_lock(&fs->mu);
		return true;
	}
	store_get(st);
	pthread_mutex_unlock(&fs->mu);
	uint64_t t0 = clock_mono_ns(), paused = 0, paused_touch = 0; /* waits for quiet, not work */
	struct vmm_buf **made = calloc(c.n, sizeof *made);
	for (size_t i = 0; made && !e && i < c.n; i++)
		if (need[i]) {
			paused += ahead_pause(fs, false);
			e = vmm_make_host(c.v[i], &made[i]);
		}
	free(need);
	uint64_t t1 = clock_mono_ns();
	if (made && !e)
		paused_touch = touch_ahead(fs, st, made, c.n);
	pthread_mutex_lock(&fs->mu);
	fs->tier->ahead_since = 0; /* the pauses between pieces counted in the 10 s too */
	/* On standby only if the store is as it was: on the device, the same layout (a move or a
	 * commit meanwhile made what was made here another store's business). */
	bool same = st->tier.at == TIER_DEVICE && !st->removed && store_lock(st)->fsm.generation == generation;
	bool standby = made && !e && same;
	if (standby) {
		vmm_set_standby(c.v, made, c.n);
		made = NULL;
		st->tier.standby = true;
		store_changed(st, "ahead"); /* a state file names it: a restart keeps it */
		fuse_log(FUSE_LOG_INFO, "gmsfs: %s: %" PRIu64 " bytes of host memory made ahead of its first move out in "
					"%.3f s, first used by the copier in %.3f s (and %.3f s waiting for a quiet mount)\n",
			 st->name, bytes, (double)(t1 - t0 - paused) / 1e9,
			 (double)(clock_mono_ns() - t1 - paused_touch) / 1e9, (double)(paused + paused_touch) / 1e9);
	} else if (e && e != -ENOSPC) {
		fuse_log(FUSE_LOG_WARNING, "gmsfs: %s: host memory ahead: %s\n", st->name, strerror(-e));
	}
	store_put(st, 1);
	pthread_mutex_unlock(&fs->mu);
	if (standby)
		vmm_copies_ready(fs->vmm); /* and the copier: the first move out waits for nothing */
	vmm_release_all(made, c.n); /* what is not on standby (a failure, or the store changed) */
	vmm_bufs_release(&c);
	pthread_mutex_lock(&fs->mu);
	return true;
}

static int add_host(struct meta_node *n, void *arg)
{
	for (size_t i = 0; n->kind == META_ALLOC && n->buf && i < vmm_npieces(n->buf); i++) {
		const struct vmm_buf *b = vmm_piece(n->buf, i);
		*(uint64_t *)arg += b->host ? b->size : 0;
	}
	return 0;
}

/* The bytes of st on the host tier: all of it, or what a switch that stopped left there. */
static uint64_t host_bytes_of(struct store *st)
{
	uint64_t bytes = 0;
	meta_walk(meta_root(st->meta, META_AREA_ALLOCS), add_host, &bytes);
	return bytes;
}

static void *mover_thread(void *arg)
{
	struct fs *fs = arg;
	struct tier *tr = fs->tier;
	pthread_mutex_lock(&fs->mu);
	while (!tr->stop) {
		bool to_host;
		struct store *st = next_job(fs, &to_host);
		if (!st && tr->ahead && make_ahead(fs))
			continue; /* asked-for moves first: one store's memory at a time */
		if (!st && tr->ahead) {
			/* A store is committed without a word to this thread: look again in a second. */
			tier_nap(fs, 1000);
			continue;
		}
		if (!st) {
			pthread_cond_wait(&fs->tier_wake, &fs->mu);
			continue;
		}
		uint64_t room = fs->room_gen; /* a change after this tries a failed move in again */
		int e = 0;
		char why[400] = "";
		store_get(st); /* fs->mu is let go while stores move */
		if (!to_host) {
			/* Room first: idle stores of lower standing go out as it comes in. */
			uint64_t bytes = host_bytes_of(st), used = atomic_load(&fs->vmm->used_bytes);
			if (used > fs->vmm->max_bytes || bytes > fs->vmm->max_bytes - used)
				e = tier_switch_in(fs, st, bytes, why, sizeof why);
			/* No idle store gives way enough: elastic stores' pages are asked back, as
			 * for a create (memory.c), and the move is tried again as they are given. */
			uint64_t asked = 0;
			if (e == -ENOSPC && !st->removed && st->tier.at == TIER_HOST) {
				asked = tier_ask_back(fs, st, bytes);
			}
			if (asked) {
				store_error(st, "moving to the device tier: %llu bytes asked back of elastic stores, "
						"which have %d ms to give them", (unsigned long long)asked, TIER_RECLAIM_MS);
			} else if (e && !st->removed && st->tier.at == TIER_HOST) {
				tr->stats.failures++;
				store_error(st, "moving to the device tier: %s", why);
				fuse_log(FUSE_LOG_WARNING, "gmsfs: %s: %s\n", st->name, st->last_error);
			}
		}
		if (!e && !st->removed && (to_host || st->tier.at == TIER_HOST))
			e = tier_move(fs, st, to_host, "move");
		if (!to_host && !st->removed) {
			/* Failed: its waiters wait on, told why at their deadline (wait_block); it is
			 * tried again when room may have come free (store_room_changed). */
			st->tier.failed = e != 0;
			st->tier.failed_room = room;
			st->tier.want_device = e != 0 && st->tier.at == TIER_HOST;
			if (e)
				wait_block(st, -ENOSPC);
		}
		store_put(st, 1);
	}
	pthread_mutex_unlock(&fs->mu);
	return NULL;
}

int tier_start(struct fs *fs, uint64_t host_bytes, bool ahead)
{
	struct tier *tr = calloc(1, sizeof *tr);
	if (!tr)
		return -ENOMEM;
	tr->ahead = ahead;
	if (!host_bytes) {
		long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
		host_bytes = pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page / 2 : 0;
	}
	fs->vmm->host_bytes = host_bytes;
	fs->tier = tr;
	int e = pthread_create(&tr->thread, NULL, mover_thread, fs);
	if (e) {
		fs->tier = NULL;
		free(tr);
		return -e;
	}
	return 0;
}

void tier_stop(struct fs *fs)
{
	struct tier *tr = fs->tier;
	if (!tr)
		return;
	pthread_mutex_lock(&fs->mu);
	tr->stop = true;
	pthread_cond_signal(&fs->tier_wake);
	pthread_mutex_unlock(&fs->mu);
	pthread_join(tr->thread, NULL);
	fs->tier = NULL;
	free(tr);
}

static int add_standby(struct meta_node *n, void *arg)
{
	for (size_t i = 0; n->kind == META_ALLOC && n->buf && i < vmm_npieces(n->buf); i++) {
		const struct vmm_buf *b = vmm_piece(n->buf, i);
		*(uint64_t *)arg += b->standby ? b->standby->size : 0;
	}
	return 0;
}

uint64_t tier_standby_unused(struct fs *fs)
{
	uint64_t bytes = 0;
	for (size_t i = 0; fs->stores && i < fs->stores->n; i++)
		if (fs->stores->v[i]->tier.standby_untouched && !fs->stores->v[i]->removed)
			meta_walk(meta_root(fs->stores->v[i]->meta, META_AREA_ALLOCS), add_standby, &bytes);
	return bytes;
}

void tier_stats_read(struct fs *fs, struct tier_stats *out)
{
	*out = fs->tier ? fs->tier->stats : (struct tier_stats){0};
	out->host_bytes = fs->vmm->host_bytes;
	out->host_used = atomic_load(&fs->vmm->host_used);
	out->host_standby = atomic_load(&fs->vmm->host_standby);
}

/* ---- quota and priority ---- */

bool tier_xattr_known(const char *name)
{
	return !strcmp(name, GMSFS_XATTR_QUOTA) || !strcmp(name, GMSFS_XATTR_PRIORITY) ||
	       !strcmp(name, GMSFS_XATTR_MIN) || !strcmp(name, GMSFS_XATTR_RESERVED);
}

int tier_xattr_get(const struct store *st, const char *name, char *buf, size_t size)
{
	if (!strcmp(name, GMSFS_XATTR_PRIORITY))
		return snprintf(buf, size, "%d", st->tier.priority);
	uint64_t q = !strcmp(name, GMSFS_XATTR_QUOTA) ? atomic_load(&st->pool->quota)
		     : !strcmp(name, GMSFS_XATTR_MIN)	? atomic_load(&st->pool->min)
		     : !strcmp(name, GMSFS_XATTR_RESERVED) ? st->tier.reserved
							   : 0;
	return q ? snprintf(buf, size, "%llu", (unsigned long long)q) : -ENODATA;
}

/* user.gms.min and user.gms.reserved, their text a size already (q). */
static int set_elastic(struct store *st, const char *name, uint64_t q)
{
	if (!strcmp(name, GMSFS_XATTR_RESERVED)) {
		st->tier.reserved = q;
		store_notify(st);
		return 0;
	}
	uint64_t quota = atomic_load(&st->pool->quota);
	if (quota && q > quota) {
		store_error(st, "%s: %llu is above the store's quota, %llu", name, (unsigned long long)q,
			    (unsigned long long)quota);
		return -EINVAL;
	}
	if (vmm_pool_set_min(st->pool, q)) {
		store_error(st, "%s: %llu with the other stores' minimums (%llu lacking now) would pass the mount's "
				"%llu bytes", name, (unsigned long long)q,
			    (unsigned long long)vmm_mins_short(st->fs->vmm, st->pool),
			    (unsigned long long)st->fs->vmm->max_bytes);
		return -EINVAL;
	}
	store_notify(st);
	return 0;
}

int tier_xattr_set(struct store *st, const char *name, const char *value, size_t size)
{
	char text[32];
	if (st->fs->handing_over)
		return -EAGAIN;
	if (!size || size >= sizeof text || memchr(value, '\0', size))
		return -EINVAL;
	memcpy(text, value, size);
	text[size] = '\0';
	if (text[size - 1] == '\n')
		text[size - 1] = '\0';
	if (!strcmp(name, GMSFS_XATTR_PRIORITY)) {
		char *end;
		errno = 0;
		/* Digits with an optional '-', as user.gms.quota takes digits: no spaces, no '+'. */
		const char *digits = text + (text[0] == '-');
		long p = *digits >= '0' && *digits <= '9' ? strtol(text, &end, 10) : (end = text, 0);
		if (errno || end == text || *end || p < TIER_PRIORITY_MIN || p > TIER_PRIORITY_MAX) {
			store_error(st, "%s: an integer from %d to %d", name, TIER_PRIORITY_MIN, TIER_PRIORITY_MAX);
			return -EINVAL;
		}
		st->tier.priority = (int)p;
		store_notify(st);
		return 0;
	}
	uint64_t q;
	if (size_parse(text, &q) || !q) {
		store_error(st, "%s: a size in bytes (digits, then K, M, G or T), more than 0", name);
		return -EINVAL;
	}
	if (strcmp(name, GMSFS_XATTR_QUOTA))
		return set_elastic(st, name, q);
	uint64_t min = atomic_load(&st->pool->min);
	if (q < min) {
		store_error(st, "%s: %llu is below the store's minimum, %llu", name, (unsigned long long)q,
			    (unsigned long long)min);
		return -EINVAL;
	}
	uint64_t used = atomic_load(&st->pool->used);
	if (q < used) {
		store_error(st, "%s: %llu is below the %llu bytes the store holds", name, (unsigned long long)q,
			    (unsigned long long)used);
		return -EINVAL;
	}
	atomic_store(&st->pool->quota, q);
	store_notify(st);
	return 0;
}

int tier_xattr_remove(struct store *st, const char *name)
{
	if (st->fs->handing_over)
		return -EAGAIN;
	if (!strcmp(name, GMSFS_XATTR_PRIORITY)) {
		st->tier.priority = 0;
	} else if (!strcmp(name, GMSFS_XATTR_MIN)) {
		if (!atomic_load(&st->pool->min))
			return -ENODATA;
		vmm_pool_set_min(st->pool, 0);
	} else if (!strcmp(name, GMSFS_XATTR_RESERVED)) {
		if (!st->tier.reserved)
			return -ENODATA;
		st->tier.reserved = 0;
	} else {
		if (!atomic_load(&st->pool->quota))
			return -ENODATA;
		atomic_store(&st->pool->quota, 0);
	}
	store_notify(st);
	return 0;
}

/* ---- elastic stores: pages asked back ---- */

uint64_t tier_reclaim_left(const struct store *st)
{
	const struct store_tier *t = &st->tier;
	if (!t->reclaim_asked || clock_mono_ns() > t->reclaim_until)
		return 0;
	uint64_t used = atomic_load(&st->pool->used);
	uint64_t given = t->reclaim_from > used ? t->reclaim_from - used : 0;
	return given < t->reclaim_asked ? t->reclaim_asked - given : 0;
}

/* What st may give for self: its pages above its minimum, if it is elastic (a writer
 * session holds them) and may be asked. */
static uint64_t may_give_back(const struct store *st, const struct store *self, bool within_min)
{
	if (st == self || st->removed || !store_lock(st)->fsm.leader || st->tier.at != TIER_DEVICE)
		return 0;
	if (!within_min && st->tier.priority >= self->tier.priority)
		return 0;
	uint64_t used = atomic_load(&st->pool->used), min = atomic_load(&st->pool->min);
	uint64_t left = tier_reclaim_left(st); /* asked already: not counted twice */
	return used > min + left ? used - min - left : 0;
}

uint64_t tier_ask_back(struct fs *fs, struct store *self, uint64_t need)
{
	/* What the room lacks; all of it where it has none (a quota's room, not the device's) */
	uint64_t room = vmm_room_for(fs->vmm, self->pool), bytes = need > room ? need - room : need;
	uint64_t used = atomic_load(&self->pool->used), min = atomic_load(&self->pool->min);
	bool within_min = used + bytes <= min;
	struct store_table *t = fs->stores;
	uint64_t asked = 0, now = clock_mono_ns();
	for (size_t i = 0; i < t->n; i++) /* a retry does not ask again for what is on its way */
		if (t->v[i] != self)
			asked += tier_reclaim_left(t->v[i]);
	while (asked < bytes) {
		struct store *pick = NULL;
		for (size_t i = 0; i < t->n; i++) {
			struct store *st = t->v[i];
			if (may_give_back(st, self, within_min) &&
			    (!pick || st->tier.priority < pick->tier.priority ||
			     (st->tier.priority == pick->tier.priority && st->tier.last_used < pick->tier.last_used)))
				pick = st;
		}
		if (!pick)
			break;
		uint64_t give = may_give_back(pick, self, within_min), left = tier_reclaim_left(pick);
		if (give > bytes - asked)
			give = bytes - asked;
		struct store_tier *pt = &pick->tier;
		pt->reclaim_asked = left + give;
		pt->reclaim_from = atomic_load(&pick->pool->used);
		pt->reclaim_until = now + (uint64_t)TIER_RECLAIM_MS * 1000000;
		asked += give;
		store_notify(pick);
		fuse_log(FUSE_LOG_INFO, "gmsfs: %s (priority %d) asked to give back %llu bytes for %s (priority %d)\n",
			 pick->name, pt->priority, (unsigned long long)pt->reclaim_asked, self->name, self->tier.priority);
	}
	return asked;
}
