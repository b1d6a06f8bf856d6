/* copy_cuda: the GPU side of copy (copy.c), on the driver's table alone: a store's GPU by
 * its uuid with its primary context current, and host memory pinned a copying thread at a
 * time.  On an H200 each of 16 threads making its own two buffers this way (a mapping, in
 * huge pages where the kernel has them, touched, registered) had them 2-3 ms after it
 * started and all 16 within 9-11 ms, where one cuMemHostAlloc of all of them took 24-43 ms
 * before any thread could start (probe/restore_open_probe.c, `tests/gpu/run.sh pinned`). */
#ifndef GMSFS_COPY_CUDA_H
#define GMSFS_COPY_CUDA_H

#ifdef GMSFS_HAVE_CUDA
#include "cuda_api.h"

#include <stddef.h>

/* cu loaded, the GPU of uuid ("GPU-..."), its primary context retained into *ctx and made
 * current: 0, or -errno with err said (-ENOTSUP: no driver; -ENODEV: no such GPU here). */
int cpc_open(struct cu_api *cu, const char *uuid, CUcontext *ctx, char *err, size_t errlen);
/* bytes of pinned host memory for the calling thread (a context current in it): NULL with
 * err said on a failure.  cpc_unpin gives it back (ctx made current first). */
char *cpc_pinned(struct cu_api *cu, size_t bytes, char *err, size_t errlen);
void cpc_unpin(struct cu_api *cu, CUcontext ctx, char *p, size_t bytes);
#endif

#endif
