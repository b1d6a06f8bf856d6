/* Mapping on the cuda backend, in the caller's current context (as PyTorch sets
 * it): import the descriptor, map it over part of a reserved range; the access is
 * set apart, over many mappings at once (read-only for readers and for a writer
 * after commit).  The imported handle is released at once: the mapping keeps the
 * memory alive. */
#include "internal.h"

#ifdef GMSFS_HAVE_CUDA
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#define CU_ERR(r) ((r) == CUDA_ERROR_OUT_OF_MEMORY ? -ENOMEM : (r) == CUDA_ERROR_INVALID_CONTEXT ? -ENXIO : -EIO)

static int cuda_attach(gmsfs *g, char *err, size_t errlen)
{
	if (!g->cu.lib && cu_load(&g->cu, err, errlen))
		return -ENOTSUP;
	CUcontext ctx = NULL;
	if (g->cu.cuCtxGetCurrent(&ctx) != CUDA_SUCCESS || !ctx) {
		snprintf(err, errlen, "the store is in GPU memory and this thread has no current CUDA context "
				      "(make one current first: cuCtxSetCurrent, or cudaSetDevice of CUDA 12 and later)");
		return -ENXIO;
	}
	CUresult r = g->cu.cuCtxGetDevice(&g->cudev);
	if (r != CUDA_SUCCESS) {
		snprintf(err, errlen, "cuCtxGetDevice: %s", cu_name(&g->cu, r));
		return CU_ERR(r);
	}
	return 0;
}

static int cuda_reserve(gmsfs *g, uint64_t len, uint64_t align, void **va)
{
	CUdeviceptr p = 0;
	CUresult r = g->cu.cuMemAddressReserve(&p, len, align, 0, 0);
	if (r != CUDA_SUCCESS)
		return CU_ERR(r);
	*va = (void *)(uintptr_t)p;
	return 0;
}

static void cuda_unreserve(gmsfs *g, void *va, uint64_t len)
{
	g->cu.cuMemAddressFree((CUdeviceptr)(uintptr_t)va, len);
}

static int cuda_allow(gmsfs *g, void *va, uint64_t len, bool writable)
{
	CUmemAccessDesc d = {
		.location = { .type = CU_MEM_LOCATION_TYPE_DEVICE, .id = g->cudev },
		.flags = writable ? CU_MEM_ACCESS_FLAGS_PROT_READWRITE : CU_MEM_ACCESS_FLAGS_PROT_READ,
	};
	CUresult r = g->cu.cuMemSetAccess((CUdeviceptr)(uintptr_t)va, len, &d, 1);
	return r == CUDA_SUCCESS ? 0 : CU_ERR(r);
}

static int cuda_map(gmsfs *g, void *va, uint64_t aligned, int fd, uint64_t off, bool writable, char *err,
		    size_t errlen)
{
	struct cu_api *cu = &g->cu;
	if (off) {
		snprintf(err, errlen, "a CUDA descriptor holds one allocation, the manifest says offset %llu",
			 (unsigned long long)off);
		return -EPROTO;
	}
	CUmemGenericAllocationHandle h;
	CUresult r = cu->cuMemImportFromShareableHandle(&h, (void *)(uintptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
	if (r != CUDA_SUCCESS) {
		snprintf(err, errlen, "cuMemImportFromShareableHandle: %s", cu_name(cu, r));
		return CU_ERR(r);
	}
	r = cu->cuMemMap((CUdeviceptr)(uintptr_t)va, aligned, 0, h, 0);
	cu->cuMemRelease(h);
	if (r != CUDA_SUCCESS) {
		snprintf(err, errlen, "cuMemMap: %s", cu_name(cu, r));
		return CU_ERR(r);
	}
	return 0;
}

static int cuda_unmap(gmsfs *g, void *va, uint64_t aligned)
{
	CUresult r = g->cu.cuMemUnmap((CUdeviceptr)(uintptr_t)va, aligned);
	return r == CUDA_SUCCESS ? 0 : CU_ERR(r);
}

/* The allocation mapped at src, found from its address (the imported handle was let go
 * at map), mapped again at dst. */
static int cuda_alias(gmsfs *g, void *src, void *dst, uint64_t aligned, bool writable, char *err, size_t errlen)
{
	struct cu_api *cu = &g->cu;
	CUmemGenericAllocationHandle h;
	CUresult r = cu->cuMemRetainAllocationHandle(&h, src);
	if (r != CUDA_SUCCESS) {
		snprintf(err, errlen, "cuMemRetainAllocationHandle: %s", cu_name(cu, r));
		return CU_ERR(r);
	}
	r = cu->cuMemMap((CUdeviceptr)(uintptr_t)dst, aligned, 0, h, 0);
	cu->cuMemRelease(h);
	if (r != CUDA_SUCCESS) {
		snprintf(err, errlen, "cuMemMap: %s", cu_name(cu, r));
		return CU_ERR(r);
	}
	int e = cuda_allow(g, dst, aligned, writable);
	if (e) {
		cu->cuMemUnmap((CUdeviceptr)(uintptr_t)dst, aligned);
		snprintf(err, errlen, "cuMemSetAccess: %s", strerror(-e));
	}
	return e;
}

/* A held page is its allocation handle (an import, or retained from its mapping). */
static int cuda_hold(gmsfs *g, void *va, uint64_t aligned, uint64_t *held)
{
	CUmemGenericAllocationHandle h;
	CUresult r = g->cu.cuMemRetainAllocationHandle(&h, va);
	if (r != CUDA_SUCCESS)
		return CU_ERR(r);
	if ((r = g->cu.cuMemUnmap((CUdeviceptr)(uintptr_t)va, aligned)) != CUDA_SUCCESS) {
		g->cu.cuMemRelease(h);
		return CU_ERR(r);
	}
	*held = (uint64_t)h;
	return 0;
}

static int cuda_hold_fd(gmsfs *g, int fd, uint64_t off, uint64_t aligned, uint64_t *held)
{
	(void)aligned;
	if (off)
		return -EPROTO; /* a CUDA descriptor holds one allocation */
	CUmemGenericAllocationHandle h;
	CUresult r = g->cu.cuMemImportFromShareableHandle(&h, (void *)(uintptr_t)fd,
							   CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
	if (r != CUDA_SUCCESS)
		return CU_ERR(r);
	*held = (uint64_t)h;
	return 0;
}

static int cuda_place(gmsfs *g, uint64_t held, void *va, uint64_t aligned)
{
	CUresult r = g->cu.cuMemMap((CUdeviceptr)(uintptr_t)va, aligned, 0, (CUmemGenericAllocationHandle)held, 0);
	if (r != CUDA_SUCCESS)
		return CU_ERR(r);
	g->cu.cuMemRelease((CUmemGenericAllocationHandle)held); /* the mapping holds it now */
	return 0;
}

static void cuda_drop(gmsfs *g, uint64_t held, uint64_t aligned)
{
	(void)aligned;
	g->cu.cuMemRelease((CUmemGenericAllocationHandle)held);
}

static int cuda_private_alloc(gmsfs *g, uint64_t size, void **p)
{
	CUdeviceptr d = 0;
	CUresult r = g->cu.cuMemAlloc(&d, size);
	if (r != CUDA_SUCCESS)
		return CU_ERR(r);
	*p = (void *)(uintptr_t)d;
	return 0;
}

static void cuda_private_free(gmsfs *g, void *p)
{
	g->cu.cuMemFree((CUdeviceptr)(uintptr_t)p);
}

static int cuda_drain(gmsfs *g)
{
	CUresult r = g->cu.cuCtxSynchronize();
	return r == CUDA_SUCCESS ? 0 : CU_ERR(r);
}

static int cuda_copy(gmsfs *g, void *dst, const void *src, uint64_t size)
{
	CUresult r = g->cu.cuMemcpyDtoD((CUdeviceptr)(uintptr_t)dst, (CUdeviceptr)(uintptr_t)src, size);
	return r == CUDA_SUCCESS ? 0 : CU_ERR(r);
}

static int cuda_read(gmsfs *g, void *host, const void *src, uint64_t size)
{
	CUresult r = g->cu.cuMemcpyDtoH(host, (CUdeviceptr)(uintptr_t)src, size);
	return r == CUDA_SUCCESS ? 0 : CU_ERR(r);
}

static int cuda_host_alloc(gmsfs *g, uint64_t size, void **p)
{
	CUresult r = g->cu.cuMemHostAlloc(p, size, 0);
	return r == CUDA_SUCCESS ? 0 : CU_ERR(r);
}

static void cuda_host_free(gmsfs *g, void *p)
{
	if (p)
		g->cu.cuMemFreeHost(p);
}

const struct gm_backend gm_cuda_backend = {
	.name = "cuda",
	.attach = cuda_attach,
	.reserve = cuda_reserve,
	.unreserve = cuda_unreserve,
	.map = cuda_map,
	.allow = cuda_allow,
	.unmap = cuda_unmap,
	.drain = cuda_drain,
	.alias = cuda_alias,
	.hold = cuda_hold,
	.hold_fd = cuda_hold_fd,
	.place = cuda_place,
	.drop = cuda_drop,
	.private_alloc = cuda_private_alloc,
	.private_free = cuda_private_free,
	.copy = cuda_copy,
	.read = cuda_read,
	.host_alloc = cuda_host_alloc,
	.host_free = cuda_host_free,
};
#endif
