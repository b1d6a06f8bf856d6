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

/* Load path (FILE.safetensors, or a folder with model.safetensors.index.json and its
 * shards, or with model.safetensors) into g, which holds the writer session of a store
 * with no allocations: every header checked before the store is touched, then slabs of
 * slab_bytes (0: GMSFS_TORCH_SLAB_BYTES) with every tensor copied in, GMSFS_TORCH_ALIGN
 * apart, and an entry per tensor (gmsfs(5), "Tensors").  No commit: the caller commits,
 * or disconnects and nothing stays.  On cuda the store's GPU's primary context is made
 * current in the calling thread (the one PyTorch uses).  0 or -errno, the reason in err
 * (-EEXIST: the store holds allocations; -EPERM: g is not a writer's). */
GMSFS_API int gmsfs_load(gmsfs *g, const char *path, uint64_t slab_bytes, unsigned flags, char *err, size_t errlen);

/* Make the primary context of the GPU that serves store current in the calling thread
 * (nothing on the host backend), for a program with no context of its own that must
 * connect before it calls gmsfs_load (gmsfs-load(1)).  The context is kept for the
 * process's life.  0 or -errno, the reason in err. */
GMSFS_API int gmsfs_load_context(const char *store, char *err, size_t errlen);

/* Copy the committed store src into the empty store dst, on this machine's mounts (one
 * GPU, two, or the host backend): src under a read lock (taken within timeout_ms, as
 * gmsfs_connect's), dst in one writer session; the bytes device to device (dst's GPU
 * reads src's over NVLink or PCIe where it can reach it, else through pinned host
 * memory: how says which), then the entries and the commit, which must give src's layout
 * hash.  0, or -errno with the reason in err: -EEXIST (dst holds allocations), -EIO
 * (another layout hash); on any failure dst is as it was and src untouched.  Both sides'
 * GPUs' primary contexts are used; the calling thread's current context is dst's after. */
GMSFS_API int gmsfs_copy(const char *src, const char *dst, int timeout_ms, char *how, size_t howlen, char *err,
			 size_t errlen);

#ifdef __cplusplus
}
#endif

#endif
