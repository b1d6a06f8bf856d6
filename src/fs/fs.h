/* fs: the FUSE daemon of one mount.  Each module owns its state, declared in its own
 * header with what protects each field, and uses only the modules below it in
 * src/fs/layers, the one list of them (tests/layout.sh checks it, file by file).
 *
 * Threads and the lock.  One mutex, fs->mu, guards every structure of every module
 * but the ones a header marks otherwise (atomics, fields fixed at creation).
 *   - FUSE workers (libfuse's loop, up to max_threads) run the ops.  A worker takes
 *     fs->mu for the op's do_x() and lets it go before it replies; only the text of a
 *     status file is replied under fs->mu (the handle's buffer may be remade by the next
 *     read).  A worker never waits for a lock: an open that must wait is parked (wait.c)
 *     and the worker returns to the loop.
 *   - The waiter thread (wait.c) replies to parked requests once they are finished and
 *     keeps their deadlines; it waits on its own condition variable under fs->mu and
 *     replies without it.
 *   - The notifier thread (inval.c) sends the kernel's notices without fs->mu (a notice
 *     can wait for kernel locks a FUSE request holds); it waits under fs->mu.
 *   - The socket's accept thread and one thread per connection (export/sock.c) take
 *     fs->mu per request, never across a send or a receive; memory is exported without it
 *     (vmm is thread-safe).
 *   - Memory is made without fs->mu, on every path (memory.c): a FUSE worker's truncate
 *     lets it go while the backend makes the memory and takes it again to size the node.
 *     It is released without it too: a buffer's last reference may go under fs->mu (a
 *     rollback, an rmdir, what a move left), its memory then goes on vmm's releaser
 *     thread (vmm_release.c), and a make first waits for what is pending, never under
 *     fs->mu (nor does an rmdir wait: the kernel holds the mount's root meanwhile); so
 *     do the spare pages a session leaves when it ends (vmm_pool_drop_spares_later).
 *   - The mover thread (tier.c) moves stores between the device and the host tier; it
 *     waits on its own condition variable under fs->mu and copies without it.  A create
 *     that does not fit moves idle stores out itself, also copying without fs->mu.
 *   - The keeper's watch (keep_watch.c) looks at the service manager's socket every
 *     second under keep's own mutex, and takes fs->mu (never under it) to hand every
 *     store to a new manager.
 *   - libfuse's interrupt callback (wait.c) runs with the request's own lock held and
 *     takes fs->mu; nothing that holds fs->mu waits for a request's lock.
 * Condition variables, each used with fs->mu: the socket's (export/), the waiter
 * thread's (wait.c), the notifier's two (inval.c) and the mover's (fs->tier_wake). */
#ifndef GMSFS_FS_H
#define GMSFS_FS_H

#define FUSE_USE_VERSION 312
#include <fuse_lowlevel.h>
#include <gmsfs/abi.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <time.h>

#include "clock.h"
#include "../meta/meta.h"
#include "../vmm/vmm.h"

#define FS_NODE_MAGIC 0x67666e64u /* "gfnd" */

enum fs_kind {
	FS_ROOT, FS_DEVICE, FS_STATUS, FS_METRICS, FS_STORE,
	FS_LOCK, FS_COMMIT, FS_ABORT, FS_STATE, FS_HASH, FS_TIER, FS_PREFETCH, FS_GEN, FS_CONTENT,
	FS_VERSION, FS_VERSIONS, FS_HISTORY,
	FS_NKINDS
};
#define FS_STORE_FILES (FS_NKINDS - FS_LOCK) /* a store's files: FS_LOCK on (node.h's table names them) */

/* The daemon's own nodes (the root, its files, a store's directory and files): fixed for
 * their life.  Inode numbers are object addresses: every object starts with a magic word
 * that says what it is, this one or a layout node's (src/meta). */
struct fs_node {
	uint32_t magic;
	enum fs_kind kind;
	struct store *store; /* NULL for the root and its files */
};

/* A call or commit over this many items leaves enough free memory in malloc's arenas
 * to be worth giving back (store_want_trim). */
#define FS_TRIM_ITEMS 10000

struct store;       /* store.h */
struct store_table; /* store.h */
struct waitq;       /* wait.h */
struct inval;       /* inval.h */
struct export;      /* export/export.h */
struct tier;        /* tier.h */
struct keep;        /* keep.h */
struct vmm_buf;

/* One buffer asked of the door for memory (memory.h): its path under allocs/ (said in why;
 * under GMSFS_PAGES_PREFIX, an elastic store's page: one it kept is taken first) and its
 * size in bytes; or, like set, a buffer of like's shape (its pieces: a copy of it for the
 * next version; size is its). */
struct memory_ask {
	const char *path;
	uint64_t size;
	const struct vmm_buf *like;
};

/* What a restart keeps, as the stores see it (gmsfs(5), RESTART): keep.c fills it in
 * under -o state= (NULL without), so that nothing below keep calls keep.  Every hook
 * runs under fs->mu. */
struct fs_persist {
	/* st's image written again: 0 once it is on disk, else -errno (last_error says why). */
	int (*save)(struct store *st);
	/* st's image removed (rmdir): 0 once it is gone from the disk. */
	int (*drop)(struct store *st);
	/* Does the image on disk name b's memory, so that it may not be given back yet? */
	bool (*names)(const struct store *st, const struct vmm_buf *b);
	/* The processes that hold read locks on st changed. */
	void (*readers)(struct store *st);
	/* st is being freed: what keep holds for it goes. */
	void (*forget)(struct store *st);
};

struct fs {
	pthread_mutex_t mu;
	/* Fixed once the mount is live: */
	struct fs_node root, device, status, metrics; /* the root's own files */
	struct vmm *vmm;               /* thread-safe */
	struct fuse_session *se;
	struct timespec started;       /* the times of the daemon's own files */
	bool allow_other;              /* the mount admits other users (and so does the socket) */
	char *options;                 /* its -o options in effect, as the device file shows them */
	bool next_ahead;               /* a store's next version's memory made between refits (version.c) */
	/* Each module's own state (its header says what guards each field): */
	struct store_table *stores;
	struct waitq *wq;
	struct inval *inval;
	struct export *ex;
	struct tier *tier;
	struct keep *keep;             /* NULL: no state= (keep.h) */
	const struct fs_persist *persist; /* keep's hooks, NULL: none */
	/* wait.c's, set at its start: grant st's parked requests that can go now.  A lock
	 * change calls it (lock_changed): the lock stays below its queue. */
	void (*grant_waiters)(struct store *st);
	/* memory.c's door (memory_make_waiting), set at the start: a lower module's memory (a
	 * version's copies) is asked of it as every other, fs->mu not held. */
	int (*make_memory)(struct fs *fs, struct store *st, const struct memory_ask *ask, size_t n,
			   struct vmm_buf **out, char *why, size_t whylen);
	/* Bumped when memory may have come free on either tier (a release, a commit, a move,
	 * a removal): a move that failed for room is tried again (tier.c). */
	uint64_t room_gen;
	pthread_cond_t tier_wake;      /* with mu: the mover thread's, signalled when a move is asked */
	/* Under fs->mu: layout nodes the kernel still knows after they went (node.c). */
	struct meta_graveyard grave;
	size_t grave_freed;            /* nodes freed from it at forgets since the last trim */
	atomic_bool trim_wanted;       /* much memory was freed: store_trim gives it back */
	/* When a client last asked something that maps, makes or commits (clock_mono_ns): a
	 * socket request, an ioctl, a commit.  Host memory made ahead waits for a quiet
	 * mount (tier.c).  A start counts: the engines of a restarted or replaced daemon come
	 * back at once, and pinning host memory then would hold the driver under their maps. */
	_Atomic uint64_t busy_ns;
	/* Under fs->mu: a successor takes the stores over (handover.c): nothing is committed,
	 * made, removed or moved meanwhile. */
	bool handing_over;
};

/* A client's request that may map, make or commit: the mount is busy now. */
static inline void fs_busy(struct fs *fs)
{
	atomic_store_explicit(&fs->busy_ns, clock_mono_ns(), memory_order_relaxed);
}

static inline struct fs *fs_of(fuse_req_t req)
{
	return fuse_req_userdata(req);
}

/* An object's inode number: its address (the root's is FUSE's). */
static inline fuse_ino_t node_ino(struct fs *fs, const void *p)
{
	return p == &fs->root ? FUSE_ROOT_ID : (fuse_ino_t)(uintptr_t)p;
}

/* ops_*.c */
extern const struct fuse_lowlevel_ops fs_ops;

#endif
