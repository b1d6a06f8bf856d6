/* vmm: where allocation memory comes from: the interface (types and calls; the code is
 * in the files src/vmm/layers lists).  The daemon creates, exports and releases; it never
 * maps.  Backends: host (sealed memfds), cuda (CUDA VMM).  Errors are -errno; a message
 * goes to err where one is asked for. */
#ifndef GMSFS_VMM_H
#define GMSFS_VMM_H

#include <errno.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/types.h>

struct vmm;

/* Where one store's buffers come from.  host: one memfd for the whole store, each buffer
 * a range of it (descriptors do not grow with allocations); cuda: nothing shared. */
struct vmm_pool {
	struct vmm *vmm;
	atomic_uint refs;     /* the store's and one per buffer */
	_Atomic uint64_t quota; /* bytes its buffers may hold, on either tier (0: no limit) */
	atomic_uint_fast64_t used; /* aligned bytes its buffers hold, on either tier */
	_Atomic uint64_t min;  /* bytes of the device kept for it while it holds less (0: none) */
	atomic_uint_fast64_t peak; /* the most it has held */
	/* Spare pages: pages it gave back, made still, for its own next growth (vmm_alloc_page), and memory
	 * made ahead of its next version (vmm_spare_make_like_later): in neither used nor the device's
	 * used_bytes, in the device's pages_spare; listed in spare_list. */
	atomic_uint_fast64_t pages_spare;
	void *spare_list;
	atomic_uint pieces;   /* buffers that are pieces of its allocations in pieces (vmm_pieces.c) */
	void *priv;
};

struct vmm_buf {
	struct vmm *vmm;
	struct vmm_pool *pool;
	uint64_t size;        /* aligned size: what the backend holds */
	atomic_uint refs;
	int fd;               /* the exported descriptor, kept for the buffer's (or pool's) life */
	uint64_t offset;      /* where the buffer starts in it */
	atomic_int ro_fd;     /* cuda: unused; host: see the pool */
	bool host;            /* on the host tier: counted in host_used, never exported */
	/* Host memory on standby: from the last move in, for the next move out (making pinned
	 * memory is what a move out would spend its time on).  A buffer on standby is in
	 * host_used and host_standby, not in its pool's use; under the caller's lock. */
	struct vmm_buf *standby;
	bool on_standby;
	bool page;            /* an elastic store's page (vmm_alloc_page): a spare when given back */
	bool last_host;       /* released: the host tier's last memory (the copier is unneeded) */
	uint64_t release_after; /* CLOCK_MONOTONIC ns: its memory is released no sooner (0: at once):
	                       * a client about to unmap it would otherwise drop the last reference and
	                       * wait while the driver frees it (a version's last reader to flip) */
	/* An allocation past the mount's piece size (vmm_pieces.c) is buffers of its own,
	 * pieces[0..npieces), a reference each, all of one size but the last, that clients
	 * map side by side: it moves, and a switch empties and fills it, piece by piece.
	 * Such a buffer holds no memory itself (fd -1; its host and standby mean nothing);
	 * npieces 0: the buffer is its memory. */
	struct vmm_buf **pieces;
	uint32_t npieces;
};

/* The memory of b: vmm_npieces(b) buffers, its pieces or b itself. */
static inline size_t vmm_npieces(const struct vmm_buf *b)
{
	return b->npieces ? b->npieces : 1;
}
static inline struct vmm_buf *vmm_piece(struct vmm_buf *b, size_t i)
{
	return b->npieces ? b->pieces[i] : b;
}

struct vmm_device {
	int index;
	int gpu;              /* its number in the metrics' gpu label (dcgm-exporter's: nvidia-smi's
	                       * index): -o gpu=N, else index */
	char uuid[64];
	char name[128];
	const char *backend;
	uint64_t total_bytes; /* what the device has */
	uint64_t granularity;
};

/* What a daemon knew of its device, for the next one's start (vmm_facts.c): kept under
 * state= by the daemon before (STATE/device), or read from the device file of the one a
 * takeover replaces.  With them the cuda backend serves at once and opens the driver on a
 * thread, checking them: a restart's cuInit beside the engines' contexts took 10.5-15.8 ms
 * of the new daemon's 11-18 ms start on an H200. */
struct vmm_known {
	struct vmm_device dev; /* index, uuid, name, total_bytes, granularity */
	char env[256];         /* CUDA_VISIBLE_DEVICES and CUDA_DEVICE_ORDER as they were (vmm_facts_env) */
	char path[4096];       /* the file they came from, removed if the device proves them wrong ("": none) */
	/* The mount's last busy moment (fs.h's busy_ns; NULL: none): the driver opens once the
	 * mount has been quiet a second, at the first create, or after 10 s. */
	const _Atomic uint64_t *busy_ns;
};

struct vmm_ops {
	const char *name;
	int (*open)(struct vmm *v, const char *device, char *err, size_t errlen);
	/* Open with the device's facts known (vmm_known), at once; the driver is opened on a
	 * thread of the backend's own, and what needs it waits (optional; cuda). */
	int (*open_known)(struct vmm *v, const struct vmm_known *k, char *err, size_t errlen);
	int (*pool_open)(struct vmm_pool *p);       /* optional */
	void (*pool_close)(struct vmm_pool *p);     /* optional */
	int (*create)(struct vmm_pool *p, uint64_t aligned, struct vmm_buf **out);
	void (*release)(struct vmm_buf *b);
	/* A descriptor to send, kept by the buffer (the caller does not close it);
	 * read_only: one that can only be mapped read-only. */
	int (*export_fd)(struct vmm_buf *b, bool read_only);
	ssize_t (*pread)(struct vmm_buf *b, void *dst, size_t len, uint64_t off);
	ssize_t (*pwrite)(struct vmm_buf *b, const void *src, size_t len, uint64_t off);
	/* The host tier: a buffer in host memory, the bytes of n buffers copied to n others
	 * (either way), and two buffers' memory exchanged (their sizes are equal). */
	int (*create_host)(struct vmm_pool *p, uint64_t aligned, struct vmm_buf **out);
	int (*copy)(struct vmm *v, struct vmm_buf *const *src, struct vmm_buf *const *dst, size_t n, char *err,
		    size_t errlen);
	void (*swap)(struct vmm_buf *a, struct vmm_buf *b);
	/* copy in two halves, for a switch (optional): copy_send starts one, copy_recv waits
	 * for the oldest started; at most two in flight, so that the next is made ready while
	 * the copies of the one before run.  After a failure, every one in flight is waited
	 * for (failing too, maybe) before anything else is asked of the backend. */
	int (*copy_send)(struct vmm *v, struct vmm_buf *const *src, struct vmm_buf *const *dst, size_t n, char *err,
			 size_t errlen);
	int (*copy_recv)(struct vmm *v, char *err, size_t errlen);
	/* Be ready to copy now, and stay so (optional; cuda: gmsfs-mover started, and kept
	 * running: a first move would otherwise wait for its CUDA context). */
	void (*copies_ready)(struct vmm *v);
	/* The last host memory went: copies_ready's readiness is not needed now (optional;
	 * cuda: the helper ends when idle, and its context's device memory goes back). */
	void (*copies_unneeded)(struct vmm *v);
	/* Host memory made ahead, used once by the copier (optional; cuda: its first copy
	 * was ~10% slower than later ones, the first move out's whole margin). */
	int (*touch)(struct vmm *v, struct vmm_buf *const *bufs, size_t n, char *err, size_t errlen);
	/* A buffer over memory another daemon made (a handover, a restart): aligned bytes at
	 * offset in fd (host: on the host tier), which the backend dups for itself. */
	int (*adopt)(struct vmm_pool *p, int fd, uint64_t offset, uint64_t aligned, bool host, struct vmm_buf **out);
	/* After adopting: memory of the pool's file (host: of the host tier's) that no
	 * buffer uses goes back, a dead daemon's uncommitted allocations (optional). */
	void (*trim)(struct vmm_pool *p, bool host);
	/* Releases done, and none for a while (the releaser thread, optional): ready the next
	 * create.  cuda: after a process released memory, its next cuMemCreate paid 4-6 ms
	 * more once 50 ms had passed (16 x 1 GiB made in 4-7 ms instead of 1.3-2 on an H200),
	 * and one small allocation made and freed in between took that off the next. */
	void (*settle)(struct vmm *v);
	/* The daemon ends, its buffers next (optional; cuda: the copy helper is let go first,
	 * told nothing of them, and nobody waits for it). */
	void (*leave)(struct vmm *v);
	void (*close)(struct vmm *v); /* optional */
};

struct vmm {
	const struct vmm_ops *ops;
	struct vmm_device dev;
	uint64_t max_bytes;   /* the daemon's limit: min(max_bytes=, device total) */
	uint64_t piece_bytes; /* allocations past this are made of pieces (vmm_pieces.c; 0: never) */
	atomic_uint_fast64_t used_bytes;
	uint64_t host_bytes;  /* the host tier's limit */
	atomic_uint_fast64_t host_used;
	atomic_uint_fast64_t host_standby; /* of host_used: buffers on standby, given up when room is needed */
	const char *helper;   /* cuda: the copy helper's path (gmsfs-mover) */
	/* Told before a backend closes a descriptor that held memory (a buffer's, a pool's),
	 * so that a copy kept elsewhere (the service manager's store) can go too; NULL: none. */
	void (*closing)(void *arg, int fd);
	void *closing_arg;
	/* At the end under a service manager that keeps the memory (keep.c): buffers go
	 * without their memory being freed. */
	bool keep_memory;
	/* A successor takes the memory over (handover.c): no new buffers meanwhile. */
	atomic_bool frozen;
	/* The pools with a minimum (vmm_pool_set_min), under mins_mu: what the device must
	 * keep free for each while it holds less. */
	void *mins;
	/* Device memory of spare pages, for their stores' next growth (vmm_alloc_page), not in
	 * used_bytes: given up for anyone's reservation that needs the room. */
	atomic_uint_fast64_t pages_spare;
	void *spare_pools; /* the pools with spare pages, under its lock */
	void *releases;   /* releases pending (vmm_release.c), under its lock */
	/* Of the memory whose last reference went, what is not released yet (device, host):
	 * room in the accounting, not yet in memory (vmm_released_for). */
	atomic_uint_fast64_t releasing, host_releasing;
	/* Called on the releaser thread before each release (NULL: nothing): the daemon's
	 * fault point release.buf, a release that never returns (tests/57-operations.bats). */
	void (*before_release)(void);
	bool known;          /* opened from the facts a daemon before kept (vmm_open's known) */
	void *priv;
};

/* For the backends: a memory descriptor is closed. */
void vmm_close_fd(struct vmm *v, int fd);

extern const struct vmm_ops vmm_host_ops;
#ifdef GMSFS_HAVE_CUDA
extern const struct vmm_ops vmm_cuda_ops;
#endif

/* backend: "host", "cuda" or NULL (cuda where a VMM-capable GPU is found, else host).
 * known (NULL: none): the device's facts as the daemon before had them, used where they
 * fit (vmm_facts_fit); v->known says whether they were. */
int vmm_open(struct vmm **out, const char *backend, const char *device, const struct vmm_known *known,
	     uint64_t max_bytes, char *err, size_t errlen);

/* vmm_facts.c.  0, or -EINVAL where text (a facts file, or a daemon's device file) does not
 * give a cuda device's index, uuid, name, total_bytes and granularity, each valid. */
int vmm_facts_parse(const char *text, struct vmm_known *k);
/* The facts of the file at path: 0, -errno, or -EINVAL as above; k->path is path. */
int vmm_facts_read(const char *path, struct vmm_known *k);
/* v's device's facts into path (written whole, then renamed over it): 0 or -errno. */
int vmm_facts_write(const char *path, const struct vmm *v);
/* The environment that gives a device its index, as facts keep it (NULL: unset). */
void vmm_facts_env(const char *visible, const char *order, char *out, size_t size);
/* The same of process pid's environment as it started (/proc/PID/environ): 0 or -errno. */
int vmm_facts_env_of(pid_t pid, char *out, size_t size);
/* Whether k is the device that backend and device= (NULL: the first) name, seen under
 * this process's environment, and holds max_bytes (0: the device's own). */
bool vmm_facts_fit(const struct vmm_known *k, const char *backend, const char *device, uint64_t max_bytes);

/* Keep min bytes of the device for pool while it holds less: another pool's buffer is
 * refused (-ENOSPC) where it would leave less free than every minimum still lacks.
 * -EINVAL when the minimums together would pass max_bytes; 0 takes the minimum away. */
int vmm_pool_set_min(struct vmm_pool *pool, uint64_t min);
/* What the minimums of pools other than pool (NULL: all) still lack on the device. */
uint64_t vmm_mins_short(struct vmm *v, const struct vmm_pool *pool);
/* The device bytes pool may take now: max_bytes less what is used and what the other
 * pools' minimums still lack (spare pages are room: they go for it). */
uint64_t vmm_room_for(struct vmm *v, const struct vmm_pool *pool);
/* Every buffer whose last reference went is released by now (they go on a thread of
 * their own: vmm_release.c).  Never under fs->mu. */
void vmm_released(struct vmm *v);
/* The daemon ends: called before its buffers go (then vmm_close). */
void vmm_leave(struct vmm *v);
void vmm_close(struct vmm *v);

uint64_t vmm_align(const struct vmm *v, uint64_t size);
/* A store's pool, one reference; the last put (the store's or its last buffer's) closes it. */
int vmm_pool_new(struct vmm *v, struct vmm_pool **out);
void vmm_pool_get(struct vmm_pool *p);
void vmm_pool_put(struct vmm_pool *p);
/* A new buffer of at least size bytes from the pool, one reference: one piece of memory,
 * or past the mount's piece size a buffer of pieces (vmm_pieces.c), all made or none.
 * -ENOSPC past max_bytes or when the backend is out of memory; -EDQUOT past the pool's
 * quota; -EMFILE/-ENFILE out of descriptors. */
int vmm_alloc(struct vmm_pool *p, uint64_t size, struct vmm_buf **out);
/* vmm_alloc of one piece of memory, whatever its size. */
int vmm_alloc_one(struct vmm_pool *p, uint64_t size, struct vmm_buf **out);
/* The default piece size (gmsfs -o piece_bytes=), and the most pieces an allocation has
 * (GMSFS_PIECES_MAX): a bigger allocation has bigger pieces. */
#define VMM_PIECE_DEFAULT (1ull << 30)
/* The size of the pieces of an allocation of aligned bytes; 0: it is one piece. */
uint64_t vmm_piece_of(const struct vmm *v, uint64_t aligned);
/* A buffer of n pieces (their references taken over on success): an allocation that
 * came in pieces (a restart's, a handover's).  -EINVAL where they do not make one (one
 * piece, more than GMSFS_PIECES_MAX, sizes that differ, another pool's). */
int vmm_compound(struct vmm_buf *const *pieces, size_t n, struct vmm_buf **out);
/* vmm_alloc for an elastic store's page: one of its pool's spares is taken first
 * (no memory made: making and exporting it is most of a page's cost), else a new one.
 * A page's last put makes it a spare, for the pool's next page of that size, out of the pool's
 * use, until vmm_pool_drop_spares, the pool's end, or a reservation anywhere that needs
 * the room.  Spare pages hold that store's bytes: only its own pages reuse them. */
int vmm_alloc_page(struct vmm_pool *p, uint64_t size, struct vmm_buf **out);
/* A spare of p of aligned bytes taken into use, counted as new memory is (within the quota
 * and the others' minimums): 0 with *out (one reference, still a page: a spare again at its
 * last put unless the caller says otherwise), -ENOENT where p has none of that size, or
 * -EDQUOT / -ENOSPC (the spare stays one). */
int vmm_spare_use(struct vmm_pool *p, uint64_t aligned, struct vmm_buf **out);
/* Spare memory of like's shape (each piece a spare of p, vmm_alloc_page's kind) made on the
 * releaser thread, after the releases queued before it, for like's next copy
 * (vmm_alloc_like takes them): a store's next version's memory made while its trainer
 * steps.  Only in room nobody holds (no spare or host memory given up for it) and within
 * p's quota; what was not made is not.  Each of like[0..n) is held until then. */
void vmm_spare_make_like_later(struct vmm_pool *p, struct vmm_buf *const *like, size_t n);
void vmm_pool_drop_spares(struct vmm_pool *p);
/* The same, their memory released on the releaser thread (vmm_release.c), the pool held
 * until then: a session's end under fs->mu lets its spare pages go (off the list and out
 * of pages_spare at once) without a backend call there. */
void vmm_pool_drop_spares_later(struct vmm_pool *p);
/* A buffer over aligned bytes at offset in fd, memory another daemon made and handed
 * over (fd stays the caller's: the backend keeps a dup).  Counted as vmm_alloc counts
 * (host: in host_used), but never refused: the memory exists already. */
int vmm_adopt(struct vmm_pool *p, int fd, uint64_t offset, uint64_t aligned, bool host, struct vmm_buf **out);
/* Once a pool's buffers are adopted and the daemon that made them is gone: what the
 * memory file held besides them (a dead session's allocations) is freed. */
void vmm_pool_trim(struct vmm_pool *p, bool host);
void vmm_buf_get(struct vmm_buf *b);
void vmm_buf_put(struct vmm_buf *b);
int vmm_export(struct vmm_buf *b, bool read_only);
/* Why an allocation failed, in words an operator can act on; -EDQUOT (vmm_alloc's
 * answer past the pool's quota) with the pool's figures. */
void vmm_why(const struct vmm *v, int e, char *buf, size_t len);
void vmm_pool_why(const struct vmm_pool *p, int e, uint64_t size, char *buf, size_t len);

/* ---- the host tier ---- */
/* Move n buffers' bytes to the other tier (to_host: from the device): each gets new
 * memory there and the bytes are copied; the old memory comes back in *old (n
 * entries; NULL for a buffer that was there already), for vmm_release_all once the
 * move is seen done (freeing pinned memory takes time nobody should wait for).  All or nothing: on failure every buffer is where
 * it was.  -ENOSPC: the other tier's limit (why in err).  Nobody may map or write the
 * buffers meanwhile (the caller sees to that); may run without the caller's locks: it
 * takes the time of the copy.  ns (may be NULL): where the time went, [0] making the
 * new memory, [1] the copy. */
int vmm_move(struct vmm_buf *const *bufs, size_t n, bool to_host, struct vmm_buf ***old, uint64_t ns[2],
	     char *err, size_t errlen);
void vmm_release_all(struct vmm_buf **bufs, size_t n);
/* b's memory on the other tier (to_host, or to the device), of its size, counted against
 * that tier's limit (-ENOSPC past it): to the host, what b has on standby from its last move in if
 * anything, else new.  vmm_twin_why says why one could not be made. */
int vmm_twin(struct vmm_buf *b, bool to_host, struct vmm_buf **out);
void vmm_twin_why(const struct vmm_buf *b, bool to_host, int e, char *err, size_t errlen);
/* Each buffer takes its twin's memory (and tier); the twins then hold the old. */
void vmm_take(struct vmm_buf *const *bufs, struct vmm_buf **twins, size_t n);
/* A switch (vmm_switch.c): outs' bytes to the host tier and ins' to the device, both ways
 * at once and piece by piece, in the room the outs give back.  Every out's host memory
 * is made first (within host_bytes); then, round after round, a piece of the outs and
 * what fits of the ins are copied together (the backend copies both ways at once), and
 * the piece that went out is given to out_done (under no lock of vmm's): the caller's
 * buffers take their twins' memory there (vmm_take), where the caller sees to it that
 * nobody looks meanwhile, names it (its image), and gives back the old, the next ins'
 * room.  At the end *in_twins holds the ins' new device memory (nin), for the caller to
 * take (vmm_take) and put the old on standby for the next move out (vmm_set_standby).  On failure the
 * ins are untouched (their new memory released), the outs given to out_done are on the
 * host tier and the rest on the device: -errno, why in err. */
struct vmm_switch_ops {
	void (*out_done)(void *arg, struct vmm_buf *const *outs, struct vmm_buf **twins, size_t n);
	void *arg;
	/* Where the time went (nanoseconds): new memory, copies, out_done; and the rounds. */
	uint64_t ns_memory, ns_copy, ns_done, rounds;
};
int vmm_switch(struct vmm_buf *const *outs, size_t nout, struct vmm_buf *const *ins, size_t nin,
	       struct vmm_switch_ops *o, struct vmm_buf ***in_twins, char *err, size_t errlen);
/* Each buffer's bytes copied into new memory of its own tier, which it takes; the old
 * comes back in *old (n buffers), to release, or to take back with vmm_unrenew (the
 * memory is swapped back and the new released).  A takeover gives a rolled-back writer's
 * mappings memory of their own this way.  All or nothing; the time of a copy. */
int vmm_renew(struct vmm_buf *const *bufs, size_t n, struct vmm_buf ***old, char *err, size_t errlen);
void vmm_unrenew(struct vmm_buf *const *bufs, struct vmm_buf **old, size_t n);
/* New device memory of like's shape (its pieces, each of its size: p's spares of that size
 * first, made ahead by vmm_spare_make_like_later), counted as an allocation of p (-EDQUOT
 * past its quota, -ENOSPC past the device's budget): a store's next version's copy, made
 * through the daemon's door (src/fs/memory.h).  -EINVAL: like is on the host tier. */
int vmm_alloc_like(struct vmm_pool *p, const struct vmm_buf *like, struct vmm_buf **out);
/* from's bytes copied into to, of its shape (vmm_alloc_like); from stays as it is.  The
 * time of a copy: call it without the caller's locks.  0 or -errno and err. */
int vmm_copy(struct vmm_buf *from, struct vmm_buf *to, char *err, size_t errlen);
/* A list of buffers, one reference each, given back together (vmm_bufs_release) where
 * nobody waits for it: releasing pinned or device memory takes time. */
struct vmm_bufs {
	struct vmm_buf **v;
	size_t n, cap;
};
/* b pushed on l (the list takes its reference): 0, or -ENOMEM with l as it was. */
static inline int vmm_bufs_push(struct vmm_bufs *l, struct vmm_buf *b)
{
	if (l->n == l->cap) {
		size_t cap = l->cap ? 2 * l->cap : 16;
		struct vmm_buf **v = (struct vmm_buf **)realloc(l->v, cap * sizeof *v);
		if (!v)
			return -ENOMEM;
		l->v = v, l->cap = cap;
	}
	l->v[l->n++] = b;
	return 0;
}
void vmm_bufs_release(struct vmm_bufs *l);
/* Host memory for b's first move out, made ahead (counted against host_bytes: -ENOSPC
 * past it; on standby, never in its pool's use), for vmm_set_standby; may run without the caller's
 * locks: it takes the time of pinning. */
int vmm_make_host(struct vmm_buf *b, struct vmm_buf **out);
/* After a move in: bufs[i] has old[i] on standby (vmm_move's *old, or vmm_make_host's; NULL:
 * none) for its next move out, which then copies without making host memory.  Frees
 * the array. */
void vmm_set_standby(struct vmm_buf *const *bufs, struct vmm_buf **old, size_t n);
/* The backend ready to copy at once from now on (host_ahead); nothing where it always is. */
void vmm_copies_ready(struct vmm *v);
/* vmm_make_host's memory (bufs[i] NULL: skipped) used once by the backend's copier, so
 * that a first move out into it is as fast as later ones; 0 where the backend needs
 * nothing.  Takes the time of a copy of their bytes. */
int vmm_touch_host(struct vmm_buf *const *bufs, size_t n, char *err, size_t errlen);
/* Whether vmm_touch_host does anything on v's backend (cuda: its copier maps and copies). */
bool vmm_touches(const struct vmm *v);
/* Host memory the daemon before had on standby for b (a takeover's or a restart's: fd at
 * offset, b's size), adopted as b's standby; b (a piece, on the device) has none yet.  0
 * or the backend's -errno (nothing adopted). */
int vmm_adopt_standby(struct vmm_buf *b, int fd, uint64_t offset);
/* What b has on standby, taken off it (NULL: nothing), for vmm_buf_put where nobody waits. */
struct vmm_buf *vmm_take_standby(struct vmm_buf *b);
ssize_t vmm_pread(struct vmm_buf *b, void *dst, size_t len, uint64_t off);
ssize_t vmm_pwrite(struct vmm_buf *b, const void *src, size_t len, uint64_t off);

#endif
