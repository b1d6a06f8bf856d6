/* ops_file: open files (open, create, read, write, flush, release, poll).  Opening a
 * file of a store takes its lock (store.c); the handle holds it until released.  Only a
 * handle that began or joined a writer session by its open is flushed (the close ends
 * its process's membership at once, lock_closed); every other close costs no round
 * trip (noflush). */
#include "ops.h"
#include "content.h"
#include "inval.h"
#include "named.h"
#include "history.h"
#include "lock.h"
#include "version.h"
#include "store.h"
#include "tier.h"
#include "text.h"
#include "wait.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>

/* Reply to an open or create (fs->mu not held); an interrupted open never gets a
 * release, so undo it here. */
static void reply_open(fuse_req_t req, struct fs *fs, struct fs_handle *h, struct fuse_file_info *fi,
		       struct fuse_entry_param *entry)
{
	fi->fh = (uintptr_t)h;
	fi->direct_io = 1;
	fi->keep_cache = 0;
	fi->noflush = !h->flushes;
	int r = entry ? fuse_reply_create(req, entry, fi) : fuse_reply_open(req, fi);
	if (r == -ENOENT) {
		pthread_mutex_lock(&fs->mu);
		if (entry && h->node)
			meta_forget(h->node, 1);
		ops_handle_free(h);
		pthread_mutex_unlock(&fs->mu);
	}
}

static int timeout_of(int flags)
{
	return flags & O_NONBLOCK ? 0 : -1;
}

/* ---- opens that wait (wait.c) ---- */

struct open_wait {
	struct fs_waiter w;       /* w.h: the new handle, freed here if the open fails */
	int flags;
	struct fuse_file_info fi;
	struct meta_node *dir;    /* create: where, held while waiting */
	char *name;
	struct fuse_entry_param entry;
	char *path;               /* an outsider's open of a layout file: its path, and area */
	enum meta_area area;
};

/* What an open does once its lock is granted (fs->mu held). */
static int opened(struct fs_handle *h, enum lock_want want, int flags)
{
	int e = lock_granted(h, want);
	if (!e && h->writable && (flags & O_TRUNC) && h->node && h->node->kind == META_ENTRY)
		e = lock_layout_change(h->store) ?: meta_entry_truncate(h->node, 0);
	/* O_TRUNC of an allocation leaves it alone: its size is fixed (dd without conv=notrunc). */
	if (!e) {
		store_track(h->store, h);
		lock_opened(h);
	}
	return e;
}

/* What a create does once its lock is granted (fs->mu held). */
static int created(struct fs *fs, struct fs_handle *h, struct meta_node *dir, const char *name,
		   struct fuse_entry_param *entry)
{
	struct meta_node *m = NULL;
	int e = meta_create(dir, name, dir->area == META_AREA_ALLOCS ? META_ALLOC : META_ENTRY, &m);
	if (e)
		return e;
	h->node = m;
	h->writable = true;
	h->created = true;
	meta_hold(m);
	store_track(h->store, h);
	lock_opened(h);
	store_notify(h->store);
	node_entry(fs, &(struct obj){ .m = m, .st = h->store }, entry);
	return 0;
}

/* An outsider waited for a session that removed its file and made another of the same
 * name, now committed: the open ends with ESTALE, and the kernel walks the path again at
 * once (LOOKUP_REVAL) and opens the new file, as a lookup of the name would now (gmsfs(5),
 * "What a session shows").  Its process keeps a read lock meanwhile (lock_bridge), so
 * that no writer can replace the name again before that second open.  -ENOENT: the name
 * is gone. */
static int replaced(struct fs_handle *h, enum meta_area area, const char *path)
{
	struct meta_node *now = h->store->meta ? meta_resolve(h->store->meta, area, path) : NULL;
	if (!now || !now->linked || now->kind != h->node->kind)
		return -ENOENT;
	lock_bridge(h->store, h->tgid);
	return -ESTALE;
}

static int ow_grant(struct fs_waiter *w, int e)
{
	struct open_wait *o = (struct open_wait *)w;
	if (!e)
		e = o->dir ? created(w->st->fs, w->h, o->dir, o->name, &o->entry) : opened(w->h, w->want, o->flags);
	if (e == -ENOENT && o->path && w->h->node && !w->h->node->linked && w->h->hold == HOLD_READ)
		e = replaced(w->h, o->area, o->path);
	if (o->dir)
		meta_drop(o->dir);
	o->dir = NULL;
	if (e) {
		ops_handle_free(w->h); /* gives back a lock it may have got */
		w->h = NULL;
	}
	return e;
}

static void ow_reply(struct fs_waiter *w, int e)
{
	struct open_wait *o = (struct open_wait *)w;
	if (e)
		return (void)fuse_reply_err(w->req, -e);
	reply_open(w->req, w->st->fs, w->h, &o->fi, o->name ? &o->entry : NULL);
}

static void ow_free(struct fs_waiter *w)
{
	struct open_wait *o = (struct open_wait *)w;
	struct fs *fs = w->st->fs;
	pthread_mutex_lock(&fs->mu);
	store_put(w->st, 1);
	pthread_mutex_unlock(&fs->mu);
	free(o->name);
	free(o->path);
	free(o);
}

static const struct wait_ops open_wait_ops = {
	.grant = ow_grant, .reply = ow_reply, .free = ow_free,
};

/* A waiter for h (fs->mu held; it keeps the store). */
static struct open_wait *open_waiter(fuse_req_t req, struct fs_handle *h, enum lock_want want,
				     struct fuse_file_info *fi)
{
	struct open_wait *o = calloc(1, sizeof *o);
	if (!o)
		return NULL;
	o->w = (struct fs_waiter){ .ops = &open_wait_ops, .st = h->store, .h = h, .want = want, .req = req };
	o->flags = fi->flags;
	o->fi = *fi;
	store_get(h->store);
	wait_deadline(&o->w, -1); /* opens wait as long as it takes (O_NONBLOCK does not get here) */
	return o;
}

/* ---- open ---- */

static int open_control(fuse_req_t req, struct obj *o, struct fs_handle *h, int flags, enum lock_want *want)
{
	bool wr = (flags & O_ACCMODE) != O_RDONLY;
	h->fnode = o->f;
	switch (fs_kinds[o->f->kind].open) {
	case FS_OPEN_DIR:
		return -EISDIR;
	case FS_OPEN_TEXT:
		return wr ? -EACCES : 0;
	case FS_OPEN_LOCK:
		*want = lock_want_of_open(flags, true);
		return lock_open(req, h, *want, timeout_of(flags));
	case FS_OPEN_WRITE:
		h->writable = wr;
		return 0;
	}
	return -EINVAL;
}

static int open_layout(fuse_req_t req, struct obj *o, struct fs_handle *h, int flags, enum lock_want *want)
{
	if (o->m->kind == META_DIR)
		return -EISDIR;
	/* A committed node the session removed waits, seen from outside, for the session's
	 * end: gone once it commits (lock_granted), back if it rolls back. */
	if (!o->m->linked && !o->committed)
		return -ESTALE;
	h->node = o->m;
	meta_hold(o->m);
	*want = lock_want_of_open(flags, false);
	return lock_open(req, h, *want, timeout_of(flags));
}

/* 0 with *out open, LOCK_PARK with *out waiting for its lock, or -errno. */
static int do_open(fuse_req_t req, struct fs *fs, fuse_ino_t ino, int flags, struct fs_handle **out,
		   enum lock_want *want)
{
	struct obj o = {0};
	int e = ops_resolve(req, fs, ino, &o);
	if (e)
		return e;
	struct fs_handle *h = ops_handle_new(o.st);
	if (!h)
		return -ENOMEM;
	*want = WANT_READ;
	bool locks = o.f ? fs_kinds[o.f->kind].open == FS_OPEN_LOCK : true;
	e = o.f ? open_control(req, &o, h, flags, want) : open_layout(req, &o, h, flags, want);
	if (!e && locks)
		e = opened(h, *want, flags);
	else if (!e && o.st)
		store_track(o.st, h);
	if (e < 0) {
		ops_handle_free(h);
		return e;
	}
	*out = h;
	return e;
}

void fs_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct fs *fs = fs_of(req);
	struct fs_handle *h = NULL;
	enum lock_want want = WANT_READ;
	pthread_mutex_lock(&fs->mu);
	int e = do_open(req, fs, ino, fi->flags, &h, &want);
	if (e == LOCK_PARK) {
		struct open_wait *o = open_waiter(req, h, want, fi);
		char path[GMSFS_PATH_MAX + 1];
		/* Its name, should the session it waits for replace the file. */
		if (o && h->node && !meta_path(h->node, path, sizeof path) && !(o->path = strdup(path))) {
			free(o);
			o = NULL;
		}
		if (o && h->node)
			o->area = h->node->area;
		if (!o) {
			ops_handle_free(h);
			pthread_mutex_unlock(&fs->mu);
			return (void)fuse_reply_err(req, ENOMEM);
		}
		pthread_mutex_unlock(&fs->mu);
		return wait_park(&o->w);
	}
	pthread_mutex_unlock(&fs->mu);
	if (e)
		return (void)fuse_reply_err(req, -e);
	reply_open(req, fs, h, fi, NULL);
}

/* ---- create ---- */

static int do_create(fuse_req_t req, struct fs *fs, fuse_ino_t parent, const char *name, mode_t mode, int flags,
		     struct fs_handle **out, struct meta_node **dir, struct fuse_entry_param *entry)
{
	struct obj d = {0};
	int e = node_resolve(fs, parent, &d);
	if (e)
		return e;
	if (!d.m || !S_ISREG(mode))
		return -EPERM;
	struct fs_handle *h = ops_handle_new(d.st);
	if (!h)
		return -ENOMEM;
	e = lock_open(req, h, WANT_WRITE, timeout_of(flags));
	if (!e && !(e = lock_layout_change(d.st)))
		e = created(fs, h, d.m, name, entry);
	if (e < 0) {
		ops_handle_free(h);
		return e;
	}
	*out = h;
	*dir = d.m;
	return e;
}

void fs_create(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode, struct fuse_file_info *fi)
{
	struct fs *fs = fs_of(req);
	struct fs_handle *h = NULL;
	struct meta_node *dir = NULL;
	struct fuse_entry_param entry;
	pthread_mutex_lock(&fs->mu);
	int e = do_create(req, fs, parent, name, mode, fi->flags, &h, &dir, &entry);
	if (e == LOCK_PARK) {
		struct open_wait *o = open_waiter(req, h, WANT_WRITE, fi);
		if (o && !(o->name = strdup(name))) {
			free(o);
			o = NULL;
		}
		if (!o) {
			ops_handle_free(h);
			pthread_mutex_unlock(&fs->mu);
			return (void)fuse_reply_err(req, ENOMEM);
		}
		o->dir = dir;
		meta_hold(dir); /* the directory must outlive the wait */
		pthread_mutex_unlock(&fs->mu);
		return wait_park(&o->w);
	}
	pthread_mutex_unlock(&fs->mu);
	if (e)
		return (void)fuse_reply_err(req, -e);
	reply_open(req, fs, h, fi, &entry);
}

/* A close of a session handle's descriptor (only those are flushed: reply_open). */
void fs_flush(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct fs *fs = fs_of(req);
	pthread_mutex_lock(&fs->mu);
	ops_drop_refused((struct fs_handle *)(uintptr_t)fi->fh); /* before close returns: no release is waited for */
	lock_closed((struct fs_handle *)(uintptr_t)fi->fh);
	pthread_mutex_unlock(&fs->mu);
	fuse_reply_err(req, 0);
}

/* Used for files and directories alike. */
void fs_release(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct fs *fs = fs_of(req);
	struct fs_handle *h = (struct fs_handle *)(uintptr_t)fi->fh;
	pthread_mutex_lock(&fs->mu);
	if (h)
		node_count(h->store, h->fnode);
	ops_handle_free(h);
	pthread_mutex_unlock(&fs->mu);
	fuse_reply_err(req, 0);
	store_trim(fs); /* the last handle of a removed store frees it */
}

/* ---- read and write ---- */

/* A status file's text, made at offset 0 so that one cat sees one consistent text. */
static int status_text(struct fs *fs, struct fs_handle *h, off_t off)
{
	enum fs_kind k = h->fnode->kind;
	if (off != 0 && h->text)
		return 0;
	free(h->text);
	h->text = NULL;
	if (k == FS_DEVICE)
		return text_device(fs, &h->text, &h->text_len);
	if (k == FS_STATUS)
		return text_status_json(fs, &h->text, &h->text_len);
	if (k == FS_METRICS)
		return text_metrics(fs, &h->text, &h->text_len);
	if (h->store->removed)
		return -ENOENT;
	if (k == FS_STATE) {
		h->seen_events = h->store->events;
		return text_state(h->store, &h->text, &h->text_len);
	}
	if (k == FS_TIER)
		return text_tier(h->store, &h->text, &h->text_len);
	if (k == FS_GEN || k == FS_VERSION) /* poll: until another commit */
		h->seen_events = store_lock(h->store)->fsm.generation;
	if (k == FS_GEN)
		return text_generation(h->store, &h->text, &h->text_len);
	if (k == FS_VERSION)
		return named_text(h->store, &h->text, &h->text_len);
	if (k == FS_VERSIONS)
		return named_list_text(h->store, &h->text, &h->text_len);
	if (k == FS_HISTORY)
		return history_text(h->store, &h->text, &h->text_len);
	if (k == FS_CONTENT)
		return content_text(h->store, &h->text, &h->text_len);
	return text_hash(h->store, &h->text, &h->text_len);
}

/* What to reply to a read: a slice of text held by the handle (under mu), or bytes
 * of an allocation read after mu is released (buf set, with a reference). */
struct read_plan {
	const char *p;
	size_t n;
	struct vmm_buf *buf;
	uint64_t off;
};

static void slice(struct read_plan *r, const char *p, size_t len, size_t size, off_t off)
{
	r->p = p;
	r->n = (uint64_t)off >= len ? 0 : len - (size_t)off < size ? len - (size_t)off : size;
	if (r->n)
		r->p += off;
}

static int do_read(struct fs *fs, struct fs_handle *h, size_t size, off_t off, struct read_plan *r)
{
	*r = (struct read_plan){0};
	node_count(h->store, h->fnode);
	if (h->fnode) {
		if (!fs_kinds[h->fnode->kind].text)
			return 0;
		int e = status_text(fs, h, off);
		if (!e)
			slice(r, h->text, h->text_len, size, off);
		return e;
	}
	struct meta_node *m = h->node;
	if (!m->linked)
		return -ESTALE;
	if (m->kind == META_ENTRY) {
		slice(r, m->value, m->value_len, size, off);
		return 0;
	}
	if (!m->buf || (uint64_t)off >= m->size)
		return 0;
	r->n = m->size - (uint64_t)off < size ? (size_t)(m->size - (uint64_t)off) : size;
	r->buf = version_buf(h->store, h, m); /* the version this handle is on */
	r->off = (uint64_t)off;
	vmm_buf_get(r->buf);
	return 0;
}

void fs_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, struct fuse_file_info *fi)
{
	struct fs *fs = fs_of(req);
	struct read_plan r;
	pthread_mutex_lock(&fs->mu);
	int e = do_read(fs, (struct fs_handle *)(uintptr_t)fi->fh, size, off, &r);
	if (e || !r.buf) {
		/* Text is replied under mu: the handle's buffer may be remade by the next read. */
		if (e)
			fuse_reply_err(req, -e);
		else
			fuse_reply_buf(req, r.p, r.n);
		return (void)pthread_mutex_unlock(&fs->mu);
	}
	pthread_mutex_unlock(&fs->mu);
	char *data = malloc(r.n ? r.n : 1);
	ssize_t n = data ? vmm_pread(r.buf, data, r.n, r.off) : -ENOMEM;
	vmm_buf_put(r.buf);
	if (n < 0)
		fuse_reply_err(req, (int)-n);
	else
		fuse_reply_buf(req, data, (size_t)n);
	free(data);
}

/* 1 where b holds data at off already, 0 where it does not, -errno where its bytes cannot
 * be read (a backend without I/O: cuda, where the write would fail the same way).  Off
 * fs->mu: a backend call. */
static int same_bytes(struct vmm_buf *b, const char *data, size_t n, uint64_t off)
{
	char *have = malloc(n ? n : 1);
	ssize_t r = have ? vmm_pread(b, have, n, off) : -ENOMEM;
	int same = r < 0 ? (int)r : r == (ssize_t)n && !memcmp(have, data, n);
	free(have);
	return same;
}

/* 0 with *buf set when the bytes go to an allocation after mu is released; *last_commit
 * when they go into the last commit's bytes and the session has not said so yet (the
 * caller says it once they differ from what is there: see fs_write). */
static int do_write(fuse_req_t req, struct fs_handle *h, const char *data, size_t size, off_t off,
		    struct vmm_buf **buf, size_t *n, bool *last_commit)
{
	*buf = NULL;
	*n = size;
	*last_commit = false;
	node_count(h->store, h->fnode);
	if (h->fnode && h->fnode->kind == FS_TIER)
		return h->store->removed ? -ENOENT : tier_request(h->store, data, size);
	if (h->fnode && h->fnode->kind == FS_PREFETCH) /* what echo device > tier does */
		return h->store->removed ? -ENOENT : tier_request(h->store, "device", 6);
	if (h->fnode)
		return lock_control_write(req, h); /* a commit's image is written before it returns */
	struct meta_node *m = h->node;
	if (h->hold != HOLD_SESSION)
		return -EROFS; /* committed: the handle is a read handle now */
	if (!m->linked || h->store->fs->handing_over)
		return -ESTALE; /* removed; or the session ends with this daemon (a takeover) */
	if (m->kind == META_ENTRY) {
		int e = lock_layout_change(h->store) ?: meta_entry_write(m, (uint64_t)off, data, size);
		if (!e)
			store_notify(h->store);
		return e;
	}
	if (!m->buf || (uint64_t)off >= m->size)
		return -EFBIG; /* fixed size: ftruncate first, never past the end */
	int e = 0;
	if (version_needs_copy(h->store, h, m)) /* beside the readers: into a copy (lets fs->mu go) */
		e = version_copy(h->store, h, &m, 1, false, NULL, 0);
	else
		*last_commit = meta_committed(m) && lock_would_write_in_place(h->store);
	if (e)
		return e;
	*n = m->size - (uint64_t)off < size ? (size_t)(m->size - (uint64_t)off) : size;
	*buf = version_buf(h->store, h, m);
	vmm_buf_get(*buf);
	return 0;
}

void fs_write(fuse_req_t req, fuse_ino_t ino, const char *data, size_t size, off_t off, struct fuse_file_info *fi)
{
	struct fs *fs = fs_of(req);
	struct fs_handle *h = (struct fs_handle *)(uintptr_t)fi->fh;
	struct vmm_buf *b;
	size_t n;
	bool last_commit;
	pthread_mutex_lock(&fs->mu);
	int e = do_write(req, h, data, size, off, &b, &n, &last_commit);
	pthread_mutex_unlock(&fs->mu);
	/* Into the last commit's bytes: said (write-ahead) only where they change.  A write of
	 * what is there already (posix_fallocate's zeros over zeros, a cp of the same file)
	 * leaves the last commit whole, and a crash after it no store TORN. */
	int same = !e && b && last_commit ? same_bytes(b, data, n, (uint64_t)off) : 0;
	if (same) { /* as there already: nothing to write; or unreadable: nothing written, said */
		vmm_buf_put(b);
		return same > 0 ? (void)fuse_reply_write(req, n) : (void)fuse_reply_err(req, -same);
	}
	if (!e && b && last_commit) {
		pthread_mutex_lock(&fs->mu);
		e = h->hold != HOLD_SESSION ? -EROFS : lock_in_place(h->store);
		pthread_mutex_unlock(&fs->mu);
		if (e) {
			vmm_buf_put(b);
			return (void)fuse_reply_err(req, -e);
		}
	}
	if (!e && h->fnode && h->fnode->kind == FS_ABORT)
		inval_flush(fs); /* the rolled-back names are gone from the kernel before abort returns */
	if (e)
		return (void)fuse_reply_err(req, -e);
	if (!b) {
		fuse_reply_write(req, n);
		store_trim(fs); /* after a commit of a big store */
		return;
	}
	ssize_t r = vmm_pwrite(b, data, n, (uint64_t)off);
	vmm_buf_put(b);
	if (r < 0)
		return (void)fuse_reply_err(req, (int)-r);
	fuse_reply_write(req, (size_t)r);
}

/* Readable once state changed, or generation moved, since this handle last read it at
 * offset 0. */
static unsigned do_poll(struct fs_handle *h, struct fuse_pollhandle **ph)
{
	if (!h->fnode || !fs_kinds[h->fnode->kind].watched)
		return POLLIN | POLLRDNORM;
	bool by_commit = h->fnode->kind == FS_GEN || h->fnode->kind == FS_VERSION;
	uint64_t now = by_commit ? store_lock(h->store)->fsm.generation : h->store->events;
	if (h->seen_events != now || h->store->removed)
		return POLLIN | POLLRDNORM;
	if (*ph) {
		if (h->ph)
			fuse_pollhandle_destroy(h->ph);
		else
			h->store->pollers++;
		h->ph = *ph;
		*ph = NULL;
	}
	return 0;
}

void fs_poll(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi, struct fuse_pollhandle *ph)
{
	struct fs *fs = fs_of(req);
	pthread_mutex_lock(&fs->mu);
	unsigned revents = do_poll((struct fs_handle *)(uintptr_t)fi->fh, &ph);
	pthread_mutex_unlock(&fs->mu);
	if (ph)
		fuse_pollhandle_destroy(ph);
	fuse_reply_poll(req, revents);
}
