/* ops_tree: names and attributes (lookup, getattr, setattr, mkdir, rmdir, unlink,
 * readdir, statfs).  Each do_x() runs with fs->mu held and returns -errno; the
 * fs_x() around it replies. */
#include "ops.h"
#include "inval.h"
#include "lock.h"
#include "memory.h"
#include "store.h"
#include "tier.h"
#include "grow.h"
#include "clock.h"
#include "fault.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>
#include <unistd.h>

/* Send an entry made by node_entry (fs->mu not held); the kernel's reference goes back
 * if the reply does not arrive (an interrupted request). */
static void reply_entry(fuse_req_t req, struct fs *fs, const struct fuse_entry_param *e)
{
	if (fuse_reply_entry(req, e)) {
		pthread_mutex_lock(&fs->mu);
		node_forget(fs, e->ino, 1);
		pthread_mutex_unlock(&fs->mu);
	}
}

static int do_lookup(fuse_req_t req, struct fs *fs, fuse_ino_t parent, const char *name, struct obj *o)
{
	struct obj dir = {0};
	int e = ops_resolve(req, fs, parent, &dir);
	return e ? e : node_child(fs, &dir, name, o);
}

void fs_lookup(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	struct fs *fs = fs_of(req);
	struct obj o = {0};
	struct fuse_entry_param entry;
	pthread_mutex_lock(&fs->mu);
	int e = do_lookup(req, fs, parent, name, &o);
	if (!e)
		node_entry(fs, &o, &entry);
	pthread_mutex_unlock(&fs->mu);
	if (e)
		return (void)fuse_reply_err(req, -e);
	reply_entry(req, fs, &entry);
}

void fs_forget(fuse_req_t req, fuse_ino_t ino, uint64_t nlookup)
{
	struct fs *fs = fs_of(req);
	pthread_mutex_lock(&fs->mu);
	node_forget(fs, ino, nlookup);
	pthread_mutex_unlock(&fs->mu);
	fuse_reply_none(req);
	store_trim(fs); /* the last forget of a removed store frees it */
}

void fs_forget_multi(fuse_req_t req, size_t count, struct fuse_forget_data *forgets)
{
	struct fs *fs = fs_of(req);
	pthread_mutex_lock(&fs->mu);
	for (size_t i = 0; i < count; i++)
		node_forget(fs, forgets[i].ino, forgets[i].nlookup);
	pthread_mutex_unlock(&fs->mu);
	fuse_reply_none(req);
	store_trim(fs);
}

/* *timeout: as node_entry's, the root, stores and control files keep their attributes
 * (else every path walk asks for the root's again); layout nodes for a while, and not at
 * all during a writer session. */
static int do_getattr(fuse_req_t req, struct fs *fs, fuse_ino_t ino, struct stat *s, double *timeout)
{
	struct obj o = {0};
	int e = ops_resolve(req, fs, ino, &o);
	if (!e) {
		node_attr(fs, &o, s);
		*timeout = node_timeout(&o);
	}
	return e;
}

void fs_getattr(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct fs *fs = fs_of(req);
	struct stat s;
	double timeout;
	pthread_mutex_lock(&fs->mu);
	int e = do_getattr(req, fs, ino, &s, &timeout);
	pthread_mutex_unlock(&fs->mu);
	if (e)
		return (void)fuse_reply_err(req, -e);
	fuse_reply_attr(req, &s, timeout);
}

/* An allocation sized once: its memory made through the one door (memory.h), fs->mu let
 * go meanwhile; the node and the session are looked at again after.  Elastic stores asked
 * for pages have TIER_RECLAIM_MS to give them, waited for here (a shell's truncate has no
 * retry of its own). */
static int size_alloc(fuse_req_t req, struct fs *fs, struct obj *o, uint64_t size, const struct fs_handle *h)
{
	struct meta_node *m = o->m;
	struct store *st = o->st;
	if (m->size == size || (!m->size && !size))
		return 0;
	if (m->size)
		return -EPERM; /* sized once: the size never changes */
	char path[GMSFS_PATH_MAX + 1] = "", why[600] = "";
	meta_path(m, path, sizeof path);
	struct memory_ask ask = { path, size, NULL };
	struct vmm_buf *b = NULL;
	store_get(st);
	meta_hold(m);
	pthread_mutex_unlock(&fs->mu);
	int e = memory_make_waiting(fs, st, &ask, 1, &b, why, sizeof why);
	pthread_mutex_lock(&fs->mu);
	bool taken = false; /* b is the node's */
	if (e)
		store_error(st, "%s", why);
	else if (!m->linked || m->size || (e = lock_check_change(req, st, h)))
		/* removed or sized meanwhile (the same size: done), or the session went */
		e = e ? e : !m->linked ? -ESTALE : m->size == size ? 0 : -EPERM;
	else if ((e = meta_alloc_size(m, size, b->size, b)))
		store_error(st, "allocs/%.200s: %s", path, strerror(-e));
	else
		taken = true;
	if (b && !taken) { /* a release is the backend's call too: not under fs->mu */
		pthread_mutex_unlock(&fs->mu);
		vmm_buf_put(b);
		pthread_mutex_lock(&fs->mu);
	}
	meta_drop(m);
	store_put(st, 1);
	return e;
}

/* truncate(2) and ftruncate: size an allocation once, cut an entry's value; control
 * files take it as a no-op (O_TRUNC of `echo > commit`). */
static int do_truncate(fuse_req_t req, struct fs *fs, struct obj *o, uint64_t size, struct fuse_file_info *fi)
{
	if (o->f) {
		const struct fs_kind_row *k = &fs_kinds[o->f->kind];
		return k->open == FS_OPEN_DIR ? -EISDIR : k->truncates ? 0 : -EACCES;
	}
	if (o->m->kind == META_DIR)
		return -EISDIR;
	if (!o->m->linked)
		return -ESTALE;
	int e = lock_check_change(req, o->st, fi ? (struct fs_handle *)(uintptr_t)fi->fh : NULL);
	if (e)
		return e;
	if (o->m->kind != META_ALLOC) {
		if (!(e = meta_entry_truncate(o->m, size)))
			store_notify(o->st);
		return e;
	}
	e = size_alloc(req, fs, o, size, fi ? (struct fs_handle *)(uintptr_t)fi->fh : NULL);
	/* A size refused changes nothing: the descriptor may ask another.  truncate -s N of a
	 * file it just made (open O_CREAT, then ftruncate) that was refused leaves no unsized
	 * allocation behind at its close (ops_handle_free) for the commit to trip over. */
	struct fs_handle *h = fi ? (struct fs_handle *)(uintptr_t)fi->fh : NULL;
	if (e && h && h->created && h->node == o->m)
		h->size_refused = true;
	if (!e)
		store_notify(o->st);
	return e;
}

static int do_setattr(fuse_req_t req, struct fs *fs, fuse_ino_t ino, struct stat *attr, int to_set,
		      struct fuse_file_info *fi)
{
	struct obj o = {0};
	int e = node_resolve(fs, ino, &o);
	if (e)
		return e;
	if (to_set & (FUSE_SET_ATTR_MODE | FUSE_SET_ATTR_UID | FUSE_SET_ATTR_GID))
		return -EPERM;
	if ((to_set & FUSE_SET_ATTR_SIZE) && (e = do_truncate(req, fs, &o, (uint64_t)attr->st_size, fi)))
		return e;
	node_attr(fs, &o, attr);
	return 0;
}

void fs_setattr(fuse_req_t req, fuse_ino_t ino, struct stat *attr, int to_set, struct fuse_file_info *fi)
{
	struct fs *fs = fs_of(req);
	pthread_mutex_lock(&fs->mu);
	int e = do_setattr(req, fs, ino, attr, to_set, fi);
	pthread_mutex_unlock(&fs->mu);
	if (e)
		return (void)fuse_reply_err(req, -e);
	fuse_reply_attr(req, attr, 0);
}

static int do_mkdir(fuse_req_t req, struct fs *fs, fuse_ino_t parent, const char *name, struct obj *o)
{
	struct obj dir = {0};
	int e = node_resolve(fs, parent, &dir);
	if (e)
		return e;
	if (dir.f && dir.f->kind == FS_ROOT) {
		struct store *st;
		if (node_root_file(fs, name))
			return -EINVAL; /* device, status.json, metrics */
		if ((e = store_create(fs, name, &st)))
			return e;
		store_changed(st, "mkdir");
		*o = (struct obj){ .f = &st->dir, .st = st };
		return 0;
	}
	if (!dir.m)
		return -EPERM;
	struct meta_node *m;
	if ((e = lock_check_change(req, dir.st, NULL)) || (e = meta_create(dir.m, name, META_DIR, &m)))
		return e;
	*o = (struct obj){ .m = m, .st = dir.st };
	store_notify(o->st);
	return 0;
}

void fs_mkdir(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode)
{
	struct fs *fs = fs_of(req);
	struct obj o = {0};
	struct fuse_entry_param entry;
	pthread_mutex_lock(&fs->mu);
	int e = do_mkdir(req, fs, parent, name, &o);
	if (!e)
		node_entry(fs, &o, &entry);
	pthread_mutex_unlock(&fs->mu);
	if (e)
		return (void)fuse_reply_err(req, -e);
	reply_entry(req, fs, &entry);
}

static int do_remove(fuse_req_t req, struct fs *fs, fuse_ino_t parent, const char *name, bool dir_wanted)
{
	struct obj dir = {0}, o = {0};
	int e = node_resolve(fs, parent, &dir);
	if (e)
		return e;
	if (dir.f && dir.f->kind == FS_ROOT) {
		if (node_root_file(fs, name))
			return -EPERM;
		if (!dir_wanted)
			return store_find(fs, name) ? -EISDIR : -EPERM;
		struct store *st = store_find(fs, name);
		if (!st)
			return -ENOENT;
		store_get(st);
		if (!(e = store_remove(fs, name))) /* its image goes first */
			lock_changed(st); /* waiting opens learn it is gone: ENOENT */
		store_put(st, 1);
		return e;
	}
	if (!dir.m)
		return -EPERM;
	if ((e = node_child(fs, &dir, name, &o)))
		return e;
	if (dir_wanted && o.m->kind != META_DIR)
		return -ENOTDIR;
	if (!dir_wanted && o.m->kind == META_DIR)
		return -EISDIR;
	if ((e = lock_check_change(req, dir.st, NULL)) || (e = meta_remove(o.m)))
		return e;
	store_notify(dir.st);
	return 0;
}

void fs_rmdir(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	struct fs *fs = fs_of(req);
	pthread_mutex_lock(&fs->mu);
	int e = do_remove(req, fs, parent, name, true);
	pthread_mutex_unlock(&fs->mu);
	fuse_reply_err(req, -e);
	store_trim(fs); /* a removed store's layout */
}

void fs_unlink(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	struct fs *fs = fs_of(req);
	pthread_mutex_lock(&fs->mu);
	int e = do_remove(req, fs, parent, name, false);
	pthread_mutex_unlock(&fs->mu);
	fuse_reply_err(req, -e);
}

void fs_rename(fuse_req_t req, fuse_ino_t parent, const char *name, fuse_ino_t newparent,
		      const char *newname, unsigned int flags)
{
	/* Names are fixed for a node's life: the snapshot keys on them. */
	fuse_reply_err(req, EPERM);
}

/* ---- directories ---- */

static int do_opendir(struct fs *fs, fuse_ino_t ino, struct fs_handle **out)
{
	struct obj o = {0};
	int e = node_resolve(fs, ino, &o);
	if (e)
		return e;
	if (o.m ? o.m->kind != META_DIR : o.f->kind != FS_ROOT && o.f->kind != FS_STORE)
		return -ENOTDIR;
	*out = NULL;
	if (o.m || o.f->kind == FS_STORE) {
		/* A store directory's handle can hold the store's lock (GMSFS_IOC_LOCK); a
		 * layout directory's keeps its listing (do_readdir). */
		struct fs_handle *h = ops_handle_new(o.st);
		if (!h)
			return -ENOMEM;
		h->fnode = o.f;
		store_track(o.st, h);
		*out = h;
	}
	return 0;
}

void fs_opendir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct fs *fs = fs_of(req);
	struct fs_handle *h = NULL;
	pthread_mutex_lock(&fs->mu);
	int e = do_opendir(fs, ino, &h);
	pthread_mutex_unlock(&fs->mu);
	if (e)
		return (void)fuse_reply_err(req, -e);
	fi->fh = (uintptr_t)h;
	if (fuse_reply_open(req, fi) == -ENOENT && h) { /* interrupted: no release will come */
		pthread_mutex_lock(&fs->mu);
		ops_handle_free(h);
		pthread_mutex_unlock(&fs->mu);
	}
}

struct dirbuf {
	fuse_req_t req;
	bool plus;   /* readdirplus: each entry with its attributes, counted as a lookup */
	char *buf;
	size_t size, used;
	struct obj *taken; /* plus: the references taken, given back if the reply does not arrive */
	size_t ntaken, taken_cap;
	bool oom;
	struct fs_handle *h; /* the directory's handle (NULL: the root's); a layout directory's keeps its listing */
};

/* Add one entry; false when the buffer is full.  With plus, o's entry (node_entry takes
 * the kernel's reference, as a lookup would) is added only when it fits; "." and ".."
 * (no o) take none: the kernel counts no lookup for them. */
static bool dir_add(struct fs *fs, struct dirbuf *d, const char *name, fuse_ino_t ino, const struct obj *o,
		    off_t next)
{
	size_t need = d->plus ? fuse_add_direntry_plus(d->req, NULL, 0, name, NULL, 0)
			      : fuse_add_direntry(d->req, NULL, 0, name, NULL, 0);
	if (d->used + need > d->size)
		return false;
	if (o && d->plus && GROW(d->taken, d->ntaken, d->taken_cap, 64)) {
		d->oom = true; /* a shorter reply; an empty one would say the end: ENOMEM then */
		return false;
	}
	struct fuse_entry_param e = { .ino = ino, .attr = { .st_ino = ino, .st_mode = S_IFDIR } };
	if (o && d->plus) {
		node_entry(fs, o, &e);
		d->taken[d->ntaken++] = *o;
	} else if (o && !node_is_dir(o)) {
		e.attr.st_mode = S_IFREG; /* readdir gives the type only */
	}
	if (d->plus)
		fuse_add_direntry_plus(d->req, d->buf + d->used, d->size - d->used, name, &e, next);
	else
		fuse_add_direntry(d->req, d->buf + d->used, d->size - d->used, name, &e.attr, next);
	d->used += need;
	return true;
}

/* The k-th child of dir (after . and ..) into *o, or false past the last. */
static bool dir_child(struct fs *fs, const struct obj *dir, const struct dirbuf *d, size_t k, const char **name,
		      struct obj *o)
{
	*o = (struct obj){ .st = dir->st, .committed = dir->committed };
	if (dir->m) {
		if (k >= d->h->nlisting)
			return false;
		o->m = d->h->listing[k];
		*name = o->m->name;
		return true;
	}
	if (dir->f->kind == FS_ROOT) {
		static const char *const root_files[] = { "device", "status.json", "metrics" };
		enum { NROOT = sizeof root_files / sizeof *root_files };
		if (k >= NROOT + fs->stores->n)
			return false;
		if (k < NROOT) {
			*name = root_files[k];
			o->f = node_root_file(fs, root_files[k]);
			return true;
		}
		o->st = fs->stores->v[k - NROOT];
		o->f = &o->st->dir;
		*name = o->st->name;
		return true;
	}
	if (k >= FS_STORE_FILES + 2)
		return false;
	if (k < FS_STORE_FILES) {
		*name = fs_kinds[FS_LOCK + k].name;
		o->f = &dir->st->files[k];
		return true;
	}
	o->m = meta_root(dir->st->meta, k == FS_STORE_FILES ? META_AREA_ALLOCS : META_AREA_META);
	*name = o->m->name;
	return true;
}

/* Layout directory dir's children as the caller sees them (the last commit's, outside a
 * writer session) into h's listing, each with a lookup reference: a commit between one
 * listing's calls then changes neither its names nor its nodes. */
static int listing_take(struct fs *fs, const struct obj *dir, struct fs_handle *h)
{
	struct meta_node **v;
	size_t n = 0;
	if (dir->committed) {
		int e = meta_committed_children(dir->m, &v, &n);
		if (e)
			return e;
	} else {
		n = dir->m->nkids;
		if (!(v = malloc((n ? n : 1) * sizeof *v)))
			return -ENOMEM;
		if (n)
			memcpy(v, dir->m->kids, n * sizeof *v);
	}
	for (size_t i = 0; i < n; i++)
		meta_lookup_ref(v[i]);
	ops_listing_drop(fs, h);
	h->listing = v;
	h->nlisting = n;
	return 0;
}

static int do_readdir(fuse_req_t req, struct fs *fs, fuse_ino_t ino, off_t off, struct dirbuf *d)
{
	struct obj dir = {0};
	int e = ops_resolve(req, fs, ino, &dir);
	if (e)
		return e;
	/* One listing is one view: taken at its start (offset 0), read from there on. */
	if (dir.m && (off == 0 || !d->h->listing) && (e = listing_take(fs, &dir, d->h)))
		return e;
	/* Offsets: 1 and 2 for "." and "..", then 3 + index of the child. */
	size_t i = (size_t)off;
	if (i == 0 && !dir_add(fs, d, ".", ino, NULL, 1))
		return 0;
	if (i <= 1 && !dir_add(fs, d, "..", FUSE_ROOT_ID, NULL, 2))
		return 0;
	const char *name;
	struct obj o = {0};
	for (size_t k = i > 2 ? i - 2 : 0; dir_child(fs, &dir, d, k, &name, &o); k++)
		if (!dir_add(fs, d, name, o.m ? node_ino(fs, o.m) : node_ino(fs, o.f), &o, (off_t)(k + 3)))
			break;
	return d->oom && !d->used ? -ENOMEM : 0;
}

static void reply_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, bool plus,
			  struct fuse_file_info *fi)
{
	struct fs *fs = fs_of(req);
	struct fs_handle *h = (struct fs_handle *)(uintptr_t)fi->fh;
	struct dirbuf d = { .req = req, .plus = plus, .size = size, .buf = malloc(size), .h = h };
	if (!d.buf)
		return (void)fuse_reply_err(req, ENOMEM);
	pthread_mutex_lock(&fs->mu);
	int e = h || ino == FUSE_ROOT_ID ? do_readdir(req, fs, ino, off, &d) : -EBADF;
	pthread_mutex_unlock(&fs->mu);
	if (e) {
		fuse_reply_err(req, -e);
	} else if (fuse_reply_buf(req, d.buf, d.used) && d.ntaken) {
		/* Interrupted: the kernel never saw these entries, so no forget will come for them. */
		pthread_mutex_lock(&fs->mu);
		for (size_t i = 0; i < d.ntaken; i++)
			node_forget(fs, d.taken[i].m ? node_ino(fs, d.taken[i].m) : node_ino(fs, d.taken[i].f), 1);
		pthread_mutex_unlock(&fs->mu);
	}
	free(d.taken);
	free(d.buf);
}

void fs_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, struct fuse_file_info *fi)
{
	reply_readdir(req, ino, size, off, false, fi);
}

/* ls -l: the names with their attributes in one request, not a lookup for each. */
void fs_readdirplus(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, struct fuse_file_info *fi)
{
	reply_readdir(req, ino, size, off, true, fi);
}

/* df: the device's budget; in a store with a quota, the quota (no more than the budget)
 * and the store's use, with no more free than the device has. */
void fs_statfs(fuse_req_t req, fuse_ino_t ino)
{
	struct fs *fs = fs_of(req);
	const struct vmm *v = fs->vmm;
	uint64_t g = v->dev.granularity, used = atomic_load(&v->used_bytes), total = v->max_bytes;
	uint64_t free_bytes = total - (used < total ? used : total);
	struct obj o = {0};
	pthread_mutex_lock(&fs->mu);
	if (!node_resolve(fs, ino, &o) && o.st && atomic_load(&o.st->pool->quota)) {
		uint64_t quota = atomic_load(&o.st->pool->quota), mine = atomic_load(&o.st->pool->used);
		total = quota < total ? quota : total;
		uint64_t left = total - (mine < total ? mine : total);
		free_bytes = left < free_bytes ? left : free_bytes;
	}
	pthread_mutex_unlock(&fs->mu);
	struct statvfs s = {
		.f_bsize = g, .f_frsize = g,
		.f_blocks = total / g,
		.f_bfree = free_bytes / g,
		.f_namemax = GMSFS_NAME_MAX,
	};
	s.f_bavail = s.f_bfree;
	fault_point("statfs", "reply"); /* a request read, never answered (tests/57-operations.bats) */
	fuse_reply_statfs(req, &s);
}
