/* handle: an open file of the mount (a FUSE file handle), and what it holds: data
 * only (the ops make and free handles, ops.c; lock.c decides what they hold).  Every
 * field under fs->mu. */
#ifndef GMSFS_FS_HANDLE_H
#define GMSFS_FS_HANDLE_H

#include "fs.h"

struct store;         /* store.h */
struct export_handle; /* export/export.h */

/* What a handle holds (lock.c). */
enum lock_hold { HOLD_NONE, HOLD_READ, HOLD_SESSION };

struct fs_handle {
	struct fs_handle *next, *prev; /* in the store's list: commit turns its session handles into readers */
	struct store *store;           /* NULL for the root's files and directories */
	struct fs_node *fnode;         /* a control file or store directory, or NULL */
	struct meta_node *node;        /* an allocation or entry, held, or NULL */
	/* Its lock (lock.c). */
	enum lock_hold hold;
	pid_t tgid;                    /* who opened it (or locked it by ioctl) */
	bool writable;                 /* opened for writing, or locked RW by ioctl */
	bool created;                  /* its open made the node (O_CREAT) */
	bool size_refused;             /* a size asked through it was refused (ops_tree.c) */
	bool opening;                  /* a session handle whose descriptor was not seen yet (lock.c) */
	bool flushes;                  /* the kernel tells its closes (FLUSH): set once, before the reply */
	bool on_prev;                  /* a read handle still on the version before (version.c) */
	bool paused;                   /* its read lock given back, its process's mappings kept (lock_pause) */
	bool remap;                    /* resumed onto other memory: the caller maps again (lock_granted) */
	bool asks_in_place;            /* its last LOCK said GMSFS_LOCK_ASKS_IN_PLACE (lock_granted) */
	bool own;                      /* its last LOCK said GMSFS_LOCK_OWN: a session of its own */
	/* poll on state (ops_file.c). */
	uint64_t seen_events;
	struct fuse_pollhandle *ph;    /* a poller waiting for the next change */
	/* What cat reads of a status file (text.c), made at offset 0. */
	char *text;
	size_t text_len;
	/* A layout directory's children as its listing began (readdir at offset 0, ops_tree.c):
	 * the rest of one listing comes from it, so one ls sees one commit.  Each counted as a
	 * kernel lookup, which keeps the node, not an allocation's memory.  NULL: not taken. */
	struct meta_node **listing;
	size_t nlisting;
	struct export_handle *x;       /* its ticket and socket connections (export/); NULL if none */
};

#endif
