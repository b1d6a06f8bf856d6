/* fs: the FUSE daemon.  One big mutex (fs->mu) serializes the tree and the
 * locks.  Inode numbers are object addresses: every object starts with a magic
 * word that says what it is.
 *
 * Files: node.c (what an inode is, its attributes), ops_tree.c, ops_file.c,
 * ops_xattr.c, ops_ioctl.c (the FUSE boundary, by op family), handle.c (open
 * files), store.c (stores and their locks), caller.c (who is asking), text.c
 * (device and state), ticket.c, sock.c (the socket server), rpc.c (what a
 * socket request does), main.c (options, mount). */
#ifndef GMSFS_FS_H
#define GMSFS_FS_H

#define FUSE_USE_VERSION 312
#include <fuse_lowlevel.h>
#include <gmsfs/abi.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "../fsm/fsm.h"
#include "../meta/meta.h"
#include "../vmm/vmm.h"

#define FS_NODE_MAGIC 0x67666e64u /* "gfnd" */
/* A call or commit over this many items leaves enough free memory in malloc's arenas
 * to be worth giving back (store_want_trim). */
#define FS_TRIM_ITEMS 10000

enum fs_kind {
	FS_ROOT, FS_DEVICE, FS_STATUS, FS_METRICS, FS_STORE,
	FS_LOCK, FS_COMMIT, FS_ABORT, FS_STATE, FS_HASH,
	FS_NKINDS
};
#define FS_STORE_FILES 5 /* lock, commit, abort, state, layout_hash */
extern const char *const fs_store_file_names[FS_STORE_FILES];

struct store;
struct sock_conn;

struct fs_node {
	uint32_t magic;
	enum fs_kind kind;
	struct store *store; /* NULL for the root and device */
};

enum fs_hold { HOLD_NONE, HOLD_READ, HOLD_SESSION };
enum fs_want { WANT_READ, WANT_WRITE, WANT_RW_OR_RO };
enum ticket_kind { TICKET_NONE, TICKET_EXPORT, TICKET_EXPORT_ALL, TICKET_CHANNEL };

struct fs_handle {
	struct fs_handle *next, *prev; /* in the store's list: commit turns them into readers */
	struct store *store;
	struct fs_node *fnode;         /* control file or store directory, or NULL */
	struct meta_node *node;        /* allocation or entry, held, or NULL */
	enum fs_hold hold;
	pid_t tgid;                    /* who opened it */
	bool writable;                 /* opened for writing, or locked RW by ioctl */
	uint64_t seen_events;          /* for poll on state */
	struct fuse_pollhandle *ph;    /* a poller waiting for the next change */
	char *text;                    /* rendered content of a status file */
	size_t text_len;
	/* A ticket (ticket.c): live until presented or the handle is released. */
	enum ticket_kind ticket;
	uint8_t ticket_bytes[16];
	pid_t ticket_tgid;
	uid_t ticket_uid;
	struct fs_handle *tnext;       /* in fs->tickets */
	struct sock_conn *conns;       /* socket connections bound to this handle */
};

/* A request waiting for a lock (wait.c).  Each kind of op embeds one and says how to
 * try again, finish and reply. */
enum wait_state { WAIT_NEW, WAIT_PARKED, WAIT_DONE };
struct fs_waiter;
struct wait_ops {
	int (*grant)(struct fs_waiter *w, int e); /* fs->mu held: the wait ended with e; finish the op */
	void (*reply)(struct fs_waiter *w, int e); /* nothing held: reply with grant's result */
	void (*free)(struct fs_waiter *w);
};
struct fs_waiter {
	struct fs_waiter *next;        /* in the store's queue, then in fs->replies */
	const struct wait_ops *ops;
	struct store *st;
	struct fs_handle *h;           /* the handle that waits for the lock; want: which */
	enum fs_want want;
	fuse_req_t req;
	enum wait_state state;
	bool interrupted, as_writer, has_deadline;
	struct timespec deadline;      /* CLOCK_MONOTONIC */
	int result;
};

struct store {
	struct fs_node dir;
	struct fs_node files[FS_STORE_FILES];
	char *name;
	struct fs *fs;
	struct meta_store *meta;
	struct vmm_pool *pool;         /* where its memory comes from */
	struct fsm fsm;
	uint64_t leader_start;         /* start time of the leader: pids are reused */
	unsigned refs;                 /* table + kernel lookups + handles */
	bool removed;
	uint64_t events;               /* bumped on every change state shows */
	uint64_t requests;             /* FUSE requests on its files but state */
	uint64_t socket_requests;      /* socket requests for its handles */
	uint64_t commits, aborts;      /* sessions that committed; that ended without (rolled back) */
	uint64_t lock_waits;           /* opens and lock ioctls that had to wait */
	uint64_t exports;              /* export requests served (import_all, import) */
	struct fs_handle handles;      /* list head */
	struct fs_waiter *waiters;     /* parked requests, first come first */
	bool granting, regrant;        /* wait_grant is running; run it again */
	unsigned pollers;              /* handles with a poll handle: notify walks only if any */
	char last_error[512];
};

struct fs {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	struct fs_node root, device, status, metrics; /* the root's own files */
	struct store **stores;
	size_t nstores, stores_cap;
	struct store **removed;        /* removed stores the kernel still knows */
	size_t nremoved, removed_cap;
	struct vmm *vmm;
	struct meta_graveyard grave;   /* layout nodes the kernel still knows after they went */
	size_t grave_freed;            /* nodes freed from it at forgets since the last trim */
	struct fuse_session *se;
	struct timespec started;       /* the times of the daemon's own files */
	bool allow_other;              /* the mount admits other users (and so does the socket) */
	atomic_bool trim_wanted;       /* much memory was freed: store_trim gives it back */
	/* The socket (sock.c). */
	char socket_path[108];
	int sock_fd;
	pthread_t sock_thread;
	unsigned sock_conns;           /* open connections, under mu */
	/* A thread made ahead for the next connection (sock.c), under mu: a spare waits,
	 * the accept thread hands it a connection, spares counts those not yet gone. */
	bool sock_spare;
	struct sock_conn *sock_handoff;
	unsigned sock_spares;
	pthread_cond_t sock_spare_cv;
	struct sock_conn *sock_list;   /* all of them, under mu */
	struct sock_uid { uid_t uid; unsigned conns; } *sock_uids; /* per peer uid, under mu */
	size_t nsock_uids, sock_uids_cap;
	bool exiting;
	struct fs_handle *tickets;     /* handles with a live ticket */
	/* The waiter thread (wait.c): replies to finished waiters, keeps their deadlines. */
	pthread_t wait_thread;
	pthread_cond_t wait_cv;
	struct fs_waiter *replies;
	bool wait_stop;
	/* The notifier thread (inval.c): what the kernel must drop, sent outside any request. */
	pthread_t inval_thread;
	pthread_cond_t inval_cv, inval_done_cv;
	struct inval_item *inval_q;
	size_t inval_n, inval_cap;
	uint64_t inval_queued, inval_done; /* how many were queued, and sent */
	bool inval_stop;
};

static inline struct fs *fs_of(fuse_req_t req)
{
	return fuse_req_userdata(req);
}

/* What an inode number stands for (node.c): a daemon node or a layout node. */
struct obj {
	struct fs_node *f;
	struct meta_node *m;
	struct store *st;
};
/* fs->mu held.  A store's object also counts one request of that store. */
int node_resolve(struct fs *fs, fuse_ino_t ino, struct obj *o);
fuse_ino_t node_ino(struct fs *fs, const void *p);
void node_attr(struct fs *fs, const struct obj *o, struct stat *s);
/* A directory (the root, a store, a layout directory)?  What a plain readdir gives. */
bool node_is_dir(const struct obj *o);
/* The child name of directory dir. */
int node_child(struct fs *fs, const struct obj *dir, const char *name, struct obj *out);
/* o's entry (inode, attributes, timeouts), taking the kernel's reference: what a lookup,
 * a create and each readdirplus entry give it. */
void node_entry(struct fs *fs, const struct obj *o, struct fuse_entry_param *e);
/* An entry reply for o, taking the kernel's reference; fs->mu is released. */
void node_reply_entry(fuse_req_t req, struct fs *fs, struct obj *o);
void node_forget(struct fs *fs, fuse_ino_t ino, uint64_t n);
/* One more request for st, unless it reads the state file (f): what state's counter shows. */
void node_count(struct store *st, const struct fs_node *f);

/* handle.c: open files.  fs->mu held. */
struct fs_handle *handle_new(struct store *st);
void handle_free(struct fs_handle *h);
/* The lock a handle holds, as the ioctl reports it: GMSFS_RO, GMSFS_RW or 0. */
uint32_t handle_lock(const struct fs_handle *h);
/* May it hand out writable descriptors and change the store? */
bool handle_writes(const struct fs_handle *h);

/* store.c: stores and their locks.  All with fs->mu held. */
int store_create(struct fs *fs, const char *name, struct store **out);
struct store *store_find(struct fs *fs, const char *name);
int store_remove(struct fs *fs, const char *name);
void store_get(struct store *st);
void store_put(struct store *st, unsigned n);
/* Freed memory goes back to the system (malloc_trim) once fs->mu is released: on a
 * fragmented heap the trim takes tens of ms, which no other caller should wait for.
 * store_want_trim under fs->mu; store_trim without it, after the reply. */
void store_want_trim(struct fs *fs);
void store_trim(struct fs *fs);
/* Something state shows changed: bump events, wake a poller. */
void store_notify(struct store *st);
/* A lock changed: notify, and wake the waiting opens too. */
void store_changed(struct store *st);
/* The store's list of handles, that commit walks. */
void store_track(struct store *st, struct fs_handle *h);
void store_untrack(struct fs_handle *h);
/* The lock for tgid now: 0 with *out set; -EAGAIN: it must wait; -EDEADLK: it would wait
 * for its own read handles; -ENOENT: the store is gone.  Members join their session at
 * once; a process that holds a read handle gets another past waiting writers. */
int store_try(struct store *st, enum fs_want want, pid_t tgid, enum fs_hold *out);
/* The same for a parked waiter (neither a member nor a reader already): the FSM alone. */
int store_take(struct store *st, enum fs_want want, pid_t tgid, enum fs_hold *out);
bool store_wants_write(const struct store *st, enum fs_want want);
/* The lock for a new handle h of st: 0 (granted), STORE_PARK (it must wait: park it, with
 * timeout_ms > 0 as its deadline or -1 for none), or -errno (-EAGAIN: timeout_ms 0). */
#define STORE_PARK 1
int store_lock_handle(fuse_req_t req, struct fs_handle *h, enum fs_want want, int timeout_ms);
/* After a grant: the handle's write right, and whether its file still exists. */
int store_granted(struct fs_handle *h, enum fs_want want);
/* Give the handle's hold back; a session ending without commit rolls back. */
void store_release(struct store *st, struct fs_handle *h);
/* May tgid change the namespace now?  0, -EBUSY (another holds it), -EROFS (nobody). */
int store_may_change(struct store *st, pid_t tgid);
/* The same for a request: through a session handle h, or as a member; -EROFS through a
 * read handle. */
int store_check_change(fuse_req_t req, struct store *st, const struct fs_handle *h);
/* 1 yes, 0 no, -errno (-EMFILE: the daemon is out of descriptors and cannot tell). */
int store_is_member(struct store *st, pid_t tgid);
int store_commit(struct store *st);
int store_abort(struct store *st);
/* e (-EMFILE, -ENFILE: the daemon is out of descriptors) goes to last_error and the log. */
int store_cannot_tell(struct store *st, int e);
/* Size an allocation once: memory from the backend, or ENOSPC with last_error. */
int store_size_alloc(struct store *st, struct meta_node *m, uint64_t size);

/* wait.c: parked requests.  wait_park: fs->mu not held; it tries once more, then parks
 * or replies.  wait_grant: fs->mu held, after a lock change: grant whoever can go now. */
void wait_park(struct fs_waiter *w);
void wait_grant(struct store *st);
void wait_deadline(struct fs_waiter *w, int timeout_ms);
int wait_start(struct fs *fs);
/* Answer every parked request (EINTR) and stop the thread: at unmount. */
void wait_stop(struct fs *fs);

/* inval.c: the kernel keeps layout names and attributes LAYOUT_TIMEOUT seconds; changes
 * made behind its back are sent to it by a thread of its own.  inval_flush: fs->mu not
 * held, never in a FUSE handler whose kernel locks the notices may need (a write to a
 * layout file); returns once what was queued before it has been sent. */
#define LAYOUT_TIMEOUT 10.0
void inval_watch(struct store *st);
int inval_start(struct fs *fs);
void inval_flush(struct fs *fs);
void inval_stop(struct fs *fs);

/* caller.c: who is asking. */
/* The thread group of a request's thread; -EPERM for pid 0 (outside our pid namespace). */
int caller_tgid(fuse_req_t req, pid_t *tgid);
int caller_start_time(pid_t pid, uint64_t *start);
/* 1 yes, 0 no, or -errno when the daemon cannot tell (out of descriptors). */
int caller_descends(pid_t tgid, pid_t ancestor, uint64_t ancestor_start);
/* Has process tgid a descriptor open on one of these inodes?  (/proc/PID/fdinfo: no
 * request to this mount.) */
int caller_holds(pid_t tgid, const uint64_t *inos, size_t n);
/* Would the kernel let the request's caller open a file of mode (owner: the daemon's
 * uid and gid) for reading (want 4) or writing (want 2)?  0 or -EACCES. */
int caller_may(fuse_req_t req, mode_t mode, int want);

/* text.c: the content of device and state. */
int text_device(struct fs *fs, char **out, size_t *len);
/* status.json and metrics (Prometheus text format): every store and the device. */
int text_status_json(struct fs *fs, char **out, size_t *len);
int text_metrics(struct fs *fs, char **out, size_t *len);
/* A root file's name (device, status.json, metrics), or NULL. */
struct fs_node *node_root_file(struct fs *fs, const char *name);
int text_state(struct store *st, char **out, size_t *len);
int text_hash(struct store *st, char **out, size_t *len);

/* ticket.c: one-time tickets (fs->mu held). */
int ticket_issue(struct fs *fs, struct fs_handle *h, enum ticket_kind kind, pid_t tgid, uid_t uid, uint8_t out[16]);
void ticket_revoke(struct fs *fs, struct fs_handle *h);
/* Find and spend a ticket presented by pid/uid: the handle, or NULL with -EACCES (no such
 * live ticket) or -EPERM (another process or user: the ticket stays for its owner). */
struct fs_handle *ticket_redeem(struct fs *fs, const uint8_t t[16], pid_t pid, uid_t uid, enum ticket_kind *kind,
				int *err, char *why, size_t whylen);

/* sock.c: the socket server. */
/* path NULL: /run/gmsfs/gmsfs-PID.sock as root, else under $XDG_RUNTIME_DIR or /tmp. */
int sock_start(struct fs *fs, const char *path, char *err, size_t errlen);
void sock_stop(struct fs *fs);
/* fs->mu held: bind c to h for pid and uid; the handle c is bound to, for the sender
 * pid/uid (NULL with -ENOLCK: none, or it was released; -EPERM: bound by another); the
 * handle goes, so its connections answer ENOLCK from now on. */
void sock_bind(struct sock_conn *c, struct fs_handle *h, pid_t pid, uid_t uid);
struct fs_handle *sock_handle(struct sock_conn *c, pid_t pid, uid_t uid, int *err);
void sock_unbind_all(struct fs_handle *h);
/* Send one reply message with descriptors; 0 or -errno. */
int sock_send(int sock, const void *data, size_t len, const int *fds, size_t nfds);

/* rpc.c: one request of a connection; the reply is sent.  >0: keep the connection,
 * 0: close it (the peer broke the protocol). */
struct rpc_req {
	struct sock_conn *conn;
	int sock;
	pid_t pid;
	uid_t uid;
	enum gmsfs_op op;
	const uint8_t *ticket;
	const uint8_t *body;
	size_t body_len;
};
int rpc_serve(struct fs *fs, const struct rpc_req *r);

/* ops_*.c */
extern const struct fuse_lowlevel_ops fs_ops;

#endif
