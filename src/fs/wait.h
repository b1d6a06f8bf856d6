/* wait: requests that must wait for a store's lock are parked here (lock.c decides;
 * this is its queue), and replied to by a thread of its own. */
#ifndef GMSFS_FS_WAIT_H
#define GMSFS_FS_WAIT_H

#include "fs.h"
#include "lock.h"

/* A request waiting for a lock.  Each kind of op embeds one and says how to finish and
 * reply.  Fields under fs->mu. */
enum wait_state { WAIT_NEW, WAIT_PARKED, WAIT_DONE };
struct fs_waiter;
struct wait_ops {
	int (*grant)(struct fs_waiter *w, int e); /* fs->mu held: the wait ended with e; finish the op */
	void (*reply)(struct fs_waiter *w, int e); /* nothing held: reply with grant's result */
	void (*free)(struct fs_waiter *w);         /* nothing held */
};
struct fs_waiter {
	struct fs_waiter *next;        /* in the store's queue, then in the replies */
	const struct wait_ops *ops;
	struct store *st;
	struct fs_handle *h;           /* the handle that waits for the lock; want: which */
	enum lock_want want;
	fuse_req_t req;
	enum wait_state state;
	bool interrupted, as_writer, has_deadline;
	struct timespec deadline;      /* CLOCK_MONOTONIC */
	int result;
};

/* fs->mu not held: try once more, then park or reply. */
void wait_park(struct fs_waiter *w);
void wait_deadline(struct fs_waiter *w, int timeout_ms);
int wait_start(struct fs *fs);
/* Answer every parked request (EINTR) and stop the thread: at unmount. */
void wait_stop(struct fs *fs);
/* Every parked request answered with e (-ESTALE: the daemon was replaced), and the
 * answers sent; new ones may still park. */
void wait_answer_all(struct fs *fs, int e);
/* The store cannot be granted for a while (e: -ENOSPC, its move in failed; last_error
 * says why): a wait that times out meanwhile ends with e.  Unblocked once it moved in. */
void wait_block(struct store *st, int e);
void wait_unblock(struct store *st);

#endif
