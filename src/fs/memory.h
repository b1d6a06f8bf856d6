/* memory: the one door through which a store's memory is made, for every path that makes
 * it (a truncate, the socket's create and create_many, an elastic store's pages, a copy
 * for a store's next version through fs->make_memory): room
 * first where it lacks (idle stores moved to the host tier, then elastic stores asked for
 * pages back), then each buffer, never under fs->mu (making and exporting memory is a
 * backend call of milliseconds, and every request of the mount waits for fs->mu).  A
 * move in makes its memory in the tier's switch (tier_room.c: those that give way go out
 * while it comes in, piece by piece), and where they are not enough asks elastic stores
 * for pages the same way (tier.c), tried again as they give them. */
#ifndef GMSFS_FS_MEMORY_H
#define GMSFS_FS_MEMORY_H

#include "fs.h"

#include <stddef.h>
#include <stdint.h>

struct fs;
struct store;
struct vmm_buf;

/* struct memory_ask, one buffer asked for: fs.h (fs->make_memory's). */

/* Whether the asker may still have the memory, under fs->mu (its session may end while
 * others move out for it): 0, or -errno with why. */
struct memory_check {
	int (*may)(struct fs *fs, void *arg, char *why, size_t whylen);
	void *arg;
};

/* n buffers for st (the caller holds a reference; fs->mu not held) into out[0..n), each of
 * at least its size: room first for all of them where it lacks, then each; one that still
 * finds none makes room for the rest and is tried once more.  0: all made; or -errno with
 * none made and why naming the allocation that did not fit: -ENOSPC (no room, or past the
 * store's quota), -EAGAIN (elastic stores were asked to give pages back: ask again within
 * TIER_RECLAIM_MS), -EMFILE/-ENFILE, or the check's error.  check may be NULL. */
int memory_make(struct fs *fs, struct store *st, const struct memory_ask *ask, size_t n, struct vmm_buf **out,
		const struct memory_check *check, char *why, size_t whylen);
/* memory_make for a caller that cannot be told to ask again (a truncate, a write that
 * copies): elastic stores asked for pages are waited for TIER_RECLAIM_MS, then -ENOSPC
 * with why naming who was asked.  fs->mu not held.  fs->make_memory is this. */
int memory_make_waiting(struct fs *fs, struct store *st, const struct memory_ask *ask, size_t n,
			struct vmm_buf **out, char *why, size_t whylen);

#endif
