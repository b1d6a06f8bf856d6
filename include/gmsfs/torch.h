/* gmsfs/torch.h: the layout of PyTorch tensors in a store, shared by libgmsfs's
 * allocator (gmsfs_torch_use), gmsfs-load, gmsfs-save and the Python package
 * gmsfs.torch (which checks its own copy of these against this header in its tests).
 * See gmsfs(5), "Tensors".
 *
 * Tensors live in allocations tagged GMSFS_TORCH_TAG whose names start with
 * GMSFS_TORCH_PREFIX (slabs of GMSFS_TORCH_SLAB_BYTES by default: fewer, larger
 * allocations import faster), each tensor's storage at a multiple of GMSFS_TORCH_ALIGN
 * in its slab, as PyTorch's own allocator places them.  Each tensor NAME (a module's
 * state_dict key) has the metadata entry GMSFS_TORCH_PREFIX NAME: user.gms.alloc its
 * slab, user.gms.offset where its storage starts, user.gms.size the storage's bytes,
 * and as value one JSON object:
 *   {"dtype": "bfloat16", "shape": [4096, 4096], "stride": [4096, 1],
 *    "storage_offset": 0, "param": true}
 * dtype is PyTorch's name without "torch." (float32, bfloat16, int64, float8_e4m3fn...);
 * shape and stride in elements; storage_offset in elements from the entry's offset;
 * param: a parameter (true) or a buffer (false).  Other keys (gmsfs-load adds "source",
 * the file it came from) are kept and ignored by readers. */
#ifndef GMSFS_TORCH_H
#define GMSFS_TORCH_H

#define GMSFS_TORCH_PREFIX "torch/"          /* entries and allocations */
#define GMSFS_TORCH_TAG "torch"               /* the allocations' tag */
#define GMSFS_TORCH_ALIGN 512u                /* bytes: where each storage starts in its slab */
#define GMSFS_TORCH_SLAB_BYTES (1ull << 30)  /* the allocator's and gmsfs-load's slab size */

#endif
