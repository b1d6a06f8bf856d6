/* lane: a thread of its own for one side of gmsfs-peer's work on a piece of a store's
 * bytes (hash it, copy it out of or into the GPU), so that the thread that moves the
 * connection does nothing else: with both on one thread, a pull ran at 0.4-0.5x of what
 * UCX alone moves (ln_).  One job at a time, given and waited for by one thread. */
#ifndef GMSFS_LOADER_LANE_H
#define GMSFS_LOADER_LANE_H

#include "net.h"

#include <stddef.h>

struct ln;

/* A job: 0, or -errno with err said. */
typedef int (*ln_job)(void *arg, char *err, size_t errlen);

/* A lane; enter(arg) runs first in its thread (NULL: nothing), for what a thread must hold
 * (the GPU's context). */
int ln_start(struct ln **out, void (*enter)(void *arg), void *arg);
/* The job to run next: the lane is idle (started, or waited for). */
void ln_give(struct ln *l, ln_job job, void *arg);
/* Until the job given is done, the connection moved meanwhile (c NULL: not moved): its
 * result, its words in err.  0 with no job given. */
int ln_wait(struct ln *l, struct nt_conn *c, char *err, size_t errlen);
/* The job given waited for, the thread ended, l freed.  NULL: nothing. */
void ln_stop(struct ln *l);

#endif
