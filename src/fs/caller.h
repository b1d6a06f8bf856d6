/* caller: who is asking.  FUSE gives the thread id of the caller in the pid namespace
 * of whoever mounted, or 0 when the caller is outside it.  No state. */
#ifndef GMSFS_FS_CALLER_H
#define GMSFS_FS_CALLER_H

#include "fs.h"

/* The thread group of a request's thread; -EPERM for pid 0 (outside our pid namespace). */
int caller_tgid(fuse_req_t req, pid_t *tgid);
int caller_start_time(pid_t pid, uint64_t *start);
/* Was the request's thread killed (SIGKILL pending), so that it waits for its answer in
 * the kernel?  False when it cannot tell. */
bool caller_killed(fuse_req_t req);
/* 1 yes, 0 no, or -errno when the daemon cannot tell (out of descriptors). */
int caller_descends(pid_t tgid, pid_t ancestor, uint64_t ancestor_start);
/* Has process tgid a descriptor open on one of these inodes?  (/proc/PID/fdinfo: no
 * request to this mount.)  found (NULL, or n flags): which ones, all of its table read. */
int caller_holds(pid_t tgid, const uint64_t *inos, size_t n, bool *found);
/* Would the kernel let the request's caller open a file of mode (owner: the daemon's
 * uid and gid) for reading (want 4) or writing (want 2)?  0 or -EACCES. */
int caller_may(fuse_req_t req, mode_t mode, int want);

#endif
