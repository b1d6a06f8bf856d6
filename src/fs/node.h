/* node: what an inode number stands for (a daemon node, struct fs_node of fs.h, or a
 * layout node of src/meta), its attributes, its children.  Everything under fs->mu. */
#ifndef GMSFS_FS_NODE_H
#define GMSFS_FS_NODE_H

#define FUSE_USE_VERSION 312
#include <fuse_lowlevel.h>
#include <stdbool.h>
#include <stdint.h>

#include "fs.h"

struct fs;
struct store;

/* The daemon's own nodes, a row per kind: the one place that says what each is and does
 * (gmsfs(5), THE TREE).  The tree, the file ops and the lock look a kind's behaviour up
 * here instead of naming kinds. */
enum fs_open_does {
	FS_OPEN_DIR,   /* a directory: open is EISDIR */
	FS_OPEN_TEXT,  /* read-only text, made when read at offset 0: a write open is EACCES */
	FS_OPEN_LOCK,  /* opening it takes the store's lock, as its mode asks */
	FS_OPEN_WRITE, /* a write does the work (commit, abort, tier, prefetch) */
};
struct fs_kind_row {
	const char *name;       /* in its directory ("" for the root, a store's is its name) */
	unsigned mode;          /* the file's permission bits (a directory's: 0755) */
	enum fs_open_does open;
	bool text;              /* read: a text made at offset 0 (one cat, one consistent text) */
	bool truncates;         /* truncate and O_TRUNC take it as a no-op (echo > commit); else EACCES */
	bool watched;           /* reading it is watching, not using; poll is readable once it changed */
};
extern const struct fs_kind_row fs_kinds[FS_NKINDS];

/* What an inode number stands for: a daemon node or a layout node, and how the caller
 * sees it: committed, for a caller outside the store's writer session (lock_outside),
 * which sees the layout of the last commit (meta's committed view), not the session's. */
struct obj {
	struct fs_node *f;
	struct meta_node *m;
	struct store *st;
	bool committed;
};
/* A store's object also counts one request of that store. */
int node_resolve(struct fs *fs, fuse_ino_t ino, struct obj *o);
void node_attr(struct fs *fs, const struct obj *o, struct stat *s);
/* A directory (the root, a store, a layout directory)?  What a plain readdir gives. */
bool node_is_dir(const struct obj *o);
/* The child name of directory dir, in dir's view (out's view is dir's). */
int node_child(struct fs *fs, const struct obj *dir, const char *name, struct obj *out);
/* How long the kernel may keep o's name and attributes: a layout node's not at all while
 * a writer session runs (each side of it sees its own view), LAYOUT_TIMEOUT else. */
double node_timeout(const struct obj *o);
/* o's entry (inode, attributes, timeouts), taking the kernel's reference: what a lookup,
 * a create and each readdirplus entry give it.  If the reply does not arrive, give the
 * reference back with node_forget(fs, e->ino, 1). */
void node_entry(struct fs *fs, const struct obj *o, struct fuse_entry_param *e);
void node_forget(struct fs *fs, fuse_ino_t ino, uint64_t n);
/* One more request for st, unless it reads the state file (f): what state's counter shows. */
void node_count(struct store *st, const struct fs_node *f);
/* A root file's name (device, status.json, metrics), or NULL. */
struct fs_node *node_root_file(struct fs *fs, const char *name);

#endif
