/* lock: who holds a store (lock.h).  The FSM (src/fsm) counts holders and waiters;
 * this file decides for a caller: a member of the writer session joins it, a process
 * that holds a read handle gets another past waiting writers, anyone else goes by the
 * FSM or waits (wait.c).  Everything runs under fs->mu and never sleeps. */
#include "lock.h"
#include "version.h"
#include "named.h"
#include "history.h"
#include "caller.h"
#include "clock.h"
#include "fault.h"
#include "grow.h"
#include "handle.h"
#include "node.h"
#include "store.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void lock_changed(struct store *st)
{
	st->lock.gen++;
	store_notify(st);
	if (st->fs->grant_waiters)
		st->fs->grant_waiters(st);
}

/* ---- who reads: each process once, with its handles and inherited holds ---- */

struct lock_reader *lock_reader_find(struct lock *l, pid_t pid)
{
	for (size_t i = 0; i < l->nreaders; i++)
		if (l->readers[i].pid == pid)
			return &l->readers[i];
	return NULL;
}

/* One more read handle of pid.  Out of memory the FSM still counts the handle: only a
 * restart would not learn of this reader.  Each change is said (store_readers_changed). */
static void reader_add(struct lock *l, pid_t pid)
{
	struct lock_reader *r = lock_reader_find(l, pid);
	if (r)
		r->handles++;
	else if (!GROW(l->readers, l->nreaders, l->readers_cap, 8))
		l->readers[l->nreaders++] = (struct lock_reader){ .pid = pid, .handles = 1 };
}

/* One read handle (inherited: one inherited hold) of pid less; pid leaves at its last. */
void lock_reader_drop(struct lock *l, pid_t pid, bool inherited)
{
	struct lock_reader *r = lock_reader_find(l, pid);
	unsigned *n = r ? (inherited ? &r->inherited : &r->handles) : NULL;
	if (!n || !*n)
		return;
	--*n;
	if (!r->handles && !r->inherited)
		*r = l->readers[--l->nreaders];
}

/* ---- taking ---- */

int lock_take(struct store *st, enum lock_want want, pid_t tgid, enum lock_hold *out)
{
	struct fsm *f = &st->lock.fsm;
	if (st->removed)
		return -ENOENT;
	if (st->fs->handing_over)
		return -EAGAIN; /* a successor takes over: it would not know of this lock (ESTALE at the end) */
	if (!store_tier_ready(st->fs, &st->tier))
		return -EAGAIN; /* moving, or on the host tier: its move in is asked for */
	bool write = lock_wants_write(st, want);
	if (want == WANT_DATA && !f->committed)
		return -EAGAIN; /* no layout to keep yet: it waits for a first commit, as a read does */
	int e = lock_wants_beside(st, want) ? fsm_open_beside(f, tgid)
		: want == WANT_DATA    ? fsm_open_data(f, tgid) /* in place: past paused readers */
		: write		       ? fsm_open_write(f, tgid)
				       : fsm_open_read(f);
	if (e == -EUCLEAN)
		return e; /* torn: refused until a writer commits (last_error says why) */
	if (e)
		return -EAGAIN; /* held, a writer waits, or nothing is committed yet */
	if (write) {
		caller_start_time(tgid, &st->lock.leader_start);
		st->last_error[0] = '\0';
		history_begin(st, want == WANT_DATA ? HISTORY_DATA : HISTORY_RW, tgid);
	}
	*out = write ? HOLD_SESSION : HOLD_READ;
	if (!write) {
		reader_add(&st->lock, tgid);
		store_readers_changed(st); /* with its count: a restart keeps as many holds */
	}
	store_tier_used(&st->tier);
	st->lock.gen++;
	store_notify(st); /* taking a lock never lets a waiter in: no grant walk */
	return 0;
}

/* The lock for tgid now: members join their session at once; a process that holds a
 * read handle gets another past waiting writers; anyone else goes by the FSM.  A handle
 * of its own (GMSFS_LOCK_OWN) goes by the FSM whatever its process holds. */
static int try_lock(struct store *st, enum lock_want want, pid_t tgid, bool own, enum lock_hold *out)
{
	if (st->removed)
		return -ENOENT;
	int r = own ? 0 : lock_is_member(st, tgid);
	if (r < 0)
		return store_cannot_tell(st, r);
	if (r) {
		int joined = fsm_join(&st->lock.fsm);
		assert(joined == 0); /* a member joins a session that runs */
		(void)joined;
		st->lock.gen++;
		*out = HOLD_SESSION;
		return 0;
	}
	/* A reader from before a restart connects again: its inherited hold becomes this
	 * handle's, past waiting writers (they wait for this very process). */
	struct fsm *f = &st->lock.fsm;
	struct lock_reader *was = st->lock.inherited ? lock_reader_find(&st->lock, tgid) : NULL;
	if (was && was->inherited && was->writer && lock_wants_write(st, want)) {
		fuse_log(FUSE_LOG_INFO, "gmsfs: %s: pid %d, whose kept session the restart ended, takes its lock back\n",
			 st->name, (int)tgid);
		lock_inherited_go(st, was, was->inherited, false); /* its own lock next: no waiter slips in */
		was = NULL;
	}
	if (was && was->inherited) {
		if (lock_wants_write(st, want))
			return -EDEADLK;
		was->handles++;
		st->lock.inherited--;
		if (was->bridged)
			was->bridged--;
		if (!--was->inherited)
			store_put(st, 1); /* lock_inherit's: the caller's handle holds the store now */
		st->lock.gen++;
		*out = HOLD_READ;
		store_notify(st);
		return 0;
	}
	/* Only a read that would wait (a writer waits) or a write asks whether the caller
	 * holds a read handle: a granted read needs no look at its descriptors. */
	bool ask = !own && f->readers && (lock_wants_write(st, want) || fsm_can_read(f));
	if (ask && (r = lock_holds_read(st, tgid)) < 0)
		return r;
	if (ask && r) {
		if (want == WANT_WRITE || want == WANT_DATA)
			return -EDEADLK; /* it would wait for its own read handles */
		fsm_reopen_read(f);
		reader_add(&st->lock, tgid); /* not new: it held one */
		store_readers_changed(st);
		*out = HOLD_READ;
		store_notify(st);
		return 0;
	}
	return lock_take(st, want, tgid, out);
}

int lock_open(fuse_req_t req, struct fs_handle *h, enum lock_want want, int timeout_ms)
{
	pid_t tgid;
	int e = caller_tgid(req, &tgid);
	if (e) {
		if (e == -EPERM)
			fuse_log(FUSE_LOG_WARNING,
				 "gmsfs: refused a lock to a caller outside the daemon's pid namespace (pid 0)\n");
		return store_cannot_tell(h->store, e);
	}
	return lock_open_as(h, tgid, want, timeout_ms);
}

void lock_inherited_go(struct store *st, struct lock_reader *r, unsigned k, bool tell)
{
	struct lock *l = &st->lock;
	pid_t pid = r->pid;
	bool last = k >= r->inherited;
	assert(k <= r->inherited && k <= l->inherited);
	for (unsigned i = 0; i < k; i++) {
		int released = fsm_release_read(&l->fsm);
		assert(released == 0); /* an inherited hold is one of the FSM's readers */
		(void)released;
		l->inherited--;
		lock_reader_drop(l, pid, true);
	}
	if (k)
		store_readers_changed(st);
	if (st->removed && st->meta && !l->fsm.readers && !l->fsm.paused)
		store_free_layout(st);
	if (tell) {
		store_room_changed(st->fs);
		lock_changed(st);
	}
	if (last)
		store_put(st, 1); /* lock_inherit's */
}

int lock_open_as(struct fs_handle *h, pid_t tgid, enum lock_want want, int timeout_ms)
{
	h->tgid = tgid;
	int e = try_lock(h->store, want, tgid, h->own, &h->hold);
	if (e == -EAGAIN && timeout_ms)
		return LOCK_PARK;
	if (e == -EAGAIN && h->store->tier.at != TIER_DEVICE)
		store_error(h->store, "the store is %s: it is on the device again once moved (an open that waits, "
			    "or prefetch)", store_tier_name(&h->store->tier));
	if (e)
		return e;
	return lock_granted(h, want);
}

int lock_ioctl(fuse_req_t req, struct fs_handle *h, uint32_t mode, int timeout_ms, pid_t tgid,
	       enum lock_want *want)
{
	struct store *st = h->store;
	if (!h->fnode || h->fnode->kind != FS_STORE)
		return -ENOTTY;
	if (h->hold != HOLD_NONE)
		return -EBUSY; /* this handle holds the lock already */
	int e = lock_want_of_mode(mode, want);
	if (e)
		return e;
	struct stat lock_attr;
	node_attr(st->fs, &(struct obj){ .f = &st->files[FS_LOCK - FS_LOCK], .st = st }, &lock_attr);
	if ((e = caller_may(req, lock_attr.st_mode, *want == WANT_READ ? 4 : 2)))
		return e;
	/* One RW connection per writer session: the library could not make a second
	 * handle's mappings read-only when the first commits.  A session of its own waits. */
	if (*want != WANT_READ && st->lock.fsm.leader && !h->own &&
	    (*want == WANT_WRITE || *want == WANT_DATA || !st->lock.fsm.committed) &&
	    (e = lock_is_member(st, tgid)))
		return e < 0 ? e : -EBUSY;
	return lock_open_as(h, tgid, *want, timeout_ms); /* tgid read once (a file of /proc) */
}

/* A paused handle was granted a lock again: out of the pause.  Its memory is what it
 * paused on (nothing else can change it meanwhile) but where a version was committed
 * beside it, or it writes the next version: then its caller maps again (h->remap). */
static void resumed(struct fs_handle *h)
{
	struct store *st = h->store;
	int unpaused = fsm_unpause(&st->lock.fsm);
	assert(unpaused == 0); /* a paused handle is one of the FSM's paused */
	(void)unpaused;
	lock_reader_drop(&st->lock, h->tgid, false); /* the pause's; the grant counted the lock */
	store_readers_changed(st);
	h->paused = false;
	/* Beside the readers, its writer writes copies, which it has not mapped yet. */
	h->remap = h->on_prev || (h->hold == HOLD_SESSION && st->lock.fsm.beside);
	if (version_leave(st, h))
		fsm_prev_gone(&st->lock.fsm);
	/* A writer resumed over the mappings it kept writes the committed bytes through
	 * them: in place from now on (a crash before its commit leaves the store TORN),
	 * unless its caller says so itself before it makes them writable (an EXPORT with
	 * inplace: GMSFS_LOCK_ASKS_IN_PLACE).  Beside the readers it writes copies. */
	if (h->hold == HOLD_SESSION && !h->asks_in_place && lock_in_place(st))
		fuse_log(FUSE_LOG_ERR, "gmsfs: %s: %s\n", st->name, st->last_error);
}

int lock_granted(struct fs_handle *h, enum lock_want want)
{
	if (h->paused && h->hold != HOLD_NONE)
		resumed(h);
	h->writable = want != WANT_READ && h->hold == HOLD_SESSION;
	/* Whatever we waited for may have removed the file meanwhile. */
	return h->node && !h->node->linked ? -ENOENT : 0;
}

/* ---- giving back, commit, abort ---- */

/* Back to the last commit; a session that made many items leaves their memory to trim. */
static void rollback(struct store *st)
{
	struct meta_stats was, is;
	meta_stats(st->meta, &was);
	meta_rollback(st->meta);
	vmm_pool_drop_spares_later(st->pool); /* the session's end: its spare pages go (after the
	                                     * rollback, whose freed pages became spares), off fs->mu */
	meta_stats(st->meta, &is);
	if (was.allocations + was.entries >= is.allocations + is.entries + FS_TRIM_ITEMS)
		store_want_trim(st->fs);
}

/* last_error after a rollback: the layout is the last commit's; its bytes are not when
 * the session wrote them in place (TORN).  The history says it: kind, or torn. */
static void rolled_back(struct store *st, const char *how, const char *kind)
{
	history_add(st, st->lock.fsm.torn ? HISTORY_TORN : kind);
	/* The session's own last error (its session began with none) is kept behind: a
	 * writer that left after ENOSPC still says why. */
	char was[sizeof st->last_error / 2];
	memcpy(was, st->last_error, sizeof was - 1); /* its first half: the rest is said around it */
	was[sizeof was - 1] = '\0';
	const char *open = was[0] ? " (its last error: " : "", *close = was[0] ? ")" : "";
	if (st->lock.fsm.torn)
		snprintf(st->last_error, sizeof st->last_error,
			 "%s: TORN: it wrote into generation %llu's bytes in place; reads and imports are refused "
			 "(EUCLEAN) until a writer commits%s%s%s", how, (unsigned long long)st->lock.fsm.generation, open,
			 was, close);
	else
		snprintf(st->last_error, sizeof st->last_error, "%s: rolled back to the last committed layout%s%s%s", how,
			 open, was, close);
}

int lock_pause(struct fs_handle *h)
{
	struct store *st = h->store;
	if (h->hold != HOLD_READ || h->paused)
		return -ENOLCK;
	int paused = fsm_pause(&st->lock.fsm);
	assert(paused == 0); /* a read handle is one of the FSM's readers */
	(void)paused;
	h->hold = HOLD_NONE; /* its process stays a reader (lock_reader): its mappings are kept */
	h->paused = true;
	store_tier_used(&st->tier);
	lock_changed(st); /* a data-only writer may go now */
	return 0;
}

void lock_release(struct fs_handle *h)
{
	struct store *st = h->store;
	bool room = false, kept = false;
	if (h->paused) { /* a paused handle goes: its mappings went, or its process */
		fsm_unpause(&st->lock.fsm);
		h->paused = false;
		lock_reader_drop(&st->lock, h->tgid, false);
		store_readers_changed(st);
		if (version_leave(st, h))
			fsm_prev_gone(&st->lock.fsm);
		room = !st->lock.fsm.readers;
	}
	if (h->hold == HOLD_READ) {
		if (version_leave(st, h))
			fsm_prev_gone(&st->lock.fsm); /* the last on the version before: a session beside may begin */
		int released = fsm_release_read(&st->lock.fsm);
		assert(released == 0); /* a read handle is one of the FSM's readers */
		(void)released;
		lock_reader_drop(&st->lock, h->tgid, false);
		store_readers_changed(st); /* a count less is said too: else a restart keeps a hold
					    * that this process gave back, and waits for it forever */
		room = !st->lock.fsm.readers; /* idle now: it may give way */
	} else if (h->hold == HOLD_SESSION && (kept = st->lock.fsm.kept, fsm_release_session(&st->lock.fsm) == 1) &&
		   st->meta) {
		/* The session's last handle went without commit (a crash included): abort.  Its
		 * allocations were never in an image: their memory goes at once. */
		fault_point("rollback", "give");
		version_drop_next(st);
		named_drop_pending(st);
		rollback(st);
		room = true;
		st->lock.aborts++;
		st->tier.reserved = st->tier.reclaim_asked = 0; /* an elastic store's pages went with it */
		rolled_back(st, "writer left without commit", HISTORY_LEFT);
		if (kept)
			store_readers_changed(st); /* its engine is no reader to keep any more */
	}
	h->hold = HOLD_NONE;
	h->writable = false;
	store_tier_used(&st->tier);
	if (st->removed && st->meta && !st->lock.fsm.readers && !st->lock.fsm.paused)
		store_free_layout(st); /* removed while held (deferred): its last holder left */
	if (room)
		store_room_changed(st->fs);
	lock_changed(st);
}

/* Validate, hash and publish the session's layout (a commit's or a keep's); last_error
 * says why not. */
static int publish(struct store *st, const char *what)
{
	char err[sizeof st->last_error - 16];
	int e = meta_commit(st->meta, err, sizeof err);
	if (e) {
		snprintf(st->last_error, sizeof st->last_error, "%s: %s", what, err[0] ? err : strerror(-e));
		lock_changed(st);
	}
	return e;
}

int lock_commit(struct store *st)
{
	if (st->fs->handing_over) {
		store_error(st, "commit: the daemon is being replaced (gmsfs -o takeover): this session ends uncommitted");
		return -ESTALE;
	}
	if (st->versions.copying) { /* another thread of the session still has copies made */
		store_error(st, "commit: the session's copies of allocations are still being made: commit after them");
		return -EBUSY;
	}
	int e = publish(st, "commit");
	if (e)
		return e;
	/* Beside the readers: the copies become the allocations' memory, the readers stay on
	 * the version before (before the session's handles become readers too). */
	unsigned on_prev = st->lock.fsm.beside ? version_commit(st) : 0;
	bool was_kept = st->lock.fsm.kept;
	int committed = fsm_commit(&st->lock.fsm);
	assert(committed == 0); /* only the session's members commit */
	(void)committed;
	named_commit(st); /* the name its session gave it, with its generation */
	history_add(st, HISTORY_COMMITTED);
	if (st->lock.fsm.prev_held && !on_prev)
		fsm_prev_gone(&st->lock.fsm); /* only readers from before a restart: not held to it */
	st->lock.commits++;
	fs_busy(st->fs); /* its engines map it now: host memory ahead waits (tier.c) */
	struct meta_stats ms;
	meta_stats(st->meta, &ms);
	if (ms.allocations + ms.entries >= FS_TRIM_ITEMS)
		store_want_trim(st->fs); /* the hash's sorted copies of a big layout */
	/* The downgrade: every handle of the session becomes a read handle at once. */
	bool new_readers = false;
	for (struct fs_handle *h = st->handles.next; h != &st->handles; h = h->next)
		if (h->hold == HOLD_SESSION) {
			h->hold = HOLD_READ;
			reader_add(&st->lock, h->tgid);
			new_readers = true;
		}
	st->last_error[0] = '\0';
	/* Write-ahead: the image that no longer names what the session freed is written
	 * before that memory goes (a failure leaves it held and says why). */
	store_changed(st, "commit");
	vmm_pool_drop_spares_later(st->pool); /* the session's end (after what it freed went, spares) */
	if (new_readers || was_kept) /* a kept session's engine held across a restart no more */
		store_readers_changed(st);
	store_room_changed(st->fs);
	lock_changed(st);
	return 0;
}

/* An allocation outside pages/ in a kept layout: no record marks its bytes, so the
 * session's end leaves the store TORN. */
static int not_a_page(struct meta_node *n, void *arg)
{
	if (n->kind != META_ALLOC)
		return 0;
	char path[GMSFS_PATH_MAX + 1];
	if (meta_path(n, path, sizeof path) < 0 || strncmp(path, GMSFS_PAGES_PREFIX, strlen(GMSFS_PAGES_PREFIX))) {
		snprintf(arg, 256, "%.200s", path);
		return -EINVAL;
	}
	return 0;
}

int lock_keep(struct store *st)
{
	if (st->fs->handing_over) {
		store_error(st, "keep: the daemon is being replaced (gmsfs -o takeover): keep after it");
		return -ESTALE;
	}
	if (st->lock.fsm.data || st->lock.fsm.beside) {
		store_error(st, "keep: a data-only session, or one beside readers, cannot keep its layout");
		return -EINVAL;
	}
	char bad[256] = "";
	bool marked = !meta_walk(meta_root(st->meta, META_AREA_ALLOCS), not_a_page, bad);
	int e = publish(st, "keep");
	if (e)
		return e;
	int kept = fsm_keep(&st->lock.fsm, marked);
	assert(kept == 0); /* a session that is neither data-only nor beside */
	(void)kept;
	st->lock.commits++;
	history_add(st, HISTORY_KEPT);
	if (marked)
		st->last_error[0] = '\0';
	else /* said, as a write in place is: the image says torn before a byte changes */
		snprintf(st->last_error, sizeof st->last_error, "keep: allocation '%s' is not an elastic store's page: the "
			 "session's end without commit leaves the layout TORN (GMS's LAYOUT_COMMITTED)", bad);
	store_changed(st, "keep"); /* write-ahead, as a commit's: before what the session freed goes */
	store_readers_changed(st); /* marked, its engine is held across a restart (lock_readers) */
	store_room_changed(st->fs);
	lock_changed(st);
	return 0;
}

int lock_flip(struct fs_handle *h)
{
	struct store *st = h->store;
	if (h->hold != HOLD_READ)
		return -ENOLCK;
	if (!h->on_prev)
		return 0;
	if (version_leave(st, h)) {
		fsm_prev_gone(&st->lock.fsm);
		store_room_changed(st->fs); /* the version before's memory went */
	}
	st->versions.flips++;
	lock_changed(st); /* a session beside the readers may wait for this */
	return 1;
}

int lock_abort(struct store *st)
{
	int e = fsm_abort(&st->lock.fsm);
	if (e)
		return e;
	fault_point("rollback", "give");
	version_drop_next(st);
	named_drop_pending(st);
	rollback(st);
	store_room_changed(st->fs);
	rolled_back(st, "aborted", HISTORY_ABORTED);
	lock_changed(st);
	return 0;
}

bool lock_would_write_in_place(const struct store *st)
{
	return fsm_would_write_in_place(&st->lock.fsm);
}

int lock_in_place(struct store *st)
{
	if (fsm_write_in_place(&st->lock.fsm) != 1)
		return 0; /* said before, or nothing committed to tear */
	/* Write-ahead: the image says torn before a byte changes (a commit's image clears it).
	 * Not written: the caller is refused, no byte changes, and the mark goes too (else the
	 * session's end would tear a store nobody wrote). */
	int e = store_changed(st, "inplace");
	if (e)
		fsm_write_in_place_undo(&st->lock.fsm);
	return e ? -EIO : 0;
}

int lock_control_write(fuse_req_t req, struct fs_handle *h)
{
	struct store *st = h->store;
	if (h->fnode->kind != FS_COMMIT && h->fnode->kind != FS_ABORT)
		return -EINVAL; /* lock takes no data */
	pid_t tgid;
	int e = caller_tgid(req, &tgid);
	if (e)
		return e;
	if (st->removed)
		return -ENOENT;
	if ((e = lock_is_member(st, tgid)) <= 0)
		return e < 0 ? e : -EPERM;
	return h->fnode->kind == FS_COMMIT ? lock_commit(st) : lock_abort(st);
}
