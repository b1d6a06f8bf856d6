/* fsm: the lock state machine of one store. Pure: no FUSE, no I/O, no threads.
 *
 * The state is never stored: it is derived from the counts of open handles.
 * The caller (the daemon) serializes calls and does the waiting; every
 * function here either applies an event or refuses it with -errno and
 * changes nothing. */
#ifndef GMSFS_FSM_H
#define GMSFS_FSM_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

/* TORN: committed, but a session that wrote the committed bytes in place ended without
 * commit: the layout is the last commit's, its bytes are not (gmsfs(5), Abort). */
enum fsm_state { FSM_EMPTY, FSM_RW, FSM_COMMITTED, FSM_RO, FSM_TORN };

struct fsm {
	bool committed;            /* a committed layout exists */
	pid_t leader;              /* thread group of the session leader, 0: no session */
	unsigned session_handles;  /* handles that belong to the writer session */
	unsigned readers;          /* read handles (committed sessions' handles included) */
	unsigned waiting_writers;
	unsigned waiting_readers;
	uint64_t generation;       /* commits so far */
	bool in_place;             /* the session may have written committed bytes in place */
	bool torn;                 /* such a session ended without commit: reads are refused
	                            * until a commit */
	/* Versions (gmsfs(5), VERSIONS): a data-only session granted beside the readers, which
	 * never writes the committed bytes (its allocations are copies: the next version), and
	 * whose commit leaves the readers it found on the version before until they flip. */
	bool beside;               /* the session runs beside readers */
	bool prev_held;            /* readers are on the version before the last commit */
	/* Paused readers (gmsfs(5), Pause): handles that gave their read lock back but keep
	 * their mappings.  A data-only session writes in place past them; nothing else that
	 * would change their memory (another writer, a move) goes until they resume or go. */
	unsigned paused;
	bool data;                 /* the session is data-only (its layout stays) */
	/* Kept (gmsfs(5), KEPT): the session committed its layout and goes on writing bytes
	 * (GMS's commit_layout): its end without commit rolls back to that layout.  Marked (a
	 * KV cache whose engine's records say which pages to trust): never torn; unmarked, it
	 * writes in place from the keep on and its end leaves the store TORN (GMS's
	 * LAYOUT_COMMITTED: the layout stays, its bytes wait for a writer's commit). */
	bool kept;
};

enum fsm_state fsm_state(const struct fsm *f);
const char *fsm_state_name(enum fsm_state s);

/* Would a read open be granted now?  0, or -EAGAIN (it must wait), or
 * -ENOENT (nothing committed to read yet: it must wait too), or -EUCLEAN (torn: refused
 * until a writer commits; a writer at work is waited for first). */
int fsm_can_read(const struct fsm *f);
/* Would a new writer session be granted now?  0 or -EAGAIN. */
int fsm_can_write(const struct fsm *f);

int fsm_open_read(struct fsm *f);                /* take a read handle */
int fsm_open_write(struct fsm *f, pid_t leader); /* begin a session, first handle */
/* A data-only session, in place: past paused readers.  0 or -EAGAIN (a session runs, or
 * readers read), -ENOENT (nothing committed). */
int fsm_open_data(struct fsm *f, pid_t leader);
/* A read handle pauses (-EINVAL: none reads); a paused one leaves the pause (resumed, or
 * gone: -EINVAL when none is paused). */
int fsm_pause(struct fsm *f);
int fsm_unpause(struct fsm *f);
/* Would a session beside the readers be granted now?  0, or -EAGAIN (a session runs, or
 * readers are on the version before), -ENOENT (nothing committed: nothing to build on). */
int fsm_can_write_beside(const struct fsm *f);
int fsm_open_beside(struct fsm *f, pid_t leader); /* begin one */
/* The readers on the version before have all flipped or gone.  -EINVAL: none were. */
int fsm_prev_gone(struct fsm *f);
int fsm_join(struct fsm *f);                     /* another handle of the running session */
/* Another read handle for a process that already holds one: granted even while a
 * writer waits (it waits for this very process, which would deadlock).  -EINVAL
 * when nobody reads. */
int fsm_reopen_read(struct fsm *f);

/* The session writes into committed bytes in place (before the first such write or
 * writable mapping).  1 when it is the session's first (the caller records it ahead, so
 * that a crash leaves the store torn), 0 when said before or nothing is committed yet,
 * -EINVAL without a session. */
int fsm_write_in_place(struct fsm *f);
/* A first fsm_write_in_place whose write could not begin after all (its record was not
 * written): the session is as before it. */
void fsm_write_in_place_undo(struct fsm *f);
/* Whether fsm_write_in_place would return 1 now (nothing changes). */
bool fsm_would_write_in_place(const struct fsm *f);

/* Release a read handle.  -EINVAL if there is none. */
int fsm_release_read(struct fsm *f);
/* Release a session handle.  1 when it was the last one: the session ended
 * without commit and the caller must roll the layout back (the store is torn if it
 * wrote in place); 0 otherwise; -EINVAL if there is no session. */
int fsm_release_session(struct fsm *f);

/* Commit: the session's handles become read handles in one step; torn no more.  A
 * session beside readers leaves them on the version before (prev_held) if there were any. */
int fsm_commit(struct fsm *f);
/* Keep: commit and stay the session, kept from now on, marked or not (-EINVAL without a
 * session, or for a data-only one or one beside readers). */
int fsm_keep(struct fsm *f, bool marked);
/* Abort written by a member: the session stays; the store is torn if it wrote in place
 * (a rollback cannot bring those bytes back). */
int fsm_abort(struct fsm *f);

int fsm_wait_begin(struct fsm *f, bool writer);
int fsm_wait_end(struct fsm *f, bool writer);

/* Removing the store needs no writer session: 0 or -EBUSY.  Readers and waiters do not
 * keep it (the freeing waits for the last reader: gmsfs(5), Removal). */
int fsm_can_remove(const struct fsm *f);

/* Invariants that must hold in every reachable state: 0 or -EPROTO. */
int fsm_check(const struct fsm *f);

#endif
