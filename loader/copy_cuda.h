/* copy_cuda: the GPU side of copy (copy.c), on the driver's table alone: a command's stores'
 * GPUs shown to the driver (no other) and its contexts' work queues, a store's GPU by its
 * uuid with its primary context current, and host memory pinned a copying thread at a
 * time.  On an H200 each of 16 threads making its own two buffers this way (a mapping, in
 * huge pages where the kernel has them, touched, registered) had them 2-3 ms after it
 * started and all 16 within 9-11 ms, where one cuMemHostAlloc of all of them took 24-43 ms
 * before any thread could start (probe/restore_open_probe.c, `tests/gpu/run.sh pinned`). */
#ifndef GMSFS_COPY_CUDA_H
#define GMSFS_COPY_CUDA_H

#include <stddef.h>

/* Called by a command before any thread and before the driver's cuInit: where the caller
 * left CUDA_VISIBLE_DEVICES unset, the process is shown only the GPUs of the n stores
 * named (their uuids, comma-separated), so that cuInit sets up those devices alone, not
 * every GPU of the machine.  Unchanged where a store's mount cannot be read or is not on
 * a GPU (the error comes later, as before).  Returns what it set, or NULL. */
const char *cpc_show_only(const char *const *stores, size_t n);
/* Called as cpc_show_only is, by a command whose copies go one way over PCIe (a save, a
 * restore, a load): its contexts get one hardware work queue (CUDA_DEVICE_MAX_CONNECTIONS=1)
 * where the caller left it unset; the driver's default is 8, each made with the context.
 * Not for a copy between GPUs (one queue feeds one copy engine: 17.2 GB over two H200's
 * NVLink took 0.123 s, against 0.054 s), nor a process that copies both ways at once (the
 * daemon's gmsfs-mover in a switch), whose two directions would queue behind each other. */
void cpc_one_queue(void);

#ifdef GMSFS_HAVE_CUDA
#include "cuda_api.h"

/* cu loaded, the GPU of uuid ("GPU-..."), its primary context retained into *ctx and made
 * current: 0, or -errno with err said (-ENOTSUP: no driver; -ENODEV: no such GPU here). */
int cpc_open(struct cu_api *cu, const char *uuid, CUcontext *ctx, char *err, size_t errlen);
/* bytes of pinned host memory for the calling thread (a context current in it): NULL with
 * err said on a failure.  cpc_unpin gives it back (ctx made current first). */
char *cpc_pinned(struct cu_api *cu, size_t bytes, char *err, size_t errlen);
void cpc_unpin(struct cu_api *cu, CUcontext ctx, char *p, size_t bytes);
#endif

#endif
