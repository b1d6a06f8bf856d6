/* store: the table of stores and each store's locks.  Everything here runs
 * with fs->mu held and never sleeps: an open that must wait is parked (wait.c). */
#include "fs.h"
#include "grow.h"

#include <errno.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static void release_buf(void *buf, void *ctx)
{
	vmm_buf_put(buf);
}

int store_create(struct fs *fs, const char *name, struct store **out)
{
	if (strlen(name) > 255)
		return -ENAMETOOLONG;
	if (!meta_name_valid(name) || node_root_file(fs, name))
		return -EINVAL;
	if (store_find(fs, name))
		return -EEXIST;
	if (GROW(fs->stores, fs->nstores, fs->stores_cap, 8))
		return -ENOMEM;
	struct store *st = calloc(1, sizeof *st);
	int e = -ENOMEM;
	if (!st || !(st->name = strdup(name)) || !(st->meta = meta_store_new(release_buf, st)) ||
	    (e = vmm_pool_new(fs->vmm, &st->pool))) {
		if (st) {
			meta_store_free(st->meta);
			free(st->name);
		}
		free(st);
		return e;
	}
	st->fs = fs;
	st->refs = 1;
	meta_set_graveyard(st->meta, &fs->grave);
	inval_watch(st);
	st->dir = (struct fs_node){ FS_NODE_MAGIC, FS_STORE, st };
	for (int i = 0; i < FS_STORE_FILES; i++)
		st->files[i] = (struct fs_node){ FS_NODE_MAGIC, FS_LOCK + i, st };
	st->handles.next = st->handles.prev = &st->handles;
	fs->stores[fs->nstores++] = st;
	*out = st;
	return 0;
}

struct store *store_find(struct fs *fs, const char *name)
{
	for (size_t i = 0; i < fs->nstores; i++)
		if (!strcmp(fs->stores[i]->name, name))
			return fs->stores[i];
	return NULL;
}

int store_remove(struct fs *fs, const char *name)
{
	for (size_t i = 0; i < fs->nstores; i++) {
		struct store *st = fs->stores[i];
		if (strcmp(st->name, name))
			continue;
		int e = fsm_can_remove(&st->fsm);
		if (e)
			return e;
		if (GROW(fs->removed, fs->nremoved, fs->removed_cap, 8))
			return -ENOMEM;
		fs->stores[i] = fs->stores[--fs->nstores];
		st->removed = true;
		fs->removed[fs->nremoved++] = st; /* until the kernel forgets it, or the daemon exits */
		meta_store_free(st->meta); /* frees the memory now; lookups may outlive it */
		st->meta = NULL;
		store_want_trim(fs); /* a big store's metadata goes back to the system, not to malloc's arenas */
		store_changed(st);
		store_put(st, 1);
		return 0;
	}
	return -ENOENT;
}

void store_get(struct store *st)
{
	st->refs++;
}

void store_put(struct store *st, unsigned n)
{
	st->refs -= n < st->refs ? n : st->refs;
	if (st->refs)
		return;
	struct fs *fs = st->fs;
	for (size_t i = 0; st->removed && i < fs->nremoved; i++)
		if (fs->removed[i] == st) {
			fs->removed[i] = fs->removed[--fs->nremoved];
			break;
		}
	meta_store_free(st->meta);
	vmm_pool_put(st->pool);
	free(st->name);
	free(st);
	store_want_trim(fs);
}

void store_want_trim(struct fs *fs)
{
	atomic_store(&fs->trim_wanted, true);
}

void store_trim(struct fs *fs)
{
	/* A plain load first: every release and forget passes here, and is not worth a
	 * locked exchange. */
	if (atomic_load_explicit(&fs->trim_wanted, memory_order_relaxed) && atomic_exchange(&fs->trim_wanted, false))
		malloc_trim(0);
}

void store_notify(struct store *st)
{
	st->events++;
	for (struct fs_handle *h = st->handles.next; st->pollers && h != &st->handles; h = h->next) {
		if (!h->ph)
			continue;
		fuse_lowlevel_notify_poll(h->ph);
		fuse_pollhandle_destroy(h->ph);
		h->ph = NULL;
		st->pollers--;
	}
}

void store_changed(struct store *st)
{
	store_notify(st);
	wait_grant(st);
}

/* The inodes of the store's handles with this hold (and opened by tgid, if not 0), for
 * caller_holds.  During a session every handle of lock or of a layout file is the
 * session's (readers cannot be there), so whoever has one open holds the session.  A
 * store directory counts only for the process that locked it (ls has it open too). */
static size_t held_inodes(struct store *st, enum fs_hold hold, pid_t tgid, pid_t dir_owner, uint64_t *inos,
			  size_t max)
{
	size_t n = 0;
	for (struct fs_handle *h = st->handles.next; h != &st->handles && n < max; h = h->next) {
		if (h->hold != hold || (tgid && h->tgid != tgid))
			continue;
		const void *obj = h->node ? (const void *)h->node : (const void *)h->fnode;
		if (!h->node && h->fnode->kind == FS_STORE && h->tgid != dir_owner)
			continue;
		uint64_t ino = node_ino(st->fs, obj);
		size_t i = 0;
		while (i < n && inos[i] != ino)
			i++;
		if (i == n)
			inos[n++] = ino;
	}
	return n;
}

/* Does process p still hold a descriptor of the session?  A handle it closed does not
 * count: its release reaches us after close() returned. */
static int holds_session(struct store *st, pid_t p)
{
	uint64_t inos[64];
	size_t n = held_inodes(st, HOLD_SESSION, 0, p, inos, 64);
	return n ? caller_holds(p, inos, n) : 0;
}

/* A member of the session holds one of its descriptors (the leader, a child it left
 * behind), or descends from a leader that still holds one (a program its shell runs). */
int store_is_member(struct store *st, pid_t tgid)
{
	pid_t leader = st->fsm.leader;
	if (!leader)
		return 0;
	int r = holds_session(st, tgid);
	if (r || tgid == leader)
		return r;
	if ((r = caller_descends(tgid, leader, st->leader_start)) <= 0)
		return r;
	return holds_session(st, leader);
}

int store_may_change(struct store *st, pid_t tgid)
{
	int r = store_is_member(st, tgid);
	if (r)
		return r < 0 ? r : 0;
	return st->fsm.leader || st->fsm.readers ? -EBUSY : -EROFS;
}

int store_cannot_tell(struct store *st, int e)
{
	if (e == -EMFILE || e == -ENFILE) {
		vmm_why(st->fs->vmm, e, st->last_error, sizeof st->last_error);
		fuse_log(FUSE_LOG_WARNING, "gmsfs: %s: %s\n", st->name, st->last_error);
		store_notify(st);
	}
	return e;
}

int store_check_change(fuse_req_t req, struct store *st, const struct fs_handle *h)
{
	if (h && h->hold == HOLD_SESSION)
		return 0;
	if (h && h->hold == HOLD_READ)
		return -EROFS;
	pid_t tgid;
	int e = caller_tgid(req, &tgid);
	if (e) {
		if (e == -EPERM)
			fuse_log(FUSE_LOG_WARNING, "gmsfs: refused a change from outside the daemon's pid namespace\n");
		return store_cannot_tell(st, e);
	}
	return store_cannot_tell(st, store_may_change(st, tgid));
}

int store_size_alloc(struct store *st, struct meta_node *m, uint64_t size)
{
	struct vmm *v = st->fs->vmm;
	if (m->size == size || (!m->size && !size))
		return 0;
	if (m->size)
		return -EPERM; /* sized once: the size never changes */
	struct vmm_buf *b;
	int e = vmm_alloc(st->pool, size, &b);
	if (e) {
		char path[GMSFS_PATH_MAX + 1] = "", why[256];
		meta_path(m, path, sizeof path);
		vmm_why(v, e, why, sizeof why);
		snprintf(st->last_error, sizeof st->last_error, "allocs/%.200s: %llu bytes: %.256s", path,
			 (unsigned long long)size, why);
		store_notify(st);
		return e;
	}
	if ((e = meta_alloc_size(m, size, b->size, b)))
		vmm_buf_put(b);
	return e;
}

/* Does tgid hold a read handle here?  Then its next read must not queue behind a
 * writer that waits for this very process.  A handle it has closed does not count: the
 * release reaches us after close() returned, so its descriptors are asked too. */
static int holds_read(struct store *st, pid_t tgid)
{
	uint64_t inos[64];
	size_t n = held_inodes(st, HOLD_READ, tgid, tgid, inos, 64);
	return n ? caller_holds(tgid, inos, n) : 0;
}

int store_take(struct store *st, enum fs_want want, pid_t tgid, enum fs_hold *out)
{
	if (st->removed)
		return -ENOENT;
	bool write = want == WANT_WRITE || (want == WANT_RW_OR_RO && !st->fsm.committed);
	if (write ? fsm_open_write(&st->fsm, tgid) : fsm_open_read(&st->fsm))
		return -EAGAIN; /* held, a writer waits, or nothing is committed yet */
	if (write) {
		caller_start_time(tgid, &st->leader_start);
		st->last_error[0] = '\0';
	}
	*out = write ? HOLD_SESSION : HOLD_READ;
	store_notify(st); /* taking a lock never lets a waiter in: no grant walk */
	return 0;
}

bool store_wants_write(const struct store *st, enum fs_want want)
{
	return want == WANT_WRITE || (want == WANT_RW_OR_RO && !st->fsm.committed);
}

int store_try(struct store *st, enum fs_want want, pid_t tgid, enum fs_hold *out)
{
	if (st->removed)
		return -ENOENT;
	int r = store_is_member(st, tgid);
	if (r < 0)
		return store_cannot_tell(st, r);
	if (r) {
		fsm_join(&st->fsm);
		*out = HOLD_SESSION;
		return 0;
	}
	/* Only a read that would wait (a writer waits) or a write asks whether the caller
	 * holds a read handle: a granted read needs no look at its descriptors. */
	bool ask = st->fsm.readers && (store_wants_write(st, want) || fsm_can_read(&st->fsm));
	if (ask && (r = holds_read(st, tgid)) < 0)
		return r;
	if (ask && r) {
		if (want == WANT_WRITE)
			return -EDEADLK; /* it would wait for its own read handles */
		fsm_reopen_read(&st->fsm);
		*out = HOLD_READ;
		store_notify(st);
		return 0;
	}
	return store_take(st, want, tgid, out);
}

int store_lock_handle(fuse_req_t req, struct fs_handle *h, enum fs_want want, int timeout_ms)
{
	pid_t tgid;
	int e = caller_tgid(req, &tgid);
	if (e) {
		if (e == -EPERM)
			fuse_log(FUSE_LOG_WARNING,
				 "gmsfs: refused a lock to a caller outside the daemon's pid namespace (pid 0)\n");
		return store_cannot_tell(h->store, e);
	}
	h->tgid = tgid;
	e = store_try(h->store, want, tgid, &h->hold);
	if (e == -EAGAIN && timeout_ms)
		return STORE_PARK;
	if (e)
		return e;
	return store_granted(h, want);
}

int store_granted(struct fs_handle *h, enum fs_want want)
{
	h->writable = want != WANT_READ && h->hold == HOLD_SESSION;
	/* Whatever we waited for may have removed the file meanwhile. */
	return h->node && !h->node->linked ? -ENOENT : 0;
}

/* Back to the last commit; a session that made many items leaves their memory to trim. */
static void rollback(struct store *st)
{
	struct meta_stats was, is;
	meta_stats(st->meta, &was);
	meta_rollback(st->meta);
	meta_stats(st->meta, &is);
	if (was.allocations + was.entries >= is.allocations + is.entries + FS_TRIM_ITEMS)
		store_want_trim(st->fs);
}

void store_release(struct store *st, struct fs_handle *h)
{
	if (h->hold == HOLD_READ) {
		fsm_release_read(&st->fsm);
	} else if (h->hold == HOLD_SESSION && fsm_release_session(&st->fsm) == 1 && st->meta) {
		/* The session's last handle went without commit (a crash included): abort. */
		rollback(st);
		st->aborts++;
		snprintf(st->last_error, sizeof st->last_error, "%s",
			 "writer left without commit: rolled back to the last committed layout");
	}
	h->hold = HOLD_NONE;
	store_changed(st);
}

void store_track(struct store *st, struct fs_handle *h)
{
	h->next = st->handles.next;
	h->prev = &st->handles;
	st->handles.next->prev = h;
	st->handles.next = h;
}

void store_untrack(struct fs_handle *h)
{
	if (!h->next)
		return;
	h->prev->next = h->next;
	h->next->prev = h->prev;
	h->next = h->prev = NULL;
}

int store_commit(struct store *st)
{
	char err[sizeof st->last_error - 16];
	int e = meta_commit(st->meta, err, sizeof err);
	if (e) {
		snprintf(st->last_error, sizeof st->last_error, "commit: %s", err[0] ? err : strerror(-e));
		store_changed(st);
		return e;
	}
	fsm_commit(&st->fsm);
	st->commits++;
	struct meta_stats ms;
	meta_stats(st->meta, &ms);
	if (ms.allocations + ms.entries >= FS_TRIM_ITEMS)
		store_want_trim(st->fs); /* the hash's sorted copies of a big layout */
	/* The downgrade: every handle of the session becomes a read handle at once. */
	for (struct fs_handle *h = st->handles.next; h != &st->handles; h = h->next)
		if (h->hold == HOLD_SESSION)
			h->hold = HOLD_READ;
	st->last_error[0] = '\0';
	store_changed(st);
	return 0;
}

int store_abort(struct store *st)
{
	int e = fsm_abort(&st->fsm);
	if (e)
		return e;
	rollback(st);
	snprintf(st->last_error, sizeof st->last_error, "%s", "aborted: rolled back to the last committed layout");
	store_changed(st);
	return 0;
}
