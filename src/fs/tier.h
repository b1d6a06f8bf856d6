/* tier: where a store's memory lives (the device or the host tier), and who gives way
 * when a create does not fit: idle committed stores move to the host tier, lowest
 * priority first, least recently used within a priority.  A store's quota and priority
 * are kept here too.  Moves copy without fs->mu (vmm_move); while a store moves, its
 * lock is granted to nobody (lock_take asks tier_ready), so nobody maps or writes it.
 * The mover thread does the moves asked for (STORE/tier, prefetch, an open of a store
 * on the host tier); a create that does not fit moves what it needs itself (ops_tree's
 * truncate, the socket's create).  tier sits above lock and store: it calls them, and
 * they reach it only through the inline functions below (data and a wake-up). */
#ifndef GMSFS_FS_TIER_H
#define GMSFS_FS_TIER_H

#include "fs.h"
#include "clock.h"


struct store;

enum tier_at { TIER_DEVICE, TIER_HOST, TIER_TO_HOST, TIER_TO_DEVICE };

/* A store's place (in struct store), under fs->mu. */
struct store_tier {
	enum tier_at at;
	bool want_device;              /* bring it back (an open waits, tier, prefetch) */
	bool want_host;                /* move it out once idle (tier) */
	bool failed;                   /* the last move in failed: tried again for a waiting open once
	                                * room may have come free (fs->room_gen moved past failed_room),
	                                * else only at a new request */
	uint64_t failed_room;
	bool kept;                     /* host memory kept from the last move in (vmm_keep), or made ahead */
	uint64_t ahead_tried;          /* host_ahead tried this generation + 1 (0: not since it moved) */
	int priority;                  /* user.gms.priority: higher stays on the device longer */
	uint64_t last_used;            /* CLOCK_MONOTONIC ns of the last grant or release */
	uint64_t moves_out, moves_in;
};

#define TIER_PRIORITY_MIN (-1000)
#define TIER_PRIORITY_MAX 1000

/* host_bytes: the host tier's limit (0: half of the machine's memory).  ahead: the mover
 * thread makes the host memory of committed stores (in use or not) while nothing else is
 * asked of it, within host_bytes, so that a first move out copies at once (-o host_ahead). */
int tier_start(struct fs *fs, uint64_t host_bytes, bool ahead);
void tier_stop(struct fs *fs);

/* "device", "host", "moving to host", "moving to device". */
static inline const char *tier_at_name(enum tier_at at)
{
	static const char *const names[] = { "device", "host", "moving to host", "moving to device" };
	return names[at];
}

static inline const char *tier_name(const struct store_tier *t)
{
	return tier_at_name(t->at);
}
/* A write to STORE/tier ("host" or "device") or STORE/prefetch: asked of the mover
 * thread; -EINVAL for other words or nothing committed, -EBUSY when in use (why in
 * last_error). */
int tier_request(struct store *st, const char *text, size_t len);
/* May the lock be granted now?  False while the store moves or is on the host tier
 * (then the move in is asked of the mover thread). */
static inline bool tier_ready(struct fs *fs, struct store_tier *t)
{
	if (t->at == TIER_DEVICE)
		return true;
	if (t->at == TIER_HOST && !t->want_device) {
		t->want_device = true;
		t->failed = false;
		pthread_cond_signal(&fs->tier_wake);
	}
	return false;
}

/* A lock was granted or given back: the store was used now. */
static inline void tier_used(struct store_tier *t)
{
	t->last_used = clock_mono_ns();
}
/* A create of bytes for self failed for room on the device: move idle stores out
 * until bytes more fit.  Releases fs->mu while it copies.  0: try again; -ENOSPC with
 * why naming what holds the memory. */
int tier_make_room(struct fs *fs, struct store *self, uint64_t bytes, char *why, size_t whylen);

/* user.gms.quota and user.gms.priority on a store's directory. */
int tier_xattr_get(const struct store *st, const char *name, char *buf, size_t size);
int tier_xattr_set(struct store *st, const char *name, const char *value, size_t size);
int tier_xattr_remove(struct store *st, const char *name);
bool tier_xattr_known(const char *name);

/* What metrics and status.json show of the mount. */
struct tier_stats {
	uint64_t moves_out, moves_in, bytes_out, bytes_in, evictions, failures;
	uint64_t host_bytes, host_used, host_kept;
};
void tier_stats(struct fs *fs, struct tier_stats *out);

#endif
