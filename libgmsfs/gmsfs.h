/* libgmsfs: the fast path to a gmsfs store.  See libgmsfs(3).
 *
 * One gmsfs handle is one connection to one store (a directory of a gmsfs
 * mount) and holds that store's lock.  Every call returns 0 or a negative errno
 * (-EAGAIN, -ETIMEDOUT, -ESTALE, ...); gmsfs_errmsg() says what went wrong in
 * words.  A handle is used by one thread at a time.  Descriptors are opened
 * O_CLOEXEC.  Nothing is global.
 *
 * Ownership: strings and lists returned through out-parameters are the
 * caller's (free them with the matching gmsfs_*_free); pointers into the
 * handle (gmsfs_errmsg, gmsfs_mappings) stay valid until the next call on it. */
#ifndef GMSFS_H
#define GMSFS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct gmsfs gmsfs;

#define GMSFS_API __attribute__((visibility("default")))

/* Lock modes: the same numbers as GMSFS_LOCK_* of gmsfs_ioctl.h. */
#define GMSFS_RO 1
#define GMSFS_RW 2
#define GMSFS_RW_OR_RO 3 /* RW on a store with nothing committed, else RO */

/* Connect to store_dir (e.g. /run/gmsfs/gpu0/llama) and take its lock, waiting up to
 * timeout_ms (-1: as long as it takes; 0: one try, -EAGAIN if taken).  -ETIMEDOUT when
 * the wait ran out.  A new RW writer starts from the last committed layout.  As with
 * sqlite3_open, *out is set even when it fails (NULL only for -EINVAL and -ENOMEM) so that
 * gmsfs_errmsg can say why: disconnect it either way. */
GMSFS_API int gmsfs_connect(gmsfs **out, const char *store_dir, int mode, int timeout_ms);
/* Unmap everything, give the address ranges back and release the lock.  A writer
 * that did not commit is rolled back to the last committed layout.  NULL is fine. */
GMSFS_API void gmsfs_disconnect(gmsfs *g);

GMSFS_API int gmsfs_lock_mode(const gmsfs *g);     /* GMSFS_RO, GMSFS_RW, or 0 between unmap_all and remap_all */
GMSFS_API uint64_t gmsfs_total_bytes(const gmsfs *g); /* aligned bytes of this handle's mappings */
/* The committed layout hash as 32 hex digits; "" when nothing is committed. */
GMSFS_API int gmsfs_layout_hash(gmsfs *g, char hex[33]);
GMSFS_API const char *gmsfs_errmsg(const gmsfs *g);
GMSFS_API const char *gmsfs_strerror(int err);

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

/* ---- RW ---- */
/* Create allocs/NAME of size bytes with tag (NULL: "default") and map it read-write. */
GMSFS_API int gmsfs_create(gmsfs *g, const char *name, uint64_t size, const char *tag, void **ptr);
/* Unmap ptr, delete its allocation and every metadata entry that points at it. */
GMSFS_API int gmsfs_free(gmsfs *g, void *ptr);
/* meta/KEY = value, pointing at offset of allocation alloc.  -EINVAL (nothing changed)
 * when alloc does not exist or offset is not inside it. */
GMSFS_API int gmsfs_meta_put(gmsfs *g, const char *key, const char *alloc, uint64_t offset, const void *value, size_t len);
GMSFS_API int gmsfs_meta_delete(gmsfs *g, const char *key);
/* Validate and publish.  The writer's mappings stay where they are and become read-only;
 * the lock becomes a read lock (no other writer can slip in between). */
GMSFS_API int gmsfs_commit(gmsfs *g);

/* ---- reading (RO, and RW for the session's own layout) ---- */
/* Map every allocation of the layout, in one round trip per 253 allocations. */
GMSFS_API int gmsfs_import_all(gmsfs *g);
/* Map one allocation by name. */
GMSFS_API int gmsfs_import(gmsfs *g, const char *name, void **ptr);

struct gmsfs_meta {
	char *alloc;       /* allocation path, or NULL */
	uint64_t offset;
	void *value;
	size_t value_len;
};
GMSFS_API int gmsfs_meta_get(gmsfs *g, const char *key, struct gmsfs_meta *out);
GMSFS_API void gmsfs_meta_free(struct gmsfs_meta *m);
/* Keys that start with prefix ("" or NULL: all), sorted. */
GMSFS_API int gmsfs_meta_list(gmsfs *g, const char *prefix, char ***keys, size_t *count);
GMSFS_API void gmsfs_list_free(char **keys, size_t count);

/* ---- sleep and wake ---- */
/* Unmap everything but keep every address range reserved, and release the lock. */
GMSFS_API int gmsfs_unmap_all(gmsfs *g);
/* Take the lock again (the mode held at unmap_all) and map the same allocations at the
 * same addresses.  -ESTALE, lock released and nothing mapped, if the committed layout's
 * structure changed meanwhile. */
GMSFS_API int gmsfs_remap_all(gmsfs *g, int timeout_ms);
/* RW: take the write lock and put fresh allocations (same names, sizes and tags) behind
 * the preserved addresses, mapped read-write, for the writer to fill and commit. */
GMSFS_API int gmsfs_reallocate_all(gmsfs *g, int timeout_ms);

#ifdef __cplusplus
}
#endif

#endif
