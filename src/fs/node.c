/* node: what an inode number stands for, its attributes, its children. */
#include "node.h"
#include "fs.h"
#include "inval.h"
#include "store.h"

#include <errno.h>
#include <string.h>
#include <unistd.h>

const struct fs_kind_row fs_kinds[FS_NKINDS] = {
	/*               name           mode   open           text   truncates watched */
	[FS_ROOT]     = { "",           0755, FS_OPEN_DIR,   false, false,    false },
	[FS_DEVICE]   = { "device",     0444, FS_OPEN_TEXT,  true,  false,    false },
	[FS_STATUS]   = { "status.json", 0444, FS_OPEN_TEXT, true,  false,    false },
	[FS_METRICS]  = { "metrics",    0444, FS_OPEN_TEXT,  true,  false,    false },
	[FS_STORE]    = { "",           0755, FS_OPEN_DIR,   false, false,    false },
	[FS_LOCK]     = { "lock",       0644, FS_OPEN_LOCK,  false, true,     false },
	[FS_COMMIT]   = { "commit",     0200, FS_OPEN_WRITE, false, true,     false },
	[FS_ABORT]    = { "abort",      0200, FS_OPEN_WRITE, false, true,     false },
	[FS_STATE]    = { "state",      0444, FS_OPEN_TEXT,  true,  false,    true },
	[FS_HASH]     = { "layout_hash", 0444, FS_OPEN_TEXT, true,  false,    false },
	[FS_TIER]     = { "tier",       0644, FS_OPEN_WRITE, true,  true,     false },
	[FS_PREFETCH] = { "prefetch",   0200, FS_OPEN_WRITE, false, true,     false },
	[FS_GEN]      = { "generation", 0444, FS_OPEN_TEXT,  true,  false,    true },
	[FS_CONTENT]  = { "content_hash", 0444, FS_OPEN_TEXT, true, false,    false },
	[FS_VERSION]  = { "version",    0444, FS_OPEN_TEXT,  true,  false,    true },
	[FS_VERSIONS] = { "versions",   0444, FS_OPEN_TEXT,  true,  false,    false },
	[FS_HISTORY]  = { "history",    0444, FS_OPEN_TEXT,  true,  false,    false },
};

void node_count(struct store *st, const struct fs_node *f)
{
	if (st && !(f && fs_kinds[f->kind].watched)) /* watching it is not using it */
		st->requests++;
}

int node_resolve(struct fs *fs, fuse_ino_t ino, struct obj *o)
{
	void *p = ino == FUSE_ROOT_ID ? (void *)&fs->root : (void *)(uintptr_t)ino;
	*o = (struct obj){0};
	if (*(uint32_t *)p == FS_NODE_MAGIC) {
		o->f = p;
		o->st = o->f->store;
		if (o->st && o->st->removed)
			return -ENOENT;
		node_count(o->st, o->f);
		return 0;
	}
	if (*(uint32_t *)p == META_NODE_MAGIC) {
		o->m = p;
		o->st = meta_context(o->m);
		if (!o->st)
			return -ESTALE;
		node_count(o->st, NULL);
		return 0;
	}
	return -ESTALE;
}

bool node_is_dir(const struct obj *o)
{
	return o->m ? o->m->kind == META_DIR : o->f->kind == FS_ROOT || o->f->kind == FS_STORE;
}

static void layout_attr(const struct meta_node *m, bool committed, struct stat *s)
{
	struct meta_fields f;
	if (committed)
		meta_committed_fields(m, &f);
	else
		meta_live_fields(m, &f);
	s->st_mtim.tv_sec = f.mtime_ns / 1000000000;
	s->st_mtim.tv_nsec = f.mtime_ns % 1000000000;
	s->st_ctim = s->st_atim = s->st_mtim;
	if (m->kind == META_DIR) {
		s->st_mode = S_IFDIR | 0755;
		s->st_nlink = 2;
	} else if (m->kind == META_ALLOC) {
		s->st_mode = S_IFREG | 0644;
		s->st_size = (off_t)f.size;
		s->st_blocks = (blkcnt_t)(f.aligned / 512);
	} else {
		s->st_mode = S_IFREG | 0644;
		s->st_size = (off_t)f.value_len;
		s->st_blocks = (blkcnt_t)((f.value_len + 511) / 512);
	}
}

void node_attr(struct fs *fs, const struct obj *o, struct stat *s)
{
	memset(s, 0, sizeof *s);
	s->st_uid = getuid();
	s->st_gid = getgid();
	s->st_nlink = 1;
	s->st_blksize = 4096;
	if (o->m) {
		s->st_ino = node_ino(fs, o->m);
		layout_attr(o->m, o->committed, s);
		return;
	}
	s->st_ino = node_ino(fs, o->f);
	s->st_mtim = s->st_ctim = s->st_atim = fs->started;
	if (node_is_dir(o)) {
		s->st_mode = S_IFDIR | 0755;
		s->st_nlink = 2;
		return;
	}
	s->st_mode = S_IFREG | fs_kinds[o->f->kind].mode; /* a text's size is 0: made when read (direct_io) */
}

struct fs_node *node_root_file(struct fs *fs, const char *name)
{
	struct fs_node *files[] = { &fs->device, &fs->status, &fs->metrics };
	for (size_t i = 0; i < sizeof files / sizeof files[0]; i++)
		if (!strcmp(name, fs_kinds[files[i]->kind].name))
			return files[i];
	return NULL;
}

int node_child(struct fs *fs, const struct obj *dir, const char *name, struct obj *out)
{
	*out = (struct obj){ .st = dir->st, .committed = dir->committed };
	if (dir->m) {
		if (dir->m->kind != META_DIR)
			return -ENOTDIR;
		out->m = dir->committed ? meta_committed_child(dir->m, name) : meta_lookup(dir->m, name);
		return out->m ? 0 : -ENOENT;
	}
	if (dir->f->kind == FS_ROOT) {
		if ((out->f = node_root_file(fs, name)))
			return 0;
		out->st = store_find(fs, name);
		if (!out->st)
			return -ENOENT;
		out->f = &out->st->dir;
		return 0;
	}
	if (dir->f->kind != FS_STORE)
		return -ENOTDIR;
	for (int i = 0; i < FS_STORE_FILES; i++)
		if (!strcmp(name, fs_kinds[FS_LOCK + i].name)) {
			out->f = &dir->st->files[i];
			return 0;
		}
	if (!strcmp(name, "allocs") || !strcmp(name, "meta")) {
		out->m = meta_root(dir->st->meta, name[0] == 'a' ? META_AREA_ALLOCS : META_AREA_META);
		return 0;
	}
	return -ENOENT;
}

double node_timeout(const struct obj *o)
{
	if (!o->m)
		return 3600;
	return store_in_session(o->st) ? 0 : LAYOUT_TIMEOUT;
}

void node_entry(struct fs *fs, const struct obj *o, struct fuse_entry_param *e)
{
	*e = (struct fuse_entry_param){ .ino = o->m ? node_ino(fs, o->m) : node_ino(fs, o->f) };
	node_attr(fs, o, &e->attr);
	/* Stores and their control files change only through the kernel (mkdir, rmdir): cache
	 * them.  Layout nodes too, for less long: what changes them behind the kernel's back
	 * (the socket, an abort) tells it (inval.c); the timeout bounds a race with that. */
	e->entry_timeout = e->attr_timeout = node_timeout(o);
	if (o->m)
		meta_lookup_ref(o->m);
	else if (o->f->kind >= FS_STORE)
		store_get(o->st);
}

void node_forget(struct fs *fs, fuse_ino_t ino, uint64_t n)
{
	void *p = ino == FUSE_ROOT_ID ? (void *)&fs->root : (void *)(uintptr_t)ino;
	if (*(uint32_t *)p == META_NODE_MAGIC) {
		size_t waiting = fs->grave.n;
		meta_forget(p, n);
		/* A removed store's nodes that the kernel knew are freed here, at forgets that
		 * follow rmdir and its trim: trim again once the graveyard is nearly empty (the
		 * kernel may keep a few, a cwd), or every 100,000, not at every forget. */
		fs->grave_freed += waiting - fs->grave.n;
		if (fs->grave_freed >= FS_TRIM_ITEMS &&
		    (fs->grave.n < FS_TRIM_ITEMS || fs->grave_freed >= 10 * FS_TRIM_ITEMS)) {
			fs->grave_freed = 0;
			store_want_trim(fs);
		}
	} else if (*(uint32_t *)p == FS_NODE_MAGIC) {
		struct fs_node *f = p;
		if (f->kind >= FS_STORE)
			store_put(f->store, (unsigned)n);
	}
}
