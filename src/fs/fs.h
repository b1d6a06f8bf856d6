/* fs: the FUSE daemon.  One big mutex (fs->mu) serializes the tree and the
 * locks; waiting opens sleep on fs->cv.  Inode numbers are object addresses:
 * every object starts with a magic word that says what it is. */
#ifndef GMSFS_FS_H
#define GMSFS_FS_H

#define FUSE_USE_VERSION 312
#include <fuse_lowlevel.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "../fsm/fsm.h"
#include "../meta/meta.h"
#include "../vmm/vmm.h"
#include "../../libgmsfs/gmsfs_ioctl.h"

#define FS_NODE_MAGIC 0x67666e64u /* "gfnd" */

enum fs_kind {
	FS_ROOT, FS_DEVICE, FS_STORE,
	FS_LOCK, FS_COMMIT, FS_ABORT, FS_STATE, FS_HASH,
	FS_NKINDS
};
#define FS_STORE_FILES 5 /* lock, commit, abort, state, layout_hash */

struct store;

struct fs_node {
	uint32_t magic;
	enum fs_kind kind;
	struct store *store; /* NULL for the root and device */
};

enum fs_hold { HOLD_NONE, HOLD_READ, HOLD_SESSION };

struct fs_handle {
	struct fs_handle *next, *prev; /* in the store's list: commit turns them into readers */
	struct store *store;
	struct fs_node *fnode;         /* control file or store directory, or NULL */
	struct meta_node *node;        /* allocation or entry, held, or NULL */
	enum fs_hold hold;
	pid_t tgid;                    /* who opened it */
	bool writable;
	uint64_t seen_events;          /* for poll on state */
	struct fuse_pollhandle *ph;    /* a poller waiting for the next change */
	char *text;                    /* rendered content of a status file */
	size_t text_len;
	/* An export ticket (export.c): live until redeemed or the handle is released. */
	bool ticket_live, ticket_all;
	uint8_t ticket[16];
	pid_t ticket_tgid;
	uid_t ticket_uid;
	struct fs_handle *tnext;       /* in fs->tickets */
};

struct store {
	struct fs_node dir;
	struct fs_node files[FS_STORE_FILES];
	char *name;
	struct fs *fs;
	struct meta_store *meta;
	struct fsm fsm;
	uint64_t leader_start;         /* start time of the leader: pids are reused */
	unsigned refs;                 /* table + kernel lookups + handles */
	bool removed;
	uint64_t events;               /* bumped on every change state shows */
	struct fs_handle handles;      /* list head */
	unsigned pollers;              /* handles with a poll handle: notify walks only if any */
	char last_error[512];
};

struct fs {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	struct fs_node root, device;
	struct store **stores;
	size_t nstores, stores_cap;
	struct vmm *vmm;
	struct fuse_session *se;
	struct timespec started; /* the times of the daemon's own files */
	/* The export socket (export.c). */
	char socket_path[108];
	int export_fd;
	pthread_t export_thread;
	atomic_int export_conns;
	bool exiting;
	struct fs_handle *tickets; /* handles with a live ticket */
};

/* store.c: stores and their locks.  All with fs->mu held. */
int store_create(struct fs *fs, const char *name, struct store **out);
struct store *store_find(struct fs *fs, const char *name);
int store_remove(struct fs *fs, const char *name);
void store_get(struct store *st);
void store_put(struct store *st, unsigned n);
/* Something state shows changed: bump events, wake a poller. */
void store_notify(struct store *st);
/* A lock changed: notify, and wake the waiting opens too. */
void store_changed(struct store *st);
/* The store's list of handles, that commit walks. */
void store_track(struct store *st, struct fs_handle *h);
void store_untrack(struct fs_handle *h);
/* Take a lock for a handle: waits (fs->mu released while asleep) unless nonblock. */
enum fs_want { WANT_READ, WANT_WRITE, WANT_RW_OR_RO };
/* timeout_ms: -1 waits as long as it takes, 0 tries once (-EAGAIN), else -ETIMEDOUT after it. */
int store_acquire(struct store *st, fuse_req_t req, enum fs_want want, pid_t tgid, int timeout_ms, enum fs_hold *out);
/* Give the handle's hold back; a session ending without commit rolls back. */
void store_release(struct store *st, struct fs_handle *h);
/* May tgid change the namespace now?  0, -EBUSY (another holds it), -EROFS (nobody). */
int store_may_change(struct store *st, pid_t tgid);
bool store_is_member(struct store *st, pid_t tgid);
int store_commit(struct store *st);
int store_abort(struct store *st);

/* caller.c: who is asking. */
/* The thread group of a request's thread; -EPERM for pid 0 (outside our pid namespace). */
int caller_tgid(fuse_req_t req, pid_t *tgid);
int caller_start_time(pid_t pid, uint64_t *start);
bool caller_descends(pid_t tgid, pid_t ancestor, uint64_t ancestor_start);

/* text.c: the content of device and state. */
int text_device(struct fs *fs, char **out, size_t *len);
int text_state(struct store *st, char **out, size_t *len);
int text_hash(struct store *st, char **out, size_t *len);

/* export.c: tickets (fs->mu held) and the export socket. */
int export_ticket(struct fs *fs, struct fs_handle *h, bool all, pid_t tgid, uid_t uid, uint8_t out[16]);
void export_revoke(struct fs *fs, struct fs_handle *h);
int export_parse_request(const void *buf, size_t len, struct gmsfs_sock_req *out, char *why, size_t whylen);
/* path NULL: /run/gmsfs/gmsfs-PID.sock as root, else under $XDG_RUNTIME_DIR or /tmp. */
int export_start(struct fs *fs, const char *path, char *err, size_t errlen);
void export_stop(struct fs *fs);

/* ops.c */
extern const struct fuse_lowlevel_ops fs_ops;

#endif
