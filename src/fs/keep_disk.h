/* keep_disk: the state directory's writes (-o state=), on a thread of their own.
 *
 * A disk that stops answering (a frozen file system, a hung NFS server) holds a write in
 * the kernel where no signal reaches it.  Done on a FUSE thread under fs->mu, one such
 * write stopped every request of the mount, and every client that had asked one waited
 * in the kernel, unkillable, with it.  Here the caller waits for its write at most the
 * disk's bound (GMSFS_KEEP_DISK_MS, 1000 by default); a write that takes longer leaves
 * the disk stuck: its caller is told -ETIMEDOUT, and so is every write asked while the
 * stuck one has not returned, at once (nothing queues behind a disk that does not
 * answer).  When it returns, the disk's owner is told (back): what was not written is
 * written again then.  One write at a time, in the order asked. */
#ifndef GMSFS_FS_KEEP_DISK_H
#define GMSFS_FS_KEEP_DISK_H

#include <stdbool.h>
#include <stddef.h>

struct keep_disk;

/* The thread, and its bound (GMSFS_KEEP_DISK_MS); back(arg) is called on it, with none of
 * the disk's locks held, when a write that was given up on has returned.  NULL: no memory
 * or no thread. */
struct keep_disk *keep_disk_start(void (*back)(void *arg), void *arg);
/* The end: the thread is joined and d freed: true.  false: a write given up on has still
 * not returned, and the thread stays behind with d and back's arg, which may not be freed
 * then.  NULL is nothing to stop (true). */
bool keep_disk_stop(struct keep_disk *d);

/* path written whole: len bytes of data into tmp, renamed to path (data is copied).
 * 0, -errno of the write, or -ETIMEDOUT: the disk is stuck (this write may still land). */
int keep_disk_write(struct keep_disk *d, const char *path, const char *tmp, const void *data, size_t len);
/* path removed (ENOENT is 0).  0, -errno, or -ETIMEDOUT as above. */
int keep_disk_unlink(struct keep_disk *d, const char *path);

/* Whether a write given up on has not returned yet; what it writes, and since when
 * (seconds), in why (may be NULL).  NULL d: false. */
bool keep_disk_stuck(struct keep_disk *d, char *why, size_t whylen);

#endif
