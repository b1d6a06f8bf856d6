/* store: the table of stores and each store's locks.  Everything here runs
 * with fs->mu held; store_acquire sleeps on fs->cv, which releases it. */
#include "fs.h"
#include "grow.h"

#include <errno.h>
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
	if (!meta_name_valid(name) || !strcmp(name, "device"))
		return -EINVAL;
	if (store_find(fs, name))
		return -EEXIST;
	if (GROW(fs->stores, fs->nstores, fs->stores_cap, 8))
		return -ENOMEM;
	struct store *st = calloc(1, sizeof *st);
	if (!st || !(st->name = strdup(name)) || !(st->meta = meta_store_new(release_buf, st))) {
		if (st)
			free(st->name);
		free(st);
		return -ENOMEM;
	}
	st->fs = fs;
	st->refs = 1;
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
		fs->stores[i] = fs->stores[--fs->nstores];
		st->removed = true;
		meta_store_free(st->meta); /* frees the memory now; lookups may outlive it */
		st->meta = NULL;
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
	meta_store_free(st->meta);
	free(st->name);
	free(st);
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
	pthread_cond_broadcast(&st->fs->cv);
}

bool store_is_member(struct store *st, pid_t tgid)
{
	return st->fsm.leader && caller_descends(tgid, st->fsm.leader, st->leader_start);
}

int store_may_change(struct store *st, pid_t tgid)
{
	if (store_is_member(st, tgid))
		return 0;
	return st->fsm.leader || st->fsm.readers ? -EBUSY : -EROFS;
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
		return e;
	}
	return store_may_change(st, tgid);
}

int store_size_alloc(struct store *st, struct meta_node *m, uint64_t size)
{
	struct vmm *v = st->fs->vmm;
	if (m->size == size || (!m->size && !size))
		return 0;
	if (m->size)
		return -EPERM; /* sized once: the size never changes */
	struct vmm_buf *b;
	int e = vmm_alloc(v, size, &b);
	if (e) {
		char path[GMSFS_PATH_MAX + 1] = "";
		meta_path(m, path, sizeof path);
		snprintf(st->last_error, sizeof st->last_error, "allocs/%s: %llu bytes: %s (used %llu of %llu)", path,
			 (unsigned long long)size, strerror(-e), (unsigned long long)atomic_load(&v->used_bytes),
			 (unsigned long long)v->max_bytes);
		store_notify(st);
		return e;
	}
	if ((e = meta_alloc_size(m, size, b->size, b)))
		vmm_buf_put(b);
	return e;
}

static void interrupted(fuse_req_t req, void *data)
{
	struct fs *fs = data;
	pthread_mutex_lock(&fs->mu);
	pthread_cond_broadcast(&fs->cv);
	pthread_mutex_unlock(&fs->mu);
}


/* Does tgid hold a read handle here?  Then its next read must not queue behind a
 * writer that waits for this very process. */
static bool holds_read(struct store *st, pid_t tgid)
{
	for (struct fs_handle *h = st->handles.next; h != &st->handles; h = h->next)
		if (h->hold == HOLD_READ && h->tgid == tgid)
			return true;
	return false;
}

/* A waiter leaves for good.  A writer that stops waiting lets readers in: wake them. */
static int gave_up(struct store *st, bool write, int e)
{
	if (write)
		store_changed(st);
	return e;
}

int store_acquire(struct store *st, fuse_req_t req, enum fs_want want, pid_t tgid, int timeout_ms, enum fs_hold *out)
{
	struct fs *fs = st->fs;
	if (store_is_member(st, tgid)) {
		fsm_join(&st->fsm);
		*out = HOLD_SESSION;
		return 0;
	}
	if (st->fsm.readers && holds_read(st, tgid)) {
		if (want == WANT_WRITE)
			return -EDEADLK; /* it would wait for its own read handles */
		fsm_reopen_read(&st->fsm);
		*out = HOLD_READ;
		store_changed(st);
		return 0;
	}
	struct timespec deadline;
	clock_gettime(CLOCK_REALTIME, &deadline);
	if (timeout_ms > 0) {
		deadline.tv_sec += timeout_ms / 1000;
		deadline.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
		if (deadline.tv_nsec >= 1000000000L) {
			deadline.tv_sec++;
			deadline.tv_nsec -= 1000000000L;
		}
	}
	bool registered = false;
	for (;;) {
		if (st->removed)
			return -ENOENT;
		bool write = want == WANT_WRITE || (want == WANT_RW_OR_RO && !st->fsm.committed);
		int e = write ? fsm_open_write(&st->fsm, tgid) : fsm_open_read(&st->fsm);
		if (!e) {
			if (write) {
				caller_start_time(tgid, &st->leader_start);
				snprintf(st->last_error, sizeof st->last_error, "%s", "");
			}
			*out = write ? HOLD_SESSION : HOLD_READ;
			store_changed(st);
			return 0;
		}
		if (timeout_ms == 0)
			return -EAGAIN;
		if (fuse_req_interrupted(req) || (fs->se && fuse_session_exited(fs->se)))
			return gave_up(st, write, -EINTR);
		/* A timed wait, so that a daemon told to exit is not held by a waiting open. */
		struct timespec until;
		clock_gettime(CLOCK_REALTIME, &until);
		if (timeout_ms > 0 && (until.tv_sec > deadline.tv_sec ||
				       (until.tv_sec == deadline.tv_sec && until.tv_nsec >= deadline.tv_nsec)))
			return gave_up(st, write, -ETIMEDOUT);
		until.tv_sec += 1;
		if (timeout_ms > 0 && (until.tv_sec > deadline.tv_sec ||
				       (until.tv_sec == deadline.tv_sec && until.tv_nsec > deadline.tv_nsec)))
			until = deadline;
		if (!registered) {
			/* Registering may call interrupted() at once, which takes fs->mu. */
			pthread_mutex_unlock(&fs->mu);
			fuse_req_interrupt_func(req, interrupted, fs);
			pthread_mutex_lock(&fs->mu);
			registered = true;
			continue;
		}
		/* Waiting counts are shown, but wake nobody: only lock changes do. */
		fsm_wait_begin(&st->fsm, write);
		store_notify(st);
		pthread_cond_timedwait(&fs->cv, &fs->mu, &until);
		fsm_wait_end(&st->fsm, write);
		store_notify(st);
	}
}

int store_lock_handle(fuse_req_t req, struct fs_handle *h, enum fs_want want, int timeout_ms)
{
	pid_t tgid;
	int e = caller_tgid(req, &tgid);
	if (e) {
		if (e == -EPERM)
			fuse_log(FUSE_LOG_WARNING,
				 "gmsfs: refused a lock to a caller outside the daemon's pid namespace (pid 0)\n");
		return e;
	}
	h->tgid = tgid;
	if ((e = store_acquire(h->store, req, want, tgid, timeout_ms, &h->hold)))
		return e;
	h->writable = want != WANT_READ && h->hold == HOLD_SESSION;
	/* Whatever we waited for may have removed the file meanwhile. */
	return h->node && !h->node->linked ? -ENOENT : 0;
}

void store_release(struct store *st, struct fs_handle *h)
{
	if (h->hold == HOLD_READ) {
		fsm_release_read(&st->fsm);
	} else if (h->hold == HOLD_SESSION && fsm_release_session(&st->fsm) == 1 && st->meta) {
		/* The session's last handle went without commit (a crash included): abort. */
		meta_rollback(st->meta);
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
	meta_rollback(st->meta);
	snprintf(st->last_error, sizeof st->last_error, "%s", "aborted: rolled back to the last committed layout");
	store_changed(st);
	return 0;
}
