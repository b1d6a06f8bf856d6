/* gmsfs/load.h: a safetensors checkpoint into a store, from the process that holds its
 * writer session, and a store copied from another mount's (libgmsfs-load; gmsfs-load(1)
 * and gmsfs-snapshot copy are commands around them, and the Python package's gmsfs.load
 * and gmsfs.copy call them).  See gmsfs-load(1). */
#ifndef GMSFS_LOAD_H
#define GMSFS_LOAD_H

#include <stdint.h>
#include <gmsfs/gmsfs.h>

#ifdef __cplusplus
extern "C" {
#endif

#define GMSFS_LOAD_PROGRESS 1u /* bytes, rate and time left on stderr */
#define GMSFS_LOAD_VERBOSE 2u  /* each phase's time on stderr */
#define GMSFS_LOAD_REPLACE 4u  /* a store that holds another checkpoint: its layout freed first */
#define GMSFS_LOAD_COMMIT 8u   /* commit, and tell the daemon the bytes' content hash (below) */
#define GMSFS_LOAD_NO_DIGEST 16u /* each tensor copied as it lies, unhashed: no content hash */
#define GMSFS_LOAD_FLAGS 31u

/* gmsfs_load's answer when the store's last commit holds path already (its source note is
 * of that commit and names the same files, sizes, modification times and inodes): nothing
 * was done, and the caller should not commit (a commit would make a new generation of the
 * same bytes). */
#define GMSFS_LOAD_HELD 1
/* The note (GMSFS_ENTRY_NOTE) in which gmsfs_load records a checkpoint's files. */
#define GMSFS_LOAD_SOURCE_NOTE "%gmsfs.source"

/* Each options struct and the report start with their size, which the caller sets (the
 * GMSFS_*_OPTIONS initializers do): a later libgmsfs-load with more fields still knows
 * what an older caller passed.  A size it does not know is -EINVAL. */
struct gmsfs_load_options {
	uint32_t size;       /* sizeof(struct gmsfs_load_options) */
	uint32_t flags;      /* GMSFS_LOAD_* above */
	uint64_t slab_bytes; /* 0: GMSFS_TORCH_SLAB_BYTES; else at least GMSFS_TORCH_ALIGN */
};
#define GMSFS_LOAD_OPTIONS { sizeof(struct gmsfs_load_options), 0, 0 }

struct gmsfs_copy_options {
	uint32_t size;      /* sizeof(struct gmsfs_copy_options) */
	uint32_t flags;     /* 0: none is known yet */
	int32_t timeout_ms; /* the wait for src's read lock and dst's writer lock, as gmsfs_connect's */
	uint32_t reserved;  /* 0 */
};
#define GMSFS_COPY_OPTIONS { sizeof(struct gmsfs_copy_options), 0, -1, 0 }

/* What a copy or a pull did. */
struct gmsfs_report {
	uint32_t size;         /* sizeof(struct gmsfs_report), set by the caller */
	uint32_t reserved;
	uint64_t allocations;  /* made in the target */
	uint64_t bytes;        /* moved */
	double seconds;        /* the whole call */
	double bytes_seconds;  /* the bytes' own time */
	char layout_hash[33];  /* the target's, committed (the source's) */
	char how[351];         /* in words: the path the bytes took, what each part took */
};
#define GMSFS_REPORT { sizeof(struct gmsfs_report), 0, 0, 0, 0, 0, "", "" }

/* Load path (FILE.safetensors, or a folder with model.safetensors.index.json and its
 * shards, or with model.safetensors) into g, which holds the writer session of a store:
 * every header checked before the store is touched, then slabs of opt->slab_bytes with
 * every tensor copied in, GMSFS_TORCH_ALIGN apart, an entry per tensor (gmsfs(5),
 * "Tensors"), and the note GMSFS_LOAD_SOURCE_NOTE naming the commit to come and the
 * checkpoint's files (name, size, mtime_ns, ino: as make and rsync judge a file, without
 * reading it).  A store whose last commit holds allocations: GMSFS_LOAD_HELD where its
 * source note is of that commit and names the same files, and the store is not torn
 * (nothing done); else -EEXIST, unless opt->flags has GMSFS_LOAD_REPLACE (its allocations
 * freed in the session first).  opt NULL: the defaults (GMSFS_LOAD_OPTIONS).
 * Each slab's 2 MiB pieces are read into host memory, the bytes between tensors zeros,
 * and hashed there as they pass (XXH3-64, the pieces gmsfs_digest hashes).  No commit: the
 * caller commits, or disconnects and nothing stays; with GMSFS_LOAD_COMMIT this commits and
 * tells the daemon the committed bytes' content hash (gmsfs(5), CONTENT HASH: no second
 * pass), when the commit holds the slabs and nothing else.  On cuda the store's
 * GPU's primary context is made current in the calling thread (the one PyTorch uses).  0,
 * GMSFS_LOAD_HELD, or -errno, the reason in gmsfs_errmsg(g) (-EEXIST: the store holds
 * another layout; -EPERM: g is not a writer's; -EINVAL: an option). */
GMSFS_API int gmsfs_load(gmsfs *g, const char *path, const struct gmsfs_load_options *opt);

/* Make the primary context of the GPU that serves store current in the calling thread
 * (nothing on the host backend), for a program with no context of its own that must
 * connect before it calls gmsfs_load (gmsfs-load(1)).  The context is kept for the
 * process's life.  0 or -errno, the reason in gmsfs_errmsg(NULL). */
GMSFS_API int gmsfs_load_context(const char *store);

/* Copy the committed store src into the empty store dst, on this machine's mounts (one
 * GPU, two, or the host backend): src under a read lock, dst in one writer session (each
 * waited for opt->timeout_ms); the bytes device to device (dst's GPU reads src's over
 * NVLink or PCIe where it can reach it, else through pinned host memory: out->how says
 * which), then the entries and the commit, which must give src's layout hash.  opt NULL:
 * the defaults (GMSFS_COPY_OPTIONS); out may be NULL.  0, or -errno with the reason in
 * gmsfs_errmsg(NULL): -EEXIST (dst holds allocations), -EIO (another layout hash),
 * -EINVAL (an option); on any failure dst is as it was and src untouched.  Both sides'
 * GPUs' primary contexts are used; the calling thread's current context is dst's after. */
GMSFS_API int gmsfs_copy(const char *src, const char *dst, const struct gmsfs_copy_options *opt,
			 struct gmsfs_report *out);

#ifdef __cplusplus
}
#endif

#endif
