/* tier: where a store's memory lives (the device or the host tier), and who gives way
 * when a create does not fit: idle committed stores move to the host tier, lowest
 * priority first, least recently used within a priority.  A store's quota and priority
 * are kept here too.  Moves copy without fs->mu (vmm_move); while a store moves, its
 * lock is granted to nobody (lock_take asks tier_ready), so nobody maps or writes it.
 * The mover thread does the moves asked for (STORE/tier, prefetch, an open of a store
 * on the host tier); a move in that needs room is a switch (tier_room.c): the stores
 * that give way go out while it comes in, both ways at once.  A create that does not
 * fit moves what it needs itself (ops_tree's truncate, the socket's create).  tier sits above lock and store: it calls them; its
 * data in a store (struct store_tier) is store.h's, as is the one thing lock asks of
 * it, store_tier_ready (a wake-up of the mover thread). */
#ifndef GMSFS_FS_TIER_H
#define GMSFS_FS_TIER_H

#include "fs.h"
#include "store.h"
#include "tier_stats.h"



/* host_bytes: the host tier's limit (0: half of the machine's memory).  ahead: the mover
 * thread makes the host memory of committed stores (in use or not) while nothing else is
 * asked of it, within host_bytes, so that a first move out copies at once (-o host_ahead). */
int tier_start(struct fs *fs, uint64_t host_bytes, bool ahead);
void tier_stop(struct fs *fs);

/* A write to STORE/tier ("host" or "device") or STORE/prefetch: asked of the mover
 * thread; -EINVAL for other words or nothing committed, -EBUSY when in use (why in
 * last_error). */
int tier_request(struct store *st, const char *text, size_t len);
/* A create of bytes for self failed for room on the device: move idle stores out
 * until bytes more fit.  Releases fs->mu while it copies.  0: try again; -ENOSPC with
 * why naming what holds the memory. */
int tier_make_room(struct fs *fs, struct store *self, uint64_t bytes, char *why, size_t whylen);

/* user.gms.quota and user.gms.priority on a store's directory. */
int tier_xattr_get(const struct store *st, const char *name, char *buf, size_t size);
int tier_xattr_set(struct store *st, const char *name, const char *value, size_t size);
int tier_xattr_remove(struct store *st, const char *name);
bool tier_xattr_known(const char *name);

/* How long a store asked to give pages back has to do it. */
#define TIER_RECLAIM_MS 2000
/* What st was asked to give back and has not yet (0 once given or past its time). */
uint64_t tier_reclaim_left(const struct store *st);
/* Room for self's growth of need bytes that only elastic stores' pages hold: what the
 * room lacks (all of need where there is none) is asked of those that may give (lower
 * priority, above their minimum; any above its minimum while self grows within its own),
 * lowest priority first; their engines see it in state and give pages back.  The one
 * function that asks back room: a create, a version's copy, a move in.  Returns the
 * bytes asked (0: nobody may give).  fs->mu held. */
uint64_t tier_ask_back(struct fs *fs, struct store *self, uint64_t need);

/* What metrics and status.json show of the mount. */
void tier_stats_read(struct fs *fs, struct tier_stats *out);
/* Of host_standby, the bytes the daemon before made (a takeover's, a restart's) that this
 * daemon's copier has not used yet (it does once the mount is quiet).  Under fs->mu. */
uint64_t tier_standby_unused(struct fs *fs);

#endif
