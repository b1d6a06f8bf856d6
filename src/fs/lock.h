/* lock: who holds a store.  The only place a lock mode is converted and a lock is
 * decided (try, take, grant, release, session membership, commit, abort); opens, the
 * lock ioctl and the socket all come here.  wait.c beside it is its queue: requests
 * that must wait are parked there and granted from here.  Everything under fs->mu; no
 * function here sleeps. */
#ifndef GMSFS_FS_LOCK_H
#define GMSFS_FS_LOCK_H

#include "fs.h"
#include "handle.h"
#include "store.h"

struct fs_handle;
struct fs_waiter;

#include "lock_want.h"

/* A lock changed: tell state's pollers, and grant whoever can go now (wait.c). */
void lock_changed(struct store *st);

/* ---- taking and giving back ---- */
#define LOCK_PARK 1 /* the request must wait: park it (wait.c) */
/* The lock for a new handle h: 0 (granted), LOCK_PARK (timeout_ms > 0: its deadline, -1:
 * none), or -errno (-EAGAIN when timeout_ms is 0; -EDEADLK: it would wait for its own read
 * handles; -ENOENT: the store is gone). */
int lock_open(fuse_req_t req, struct fs_handle *h, enum lock_want want, int timeout_ms);
/* The same for tgid, the caller's process, known already. */
int lock_open_as(struct fs_handle *h, pid_t tgid, enum lock_want want, int timeout_ms);
/* GMSFS_IOC_LOCK on a store directory's handle h: what opening STORE/lock would check
 * (permission, one RW connection per session), then lock_open.  *want: what it asks for. */
int lock_ioctl(fuse_req_t req, struct fs_handle *h, uint32_t mode, int timeout_ms, pid_t tgid,
	       enum lock_want *want);
/* The same for a parked waiter (not a member, not a reader already): the FSM alone.
 * 0 with *out set, -EAGAIN (still not), or -errno. */
int lock_take(struct store *st, enum lock_want want, pid_t tgid, enum lock_hold *out);
/* After a grant: the handle's write right, and whether its file still exists. */
int lock_granted(struct fs_handle *h, enum lock_want want);
/* GMSFS_IOC_PAUSE: read handle h gives its read lock back and its process keeps its
 * mappings (gmsfs(5), Pause): a data-only session may write in place meanwhile; no other
 * writer, move or eviction changes that memory until h resumes (a lock asked on it again:
 * lock_granted) or goes.  0, or -ENOLCK: h holds no read lock. */
int lock_pause(struct fs_handle *h);
/* Give the handle's hold back (a pause's too); a session ending without commit rolls back. */
void lock_release(struct fs_handle *h);

/* ---- the writer session ---- */
/* Is the request's caller outside st's writer session, so that it sees the last commit
 * (gmsfs(5), "What a session shows")?  False when no session runs; true for a caller
 * the daemon cannot name or cannot tell about (never show it uncommitted names). */
bool lock_outside(fuse_req_t req, struct store *st);

/* 1 yes, 0 no, -errno (-EMFILE: the daemon is out of descriptors and cannot tell). */
int lock_is_member(struct store *st, pid_t tgid);
/* Does tgid hold a read handle here?  Then its next read must not queue behind a
 * writer that waits for this very process.  A handle it has closed does not count: the
 * release reaches us after close() returned, so its descriptors are asked too.  1, 0,
 * -errno (lock_member.c). */
int lock_holds_read(struct store *st, pid_t tgid);
/* h, a handle of the session, was granted by an open or create the kernel has not
 * finished: its process is a member for every call that follows, its own getattr
 * during that open included, until the descriptor shows in its table, a close of it
 * is told (FLUSH: lock_closed) or the handle is released (gmsfs(5), LOCKS).  Such a
 * handle asks the kernel for its closes (h->flushes). */
void lock_opened(struct fs_handle *h);
void lock_closed(struct fs_handle *h);
/* A store brought back from its image (a restart, a takeover): its last commit's
 * generation (0: none), whether it was torn, how many sessions committed. */
void lock_restore(struct store *st, uint64_t generation, bool torn, uint64_t commits);
/* May tgid change the namespace now?  0, -EBUSY (another holds it), -EROFS (nobody). */
int lock_may_change(struct store *st, pid_t tgid);
/* The same for a request: through a session handle h, or as a member; -EROFS through a
 * read handle. */
int lock_check_change(fuse_req_t req, struct store *st, const struct fs_handle *h);
/* A change of st's layout (an allocation or entry made, sized, removed, renamed, tagged,
 * written) by a member of its session: 0, or -EPERM in a data-only session (last_error
 * says so); the caller has checked membership. */
int lock_layout_change(struct store *st);
/* A write to STORE/commit or STORE/abort through h: members only. */
int lock_control_write(fuse_req_t req, struct fs_handle *h);
/* Validate, hash, publish; the session's handles become read handles at once. */
int lock_commit(struct store *st);
/* GMSFS_OP_KEEP (gmsfs(5), KEPT): validate, hash, publish, and the session goes on, kept:
 * its end without commit rolls back to this layout, never torn when every allocation is
 * an elastic store's page (the engine's records mark them), else TORN.  -EINVAL for a
 * data-only session or one beside readers. */
int lock_keep(struct store *st);
/* GMSFS_OP_FLIP: read handle h leaves the version before for the last commit (gmsfs(5),
 * VERSIONS); the last to leave it gives its memory back.  1: it was on it, 0: it was not
 * (nothing changed), -ENOLCK: h holds no read lock. */
int lock_flip(struct fs_handle *h);
/* Back to the last commit; the session stays. */
int lock_abort(struct store *st);
/* The session is about to write into st's committed bytes in place (a write, or a
 * writable mapping of a committed allocation): its first time, the store's image says
 * so first, so that its end without commit, a crash of the daemon's included, leaves
 * the store TORN.  0, or -errno (the image could not be written: last_error). */
int lock_in_place(struct store *st);
/* Whether lock_in_place would say something now (a write into the last commit's bytes
 * that the session has not said yet). */
bool lock_would_write_in_place(const struct store *st);

/* ---- who reads, for lock_restart.c: each process once, its handles and inherited holds ---- */
struct lock_reader *lock_reader_find(struct lock *l, pid_t pid);
/* One read handle (inherited: one inherited hold) of pid less; pid leaves at its last. */
void lock_reader_drop(struct lock *l, pid_t pid, bool inherited);

/* ---- readers across a restart (gmsfs(5), RESTART): lock_restart.c ---- */
/* k of r's inherited holds given back (fs->mu held).  The last one of a process lets the
 * store go (store_put): the caller holds its own reference.  tell: waiters may go now (not
 * when the caller takes the lock itself next: a kept session's leader, r->writer). */
void lock_inherited_go(struct store *st, struct lock_reader *r, unsigned k, bool tell);
/* The processes that read st now, each with its start time (those whose process is
 * gone are left out), and a kept session's leader (writer: gmsfs(5), Kept caches); *out
 * is the caller's to free.  0 or -ENOMEM. */
int lock_readers(struct store *st, struct lock_reader **out, size_t *n);
/* A restored store: the holds the daemon before this one granted, kept for the processes
 * that still live (the same start time): st stays in use for them (no move, eviction or
 * freeing; writers wait) until they let go or end. */
void lock_inherit(struct store *st, const struct lock_reader *v, size_t n);
/* GMSFS_IOC_LET_GO: tgid's holds on st inherited from the daemon before are given back
 * (its library unmapped what it mapped through them).  0, or -ENOLCK: it had none. */
int lock_let_go(struct store *st, pid_t tgid);
/* The same for a removed store (its name is gone) whose committed layout hashes to hash. */
int lock_let_go_removed(struct fs *fs, pid_t tgid, const uint8_t hash[GMSFS_HASH_LEN]);
/* An open of tgid's that waited ends with ESTALE (its file was replaced): tgid keeps a
 * read lock until the open the kernel makes again takes it over (as a reader from before
 * a restart does), or for a few seconds at most. */
void lock_bridge(struct store *st, pid_t tgid);
/* Inherited holds of processes that ended, and bridges past their time, are given back
 * (the waiter thread, each second). */
void lock_reap(struct store *st);

#endif
