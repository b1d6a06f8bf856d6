/* fault: points where a test can have the daemon die, to see what a crash exactly there
 * leaves behind (gmsfs(8), ENVIRONMENT).  GMSFS_FAULT=WHAT.STEP[:N] sends the daemon
 * SIGKILL the Nth time (the first without :N) it passes that point: no cleanup, as in a
 * crash.  With :hang the thread stops there for good instead, holding what it holds, as
 * a driver call that never returns would: a daemon whose requests do not return.  Unset,
 * a point costs one test of a pointer. */
#ifndef GMSFS_FS_FAULT_H
#define GMSFS_FS_FAULT_H

/* Read GMSFS_FAULT, once, before any thread starts. */
void fault_init(void);
/* what: the change (commit, move, evict, mkdir, xattr, rmdir, rollback); step: where in
 * it ("image": before its image is written, "give": after, before memory is given back). */
void fault_point(const char *what, const char *step);

#endif
