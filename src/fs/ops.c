/* ops: the FUSE boundary.  Module errors are -errno; they become replies here. */
#include "fs.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/xattr.h>
#include <unistd.h>

static const char *const store_file_names[FS_STORE_FILES] = { "lock", "commit", "abort", "state", "layout_hash" };

#define XATTR_TAG "user.gms.tag"
#define XATTR_ALLOC "user.gms.alloc"
#define XATTR_OFFSET "user.gms.offset"

static struct fs *fs_of(fuse_req_t req)
{
	return fuse_req_userdata(req);
}

/* What an inode number stands for: a daemon node or a layout node. */
struct obj {
	struct fs_node *f;
	struct meta_node *m;
	struct store *st;
};

static int resolve(struct fs *fs, fuse_ino_t ino, struct obj *o)
{
	void *p = ino == FUSE_ROOT_ID ? (void *)&fs->root : (void *)(uintptr_t)ino;
	*o = (struct obj){0};
	if (*(uint32_t *)p == FS_NODE_MAGIC) {
		o->f = p;
		o->st = o->f->store;
		return o->st && o->st->removed ? -ENOENT : 0;
	}
	if (*(uint32_t *)p == META_NODE_MAGIC) {
		o->m = p;
		o->st = meta_context(o->m);
		return o->st ? 0 : -ESTALE;
	}
	return -ESTALE;
}

static fuse_ino_t ino_of(struct fs *fs, const void *p)
{
	return p == &fs->root ? FUSE_ROOT_ID : (fuse_ino_t)(uintptr_t)p;
}

static void fill_attr(struct fs *fs, const struct obj *o, struct stat *s)
{
	memset(s, 0, sizeof *s);
	s->st_uid = getuid();
	s->st_gid = getgid();
	s->st_nlink = 1;
	s->st_blksize = 4096;
	if (o->m) {
		const struct meta_node *m = o->m;
		s->st_ino = ino_of(fs, m);
		s->st_mtim = s->st_ctim = s->st_atim = m->mtime;
		if (m->kind == META_DIR) {
			s->st_mode = S_IFDIR | 0755;
			s->st_nlink = 2;
		} else if (m->kind == META_ALLOC) {
			s->st_mode = S_IFREG | 0644;
			s->st_size = (off_t)m->size;
			s->st_blocks = (blkcnt_t)(m->aligned / 512);
		} else {
			s->st_mode = S_IFREG | 0644;
			s->st_size = (off_t)m->value_len;
			s->st_blocks = (blkcnt_t)((m->value_len + 511) / 512);
		}
		return;
	}
	s->st_ino = ino_of(fs, o->f);
	s->st_mtim = s->st_ctim = s->st_atim = fs->started;
	switch (o->f->kind) {
	case FS_ROOT:
	case FS_STORE:
		s->st_mode = S_IFDIR | 0755;
		s->st_nlink = 2;
		break;
	case FS_LOCK:
		s->st_mode = S_IFREG | 0644;
		break;
	case FS_COMMIT:
	case FS_ABORT:
		s->st_mode = S_IFREG | 0200;
		break;
	default: /* device, state, layout_hash: content is made when read (direct_io) */
		s->st_mode = S_IFREG | 0444;
		break;
	}
}

/* Take a kernel reference on what a reply_entry hands out. */
static void ref_obj(struct obj *o)
{
	if (o->m)
		meta_lookup_ref(o->m);
	else if (o->f->kind >= FS_STORE)
		store_get(o->st);
}

static void reply_obj(fuse_req_t req, struct fs *fs, struct obj *o)
{
	struct fuse_entry_param e = { .ino = o->m ? ino_of(fs, o->m) : ino_of(fs, o->f) };
	fill_attr(fs, o, &e.attr);
	/* Layout nodes: zero timeouts, abort changes them behind the kernel's back.  Stores and
	 * their control files change only through the kernel (mkdir, rmdir): cache them. */
	if (!o->m)
		e.entry_timeout = e.attr_timeout = 3600;
	ref_obj(o);
	pthread_mutex_unlock(&fs->mu);
	fuse_reply_entry(req, &e);
}

static int child(struct fs *fs, const struct obj *dir, const char *name, struct obj *out)
{
	*out = (struct obj){ .st = dir->st };
	if (dir->m) {
		if (dir->m->kind != META_DIR)
			return -ENOTDIR;
		out->m = meta_lookup(dir->m, name);
		return out->m ? 0 : -ENOENT;
	}
	if (dir->f->kind == FS_ROOT) {
		if (!strcmp(name, "device")) {
			out->f = &fs->device;
			return 0;
		}
		out->st = store_find(fs, name);
		if (!out->st)
			return -ENOENT;
		out->f = &out->st->dir;
		return 0;
	}
	if (dir->f->kind != FS_STORE)
		return -ENOTDIR;
	for (int i = 0; i < FS_STORE_FILES; i++)
		if (!strcmp(name, store_file_names[i])) {
			out->f = &dir->st->files[i];
			return 0;
		}
	if (!strcmp(name, "allocs") || !strcmp(name, "meta")) {
		out->m = meta_root(dir->st->meta, name[0] == 'a' ? META_AREA_ALLOCS : META_AREA_META);
		return 0;
	}
	return -ENOENT;
}

#define LOCKED_OR_REPLY(fs, ino, o)                          \
	pthread_mutex_lock(&(fs)->mu);                      \
	int e_ = resolve((fs), (ino), &(o));                 \
	if (e_) {                                            \
		pthread_mutex_unlock(&(fs)->mu);             \
		return (void)fuse_reply_err(req, -e_);       \
	}

#define UNLOCK_REPLY_ERR(fs, e)                              \
	do {                                                 \
		pthread_mutex_unlock(&(fs)->mu);             \
		return (void)fuse_reply_err(req, -(e));      \
	} while (0)

static void fs_lookup(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	struct fs *fs = fs_of(req);
	struct obj dir, o;
	LOCKED_OR_REPLY(fs, parent, dir);
	int e = child(fs, &dir, name, &o);
	if (e)
		UNLOCK_REPLY_ERR(fs, e);
	reply_obj(req, fs, &o);
}

static void forget_one(struct fs *fs, fuse_ino_t ino, uint64_t n)
{
	void *p = ino == FUSE_ROOT_ID ? (void *)&fs->root : (void *)(uintptr_t)ino;
	if (*(uint32_t *)p == META_NODE_MAGIC) {
		meta_forget(p, n);
	} else if (*(uint32_t *)p == FS_NODE_MAGIC) {
		struct fs_node *f = p;
		if (f->kind >= FS_STORE)
			store_put(f->store, (unsigned)n);
	}
}

static void fs_forget(fuse_req_t req, fuse_ino_t ino, uint64_t nlookup)
{
	struct fs *fs = fs_of(req);
	pthread_mutex_lock(&fs->mu);
	forget_one(fs, ino, nlookup);
	pthread_mutex_unlock(&fs->mu);
	fuse_reply_none(req);
}

static void fs_forget_multi(fuse_req_t req, size_t count, struct fuse_forget_data *forgets)
{
	struct fs *fs = fs_of(req);
	pthread_mutex_lock(&fs->mu);
	for (size_t i = 0; i < count; i++)
		forget_one(fs, forgets[i].ino, forgets[i].nlookup);
	pthread_mutex_unlock(&fs->mu);
	fuse_reply_none(req);
}

static void fs_getattr(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct fs *fs = fs_of(req);
	struct obj o;
	struct stat s;
	LOCKED_OR_REPLY(fs, ino, o);
	fill_attr(fs, &o, &s);
	pthread_mutex_unlock(&fs->mu);
	fuse_reply_attr(req, &s, 0);
}

/* May this request change o's store?  Through a session handle, or as a member. */
static int may_change(fuse_req_t req, struct obj *o, struct fuse_file_info *fi)
{
	struct fs_handle *h = fi ? (struct fs_handle *)(uintptr_t)fi->fh : NULL;
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
	return store_may_change(o->st, tgid);
}

static int size_alloc(struct fs *fs, struct obj *o, uint64_t size)
{
	struct meta_node *m = o->m;
	if (m->size == size || (!m->size && !size))
		return 0;
	if (m->size)
		return -EPERM; /* sized once: the size never changes */
	struct vmm_buf *b;
	int e = vmm_alloc(fs->vmm, size, &b);
	if (e) {
		char path[META_PATH_MAX + 1] = "";
		meta_path(m, path, sizeof path);
		snprintf(o->st->last_error, sizeof o->st->last_error,
			 "allocs/%s: %llu bytes: %s (used %llu of %llu)", path, (unsigned long long)size,
			 strerror(-e), (unsigned long long)atomic_load(&fs->vmm->used_bytes),
			 (unsigned long long)fs->vmm->max_bytes);
		store_notify(o->st);
		return e;
	}
	e = meta_alloc_size(m, size, b->size, b);
	if (e) {
		vmm_buf_put(b);
		return e;
	}
	store_notify(o->st);
	return 0;
}

static void fs_setattr(fuse_req_t req, fuse_ino_t ino, struct stat *attr, int to_set, struct fuse_file_info *fi)
{
	struct fs *fs = fs_of(req);
	struct obj o;
	LOCKED_OR_REPLY(fs, ino, o);
	if (to_set & (FUSE_SET_ATTR_MODE | FUSE_SET_ATTR_UID | FUSE_SET_ATTR_GID))
		UNLOCK_REPLY_ERR(fs, -EPERM);
	if (to_set & FUSE_SET_ATTR_SIZE) {
		int e = 0;
		if (o.f) {
			/* Control files take O_TRUNC and truncate as no-ops; status files are read-only. */
			if (o.f->kind == FS_STATE || o.f->kind == FS_HASH || o.f->kind == FS_DEVICE)
				e = -EACCES;
			else if (o.f->kind == FS_ROOT || o.f->kind == FS_STORE)
				e = -EISDIR;
		} else if (o.m->kind == META_DIR) {
			e = -EISDIR;
		} else if (!o.m->linked) {
			e = -ESTALE;
		} else if (!(e = may_change(req, &o, fi))) {
			e = o.m->kind == META_ALLOC ? size_alloc(fs, &o, (uint64_t)attr->st_size)
						    : meta_entry_truncate(o.m, (uint64_t)attr->st_size);
			if (!e)
				store_notify(o.st);
		}
		if (e)
			UNLOCK_REPLY_ERR(fs, e);
	}
	struct stat s;
	fill_attr(fs, &o, &s);
	pthread_mutex_unlock(&fs->mu);
	fuse_reply_attr(req, &s, 0);
}

static void fs_mkdir(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode)
{
	struct fs *fs = fs_of(req);
	struct obj dir, o;
	LOCKED_OR_REPLY(fs, parent, dir);
	if (dir.f && dir.f->kind == FS_ROOT) {
		struct store *st;
		int e = store_create(fs, name, &st);
		if (e)
			UNLOCK_REPLY_ERR(fs, e);
		o = (struct obj){ .f = &st->dir, .st = st };
		return reply_obj(req, fs, &o);
	}
	if (!dir.m)
		UNLOCK_REPLY_ERR(fs, -EPERM);
	int e = may_change(req, &dir, NULL);
	if (!e)
		e = meta_create(dir.m, name, META_DIR, &o.m);
	if (e)
		UNLOCK_REPLY_ERR(fs, e);
	o.st = dir.st;
	store_notify(o.st);
	reply_obj(req, fs, &o);
}

static void remove_entry(fuse_req_t req, fuse_ino_t parent, const char *name, bool dir_wanted)
{
	struct fs *fs = fs_of(req);
	struct obj dir, o;
	LOCKED_OR_REPLY(fs, parent, dir);
	if (dir.f && dir.f->kind == FS_ROOT) {
		int e = !dir_wanted ? (store_find(fs, name) ? -EISDIR : -EPERM) : store_remove(fs, name);
		if (!strcmp(name, "device"))
			e = -EPERM;
		pthread_mutex_unlock(&fs->mu);
		return (void)fuse_reply_err(req, -e);
	}
	if (!dir.m)
		UNLOCK_REPLY_ERR(fs, -EPERM);
	int e = child(fs, &dir, name, &o);
	if (!e && dir_wanted && o.m->kind != META_DIR)
		e = -ENOTDIR;
	if (!e && !dir_wanted && o.m->kind == META_DIR)
		e = -EISDIR;
	if (!e)
		e = may_change(req, &dir, NULL);
	if (!e)
		e = meta_remove(o.m);
	if (!e)
		store_notify(dir.st);
	pthread_mutex_unlock(&fs->mu);
	fuse_reply_err(req, -e);
}

static void fs_rmdir(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	remove_entry(req, parent, name, true);
}

static void fs_unlink(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	remove_entry(req, parent, name, false);
}

static void fs_rename(fuse_req_t req, fuse_ino_t parent, const char *name, fuse_ino_t newparent,
		      const char *newname, unsigned int flags)
{
	/* Names are fixed for a node's life: the snapshot keys on them. */
	fuse_reply_err(req, EPERM);
}

/* ---- handles ---- */

static void handle_free(struct fs_handle *h)
{
	if (!h)
		return;
	struct store *st = h->store;
	if (h->ticket_live)
		export_revoke(st->fs, h);
	if (st && h->hold != HOLD_NONE)
		store_release(st, h);
	store_untrack(h);
	if (h->ph) {
		fuse_pollhandle_destroy(h->ph);
		st->pollers--;
	}
	if (h->node)
		meta_drop(h->node);
	if (st)
		store_put(st, 1);
	free(h->text);
	free(h);
}

/* Reply to an open or create; an interrupted open never gets a release, so undo it here. */
static void reply_open(fuse_req_t req, struct fs *fs, struct fs_handle *h, struct fuse_file_info *fi,
		       struct fuse_entry_param *entry)
{
	fi->fh = (uintptr_t)h;
	fi->direct_io = 1;
	fi->keep_cache = 0;
	pthread_mutex_unlock(&fs->mu);
	int r = entry ? fuse_reply_create(req, entry, fi) : fuse_reply_open(req, fi);
	if (r == -ENOENT) {
		pthread_mutex_lock(&fs->mu);
		if (entry && h->node)
			meta_forget(h->node, 1);
		handle_free(h);
		pthread_mutex_unlock(&fs->mu);
	}
}

static enum fs_want want_of(int flags, bool is_lock)
{
	int acc = flags & O_ACCMODE;
	if (acc == O_RDONLY)
		return WANT_READ;
	if (acc == O_RDWR && is_lock)
		return WANT_RW_OR_RO;
	return WANT_WRITE;
}

/* Take the store's lock for a new handle h on o; fs->mu held, may sleep. */
static int lock_for(fuse_req_t req, struct obj *o, struct fs_handle *h, enum fs_want want, int timeout_ms)
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
	e = store_acquire(o->st, req, want, tgid, timeout_ms, &h->hold);
	if (e)
		return e;
	/* Whatever we waited for may have removed the file meanwhile. */
	if (o->m && !o->m->linked)
		return -ENOENT;
	return 0;
}

static void fs_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct fs *fs = fs_of(req);
	struct obj o;
	LOCKED_OR_REPLY(fs, ino, o);
	bool wr = (fi->flags & O_ACCMODE) != O_RDONLY;
	struct fs_handle *h = calloc(1, sizeof *h);
	if (!h)
		UNLOCK_REPLY_ERR(fs, -ENOMEM);
	h->store = o.st;
	if (o.st)
		store_get(o.st);
	int e = 0;
	if (o.f) {
		h->fnode = o.f;
		switch (o.f->kind) {
		case FS_ROOT:
		case FS_STORE:
			e = -EISDIR;
			break;
		case FS_DEVICE:
		case FS_STATE:
		case FS_HASH:
			e = wr ? -EACCES : 0;
			break;
		case FS_LOCK:
			e = lock_for(req, &o, h, want_of(fi->flags, true), fi->flags & O_NONBLOCK ? 0 : -1);
			break;
		default: /* commit, abort: the write does the work */
			h->writable = wr;
			break;
		}
	} else if (o.m->kind == META_DIR) {
		e = -EISDIR;
	} else if (!o.m->linked) {
		e = -ESTALE;
	} else {
		h->node = o.m;
		meta_hold(o.m);
		e = lock_for(req, &o, h, wr ? WANT_WRITE : WANT_READ, fi->flags & O_NONBLOCK ? 0 : -1);
		h->writable = wr;
		if (!e && wr && (fi->flags & O_TRUNC) && o.m->kind == META_ENTRY)
			e = meta_entry_truncate(o.m, 0);
		/* O_TRUNC of an allocation leaves it alone: its size is fixed (dd without conv=notrunc). */
	}
	if (e) {
		handle_free(h);
		UNLOCK_REPLY_ERR(fs, e);
	}
	if (o.st)
		store_track(o.st, h);
	reply_open(req, fs, h, fi, NULL);
}

static void fs_create(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode, struct fuse_file_info *fi)
{
	struct fs *fs = fs_of(req);
	struct obj dir;
	LOCKED_OR_REPLY(fs, parent, dir);
	if (!dir.m)
		UNLOCK_REPLY_ERR(fs, -EPERM);
	if (!S_ISREG(mode))
		UNLOCK_REPLY_ERR(fs, -EPERM);
	struct fs_handle *h = calloc(1, sizeof *h);
	if (!h)
		UNLOCK_REPLY_ERR(fs, -ENOMEM);
	h->store = dir.st;
	store_get(dir.st);
	meta_hold(dir.m); /* the directory must outlive a wait */
	int e = lock_for(req, &dir, h, WANT_WRITE, fi->flags & O_NONBLOCK ? 0 : -1);
	struct meta_node *m = NULL;
	if (!e)
		e = meta_create(dir.m, name, dir.m->area == META_AREA_ALLOCS ? META_ALLOC : META_ENTRY, &m);
	meta_drop(dir.m);
	if (e) {
		handle_free(h);
		UNLOCK_REPLY_ERR(fs, e);
	}
	h->node = m;
	h->writable = true;
	meta_hold(m);
	store_track(dir.st, h);
	store_notify(dir.st);
	struct obj o = { .m = m, .st = dir.st };
	struct fuse_entry_param entry = { .ino = ino_of(fs, m) };
	fill_attr(fs, &o, &entry.attr);
	meta_lookup_ref(m);
	reply_open(req, fs, h, fi, &entry);
}

static void fs_release(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct fs *fs = fs_of(req);
	pthread_mutex_lock(&fs->mu);
	handle_free((struct fs_handle *)(uintptr_t)fi->fh);
	pthread_mutex_unlock(&fs->mu);
	fuse_reply_err(req, 0);
}

static void fs_flush(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	fuse_reply_err(req, 0);
}

static void reply_slice(fuse_req_t req, const char *p, size_t len, size_t size, off_t off)
{
	if ((uint64_t)off >= len)
		return (void)fuse_reply_buf(req, NULL, 0);
	size_t n = len - (size_t)off < size ? len - (size_t)off : size;
	fuse_reply_buf(req, p + off, n);
}

static void fs_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, struct fuse_file_info *fi)
{
	struct fs *fs = fs_of(req);
	struct fs_handle *h = (struct fs_handle *)(uintptr_t)fi->fh;
	pthread_mutex_lock(&fs->mu);
	if (h->fnode) {
		int e = 0;
		enum fs_kind k = h->fnode->kind;
		if (k == FS_DEVICE || k == FS_STATE || k == FS_HASH) {
			/* Made at offset 0, so one cat sees one consistent text. */
			if (off == 0 || !h->text) {
				free(h->text);
				h->text = NULL;
				if (k == FS_DEVICE)
					e = text_device(fs, &h->text, &h->text_len);
				else if (h->store->removed)
					e = -ENOENT;
				else if (k == FS_STATE) {
					h->seen_events = h->store->events;
					e = text_state(h->store, &h->text, &h->text_len);
				} else
					e = text_hash(h->store, &h->text, &h->text_len);
			}
			if (e)
				UNLOCK_REPLY_ERR(fs, e);
			reply_slice(req, h->text, h->text_len, size, off);
		} else {
			fuse_reply_buf(req, NULL, 0);
		}
		return (void)pthread_mutex_unlock(&fs->mu);
	}
	struct meta_node *m = h->node;
	if (!m->linked)
		UNLOCK_REPLY_ERR(fs, -ESTALE);
	if (m->kind == META_ENTRY) {
		reply_slice(req, m->value, m->value_len, size, off);
		return (void)pthread_mutex_unlock(&fs->mu);
	}
	if (!m->buf || (uint64_t)off >= m->size) {
		pthread_mutex_unlock(&fs->mu);
		return (void)fuse_reply_buf(req, NULL, 0);
	}
	struct vmm_buf *b = m->buf;
	size_t n = m->size - (uint64_t)off < size ? (size_t)(m->size - (uint64_t)off) : size;
	vmm_buf_get(b);
	pthread_mutex_unlock(&fs->mu);
	char *data = malloc(n ? n : 1);
	ssize_t r = data ? vmm_pread(b, data, n, (uint64_t)off) : -ENOMEM;
	vmm_buf_put(b);
	if (r < 0)
		fuse_reply_err(req, (int)-r);
	else
		fuse_reply_buf(req, data, (size_t)r);
	free(data);
}

static void fs_write(fuse_req_t req, fuse_ino_t ino, const char *buf, size_t size, off_t off,
		     struct fuse_file_info *fi)
{
	struct fs *fs = fs_of(req);
	struct fs_handle *h = (struct fs_handle *)(uintptr_t)fi->fh;
	pthread_mutex_lock(&fs->mu);
	if (h->fnode) {
		struct store *st = h->store;
		int e = -EINVAL; /* lock takes no data */
		if (h->fnode->kind == FS_COMMIT || h->fnode->kind == FS_ABORT) {
			pid_t tgid;
			e = caller_tgid(req, &tgid);
			if (!e && st->removed)
				e = -ENOENT;
			if (!e && !store_is_member(st, tgid))
				e = -EPERM; /* only the writer session commits or aborts */
			if (!e)
				e = h->fnode->kind == FS_COMMIT ? store_commit(st) : store_abort(st);
		}
		pthread_mutex_unlock(&fs->mu);
		if (e)
			return (void)fuse_reply_err(req, -e);
		return (void)fuse_reply_write(req, size);
	}
	struct meta_node *m = h->node;
	if (h->hold != HOLD_SESSION)
		UNLOCK_REPLY_ERR(fs, -EROFS); /* committed: the handle is a read handle now */
	if (!m->linked)
		UNLOCK_REPLY_ERR(fs, -ESTALE);
	if (m->kind == META_ENTRY) {
		int e = meta_entry_write(m, (uint64_t)off, buf, size);
		if (e)
			UNLOCK_REPLY_ERR(fs, e);
		store_notify(h->store);
		pthread_mutex_unlock(&fs->mu);
		return (void)fuse_reply_write(req, size);
	}
	if (!m->buf || (uint64_t)off >= m->size)
		UNLOCK_REPLY_ERR(fs, -EFBIG); /* fixed size: ftruncate first, never past the end */
	struct vmm_buf *b = m->buf;
	size_t n = m->size - (uint64_t)off < size ? (size_t)(m->size - (uint64_t)off) : size;
	vmm_buf_get(b);
	pthread_mutex_unlock(&fs->mu);
	ssize_t r = vmm_pwrite(b, buf, n, (uint64_t)off);
	vmm_buf_put(b);
	if (r < 0)
		return (void)fuse_reply_err(req, (int)-r);
	fuse_reply_write(req, (size_t)r);
}

static void fs_poll(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi, struct fuse_pollhandle *ph)
{
	struct fs *fs = fs_of(req);
	struct fs_handle *h = (struct fs_handle *)(uintptr_t)fi->fh;
	unsigned revents = POLLIN | POLLRDNORM;
	pthread_mutex_lock(&fs->mu);
	if (h->fnode && h->fnode->kind == FS_STATE) {
		/* Readable once state changed since this handle last read it at offset 0. */
		if (h->seen_events == h->store->events && !h->store->removed) {
			revents = 0;
			if (ph) {
				if (h->ph)
					fuse_pollhandle_destroy(h->ph);
				else
					h->store->pollers++;
				h->ph = ph;
				ph = NULL;
			}
		}
	}
	pthread_mutex_unlock(&fs->mu);
	if (ph)
		fuse_pollhandle_destroy(ph);
	fuse_reply_poll(req, revents);
}

/* ---- directories ---- */

static void fs_opendir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct fs *fs = fs_of(req);
	struct obj o;
	LOCKED_OR_REPLY(fs, ino, o);
	bool dir = o.m ? o.m->kind == META_DIR : (o.f->kind == FS_ROOT || o.f->kind == FS_STORE);
	if (!dir)
		UNLOCK_REPLY_ERR(fs, -ENOTDIR);
	fi->fh = 0;
	if (o.f && o.f->kind == FS_STORE) {
		/* A store directory's handle can hold the store's lock (GMSFS_IOC_LOCK). */
		struct fs_handle *h = calloc(1, sizeof *h);
		if (!h)
			UNLOCK_REPLY_ERR(fs, -ENOMEM);
		h->store = o.st;
		h->fnode = o.f;
		store_get(o.st);
		store_track(o.st, h);
		fi->fh = (uintptr_t)h;
	}
	pthread_mutex_unlock(&fs->mu);
	if (fuse_reply_open(req, fi) == -ENOENT && fi->fh) {
		pthread_mutex_lock(&fs->mu);
		handle_free((struct fs_handle *)(uintptr_t)fi->fh);
		pthread_mutex_unlock(&fs->mu);
	}
}

static void fs_releasedir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct fs *fs = fs_of(req);
	pthread_mutex_lock(&fs->mu);
	handle_free((struct fs_handle *)(uintptr_t)fi->fh);
	pthread_mutex_unlock(&fs->mu);
	fuse_reply_err(req, 0);
}

struct dirbuf {
	fuse_req_t req;
	char *buf;
	size_t size, used;
};

/* Add one entry; false when the buffer is full. */
static bool dir_add(struct dirbuf *d, const char *name, fuse_ino_t ino, mode_t mode, off_t next)
{
	struct stat s = { .st_ino = ino, .st_mode = mode };
	size_t need = fuse_add_direntry(d->req, NULL, 0, name, NULL, 0);
	if (d->used + need > d->size)
		return false;
	fuse_add_direntry(d->req, d->buf + d->used, d->size - d->used, name, &s, next);
	d->used += need;
	return true;
}

static void fs_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, struct fuse_file_info *fi)
{
	struct fs *fs = fs_of(req);
	struct obj o;
	LOCKED_OR_REPLY(fs, ino, o);
	struct dirbuf d = { .req = req, .size = size, .buf = malloc(size) };
	if (!d.buf)
		UNLOCK_REPLY_ERR(fs, -ENOMEM);
	/* Offsets: 1 and 2 for "." and "..", then 3 + index of the child. */
	size_t i = (size_t)off;
	if (i == 0 && !dir_add(&d, ".", ino, S_IFDIR, 1))
		goto out;
	if (i <= 1 && !dir_add(&d, "..", FUSE_ROOT_ID, S_IFDIR, 2))
		goto out;
	for (size_t k = i > 2 ? i - 2 : 0;; k++) {
		const char *name;
		fuse_ino_t cino;
		mode_t mode = S_IFREG;
		if (o.m) {
			if (k >= o.m->nkids)
				break;
			struct meta_node *c = o.m->kids[k];
			name = c->name;
			cino = ino_of(fs, c);
			mode = c->kind == META_DIR ? S_IFDIR : S_IFREG;
		} else if (o.f->kind == FS_ROOT) {
			if (k > fs->nstores)
				break;
			if (k == 0) {
				name = "device";
				cino = ino_of(fs, &fs->device);
			} else {
				name = fs->stores[k - 1]->name;
				cino = ino_of(fs, &fs->stores[k - 1]->dir);
				mode = S_IFDIR;
			}
		} else {
			if (k >= FS_STORE_FILES + 2)
				break;
			if (k < FS_STORE_FILES) {
				name = store_file_names[k];
				cino = ino_of(fs, &o.st->files[k]);
			} else {
				struct meta_node *r = meta_root(o.st->meta, k == FS_STORE_FILES ? META_AREA_ALLOCS : META_AREA_META);
				name = r->name;
				cino = ino_of(fs, r);
				mode = S_IFDIR;
			}
		}
		if (!dir_add(&d, name, cino, mode, (off_t)(k + 3)))
			break;
	}
out:
	pthread_mutex_unlock(&fs->mu);
	fuse_reply_buf(req, d.buf, d.used);
	free(d.buf);
}

/* ---- xattrs ---- */

static int xattr_value(const struct meta_node *m, const char *name, char *buf, size_t size)
{
	if (m->kind == META_ALLOC && !strcmp(name, XATTR_TAG))
		return snprintf(buf, size, "%s", m->tag ? m->tag : "");
	if (m->kind == META_ENTRY && !strcmp(name, XATTR_ALLOC) && m->alloc)
		return snprintf(buf, size, "%s", m->alloc);
	if (m->kind == META_ENTRY && !strcmp(name, XATTR_OFFSET))
		return snprintf(buf, size, "%llu", (unsigned long long)m->offset);
	return -ENODATA; /* never ENOSYS: the kernel would stop asking */
}

static void fs_getxattr(fuse_req_t req, fuse_ino_t ino, const char *name, size_t size)
{
	struct fs *fs = fs_of(req);
	struct obj o;
	char val[META_PATH_MAX + 2];
	LOCKED_OR_REPLY(fs, ino, o);
	int n = o.m ? xattr_value(o.m, name, val, sizeof val) : -ENODATA;
	pthread_mutex_unlock(&fs->mu);
	if (n < 0)
		return (void)fuse_reply_err(req, -n);
	if (!size)
		return (void)fuse_reply_xattr(req, (size_t)n);
	if ((size_t)n > size)
		return (void)fuse_reply_err(req, ERANGE);
	fuse_reply_buf(req, val, (size_t)n);
}

static void fs_listxattr(fuse_req_t req, fuse_ino_t ino, size_t size)
{
	struct fs *fs = fs_of(req);
	struct obj o;
	char list[64];
	size_t n = 0;
	LOCKED_OR_REPLY(fs, ino, o);
	if (o.m && o.m->kind == META_ALLOC) {
		memcpy(list, XATTR_TAG, sizeof XATTR_TAG);
		n = sizeof XATTR_TAG;
	} else if (o.m && o.m->kind == META_ENTRY) {
		if (o.m->alloc) {
			memcpy(list, XATTR_ALLOC, sizeof XATTR_ALLOC);
			n = sizeof XATTR_ALLOC;
		}
		memcpy(list + n, XATTR_OFFSET, sizeof XATTR_OFFSET);
		n += sizeof XATTR_OFFSET;
	}
	pthread_mutex_unlock(&fs->mu);
	if (!size)
		return (void)fuse_reply_xattr(req, n);
	if (n > size)
		return (void)fuse_reply_err(req, ERANGE);
	fuse_reply_buf(req, list, n);
}

static void fs_setxattr(fuse_req_t req, fuse_ino_t ino, const char *name, const char *value, size_t size, int flags)
{
	struct fs *fs = fs_of(req);
	struct obj o;
	LOCKED_OR_REPLY(fs, ino, o);
	int e = -ENOTSUP;
	bool known = o.m && ((o.m->kind == META_ALLOC && !strcmp(name, XATTR_TAG)) ||
			     (o.m->kind == META_ENTRY && (!strcmp(name, XATTR_ALLOC) || !strcmp(name, XATTR_OFFSET))));
	if (known && !o.m->linked)
		e = -ESTALE;
	else if (known && !(e = may_change(req, &o, NULL))) {
		char tmp[2];
		bool exists = xattr_value(o.m, name, tmp, sizeof tmp) >= 0;
		if ((flags & XATTR_CREATE) && exists)
			e = -EEXIST;
		else if ((flags & XATTR_REPLACE) && !exists)
			e = -ENODATA;
		else if (!strcmp(name, XATTR_TAG))
			e = meta_set_tag(o.m, value, size);
		else if (!strcmp(name, XATTR_ALLOC))
			e = meta_entry_set_alloc(o.m, value, size);
		else
			e = meta_entry_set_offset(o.m, value, size);
		if (!e)
			store_notify(o.st);
	}
	pthread_mutex_unlock(&fs->mu);
	fuse_reply_err(req, -e);
}

static void fs_removexattr(fuse_req_t req, fuse_ino_t ino, const char *name)
{
	struct fs *fs = fs_of(req);
	struct obj o;
	LOCKED_OR_REPLY(fs, ino, o);
	char tmp[2];
	int e = o.m && xattr_value(o.m, name, tmp, sizeof tmp) >= 0 ? 0 : -ENODATA;
	if (!e && !o.m->linked)
		e = -ESTALE;
	if (!e)
		e = may_change(req, &o, NULL);
	if (!e) {
		/* Back to the defaults: tag "default", no allocation, offset 0. */
		if (!strcmp(name, XATTR_TAG))
			e = meta_set_tag(o.m, "default", 7);
		else if (!strcmp(name, XATTR_ALLOC)) {
			free(o.m->alloc);
			o.m->alloc = NULL;
		} else
			o.m->offset = 0;
		store_notify(o.st);
	}
	pthread_mutex_unlock(&fs->mu);
	fuse_reply_err(req, -e);
}

static void fs_statfs(fuse_req_t req, fuse_ino_t ino)
{
	struct fs *fs = fs_of(req);
	const struct vmm *v = fs->vmm;
	uint64_t g = v->dev.granularity, used = atomic_load(&v->used_bytes);
	struct statvfs s = {
		.f_bsize = g, .f_frsize = g,
		.f_blocks = v->max_bytes / g,
		.f_bfree = (v->max_bytes - (used < v->max_bytes ? used : v->max_bytes)) / g,
		.f_namemax = 255,
	};
	s.f_bavail = s.f_bfree;
	fuse_reply_statfs(req, &s);
}

/* ---- ioctl: lock with a timeout, facts, export tickets (see gmsfs_ioctl.h) ---- */

static uint32_t lock_of(const struct fs_handle *h)
{
	return h->hold == HOLD_SESSION ? GMSFS_LOCK_RW : h->hold == HOLD_READ ? GMSFS_LOCK_RO : 0;
}

/* The facts every reply carries; count and bytes of the layout the handle sees. */
static void ioc_fill(struct fs *fs, struct fs_handle *h, struct gmsfs_ioc *io)
{
	struct store *st = h->store;
	const struct vmm *v = fs->vmm;
	io->lock = lock_of(h);
	io->backend = strcmp(v->dev.backend, "cuda") ? GMSFS_BACKEND_HOST : GMSFS_BACKEND_CUDA;
	io->device = v->dev.index;
	io->generation = st->fsm.generation;
	io->granularity = v->dev.granularity;
	io->has_hash = meta_hash(st->meta, io->layout_hash);
	struct meta_stats ms;
	meta_stats(st->meta, &ms);
	io->count = ms.allocations;
	io->size_bytes = ms.bytes;
	io->aligned_bytes = ms.aligned_bytes;
	snprintf(io->socket, sizeof io->socket, "%s", fs->socket_path);
}

static int ioc_check(unsigned cmd, const struct gmsfs_ioc *io)
{
	if (io->size != sizeof *io || io->flags)
		return -EINVAL;
	for (int i = 0; i < 4; i++)
		if (io->reserved[i])
			return -EINVAL;
	if (cmd == GMSFS_IOC_LOCK)
		return io->mode < GMSFS_LOCK_RO || io->mode > GMSFS_LOCK_RW_OR_RO || io->timeout_ms < -1 ? -EINVAL : 0;
	return io->mode || io->timeout_ms ? -EINVAL : 0;
}

static void fs_ioctl(fuse_req_t req, fuse_ino_t ino, unsigned int cmd, void *arg, struct fuse_file_info *fi,
		     unsigned flags, const void *in_buf, size_t in_bufsz, size_t out_bufsz)
{
	struct fs *fs = fs_of(req);
	struct gmsfs_ioc io;
	if (cmd != GMSFS_IOC_INFO && cmd != GMSFS_IOC_LOCK && cmd != GMSFS_IOC_EXPORT && cmd != GMSFS_IOC_EXPORT_ALL)
		return (void)fuse_reply_err(req, ENOTTY);
	/* The command encodes the size, so the kernel copied exactly one struct each way. */
	if (in_bufsz != sizeof io || out_bufsz != sizeof io)
		return (void)fuse_reply_err(req, EINVAL);
	memcpy(&io, in_buf, sizeof io);
	int e = ioc_check(cmd, &io);
	if (e)
		return (void)fuse_reply_err(req, -e);
	struct fs_handle *h = (struct fs_handle *)(uintptr_t)fi->fh;
	if (!h || !h->store)
		return (void)fuse_reply_err(req, ENOTTY); /* not a file of a store */
	pid_t tgid;
	if ((e = caller_tgid(req, &tgid)))
		return (void)fuse_reply_err(req, -e);
	uid_t uid = fuse_req_ctx(req)->uid;

	pthread_mutex_lock(&fs->mu);
	struct store *st = h->store;
	bool is_dir = h->fnode && h->fnode->kind == FS_STORE;
	bool lock_holder = h->fnode && (h->fnode->kind == FS_LOCK || is_dir);
	if (st->removed)
		UNLOCK_REPLY_ERR(fs, -ENOENT);
	switch (cmd) {
	case GMSFS_IOC_INFO:
		break;
	case GMSFS_IOC_LOCK: {
		if (!is_dir)
			UNLOCK_REPLY_ERR(fs, -ENOTTY);
		if (h->hold != HOLD_NONE)
			UNLOCK_REPLY_ERR(fs, -EBUSY); /* this handle holds the lock already */
		enum fs_want want = io.mode == GMSFS_LOCK_RO ? WANT_READ : io.mode == GMSFS_LOCK_RW ? WANT_WRITE : WANT_RW_OR_RO;
		struct obj o = { .f = h->fnode, .st = st };
		if ((e = lock_for(req, &o, h, want, io.timeout_ms)))
			UNLOCK_REPLY_ERR(fs, e);
		break;
	}
	case GMSFS_IOC_EXPORT: {
		struct meta_node *m = h->node;
		if (!m || m->kind != META_ALLOC)
			UNLOCK_REPLY_ERR(fs, -ENOTTY);
		if (!m->linked)
			UNLOCK_REPLY_ERR(fs, -ESTALE);
		if (!m->buf)
			UNLOCK_REPLY_ERR(fs, -ENODATA); /* not sized yet: no memory behind it */
		if ((e = export_ticket(fs, h, false, tgid, uid, io.ticket)))
			UNLOCK_REPLY_ERR(fs, e);
		ioc_fill(fs, h, &io);
		io.count = 1;
		io.size_bytes = m->size;
		io.aligned_bytes = m->aligned;
		pthread_mutex_unlock(&fs->mu);
		return (void)fuse_reply_ioctl(req, 0, &io, sizeof io);
	}
	case GMSFS_IOC_EXPORT_ALL:
		if (!lock_holder)
			UNLOCK_REPLY_ERR(fs, -ENOTTY);
		if (h->hold == HOLD_NONE)
			UNLOCK_REPLY_ERR(fs, -ENOLCK); /* a directory that has not taken the lock */
		if ((e = export_ticket(fs, h, true, tgid, uid, io.ticket)))
			UNLOCK_REPLY_ERR(fs, e);
		break;
	}
	ioc_fill(fs, h, &io);
	pthread_mutex_unlock(&fs->mu);
	fuse_reply_ioctl(req, 0, &io, sizeof io);
}

static void fs_init(void *userdata, struct fuse_conn_info *conn)
{
	/* echo > commit arrives as an open with O_TRUNC. */
	if (conn->capable & FUSE_CAP_ATOMIC_O_TRUNC)
		conn->want |= FUSE_CAP_ATOMIC_O_TRUNC;
	conn->want &= ~FUSE_CAP_WRITEBACK_CACHE;
}

const struct fuse_lowlevel_ops fs_ops = {
	.init = fs_init,
	.lookup = fs_lookup,
	.forget = fs_forget,
	.forget_multi = fs_forget_multi,
	.getattr = fs_getattr,
	.setattr = fs_setattr,
	.mkdir = fs_mkdir,
	.rmdir = fs_rmdir,
	.unlink = fs_unlink,
	.rename = fs_rename,
	.open = fs_open,
	.create = fs_create,
	.read = fs_read,
	.write = fs_write,
	.flush = fs_flush,
	.release = fs_release,
	.poll = fs_poll,
	.opendir = fs_opendir,
	.releasedir = fs_releasedir,
	.readdir = fs_readdir,
	.getxattr = fs_getxattr,
	.listxattr = fs_listxattr,
	.setxattr = fs_setxattr,
	.removexattr = fs_removexattr,
	.statfs = fs_statfs,
	.ioctl = fs_ioctl,
};
