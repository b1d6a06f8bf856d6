/* ops_ioctl: the binary interface of abi.h (lock with a timeout, facts, tickets).
 * The kernel copies exactly one struct gmsfs_ioc each way: the command encodes its
 * size.  fi->flags is 0 here, so what a handle may do is kept on the handle. */
#include "ops.h"
#include "caller.h"
#include "clock.h"
#include "log.h"
#include "lock.h"
#include "version.h"
#include "store.h"
#include "wait.h"
#include "export/export.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The facts every reply carries; count and bytes of the layout the handle sees. */
static void ioc_fill(struct fs *fs, struct fs_handle *h, struct gmsfs_ioc *io)
{
	struct store *st = h->store;
	const struct vmm *v = fs->vmm;
	io->lock = lock_mode_of(h);
	io->remap = h->remap; /* said once: a resume onto other memory (lock_granted) */
	h->remap = false;
	io->backend = strcmp(v->dev.backend, "cuda") ? GMSFS_BACKEND_HOST : GMSFS_BACKEND_CUDA;
	io->device = v->dev.index;
	/* The commit the handle holds: a reader on the version before holds that one (a data-only
	 * session's commit beside it did not move it: gmsfs(5), Versions). */
	io->generation = h->on_prev && store_lock(st)->fsm.prev_held ? st->versions.prev_generation
								   : store_lock(st)->fsm.generation;
	io->granularity = v->dev.granularity;
	snprintf(io->socket, sizeof io->socket, "%s", export_socket(fs));
	if (!st->meta)
		return; /* removed, and its last reader gone: its layout went with it */
	io->has_hash = meta_hash(st->meta, io->layout_hash);
	struct meta_stats ms;
	meta_stats(st->meta, &ms);
	io->count = ms.allocations;
	io->size_bytes = ms.bytes;
	io->aligned_bytes = ms.aligned_bytes;
}

static int ioc_check(unsigned cmd, const struct gmsfs_ioc *io)
{
	if (io->size != sizeof *io || (io->flags & ~(cmd == GMSFS_IOC_LOCK ? GMSFS_LOCK_ASKS_IN_PLACE | GMSFS_LOCK_OWN : 0u)))
		return -EINVAL;
	for (int i = 0; i < 4; i++)
		if (io->reserved[i])
			return -EINVAL;
	enum lock_want want;
	if (cmd == GMSFS_IOC_LOCK)
		return lock_want_of_mode(io->mode, &want) || io->timeout_ms < -1 ? -EINVAL : 0;
	return io->mode || io->timeout_ms ? -EINVAL : 0;
}

/* After LOCK is granted: the channel's ticket and the facts (fs->mu held). */
static int locked(struct fs *fs, struct fs_handle *h, struct gmsfs_ioc *io, pid_t tgid, uid_t uid)
{
	int e = export_ticket(fs, h, TICKET_CHANNEL, tgid, uid, io->ticket);
	if (!e)
		ioc_fill(fs, h, io);
	return e;
}

/* EXPORT: a ticket for one allocation's memory, an open file of it. */
static int export_one(struct fs *fs, struct fs_handle *h, struct gmsfs_ioc *io, pid_t tgid, uid_t uid)
{
	struct meta_node *m = h->node;
	int e;
	if (!m || m->kind != META_ALLOC)
		return -ENOTTY;
	if (!m->linked)
		return -ESTALE;
	if (!m->buf)
		return -ENODATA; /* not sized yet: no memory behind it */
	if (lock_writes(h) && (e = version_copy(h->store, h, &m, 1, false, NULL, 0)))
		return e; /* beside the readers, the writer's is a copy (last_error says why not) */
	if ((e = export_ticket(fs, h, TICKET_EXPORT, tgid, uid, io->ticket)))
		return e;
	ioc_fill(fs, h, io);
	io->count = 1;
	io->size_bytes = m->size;
	io->aligned_bytes = m->aligned;
	return 0;
}

struct lock_wait {
	struct fs_waiter w;       /* w.h: the directory's handle, which the kernel keeps while the ioctl runs */
	struct gmsfs_ioc io;
	uid_t uid;
};

static int lw_grant(struct fs_waiter *w, int e)
{
	struct lock_wait *l = (struct lock_wait *)w;
	if (!e)
		e = lock_granted(w->h, w->want);
	if (!e)
		e = locked(w->st->fs, w->h, &l->io, w->h->tgid, l->uid);
	if (e && w->h->hold != HOLD_NONE)
		lock_release(w->h);
	return e;
}

static void lw_reply(struct fs_waiter *w, int e)
{
	struct lock_wait *l = (struct lock_wait *)w;
	if (e)
		fuse_reply_err(w->req, -e);
	else
		fuse_reply_ioctl(w->req, 0, &l->io, sizeof l->io);
}

static void lw_free(struct fs_waiter *w)
{
	free(w);
}

static const struct wait_ops lock_wait_ops = {
	.grant = lw_grant, .reply = lw_reply, .free = lw_free,
};

static int do_ioctl(fuse_req_t req, struct fs *fs, unsigned cmd, struct fs_handle *h, struct gmsfs_ioc *io,
		    enum lock_want *want)
{
	int e = ioc_check(cmd, io);
	if (e)
		return e;
	if (!h || !h->store || (!h->fnode && !h->node))
		return -ENOTTY; /* not a file of a store (a layout directory's handle keeps a listing only) */
	node_count(h->store, h->fnode);
	/* Who asks (a file of /proc, tens of microseconds): only where it is recorded or
	 * checked; INFO and UNLOCK act on the handle's own hold, which its descriptor proves. */
	pid_t tgid = 0;
	if (cmd != GMSFS_IOC_INFO && cmd != GMSFS_IOC_UNLOCK && (e = caller_tgid(req, &tgid)))
		return e;
	uid_t uid = fuse_req_ctx(req)->uid;
	struct store *st = h->store;
	bool lock_holder = h->fnode && (h->fnode->kind == FS_LOCK || h->fnode->kind == FS_STORE);
	/* A removed store's readers may still give their locks back (its memory goes with
	 * the last of them). */
	if (st->removed && cmd != GMSFS_IOC_UNLOCK && cmd != GMSFS_IOC_LET_GO)
		return -ENOENT;
	switch (cmd) {
	case GMSFS_IOC_INFO:
		break;
	case GMSFS_IOC_LOCK:
		h->asks_in_place = io->flags & GMSFS_LOCK_ASKS_IN_PLACE;
		h->own = io->flags & GMSFS_LOCK_OWN;
		if ((e = lock_ioctl(req, h, io->mode, io->timeout_ms, tgid, want)))
			return e; /* LOCK_PARK too */
		return locked(fs, h, io, tgid, uid);
	case GMSFS_IOC_EXPORT:
		return export_one(fs, h, io, tgid, uid);
	case GMSFS_IOC_PAUSE:
		if (!h->fnode || h->fnode->kind != FS_STORE)
			return -ENOTTY;
		if ((e = lock_pause(h)))
			return e;
		break;
	case GMSFS_IOC_LET_GO:
		if (!h->fnode || h->fnode->kind != FS_STORE)
			return -ENOTTY;
		if ((e = lock_let_go(st, tgid)))
			return e;
		break;
	case GMSFS_IOC_UNLOCK: {
		/* The store directory's lock; or a read handle of STORE/lock (a committed writer's
		 * since its commit: libgmsfs gives it back before its close, whose release comes
		 * later, and a daemon killed meanwhile would keep a reader that is gone). */
		bool dir = h->fnode && h->fnode->kind == FS_STORE;
		bool read_lock = h->fnode && h->fnode->kind == FS_LOCK && h->hold == HOLD_READ;
		if (!dir && !read_lock)
			return -ENOTTY;
		if (h->hold == HOLD_NONE && !h->paused)
			return -ENOLCK;
		export_revoke(fs, h);
		lock_release(h); /* a session ending without commit rolls back here */
		break;
	}
	case GMSFS_IOC_EXPORT_ALL:
	case GMSFS_IOC_CHANNEL:
		if (!lock_holder)
			return -ENOTTY;
		if (h->hold == HOLD_NONE)
			return -ENOLCK; /* a directory that has not taken the lock */
		if (cmd == GMSFS_IOC_EXPORT_ALL && lock_writes(h) && (e = version_copy_named(st, h, NULL, 0, false, NULL, 0)))
			return e;
		e = export_ticket(fs, h, cmd == GMSFS_IOC_CHANNEL ? TICKET_CHANNEL : TICKET_EXPORT_ALL, tgid, uid,
				  io->ticket);
		if (e)
			return e;
		break;
	}
	ioc_fill(fs, h, io);
	return 0;
}

/* LET_GO on the root: for a store removed since, named by its layout hash. */
static int let_go_removed(fuse_req_t req, struct fs *fs, struct gmsfs_ioc *io)
{
	pid_t tgid;
	int e = ioc_check(GMSFS_IOC_LET_GO, io) ?: caller_tgid(req, &tgid);
	if (e)
		return e;
	pthread_mutex_lock(&fs->mu);
	e = lock_let_go_removed(fs, tgid, io->layout_hash);
	pthread_mutex_unlock(&fs->mu);
	return e;
}

void fs_ioctl(fuse_req_t req, fuse_ino_t ino, unsigned int cmd, void *arg, struct fuse_file_info *fi,
	      unsigned flags, const void *in_buf, size_t in_bufsz, size_t out_bufsz)
{
	struct fs *fs = fs_of(req);
	struct gmsfs_ioc io;
	if (cmd != GMSFS_IOC_INFO && cmd != GMSFS_IOC_LOCK && cmd != GMSFS_IOC_EXPORT && cmd != GMSFS_IOC_EXPORT_ALL &&
	    cmd != GMSFS_IOC_CHANNEL && cmd != GMSFS_IOC_UNLOCK && cmd != GMSFS_IOC_LET_GO && cmd != GMSFS_IOC_PAUSE)
		return (void)fuse_reply_err(req, ENOTTY); /* a tty's (Python's open asks isatty): not busy */
	fs_busy(fs);
	if (in_bufsz != sizeof io || out_bufsz != sizeof io)
		return (void)fuse_reply_err(req, EINVAL);
	memcpy(&io, in_buf, sizeof io);
	struct fs_handle *h = (struct fs_handle *)(uintptr_t)fi->fh;
	enum lock_want want = WANT_READ;
	if (cmd == GMSFS_IOC_LET_GO && ino == FUSE_ROOT_ID) {
		int e = let_go_removed(req, fs, &io);
		return (void)(e ? fuse_reply_err(req, -e) : fuse_reply_ioctl(req, 0, &io, sizeof io));
	}
	uint64_t t0 = log_trace_rpc() ? clock_mono_ns() : 0;
	pthread_mutex_lock(&fs->mu);
	uint64_t t_mu = t0 ? clock_mono_ns() - t0 : 0;
	int e = do_ioctl(req, fs, cmd, h, &io, &want);
	if (e == LOCK_PARK) {
		struct lock_wait *l = calloc(1, sizeof *l);
		if (l) {
			*l = (struct lock_wait){ .w = { .ops = &lock_wait_ops, .st = h->store, .h = h, .want = want,
						       .req = req }, .io = io, .uid = fuse_req_ctx(req)->uid };
			wait_deadline(&l->w, io.timeout_ms);
		}
		pthread_mutex_unlock(&fs->mu);
		if (!l)
			return (void)fuse_reply_err(req, ENOMEM);
		return wait_park(&l->w);
	}
	pthread_mutex_unlock(&fs->mu);
	if (t0)
		fuse_log(FUSE_LOG_INFO, "gmsfs: ioctl %u served in %.0f us (from %llu), waited %.0f us for the daemon's mutex\n",
			 _IOC_NR(cmd), (clock_mono_ns() - t0) / 1e3, (unsigned long long)(t0 / 1000 % 1000000000),
			 t_mu / 1e3);
	if (e)
		return (void)fuse_reply_err(req, -e);
	fuse_reply_ioctl(req, 0, &io, sizeof io);
}
