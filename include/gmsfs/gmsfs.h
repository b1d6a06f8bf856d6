/* libgmsfs: the fast path to a gmsfs store.  See libgmsfs(3).
 *
 * One gmsfs handle is one connection to one store (a directory of a gmsfs
 * mount) and holds that store's lock.  Every call returns 0 or a negative errno
 * (-EAGAIN, -ETIMEDOUT, -ESTALE, ...); gmsfs_errmsg() says what went wrong in
 * words.  A handle is used by one thread at a time.  Descriptors are opened
 * O_CLOEXEC.  Nothing is global but, per thread, the words of the last call that takes
 * no handle (gmsfs_errmsg(NULL)), as errno is.
 *
 * Ownership: strings and lists returned through out-parameters are the
 * caller's (free them with the matching gmsfs_*_free); pointers into the
 * handle (gmsfs_errmsg, gmsfs_mappings) stay valid until the next call on it. */
#ifndef GMSFS_H
#define GMSFS_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <gmsfs/abi.h> /* GMSFS_RO, GMSFS_RW, GMSFS_RW_OR_RO, GMSFS_RW_DATA, GMSFS_ENTRY_PRIVATE, limits */

#ifdef __cplusplus
extern "C" {
#endif

#define GMSFS_VERSION_MAJOR 0
#define GMSFS_VERSION_MINOR 3
#define GMSFS_VERSION_PATCH 0
#define GMSFS_VERSION_NUMBER (GMSFS_VERSION_MAJOR * 10000 + GMSFS_VERSION_MINOR * 100 + GMSFS_VERSION_PATCH)

typedef struct gmsfs gmsfs;

#define GMSFS_API __attribute__((visibility("default")))

/* GMSFS_VERSION_NUMBER of the library that is loaded, and the same as "0.2.0". */
GMSFS_API int gmsfs_version(void);
GMSFS_API const char *gmsfs_version_string(void);

/* Connect to store_dir (e.g. /run/gmsfs/GPU-.../llama) and take its lock, waiting up to
 * timeout_ms (-1: as long as it takes; 0: one try, -EAGAIN if taken).  -ETIMEDOUT when
 * the wait ran out, or when the store's daemon (stopped, or stuck) did not answer the open
 * of its directory within it (a helper thread waits for that open, and is left behind).  A new RW writer starts from the last committed layout.  A writer
 * session has one RW connection: an RW connect by a process whose session holds the store
 * (it or an ancestor is the writer) fails at once with -EBUSY; anyone else's waits like any
 * other writer.  A process that holds a read lock gets -EDEADLK.  As with sqlite3_open, *out is set
 * even when it fails (NULL only when out or store_dir is NULL, the mode is unknown, or
 * memory ran out) so that gmsfs_errmsg can say why: disconnect it either way. */
GMSFS_API int gmsfs_connect(gmsfs **out, const char *store_dir, int mode, int timeout_ms);
/* Connect's mode may carry flags, OR'ed in (others are -EINVAL):
 * GMSFS_EINTR: a signal ends every wait of this handle (connect, remap_all,
 * reallocate_all) with -EINTR, for a caller that runs its own signal handlers and then
 * retries (Python does).  Without it a signal never fails a wait that has time left: the
 * wait goes on with what is left of the timeout. */
#define GMSFS_LOCK_MASK 0xff
#define GMSFS_EINTR 0x100
/* GMSFS_OWN: the handle is a session of its own, as a GMS connection is (gmsfs(5),
 * "Sessions of their own"): granted as another process's request would be, whatever this
 * process holds; an RW connect waits for this process's read locks (timeout_ms bounds it)
 * where it would fail with -EDEADLK, and never joins this process's writer session. */
#define GMSFS_OWN 0x200
/* Unmap everything, give the address ranges back and release the lock.  A writer
 * that did not commit is rolled back to the last committed layout.  NULL is fine. */
GMSFS_API void gmsfs_disconnect(gmsfs *g);

/* The store directory the handle was connected to (the handle's own string). */
GMSFS_API const char *gmsfs_store_path(const gmsfs *g);
GMSFS_API int gmsfs_lock_mode(const gmsfs *g);     /* GMSFS_RO, GMSFS_RW, or 0 between unmap_all and remap_all */
GMSFS_API int gmsfs_backend(const gmsfs *g);       /* GMSFS_BACKEND_HOST or GMSFS_BACKEND_CUDA: what ptr points at */
GMSFS_API uint64_t gmsfs_total_bytes(const gmsfs *g); /* aligned bytes of this handle's mappings */
/* The committed layout hash as 32 hex digits; "" when nothing is committed. */
GMSFS_API int gmsfs_layout_hash(gmsfs *g, char hex[33]);
/* The store's commits so far as the handle last learned them (at each grant of its lock,
 * its commit, gmsfs_layout_hash), 0 when nothing was committed: no round trip. */
GMSFS_API uint64_t gmsfs_generation(const gmsfs *g);
/* What went wrong in words: g's last failed call; g NULL: the calling thread's last failed
 * call that takes no handle (gmsfs_copy, gmsfs_pull, gmsfs_load_context), "" when it
 * succeeded.  Valid until the next call on g, or in the thread. */
GMSFS_API const char *gmsfs_errmsg(const gmsfs *g);
GMSFS_API const char *gmsfs_strerror(int err);
/* For libraries built on libgmsfs (libgmsfs-load, libgmsfs-peer): set the words that
 * gmsfs_errmsg(g) returns (g NULL: the calling thread's; fmt NULL: "") and return err. */
GMSFS_API int gmsfs_seterr(gmsfs *g, int err, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* One mapping: ptr stays valid (mapped, or reserved while unmapped) until it is freed
 * or the handle is disconnected. */
struct gmsfs_mapping {
	const char *name;  /* allocation path below allocs/ */
	const char *tag;
	void *ptr;
	uint64_t size;     /* requested */
	uint64_t aligned;  /* what is mapped */
	int writable;
};
/* The handle's mappings, in creation or import order; *list points into the handle. */
GMSFS_API size_t gmsfs_mappings(const gmsfs *g, const struct gmsfs_mapping **list);
/* The mapping named name, or -ENOENT. */
GMSFS_API int gmsfs_find(const gmsfs *g, const char *name, struct gmsfs_mapping *out);
/* The mapping that holds address ptr and ptr's offset in it, or -ENOENT. */
GMSFS_API int gmsfs_find_ptr(const gmsfs *g, const void *ptr, struct gmsfs_mapping *out, uint64_t *offset);

/* ---- RW ---- */
/* Create allocs/NAME of size bytes with tag (NULL: "default") and map it read-write, at
 * *ptr (ptr may be NULL: gmsfs_find tells where). */
GMSFS_API int gmsfs_create(gmsfs *g, const char *name, uint64_t size, const char *tag, void **ptr);
/* One allocation for gmsfs_create_many. */
struct gmsfs_new {
	const char *name;
	uint64_t size;
	const char *tag;   /* NULL: "default" */
	void *ptr;         /* out: where it is mapped, read-write */
};
/* Create and map n allocations in one request, all or nothing: on failure (-EINVAL
 * naming the bad one, -EEXIST, -ENOSPC, ...) none of them is left in the layout.  The
 * writer's fast path: the driver's access call is made once per 16 allocations. */
GMSFS_API int gmsfs_create_many(gmsfs *g, struct gmsfs_new *v, size_t n);
/* Unmap ptr, delete its allocation and every metadata entry that points at it. */
GMSFS_API int gmsfs_free(gmsfs *g, void *ptr);
/* The same by name, mapped or not.  A writer that replaces committed allocations this
 * way, without importing them, never holds them writable: its crash leaves the last
 * commit whole, not TORN (gmsfs(5), Abort). */
GMSFS_API int gmsfs_free_name(gmsfs *g, const char *name);

/* One metadata entry to put: meta/KEY = value, describing the extent [offset, offset+size)
 * of allocation alloc (size 0: no extent, offset only). */
struct gmsfs_entry {
	const char *key;
	const char *alloc;
	uint64_t offset;
	uint64_t size;
	uint32_t flags;     /* GMSFS_ENTRY_PRIVATE: each importer gets its own copy of the extent;
	                     * GMSFS_ENTRY_NOTE: the layout hash leaves it out */
	const void *value;
	size_t value_len;   /* at most GMSFS_VALUE_MAX */
};
/* Put n entries in one round trip per batch, all or nothing: -EINVAL (nothing changed)
 * and gmsfs_errmsg naming the bad entry when a key or allocation name is invalid, the
 * allocation does not exist, the extent is not inside it, a flag is unknown or a value
 * is too long.  An existing key is replaced. */
GMSFS_API int gmsfs_meta_put_many(gmsfs *g, const struct gmsfs_entry *v, size_t n);
/* One entry with no extent size and no flags. */
GMSFS_API int gmsfs_meta_put(gmsfs *g, const char *key, const char *alloc, uint64_t offset, const void *value, size_t len);
GMSFS_API int gmsfs_meta_delete(gmsfs *g, const char *key);
/* Validate and publish (the work the caller's context queued is waited for first: the
 * bytes it publishes have landed).  The writer's mappings stay where they are and become read-only;
 * the lock becomes a read lock (no other writer can slip in between). */
GMSFS_API int gmsfs_commit(gmsfs *g);

/* ---- reading (RO, and RW for the session's own layout) ---- */
/* Map every allocation of the layout and load its metadata in one request, each reply
 * message's allocations (16 descriptors at most) as it comes, side by side in one address
 * range; private entries are copied into memory of this process. */
GMSFS_API int gmsfs_import_all(gmsfs *g);
/* Map one allocation by name (-ENOENT or -EISDIR with the name in gmsfs_errmsg). */
GMSFS_API int gmsfs_import(gmsfs *g, const char *name, void **ptr);
/* A writer's import of what it will write whole: the n named allocations (names NULL: every
 * one), mapped read-write as import_all maps them.  Beside readers (a store with
 * versions, gmsfs(5) VERSIONS) their next version's memory is made without a copy of the
 * last commit's bytes, which the writer is about to replace: until written it holds what
 * a new allocation holds.  In place (no readers beside), the same as importing them.  One
 * mapped already is left as it is (the first import in a session decides).  -EPERM for a
 * reader, -ENOENT for a name the layout lacks. */
GMSFS_API int gmsfs_import_overwrite(gmsfs *g, const char *const *names, size_t n);
/* Unmap one allocation: the handle's mapping of name goes, its address range with it
 * (gmsfs_import maps it again, maybe elsewhere); the allocation, its bytes and its
 * entries stay in the layout.  A writer that has written an allocation lets it go as its
 * writes land, before its commit: on a GPU each unmap then runs while the copies queued
 * after it run, and a commit that unmaps has none left to do (gmsfs.torch.refit does this
 * when the connection closes after its commit).  The work queued on the mapping must
 * have landed first: the caller waits for it (an event of its stream), since an unmap
 * under a running copy faults.  -ENOENT (not mapped by the handle), -EINVAL (between
 * unmap_all and remap_all), -EBUSY (mapped in a space; or, for a writer, the allocation
 * holds a private entry, whose copy is made from the mapping at the commit). */
GMSFS_API int gmsfs_unmap(gmsfs *g, const char *name);

struct gmsfs_meta {
	char *alloc;       /* allocation path */
	uint64_t offset;
	uint64_t size;     /* the extent's bytes, 0 if it has none */
	uint32_t flags;    /* GMSFS_ENTRY_PRIVATE */
	void *value;
	size_t value_len;
	/* Where the extent is in this process: in the mapping of alloc, or in this process's
	 * own copy for a private entry; NULL while that allocation is not mapped. */
	void *ptr;
};
/* Metadata answer from the handle's copy of the layout's entries, loaded by import_all
 * (or by the first get or list) and kept current by the handle's own puts. */
GMSFS_API int gmsfs_meta_get(gmsfs *g, const char *key, struct gmsfs_meta *out);
GMSFS_API void gmsfs_meta_free(struct gmsfs_meta *m);
/* Keys that start with prefix ("" or NULL: all), sorted bytewise. */
GMSFS_API int gmsfs_meta_list(gmsfs *g, const char *prefix, char ***keys, size_t *count);
GMSFS_API void gmsfs_list_free(char **keys, size_t count);
/* Every entry whose key starts with prefix, in one call: keys as gmsfs_meta_list gives
 * them and entries[i] as gmsfs_meta_get gives keys[i].  Both arrays are the caller's,
 * freed with gmsfs_meta_free_all (a binding pays one call for a model, not one per key). */
GMSFS_API int gmsfs_meta_get_all(gmsfs *g, const char *prefix, char ***keys, struct gmsfs_meta **entries,
				 size_t *count);
GMSFS_API void gmsfs_meta_free_all(char **keys, struct gmsfs_meta *entries, size_t count);

/* ---- content: the hash of the committed bytes (gmsfs(5), CONTENT HASH) ---- */
#define GMSFS_DIGEST_RECORD 1u /* tell the daemon (needs write permission on the store) */
/* A reader's handle: the content hash of the committed layout it holds, 32 hex digits
 * into hex: every allocation imported (as gmsfs_import_all) and read (GPU memory through
 * pinned host memory).  With GMSFS_DIGEST_RECORD the daemon is told, for the commit it
 * was computed on, and `cat STORE/content_hash` says it until the store changes; a refusal
 * (-EACCES: no write permission; -EBUSY: a writer session runs beside the readers) leaves
 * hex filled and gmsfs_errmsg saying why.  -EPERM on a writer's handle. */
GMSFS_API int gmsfs_digest(gmsfs *g, unsigned flags, char hex[33]);
/* The daemon's word: the content hash it was told for the commit g holds (its lock's
 * generation), 32 hex digits into hex, without reading a byte.  -ENODATA: none known for
 * that commit (not computed, or committed again since: gmsfs_digest computes it). */
GMSFS_API int gmsfs_content_hash(gmsfs *g, char hex[33]);

/* ---- sleep and wake ---- */
/* Unmap everything but keep every address range reserved, and release the lock. */
GMSFS_API int gmsfs_unmap_all(gmsfs *g);
/* gmsfs_commit, then gmsfs_unmap_all, without making the mappings read-only in between
 * (as GMS's commit, which unmaps its writer): half the CUDA calls of the two. */
GMSFS_API int gmsfs_commit_unmap_all(gmsfs *g);
/* Take the lock again (the mode held at unmap_all) and map the same allocations at the
 * same addresses.  -ESTALE, lock released and nothing mapped, if the committed layout's
 * structure changed meanwhile. */
GMSFS_API int gmsfs_remap_all(gmsfs *g, int timeout_ms);
/* A handle granted RW: take the write lock and put fresh allocations (same names, sizes
 * and tags) behind the preserved addresses, mapped read-write, for the writer to fill
 * and commit.  -EPERM on a handle that was not granted RW. */
GMSFS_API int gmsfs_reallocate_all(gmsfs *g, int timeout_ms);

/* ---- refit: a trainer's tensors into the store's, by name (libgmsfs(3), REFIT) ---- */
/* One tensor of a refit: name is its state_dict key (the store's entry
 * GMSFS_TORCH_PREFIX name, gmsfs/torch.h), dtype PyTorch's name ("bfloat16"), shape its
 * ndim sizes, data its bytes, contiguous: memory of the store's device for a CUDA store
 * (host memory on the host backend). */
struct gmsfs_tensor {
	const char *name;
	const char *dtype;
	const int64_t *shape;
	int ndim;
	const void *data;
};
/* A writer (GMSFS_RW_DATA, or RW) copies n tensors into the store's tensors of the same
 * names.  Every name, dtype and shape is checked first: any difference is -EINVAL (-ENOENT
 * for a name the store lacks) with gmsfs_errmsg naming each, both sides, and nothing is
 * written.  The allocations they lie in are imported writable where they are not mapped
 * (beside readers, on a store with versions, that makes their copies); the copies are
 * waited for.  gmsfs_commit then publishes.  The store's tensors must be contiguous. */
GMSFS_API int gmsfs_refit(gmsfs *g, const struct gmsfs_tensor *v, size_t n);

/* ---- pause: an engine that stops reading while a trainer writes in place ---- */
/* A reader gives its lock back and keeps its mappings, untouched (libgmsfs(3), PAUSE):
 * the work queued on them is waited for first; a data-only writer (GMSFS_RW_DATA) may
 * then write the committed bytes in place; nothing else changes that memory (another
 * writer, a move to the host tier) until the handle resumes or disconnects.  Nothing may
 * be read through the mappings meanwhile.  A committed writer pauses too (its next
 * refit resumes it as GMSFS_RW_DATA).  -EINVAL unless the handle holds a read lock. */
GMSFS_API int gmsfs_pause(gmsfs *g);
/* Take the lock again, mode GMSFS_RO or GMSFS_RW_DATA, waiting up to timeout_ms (as
 * connect): the same mappings at the same addresses, no map call (read-write again for a
 * writer).  A store torn meanwhile is -EUCLEAN, a wait that ran out -ETIMEDOUT: the
 * handle stays paused.  Where the daemon was replaced meanwhile, or a version was
 * committed beside it, the mappings are made again as remap_all makes them.
 * GMSFS_KEEP_READ_ONLY, OR'ed into GMSFS_RW_DATA: the mappings stay read-only, each made
 * writable by gmsfs_protect before it is written (see there why).  A resumed writer's
 * session is the handle's: no STORE/lock is opened for children, as connect opens one (a
 * child joins by opening lock itself). */
#define GMSFS_KEEP_READ_ONLY 0x200
GMSFS_API int gmsfs_resume(gmsfs *g, int mode, int timeout_ms);
/* 1 while the handle is paused (from gmsfs_pause until a resume is granted), else 0.  A
 * resume that fails after its grant (telling the daemon, or mapping writable) gives the
 * lock back and leaves the handle unmapped, as unmap_all does (remap_all maps it again,
 * read-only); nothing was written in place, the store is as it was. */
GMSFS_API int gmsfs_paused(const gmsfs *g);
/* Set the access of the handle's mapping of name (and of its spaces' mappings of it):
 * writable 1 needs the handle's writer session (-EPERM), 0 may be asked any time; -ENOENT
 * where the handle maps no such allocation.  A writer's mappings of the last commit's
 * allocations (imported, not created) come read-only: writable 1 first tells the daemon
 * that the session writes them in place (a round trip, once a session where the mapping
 * can change its access; on the host backend each such mapping is mapped again,
 * writable, at its address), so that a writer that only read them leaves the last commit
 * whole when it dies, and one that wrote leaves the store TORN (gmsfs(5)).  A writer that writes its allocations one
 * after another makes each writable just before its first write and read-only again once
 * its last write has landed: on a GPU each change (cuMemSetAccess, about 0.1 ms a GB)
 * then runs while the copies queued before it run, instead of before and after all of
 * them (gmsfs.torch.refit does this).  gmsfs_commit makes what is still writable
 * read-only. */
GMSFS_API int gmsfs_protect(gmsfs *g, const char *name, int writable);

/* ---- versions: a next version built beside the readers (libgmsfs(3), VERSIONS) ---- */
/* A reader of a store with user.gms.versions 2 moves to the last commit: the allocations
 * whose memory changed since the version it maps are mapped again at the same addresses
 * (read-only; the work queued on the old memory is waited for first), the rest stay as
 * they are; its old version's memory goes with the last reader on it.  *changed (may be
 * NULL): how many were mapped again (0: it was on the last commit).  gmsfs_generation
 * then says the commit it maps.  -EINVAL for a writer, -EBUSY when a changed allocation
 * is mapped in a space too. */
GMSFS_API int gmsfs_flip(gmsfs *g, size_t *changed);

/* ---- named versions: a commit called by a name (gmsfs(5), NAMED VERSIONS) ---- */
/* A writer: gmsfs_commit, the commit named name (a trainer's step, a checkpoint's tag).
 * -EINVAL (not a name), -EEXIST (a commit of the store had it: a name is a store's once),
 * and gmsfs_commit's errors; a failure commits nothing. */
GMSFS_API int gmsfs_commit_version(gmsfs *g, const char *name);
/* gmsfs_commit_version, then gmsfs_unmap_all, as gmsfs_commit_unmap_all: a writer that
 * lets go of its mappings after a named commit (a trainer's refit) skips their change to
 * read-only.  A failed commit unmaps nothing. */
GMSFS_API int gmsfs_commit_version_unmap_all(gmsfs *g, const char *name);
/* A writer done with the store: gmsfs_commit (gmsfs_commit_version where version is not
 * NULL), then gmsfs_disconnect, the lock given back by the commit's own request
 * (COMMIT_LEAVE): none of the round trips a disconnect after a commit makes but its lock
 * file's close (a trainer rank's refit of a group).  0: committed, and g is freed.
 * A failure commits nothing and changes nothing: g is still the caller's (its
 * gmsfs_disconnect rolls the session back). */
GMSFS_API int gmsfs_commit_disconnect(gmsfs *g, const char *version);
/* A writer's hint that its commit follows within milliseconds (it waits for copies it
 * queued to land, then commits): the daemon's thread for it watches for the commit
 * instead of sleeping, and serves it without a wake-up, where the daemon spins (8 cores,
 * or GMSFS_SPIN_US).  No reply, nothing changes; 0, -ENOLCK or -EPERM.  gmsfs_commit
 * and the like give it themselves before they wait for the work queued. */
GMSFS_API int gmsfs_commit_soon(gmsfs *g);
/* The name of the commit g holds (the one gmsfs_generation says), into name (at least
 * GMSFS_VERSION_NAME_MAX + 1 bytes): 0, or -ENODATA where it has none ("" then). */
GMSFS_API int gmsfs_version_name(gmsfs *g, char *name);
/* A reader: gmsfs_flip, only to the commit named name, or nothing changes: 0 (*changed as
 * gmsfs_flip's; 0 where g holds it already), -ESTALE (the store's last commit is another:
 * a later one, or name's is not committed yet; gmsfs_wait_version waits for it), -ENOENT
 * (no commit of the store had that name).  An engine's ranks can flip in lockstep: each
 * asks first (gmsfs_wait_version with timeout 0), and a flip of a reader on the version
 * before to the last commit cannot meet a later one (the next session waits for it). */
GMSFS_API int gmsfs_flip_to(gmsfs *g, const char *name, size_t *changed);
/* Without a lock: wait until store's last commit is the one named name (poll(2) on
 * STORE/version).  0; -ESTALE when the store committed past it; -ETIMEDOUT after
 * timeout_ms (0: one look; negative: no limit); -EINVAL (not a name); -ENOENT (no such
 * store). */
GMSFS_API int gmsfs_wait_version(const char *store, const char *name, int timeout_ms);

/* ---- virtual spaces: one allocation at several addresses ---- */
/* A space is address ranges of its own over allocations its handle has imported (or
 * created): the same memory at another address, as a CUDA graph captured for another
 * shape wants it (xLLM's multi-shape graph memory).  unmap_all unmaps a space's
 * mappings with the handle's and keeps their addresses; remap_all and reallocate_all
 * map them again at the same addresses.  A space belongs to its handle:
 * gmsfs_disconnect frees the spaces it has left. */
typedef struct gmsfs_space gmsfs_space;
/* A new, empty space of g.  -EINVAL when g holds no lock (asleep after unmap_all). */
GMSFS_API int gmsfs_space_new(gmsfs *g, gmsfs_space **out);
/* Allocation name of the handle at an address of the space, with the access the
 * handle's mapping has: writes through either address are seen at the other.  Mapped
 * once per space (again: the same address).  -ENOENT: the handle has not imported it;
 * -EINVAL: a freed space, or the handle holds no lock.  Words in gmsfs_errmsg. */
GMSFS_API int gmsfs_space_map(gmsfs_space *s, const char *name, void **ptr);
/* A space of one range of span bytes: its mappings lie side by side in it, in the order
 * they are mapped (-ENOSPC past span), so that allocations mapped one after another are
 * one run of addresses (a CUDA graph's memory made of chunks: gmsfs_graph_*). */
GMSFS_API int gmsfs_space_new_range(gmsfs *g, uint64_t span, gmsfs_space **out);
/* Unmap the space's mappings and give its address ranges back (the memory stays the
 * handle's).  A freed space's small record is kept until its handle is disconnected,
 * so that a second free, or a map after it, is -EINVAL and not a crash. */
GMSFS_API int gmsfs_space_free(gmsfs_space *s);
/* The handle of a space (NULL: s is NULL). */
GMSFS_API gmsfs *gmsfs_space_handle(const gmsfs_space *s);

/* ---- pages: a KV cache that grows and shrinks with its load (libgmsfs(3), PAGES) ---- */
/* An engine sets address space aside once and fills it with device memory page by page:
 * each page is real memory from the GPU's one budget, an allocation of the writer's
 * session (never shared, never committed), mapped read-write at its fixed place.  The
 * store's quota (user.gms.quota) bounds its pages, its minimum (user.gms.min) keeps room
 * for them, its priority says who gives pages back when the budget is short: the daemon
 * never takes a mapped page; it asks (gmsfs_pages_reclaim), and the engine gives back.
 * A writer that ends gives every page back.  Needs the writer session (GMSFS_RW). */
typedef struct gmsfs_pages gmsfs_pages;
/* Address space for span bytes (rounded up to whole pages) of pages of page_size bytes
 * (a multiple of the device's granularity; 0: the granularity), no memory yet.  The
 * store's user.gms.reserved says how much its ranges set aside.  The range belongs to
 * its handle: gmsfs_disconnect frees what is left. */
GMSFS_API int gmsfs_pages_reserve(gmsfs *g, uint64_t span, uint64_t page_size, gmsfs_pages **out);
GMSFS_API void *gmsfs_pages_base(const gmsfs_pages *p);
GMSFS_API uint64_t gmsfs_pages_size(const gmsfs_pages *p);   /* bytes of one page */
GMSFS_API uint64_t gmsfs_pages_count(const gmsfs_pages *p);  /* pages the range holds */
GMSFS_API uint64_t gmsfs_pages_mapped(const gmsfs_pages *p); /* pages mapped now */
/* Map pages idx[0..n) (each below the count, none mapped, none twice) at base + idx *
 * page size, in one request: all or nothing.  Where the budget is short, idle stores
 * move to the host tier, then lower-priority elastic stores are asked to give pages
 * back; this waits up to timeout_ms for them (0: not at all).  -ENOSPC when no room came
 * (the words say who holds what), -EDQUOT past the store's quota, -EEXIST, -EINVAL. */
GMSFS_API int gmsfs_pages_map(gmsfs_pages *p, const uint64_t *idx, size_t n, int timeout_ms);
/* Unmap pages idx[0..n) (each mapped) and give their memory back: one request.  Waits
 * first for the work this thread's CUDA context has queued (a kernel writing a page
 * that goes would fault).  The daemon keeps the pages made for this session's next map. */
GMSFS_API int gmsfs_pages_unmap(gmsfs_pages *p, const uint64_t *idx, size_t n);
/* The bytes the daemon asks this store to give back now, for a higher-priority store's
 * growth (0: none); they are asked for TIER_RECLAIM_MS (2 s).  The store's state file
 * (reclaim:) says the same, and poll(2) on it wakes when it changes. */
GMSFS_API int gmsfs_pages_reclaim(gmsfs_pages *p, uint64_t *bytes);
/* Unmap every page, give the memory and the address space back.  The handle keeps a
 * small record until disconnect, so that a second free is -EINVAL, not a crash. */
GMSFS_API int gmsfs_pages_free(gmsfs_pages *p);

/* ---- kept caches: pages that outlive their engine (libgmsfs(3), KEPT) ---- */
/* Commit the session's layout while it goes on writing bytes (GMS's commit_layout): the
 * lock stays the writer's; its end without commit rolls back to this layout.  Where every
 * allocation is an elastic store's page, that end keeps the store COMMITTED (the pages'
 * records say what to trust: gmsfs_pages_keep); else it leaves it TORN, the layout kept
 * for a writer (a data-only one: GMSFS_RW_DATA) to fill and commit. */
GMSFS_API int gmsfs_commit_layout(gmsfs *g);
/* The engine's record of what a page holds (a prefix hash, a sequence's place), kept
 * with it; len 0: none, the page's bytes are not to be trusted. */
struct gmsfs_page_record {
	uint64_t idx;
	const void *data;
	size_t len;         /* at most GMSFS_VALUE_MAX */
};
/* Commit the layout while the engine goes on writing (GMS's commit_layout): every page
 * mapped now in every range of the handle, at its index, with its record: rec[0..n) (each
 * mapped, none twice) replace those of their pages, a page mapped since the last keep
 * has none.  From here the engine's death keeps the pages, their bytes and records, and
 * rolls back to this keep (what it mapped or gave back since); the next writer adopts
 * them.  A kept range's unmap gives its pages back (none held).  Clear a page's record
 * (a keep) before writing it again: its old record is trusted until then.  Before its
 * commit (gmsfs_commit_layout) it waits for the work this thread's CUDA context queued
 * (the kernels that wrote what the records vouch for).  One or two round trips (the
 * entries in batches of 4096, then the commit).
 * The memory of a kept page unmapped since the last keep is the store's until the next
 * (a death before it brings the page back). */
GMSFS_API int gmsfs_pages_keep(gmsfs_pages *p, const struct gmsfs_page_record *rec, size_t n);
/* A range of span bytes of page_size pages (0: the kept pages' size), as reserve makes it,
 * holding the pages of the first range the store kept (by name) that no range of this
 * handle holds, mapped at the same indices with their bytes and records; none kept: an
 * empty range.  The handle's session is kept from the call on.  *adopted (may be NULL):
 * the pages it holds.  -EINVAL: a kept page past the span or of another size. */
GMSFS_API int gmsfs_pages_adopt(gmsfs *g, uint64_t span, uint64_t page_size, gmsfs_pages **out, uint64_t *adopted);
/* Page idx's record (*data NULL, *len 0: none): valid until its next keep or unmap.
 * -ENOENT: not mapped. */
GMSFS_API int gmsfs_pages_record(const gmsfs_pages *p, uint64_t idx, const void **data, size_t *len);
/* The range's name (its entries are meta/pages/NAME/INDEX). */
GMSFS_API const char *gmsfs_pages_name(const gmsfs_pages *p);
/* KV tied to the weights that made it (libgmsfs(3), KEPT).  gmsfs_pages_tie: the pages of
 * g (a writer's handle of a KV store) are computed with the weights weights holds (a
 * handle of the weights store, with its read lock: the store, its commit, the content
 * hash where the daemon knows it); each later gmsfs_pages_keep records it in the note
 * GMSFS_PAGES_WEIGHTS_NOTE (NULL: untied, the next keep removes it).  Call it again after
 * the engine flips or remaps to other weights.  gmsfs_pages_tied: before adopting, whether
 * the store's kept pages were computed with weights: 0 (or nothing is kept); -ESTALE
 * (other weights, both named in gmsfs_errmsg(g)); -ENOENT (kept without a tie: nothing
 * says). */
#define GMSFS_PAGES_WEIGHTS_NOTE "%gmsfs.weights"
GMSFS_API int gmsfs_pages_tie(gmsfs *g, gmsfs *weights);
GMSFS_API int gmsfs_pages_tied(gmsfs *g, gmsfs *weights);
/* After a gmsfs_pages_tie that names other weights than the tie before (another store, or
 * the same one committed again: the engine flipped to a refit), every page mapped then was
 * computed with the old ones: "old" until a keep gives it a record or it is unmapped, and
 * its record (what the engine said it holds) cleared at the next keep, so that no adopter
 * trusts it.  The old pages of p: the first cap indices into idx (NULL with cap 0: only
 * count), how many in *n.  0 or -EINVAL. */
GMSFS_API int gmsfs_pages_old(gmsfs_pages *p, uint64_t *idx, size_t cap, size_t *n);

/* ---- a memory pool for CUDA graphs: N captured shapes in the memory of the largest ---- */
/* Graphs captured for different shapes never run at the same time (an engine replays one
 * per step), so they may share memory: each capture gets a range space over the same
 * chunks, allocations graph/chunkNNNNN of the store g writes to, and keeps its addresses
 * for the graph's life.  A capture's tensors (its outputs too) hold their values until
 * another graph of the pool runs.  One pool per process (global state, as the PyTorch
 * allocator's).  g holds the write lock; chunk_bytes: 0 is 64 MiB; span_bytes, the most
 * one capture may use: 0 is 256 GiB (addresses only).  g NULL: the pool forgets its chunks
 * (their allocations stay g's). */
GMSFS_API int gmsfs_graph_use(gmsfs *g, uint64_t chunk_bytes, uint64_t span_bytes);
/* The next allocations are a new capture's, in a space of their own. */
GMSFS_API int gmsfs_graph_begin(void);
/* For CUDAPluggableAllocator(path, "gmsfs_graph_alloc", "gmsfs_graph_free") in a
 * torch.cuda.MemPool per capture (gmsfs.torch.GraphPool does this).  NULL: past the
 * span, or no memory. */
GMSFS_API void *gmsfs_graph_alloc(ssize_t size, int device, void *stream);
GMSFS_API void gmsfs_graph_free(void *ptr, ssize_t size, int device, void *stream);
/* The memory the pool holds: its chunks, the largest capture's need rounded up. */
GMSFS_API uint64_t gmsfs_graph_bytes(void);

/* ---- PyTorch: torch.cuda.memory.CUDAPluggableAllocator(path of libgmsfs.so.0,
 * "gmsfs_torch_alloc", "gmsfs_torch_free") ---- */
/* From now on the allocator carves tensors out of slabs of slab_bytes (0: 1 GiB) created
 * in g as torch/slabN; NULL stops it.  g must hold the write lock and stay connected
 * while the allocator is in use.  The only process-wide state of libgmsfs: the entry
 * points below carry no context.  -EPERM on a handle that is not RW. */
GMSFS_API int gmsfs_torch_use(gmsfs *g, uint64_t slab_bytes);
/* The signatures PyTorch calls, no Python and no GIL: 512-byte aligned device memory of
 * the store (NULL: out of memory, or device is not the store's); free gives a range back
 * to its slab (a pointer of no slab is ignored). */
GMSFS_API void *gmsfs_torch_alloc(ssize_t size, int device, void *stream);
GMSFS_API void gmsfs_torch_free(void *ptr, ssize_t size, int device, void *stream);
/* Every tensor entry of the handle's layout (gmsfs(5), "Tensors") in one JSON object, in
 * one call, for a binding that would pay a call per field:
 * {"values": [VALUE...], "rows": [[NAME, ALLOC, OFFSET, SIZE, PRIVATE (0 or 1), PTR (where
 * the extent is in this process, or null while its allocation is not mapped), V]...]}:
 * each distinct value (an entry's JSON object, as stored) once, and V the index of the
 * row's in "values" (a model's layers repeat their shapes); NAME without the "torch/"
 * prefix.  *json (NUL-terminated, *len bytes) is the caller's, freed with
 * gmsfs_text_free.  -EINVAL naming the entry whose value is not a JSON object. */
GMSFS_API int gmsfs_torch_manifest(gmsfs *g, char **json, size_t *len);
GMSFS_API void gmsfs_text_free(char *text);
/* Slabs the allocator holds now. */
GMSFS_API size_t gmsfs_torch_slabs(void);

#ifdef __cplusplus
}
#endif

#endif
