/* libgmsfs internals: what the library's files share.  The files stand in the layers
 * libgmsfs/layers lists, each using only those below it (tests/layout.sh checks it). */
#ifndef GMSFS_INTERNAL_H
#define GMSFS_INTERNAL_H

#include <gmsfs/gmsfs.h>
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>

#include "clock.h"
#include "wire.h"

#ifdef GMSFS_HAVE_CUDA
#include "cuda_api.h"
#endif

/* ---- the channel: one socket connection, bound to the handle's lock ---- */
struct ch {
	int sock;               /* -1: not connected */
	bool bind_pending;      /* BIND sent, its reply not read yet */
};

/* A reply's allocations with their descriptors, and its entries (entry.h) put back
 * together; the channel leaves each entry's copy NULL (meta.c makes it). */
struct ch_manifest {
	struct wire_alloc *allocs;
	int *fd;                /* allocs[i]'s descriptor (several may share one), -1 if none came */
	size_t nallocs;
	struct entry_rec *entries;
	size_t nentries;
	int *fds;               /* every descriptor kept, closed by ch_manifest_free */
	size_t nfds;
	bool has_gen;           /* the reply said which generation it shows (a flip's) */
	uint64_t gen;
	/* Set by the caller: each message's allocations [from, to) go here as they arrive,
	 * and their descriptors are closed right after (fd[i] becomes -1), so that a client
	 * never holds more than one message's descriptors (a big CUDA layout has one each).
	 * 0, or -errno with the reason in the handle. */
	int (*consume)(void *ctx, struct ch_manifest *m, size_t from, size_t to);
	void *ctx;
};
void ch_manifest_free(struct ch_manifest *m);

/* Connect to the socket at path and present a BIND ticket. */
int ch_bind(struct ch *c, const char *path, const uint8_t ticket[GMSFS_TICKET_LEN], char *err, size_t errlen);
/* The same without waiting: the next ch_call sends its request, then reads both replies
 * (one round trip, and the daemon starts the connection while the caller goes on). */
int ch_bind_start(struct ch *c, const char *path, const uint8_t ticket[GMSFS_TICKET_LEN], char *err, size_t errlen);
/* How long a call watches its socket for the reply before it sleeps, in ns (0: never). */
long ch_spin_ns(void);
/* One request; m NULL for a plain reply (else its consume and ctx are kept, the rest is
 * filled).  -ENOTCONN: the connection was gone before the daemon read the request (it
 * may be bound again and the request sent again). */
int ch_call(struct ch *c, enum gmsfs_op op, const void *body, size_t len, struct ch_manifest *m, char *err,
	    size_t errlen);
void ch_close(struct ch *c);
/* A request of no body sent, its reply left for ch_reply (the caller works meanwhile):
 * 0, or -errno (-ENOTCONN: no bound connection, or a BIND's reply still due). */
int ch_send(struct ch *c, enum gmsfs_op op);
/* The plain reply of what ch_send sent: 0 or its error (-errno, with why). */
int ch_reply(struct ch *c, char *err, size_t errlen);
/* GMSFS_OP_SOON: the next request follows shortly (no reply; a hint: nothing sent where
 * the channel is not connected, and a failure is the next call's to meet). */
void ch_soon(struct ch *c);

/* ---- how a client maps the descriptors of one backend; -errno, words in err ---- */
struct gm_backend {
	const char *name;
	/* A descriptor carries its access (host: an open file's mode): memory mapped from a
	 * read-only one is made writable by mapping a writable one in its place.  (cuda: the
	 * access is the mapping's alone, set by allow.) */
	bool fd_has_access;
	/* Ready to map in this thread?  (cuda: a current context.) */
	int (*attach)(gmsfs *g, char *err, size_t errlen);
	/* Reserve len bytes of address space, mapped to nothing, at a multiple of align (0:
	 * the backend's choice; cuda: allocations of 1 GiB mapped at addresses aligned to it
	 * map and take their access faster than at any 2 MiB). */
	int (*reserve)(gmsfs *g, uint64_t len, uint64_t align, void **va);
	/* Give a whole reservation back; nothing in it is mapped. */
	void (*unreserve)(gmsfs *g, void *va, uint64_t len);
	/* Map [off, off + aligned) of fd (not consumed) over part of a reservation at va.
	 * Usable once allow() has covered it (cuda: the access is set apart, and one call
	 * costs the same for one mapping or sixteen side by side). */
	int (*map)(gmsfs *g, void *va, uint64_t aligned, int fd, uint64_t off, bool writable, char *err, size_t errlen);
	/* Set the access of mapped bytes [va, va + len): read-only or read-write. */
	int (*allow)(gmsfs *g, void *va, uint64_t len, bool writable);
	/* Unmap, keeping the reservation. */
	int (*unmap)(gmsfs *g, void *va, uint64_t aligned);
	/* Work this thread's context queued is done (optional; cuda: a kernel still writing a
	 * page that is unmapped would fault, and the context with it). */
	int (*drain)(gmsfs *g);
	/* The memory mapped at src (a whole mapping) mapped again at dst, in a reservation,
	 * with the access given. */
	int (*alias)(gmsfs *g, void *src, void *dst, uint64_t aligned, bool writable, char *err, size_t errlen);
	/* A page kept in this process between maps (pages.c): its memory held, mapped
	 * nowhere, named by *held.  hold takes the mapping at va off its place (the
	 * reservation stays); hold_fd holds [off, off + aligned) of fd (not consumed);
	 * place maps a held page at va (it is then that mapping; allow() follows); drop
	 * lets one go. */
	int (*hold)(gmsfs *g, void *va, uint64_t aligned, uint64_t *held);
	int (*hold_fd)(gmsfs *g, int fd, uint64_t off, uint64_t aligned, uint64_t *held);
	int (*place)(gmsfs *g, uint64_t held, void *va, uint64_t aligned);
	void (*drop)(gmsfs *g, uint64_t held, uint64_t aligned);
	/* Process-private memory for private entries, and a copy into it. */
	int (*private_alloc)(gmsfs *g, uint64_t size, void **p);
	void (*private_free)(gmsfs *g, void *p);
	int (*copy)(gmsfs *g, void *dst, const void *src, uint64_t size);
	/* Mapped bytes read into host memory (NULL: the mapping is host memory, read in
	 * place), in order, on a queue of the caller's thread: read_queue starts a read into
	 * one of the queue's slots (fewer than slots in flight), read_wait waits for a slot's. */
	int (*reader_open)(gmsfs *g, int slots, void **reader);
	int (*read_queue)(gmsfs *g, void *reader, int slot, void *host, const void *src, uint64_t size);
	int (*read_wait)(gmsfs *g, void *reader, int slot);
	void (*reader_close)(gmsfs *g, void *reader);
	/* Host memory for read() to copy into fast (cuda: pinned), and its release. */
	int (*host_alloc)(gmsfs *g, uint64_t size, void **p);
	void (*host_free)(gmsfs *g, void *p, uint64_t size);
	/* Each piece's XXH3-64 (gmsfs(5), CONTENT HASH) computed where its bytes are, by the
	 * GPU (at[k] mapped, a multiple of 16 where len[k] > 240): 0 with what it did in err
	 * (for the trace), or -errno with the reason there (the caller then reads the bytes
	 * into host memory instead). */
	int (*hash_pieces)(gmsfs *g, size_t n, const void *const *at, const uint64_t *len, uint64_t *out,
			   char *err, size_t errlen);
};
extern const struct gm_backend gm_host_backend;
#ifdef GMSFS_HAVE_CUDA
extern const struct gm_backend gm_cuda_backend;
int gm_cuda_hash_pieces(gmsfs *g, size_t n, const void *const *at, const uint64_t *len, uint64_t *out, char *err,
			size_t errlen);
#endif

/* ---- the handle's metadata: an index by key over its entries ---- */
struct mt {
	bool loaded;            /* the layout's entries are here */
	struct entry_rec *v;     /* each with its copy (a private entry's), made by mt_privatize */
	size_t n, cap;
	void **index;           /* by key (common/probe.h): entry index + 1, NULL empty */
	size_t index_cap;
	char **sorted;          /* keys in order, made by list, NULL when stale */
};

/* A reservation several mappings share: an import maps each message's allocations
 * side by side in one range and sets their access with one call.  The range goes
 * back with its last mapping. */
struct mp_res {
	void *base;
	uint64_t len;
	size_t refs;            /* mappings in the table that lie in it */
};
struct mp_slot {
	bool mapped;            /* mapped now (else only reserved) */
	struct mp_res *res;
	uint64_t piece;         /* an allocation in pieces: each one's size but the last's; 0: one */
	bool ro;                /* mapped read-only as it came (a reader's, or the last commit's to
				 * its writer): written only once the daemon is told (sp_write_in_place) */
};

struct gmsfs {
	char *dir;              /* the store directory */
	int dirfd;              /* its open handle: holds the lock; -1 while unmapped */
	int sleepfd;            /* that handle kept, its lock given back (unmap_all): the next lock
				 * is asked on it, without opening the directory again; -1 if none */
	int lockfd;             /* a writer's STORE/lock, open for writing: a child it leaves behind
				 * holds the session by this descriptor (gmsfs(5)); -1 if none */
	int mode;               /* what connect asked for */
	bool eintr;             /* GMSFS_EINTR: a signal ends a wait with -EINTR, no retry */
	bool own;               /* GMSFS_OWN: every lock it takes is a session of its own */
	int lock;               /* GMSFS_RO, GMSFS_RW or 0 */
	bool granted_rw;        /* it held the writer session once: reallocate_all may */
	bool paused;            /* gmsfs_pause: lock given back, mappings kept, dirfd the paused handle */
	bool imported_all;      /* a reader's import_all succeeded under the lock it holds now:
				 * the layout cannot change until it lets go, so another is free */
	int unmapped_lock;      /* the lock given up by unmap_all */
	bool said_in_place;     /* the session told the daemon it writes the last commit in place */
	bool names_apart;       /* its daemon predates COMMIT_NAMED: a commit's name goes by setxattr */
	bool leave_apart;       /* its daemon predates COMMIT_LEAVE: commit, then UNLOCK */
	bool left;              /* COMMIT_LEAVE gave its holds back: its close sends no UNLOCK */
	bool committed;         /* this session's commit was asked for: the daemon may hold read
				 * locks for it since, which a successor keeps until the release lets go */
	struct gmsfs_ioc info;  /* the latest facts from the daemon */
	uint8_t ticket[GMSFS_TICKET_LEN]; /* the LOCK reply's ticket, until bound */
	bool have_ticket;
	struct ch ch;
	uint8_t saved_hash[GMSFS_HASH_LEN]; /* the layout at unmap_all */
	bool saved_has_hash;
	const struct gm_backend *be;
#ifdef GMSFS_HAVE_CUDA
	struct cu_api cu;       /* the process's (map_cuda.c: looked up once), copied at the first connect to a cuda store */
	CUdevice cudev;         /* the device of the caller's context */
#endif
	struct gmsfs_mapping *maps; /* what gmsfs_mappings shows */
	struct mp_slot *slots;  /* slots[i]: the state of maps[i] */
	size_t nmaps, cap;      /* both arrays have cap elements */
	void **index;           /* by name (common/probe.h): map index + 1, NULL empty */
	size_t index_cap;       /* a power of two, at least twice nmaps */
	struct mt meta;
	struct gmsfs_space *spaces; /* every space made, freed ones too (space.c) */
	gmsfs_pages *pages;         /* every pages range made, freed ones too (pages.c) */
	uint64_t pages_min;         /* the store's minimum (user.gms.min): pages within it stay here */
	char *tie;                  /* the weights its pages are computed with (tie.c), put at each keep */
	bool untied;                /* a tie taken back: the next keep deletes its note */
	char err[1024];
};

/* GMSFS_TRACE_IMPORT: import_all and the remap cycle say where their time went (stderr). */
bool gm_tracing(void);
static inline double gm_us(void)
{
	return clock_mono_ns() / 1e3;
}
/* A manifest's consumer, timed for the trace: when its first message came, and the time
 * spent in consume (ctx: the struct itself; gm_timed_consume as the manifest's consume). */
struct gm_timed {
	int (*consume)(void *ctx, struct ch_manifest *m, size_t from, size_t to);
	void *ctx;
	double first, busy;
};
int gm_timed_consume(void *timed, struct ch_manifest *m, size_t from, size_t to);
/* A trace line's clock: the monotonic microseconds, as GMSFS_TRACE_RPC's lines give them. */
static inline double gm_trace_clock(double us)
{
	return (double)((uint64_t)us % 1000000000u);
}

/* Milliseconds of the monotonic clock, for timeouts. */
static inline int64_t gm_now_ms(void)
{
	return (int64_t)(clock_mono_ns() / 1000000);
}

/* An errno (positive) that says the daemon that granted the lock is gone (killed, or
 * replaced by gmsfs -o takeover): its mount answers ENOTCONN from then on, ECONNABORTED
 * to a request it had when it died. */
static inline bool gm_gone(int e)
{
	return e == ENOTCONN || e == ECONNABORTED;
}

/* let_go.c: the read locks a gone daemon's successor keeps for this process (gmsfs(5),
 * RESTART), given back; where no daemon serves dir yet, those it did not take wait for
 * lg_retry, which each lock of dir calls on the directory it opened, before its LOCK. */
void lg_let_go(const char *dir, const struct gmsfs_ioc *info, unsigned holds);
void lg_retry(int fd, const char *dir);

/* handle.c */
int gm_error(gmsfs *g, int e, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* A request on the handle's channel, bound on first use and again if it was closed. */
int gm_call(gmsfs *g, enum gmsfs_op op, const void *body, size_t len, struct ch_manifest *m);
int gm_need_lock(gmsfs *g, int want);
/* Take the lock of g->dir in mode: g->dirfd, g->info, g->lock, the channel's ticket. */
int gm_take_lock(gmsfs *g, int mode, int timeout_ms);
/* The lock given back; the directory's handle kept for the next (g->sleepfd). */
void gm_release_lock(gmsfs *g);
/* The same for a reader in two halves around work that needs no lock (unmap_all's
 * unmapping): gm_unlock_send asks the daemon by the socket (0, or -errno where it cannot:
 * not a plain read lock, no bound connection), gm_unlock_done(g, what it returned) reads
 * the answer and releases the rest, by the ioctl where the socket's was not done. */
int gm_unlock_send(gmsfs *g);
void gm_unlock_done(gmsfs *g, int sent);
/* The kept handle closed (disconnect). */
void gm_forget_dir(gmsfs *g);
int gm_refresh(gmsfs *g);
/* Is device (an ordinal as the caller's CUDA sees it) the store's?  Always, on the host. */
bool gm_device_ok(const gmsfs *g, int device);

/* maps.c */
struct gmsfs_mapping *mp_find(const gmsfs *g, const char *name);
/* The alignment for a range that holds allocations of at most size bytes: the largest
 * power of two within it, up to 1 GiB. */
uint64_t mp_align(uint64_t size);
/* One allocation of a manifest at va (reserved): its descriptor fd, or, in pieces, each
 * piece's at its place (a->pieces[k].fd, set by the channel).  All or nothing; usable
 * once allow() covers it. */
int mp_map_alloc(gmsfs *g, void *va, const struct wire_alloc *a, int fd, bool writable, char *why, size_t whylen);
/* Unmap the allocation at va (aligned bytes, in pieces of piece bytes; 0: one): every
 * piece, and the first failure. */
int mp_unmap_alloc(gmsfs *g, void *va, uint64_t aligned, uint64_t piece);
/* The allocation mapped at src mapped again at dst, piece by piece. */
int mp_alias_alloc(gmsfs *g, void *src, void *dst, uint64_t aligned, uint64_t piece, bool writable, char *why,
		   size_t whylen);
/* Map allocations a[0..n) of a manifest (descriptors fd[0..n)) side by side in one
 * reservation; they join the table, taking a's names.  All or nothing.  ptr: the
 * first one's address, if not NULL. */
int mp_map(gmsfs *g, struct wire_alloc *a, const int *fd, size_t n, bool writable, void **ptr);
/* A manifest's consume: map its allocations [from, to) that are not in the table yet. */
int mp_import(void *ctx, struct ch_manifest *m, size_t from, size_t to);
/* Set the access of the mapped mappings (only the writable ones if only_writable),
 * neighbours in one reservation with one call. */
int mp_allow_all(gmsfs *g, bool only_writable, bool writable);
/* Tell the daemon, ahead, that the session writes the last commit's bytes of names (NULL:
 * every mapping) in place; mappings that came read-only where descriptors carry their
 * access (host) are mapped again writable.  Asked once a session where no descriptor is
 * needed.  0, or -errno with the reason in the handle. */
int sp_write_in_place(gmsfs *g, const char *const *names, size_t n);
void mp_unmap_mapped(gmsfs *g);
void mp_drop(gmsfs *g, size_t i);  /* maps[i] unmapped and out of the table */
void mp_release_all(gmsfs *g);

/* space.c */
/* Unmap every space's mappings, keeping their addresses (unmap_all). */
void sp_unmap_all(gmsfs *g);
/* Map them again over the handle's mappings, now mapped (remap_all, reallocate_all). */
int sp_remap_all(gmsfs *g, bool writable);
/* Set their access (a writer's commit, a resume). */
void sp_allow_all(gmsfs *g, bool writable);
/* Is allocation name mapped in a live space? */
bool sp_uses(const gmsfs *g, const char *name);
/* Free every space and its record (disconnect). */
void sp_release_all(gmsfs *g);

/* pages.c */
/* Unmap every range's pages and free the records (disconnect: the session's end gives
 * their memory back). */
void pg_release_all(gmsfs *g);
/* Does a range still hold pages or address space?  Then the handle may not sleep. */
bool pg_live(const gmsfs *g);
/* Every range's mapped pages read-only or read-write again, as a commit sets the rest: a
 * page a commit published is the store's committed memory, and the writer that was is
 * its reader. */
void pg_allow_all(gmsfs *g, bool writable);

/* meta.c */
/* Make the manifest's entries the handle's (taking them over). */
void mt_load(gmsfs *g, struct ch_manifest *m);
/* The entries, from the daemon if they are not here yet. */
int mt_ensure(gmsfs *g);
/* Copy the extents of private entries whose allocation is mapped. */
int mt_privatize(gmsfs *g);
/* Where x's extent is in this process: its private copy, or in its mapped allocation; NULL. */
void *mt_extent_ptr(const gmsfs *g, const struct entry_rec *x);
/* Where allocation alloc is mapped in this process; NULL where it is not. */
void *mt_alloc_ptr(const gmsfs *g, const char *alloc);
/* Drop the entries that name allocation alloc. */
void mt_forget_alloc(gmsfs *g, const char *alloc);
void mt_free(gmsfs *g);

/* layout.c */
/* gmsfs_commit; unmapping: the daemon's commit only, the mappings left as they are for
 * the caller to unmap next (an error: nothing was committed). */
int gm_commit(gmsfs *g, bool unmapping);
/* The same, the commit called name in the same round trip (GMSFS_OP_COMMIT_NAMED); -EINVAL
 * with "unknown op" in g->err from a daemon that predates the op. */
int gm_commit_named(gmsfs *g, bool unmapping, const char *name);
/* The commit's request after the work queued is drained: COMMIT; COMMIT_NAMED with a
 * name; COMMIT_LEAVE (a name or NULL) with leave.  t0, t1: the trace's start, drained. */
int gm_commit_request(gmsfs *g, const char *name, bool leave, double *t0, double *t1);
/* After gm_commit(g, true): the private entries copied out, every mapping unmapped and
 * the lock given back (gmsfs_unmap_all), whatever fails.  0 or the first -errno. */
int gm_unmap_committed(gmsfs *g);

#endif
