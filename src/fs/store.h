/* store: the table of stores, and what a store is, the data of its lock (lock.c
 * decides it) and of its place (tier.c moves it) included: those modules stand above
 * this one.  Everything under fs->mu, but the fields fixed at creation. */
#ifndef GMSFS_FS_STORE_H
#define GMSFS_FS_STORE_H

#include "fs.h"
#include "handle.h"
#include "clock.h"
#include "../fsm/fsm.h"

#include <stdlib.h>

struct fs_waiter; /* wait.h */

/* ---- a store's lock: decided only by lock.c (and lock_member.c), its queue is wait.c's ---- */

/* A process that holds read locks on a store: by its handles, or, after a restart, by
 * the holds the daemon before it granted (inherited: its descriptors of the old mount
 * cannot reach this daemon, but it still maps the store). */
struct lock_reader {
	pid_t pid;
	uint64_t start;                /* its start time (/proc/PID/stat): 0 until asked for */
	unsigned handles, inherited;
	unsigned bridged;              /* of inherited: kept across an open the kernel makes again */
	bool writer;                   /* a kept session's leader before a restart (its hold is one
	                                * inherited read): its own RW takes the lock back */
	uint64_t bridge_until;         /* CLOCK_MONOTONIC ns: then they go, if not taken over */
};

/* The hash of a store's committed bytes, as a client told it (content.c), under fs->mu. */
struct store_content {
	bool set;
	uint64_t generation;           /* the commit it was computed on */
	uint8_t hash[GMSFS_HASH_LEN];
};

/* A store's named versions (named.c), under fs->mu: the name its writer session gives
 * its commit, and the names of the last commits that had one, oldest first. */
#define STORE_NAMED_KEEP 32
struct store_named {
	char pending[META_VERSION_NAME_MAX + 1];
	struct store_name {
		uint64_t generation;
		char name[META_VERSION_NAME_MAX + 1];
	} past[STORE_NAMED_KEEP];
	size_t n;
};

/* A store's last lock events (history.c, STORE/history), oldest overwritten: in memory
 * only (a restart starts it anew). */
#define STORE_HISTORY_KEEP 64
struct store_history {
	struct store_event {
		uint64_t seq;              /* the store's count of events, from 1 */
		struct timespec when;      /* CLOCK_REALTIME */
		const char *kind;          /* a string of history.c's */
		pid_t pid;                 /* the session leader, or the caller */
		uint64_t generation;       /* the store's committed generation after it */
	} ev[STORE_HISTORY_KEEP];
	uint64_t seq;
	pid_t leader;                  /* the last session's */
};

/* A store's lock state (in struct store), under fs->mu. */
struct lock {
	struct fsm fsm;                /* counts of holders and waiters; the state derives from them */
	uint64_t leader_start;         /* start time of the session's leader: pids are reused */
	struct fs_waiter *waiters;     /* parked requests, first come first (wait.c) */
	bool granting, regrant;        /* wait_grant is running; run it again */
	uint64_t waits;                /* opens and lock ioctls that had to wait */
	uint64_t gen;                  /* bumped when who holds what changes */
	pid_t seen_tgid;               /* lock_outside's last answer, good while gen is seen_gen */
	bool seen_outside;
	uint64_t seen_gen;
	uint64_t commits, aborts;      /* sessions that committed; that ended without (rolled back) */
	struct lock_reader *readers;   /* who holds the fsm's read handles, a process once */
	size_t nreaders, readers_cap;
	unsigned inherited;            /* of fsm.readers: holds inherited from a daemon before */
	int blocked;                   /* -errno: why it cannot be granted now (its move in failed for
	                                * room): a timed wait ends with it, not -ETIMEDOUT */
};

/* ---- a store's place: moved only by tier.c, whose mover thread a lock wakes ---- */

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
	bool standby;                  /* host memory on standby: from the last move in (vmm_set_standby), or made ahead */
	uint64_t ahead_tried;          /* host_ahead tried this generation + 1 (0: not since it moved) */
	bool standby_untouched;        /* its standby came from the daemon before: not used by this one's copier */
	int priority;                  /* user.gms.priority: higher stays on the device longer */
	uint64_t last_used;            /* CLOCK_MONOTONIC ns of the last grant or release */
	uint64_t moves_out, moves_in;
	/* Elastic stores (pages that come and go in a writer session): */
	uint64_t reserved;             /* user.gms.reserved: the address space its engine set aside */
	uint64_t reclaim_asked;        /* bytes another store's growth asked it to give back, */
	uint64_t reclaim_from;         /* from what it held then, */
	uint64_t reclaim_until;        /* until then (CLOCK_MONOTONIC ns); tier_reclaim_left */
};

#define TIER_PRIORITY_MIN (-1000)
#define TIER_PRIORITY_MAX 1000

/* "device", "host", "moving to host", "moving to device". */
static inline const char *store_tier_at_name(enum tier_at at)
{
	static const char *const names[] = { "device", "host", "moving to host", "moving to device" };
	return names[at];
}

static inline const char *store_tier_name(const struct store_tier *t)
{
	return store_tier_at_name(t->at);
}

/* May the lock be granted now?  False while the store moves or is on the host tier
 * (then the move in is asked of the mover thread). */
static inline bool store_tier_ready(struct fs *fs, struct store_tier *t)
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
static inline void store_tier_used(struct store_tier *t)
{
	t->last_used = clock_mono_ns();
}

/* ---- a store's versions: version.c's (gmsfs(5), VERSIONS) ---- */

/* An allocation and memory of its: a session's copy, or the version before's. */
struct version_pair {
	struct meta_node *node;        /* held (meta_hold) */
	struct vmm_buf *buf;           /* a reference */
};

/* A store's versions (in struct store), under fs->mu. */
struct store_versions {
	unsigned allowed;              /* user.gms.versions: 1 (the default) or 2 */
	struct version_pair *next;     /* the session beside the readers: its copies */
	size_t nnext, cap_next;
	struct version_pair *prev;     /* the version before the last commit: its memory, */
	size_t nprev, cap_prev;
	unsigned prev_handles;         /* while handles on it (h->on_prev) have not flipped or gone */
	uint64_t prev_generation;
	uint64_t session;              /* bumped at each such session: copies made for one that ended go */
	bool copying;                  /* version_copy let fs->mu go */
	uint64_t copies, copied_bytes, flips; /* counters state shows */
	uint64_t overwrites;           /* of copies, those made unfilled (their writer overwrites them) */
};

/* ---- a store ---- */

struct store {
	/* Fixed from creation to the end: */
	struct fs_node dir;
	struct fs_node files[FS_STORE_FILES];
	char *name;
	struct fs *fs;
	struct vmm_pool *pool;         /* where its memory comes from */
	/* Under fs->mu: */
	struct meta_store *meta;       /* its layout; NULL once removed */
	struct lock lock;              /* lock.c */
	struct store_tier tier;        /* tier.c: where its memory is, its priority */
	struct store_versions versions; /* version.c */
	unsigned refs;                 /* table + kernel lookups + handles */
	bool removed;
	struct fs_handle handles;      /* list head: every open handle of its files */
	uint64_t events;               /* bumped on every change state shows */
	unsigned pollers;              /* handles with a poll handle: notify walks only if any */
	uint64_t requests;             /* FUSE requests on its files but state */
	uint64_t socket_requests;      /* socket requests for its handles */
	uint64_t exports;              /* export requests served (import_all, import) */
	char last_error[512];
	/* Write-ahead (store_give_back): memory the store no longer uses that the image on
	 * disk still names, given back once an image that does not is written. */
	struct vmm_bufs limbo;
	void *kept;                    /* keep.c's record of it (fs->persist), opaque here */
	struct store_content content;  /* content.c: the hash of its committed bytes, as told */
	struct store_named named;      /* named.c: its commits' version names */
	struct store_history history;  /* history.c: its last lock events */
};

/* The mount's stores, under fs->mu. */
struct store_table {
	struct store **v;
	size_t n, cap;
	struct store **removed;        /* removed stores the kernel still knows */
	size_t nremoved, removed_cap;
};

/* st's lock, to read: only the lock's files (lock.c, lock_member.c, wait.c) change it
 * (tests/layout.sh holds every other file to this). */
static inline const struct lock *store_lock(const struct store *st)
{
	return &st->lock;
}

/* The lock's own memory, at its store's end: the table of who read it (nobody by then,
 * or the daemon ends). */
static inline void store_lock_end(struct store *st)
{
	free(st->lock.readers);
}

/* Does a writer session run on st?  Then the kernel may keep no layout name or
 * attribute of it: each side of the session sees its own. */
static inline bool store_in_session(const struct store *st)
{
	return st && st->lock.fsm.leader;
}

int store_table_new(struct fs *fs);
/* At the end: every store, removed or not, freed (no kernel reference is left to honour). */
void store_table_free(struct fs *fs);

int store_create(struct fs *fs, const char *name, struct store **out);
struct store *store_find(struct fs *fs, const char *name);
/* rmdir: -EBUSY while a writer session holds it or it moves; readers defer the freeing
 * of its memory to the last one's release (the name goes now, as Triton's unregister). */
int store_remove(struct fs *fs, const char *name);
/* A removed store's layout and memory freed (the kernel may still know its nodes). */
void store_free_layout(struct store *st);
void store_get(struct store *st);
void store_put(struct store *st, unsigned n);
/* Freed memory goes back to the system (malloc_trim) once fs->mu is released: on a
 * fragmented heap the trim takes tens of ms, which no other caller should wait for.
 * store_want_trim under fs->mu; store_trim without it, after the reply. */
void store_want_trim(struct fs *fs);
void store_trim(struct fs *fs);
/* Something state shows changed: bump events, wake a poller. */
void store_notify(struct store *st);
/* The store's list of handles, that commit walks. */
void store_track(struct store *st, struct fs_handle *h);
void store_untrack(struct fs_handle *h);
/* e (-EMFILE, -ENFILE: the daemon is out of descriptors) goes to last_error and the log. */
int store_cannot_tell(struct store *st, int e);
/* Set last_error (printf-style) and tell pollers. */
void store_error(struct store *st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Processes that hold a read lock on st (a process holds one handle or many). */
unsigned store_readers(const struct store *st);
/* The allocation allocs/NAME of st, with memory: 0 with *out, else -ENOENT, -EISDIR or
 * -ENODATA (never sized) with why naming it, as an export refuses a name. */
int store_alloc_named(const struct store *st, const char *name, struct meta_node **out, char *why, size_t whylen);

/* ---- write-ahead, then give back (gmsfs(5), RESTART): no memory goes back to the
 * system while an image on disk names it, so a crash at any point restores a store
 * whose memory is all there ---- */
/* b's memory is no longer st's: given back now, or, while the image on disk names it,
 * after the next image. */
void store_give_back(struct store *st, struct vmm_buf *b);
/* st changed what its image holds (what: commit, move, evict, mkdir, xattr): the image
 * is written again, then the memory that waited for it is given back.  0, or -errno when
 * the image could not be written: the memory waits for the next one, the store serves
 * on, last_error and the log say why. */
int store_changed(struct store *st, const char *what);
/* The processes that read st changed (grants, releases, commit's downgrade). */
void store_readers_changed(struct store *st);
/* Memory may have come free: a move that failed for room is tried again. */
void store_room_changed(struct fs *fs);

#endif
