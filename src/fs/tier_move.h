/* tier_move: what tier.c (moves asked for, the mover thread) and tier_room.c (room for a
 * create or a move in: evictions, switches) share.  Private to the tier module. */
#ifndef GMSFS_FS_TIER_MOVE_H
#define GMSFS_FS_TIER_MOVE_H

#include "tier.h"

struct tier {
	pthread_t thread;
	bool stop;                     /* under fs->mu, with fs->tier_wake */
	bool ahead;                    /* host memory made ahead (-o host_ahead, the default) */
	uint64_t ahead_since;          /* under fs->mu: when it began to wait for a quiet mount (0: not) */
	struct tier_stats stats;       /* under fs->mu */
};

/* Nobody holds it, waits for it, or writes it, and something is committed: it may move. */
bool tier_idle(const struct store *st);
/* meta_walk's: every allocation's buffer into a struct vmm_bufs, one reference each. */
int tier_collect(struct meta_node *n, void *arg);
/* Which of two stores gives way first: the lower priority, then the less recently used. */
bool tier_gives_way_before(const struct store *a, const struct store *b);
/* Room on the host tier for bytes more: the host memory other stores (on the device, not
 * self) have on standby for their next move out is given up, the store that would give way first
 * first.  Under fs->mu; what is taken goes to *out, for vmm_bufs_release once fs->mu is
 * let go (unpinning takes time). */
void tier_host_room(struct fs *fs, const struct store *self, uint64_t bytes, struct vmm_bufs *out);
/* Move st to the other tier, what is not there yet (what: "move" as asked, "evict" to
 * make room).  Under fs->mu, which is released while the bytes are copied: the caller
 * holds a reference to st (store_get) across the call.  0, or -errno with why in the
 * store's last_error.  The memory it leaves goes once the image that names the new
 * memory is written. */
int tier_move(struct fs *fs, struct store *st, bool to_host, const char *what);
/* A move in that needs room (tier_room.c): the stores that give way go out while st
 * comes in, both at once.  Under fs->mu, released while copying.  0: st is on the
 * device; -ENOSPC with why when not enough can give way (nothing moved); another -errno
 * when the switch failed (st stays on the host tier, the others end on one tier each). */
int tier_switch_in(struct fs *fs, struct store *st, uint64_t bytes, char *why, size_t whylen);

#endif
