/* Mapping on the cuda backend, in the caller's current context (as PyTorch sets
 * it): import the descriptor, map it over part of a reserved range; the access is
 * set apart, over many mappings at once (read-only for readers and for a writer
 * after commit).  The imported handle is released at once: the mapping keeps the
 * memory alive. */
#include "internal.h"

#ifdef GMSFS_HAVE_CUDA
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define CU_ERR(r) ((r) == CUDA_ERROR_OUT_OF_MEMORY ? -ENOMEM : (r) == CUDA_ERROR_INVALID_CONTEXT ? -ENXIO : -EIO)

/* The driver's entry points, looked up once in the process and never let go: a lookup of
 * every one is about 0.4 ms (an H200's host), which each connect paid before. */
static struct cu_api shared_cu;
static char shared_why[160];
static pthread_once_t shared_once = PTHREAD_ONCE_INIT;

static void load_shared(void)
{
	cu_load(&shared_cu, shared_why, sizeof shared_why);
}

static int cuda_attach(gmsfs *g, char *err, size_t errlen)
{
	if (!g->cu.lib) {
		pthread_once(&shared_once, load_shared);
		if (!shared_cu.lib)
			return snprintf(err, errlen, "%s", shared_why), -ENOTSUP;
		g->cu = shared_cu; /* the handle's copy: never unloaded (gmsfs_disconnect) */
	}
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

/* A stream of its own (the caller's default one may be busy) and an event per slot. */
#define READ_SLOTS 8
struct cuda_reader {
	CUstream stream;
	CUevent done[READ_SLOTS];
};

static void cuda_reader_close(gmsfs *g, void *reader)
{
	struct cuda_reader *r = reader;
	if (!r)
		return;
	if (r->stream) {
		g->cu.cuStreamSynchronize(r->stream); /* no read still writes into what the caller frees */
		g->cu.cuStreamDestroy(r->stream);
	}
	for (int i = 0; i < READ_SLOTS; i++)
		if (r->done[i])
			g->cu.cuEventDestroy(r->done[i]);
	free(r);
}

static int cuda_reader_open(gmsfs *g, int slots, void **reader)
{
	struct cuda_reader *r = calloc(1, sizeof *r);
	if (!r || slots < 1 || slots > READ_SLOTS)
		return free(r), r ? -EINVAL : -ENOMEM;
	CUresult e = g->cu.cuStreamCreate(&r->stream, CU_STREAM_NON_BLOCKING);
	for (int i = 0; !e && i < slots; i++)
		e = g->cu.cuEventCreate(&r->done[i], CU_EVENT_DISABLE_TIMING);
	if (e) {
		cuda_reader_close(g, r);
		return CU_ERR(e);
	}
	*reader = r;
	return 0;
}

static int cuda_read_queue(gmsfs *g, void *reader, int slot, void *host, const void *src, uint64_t size)
{
	struct cuda_reader *r = reader;
	CUresult e = g->cu.cuMemcpyDtoHAsync(host, (CUdeviceptr)(uintptr_t)src, size, r->stream);
	if (!e)
		e = g->cu.cuEventRecord(r->done[slot], r->stream);
	return e == CUDA_SUCCESS ? 0 : CU_ERR(e);
}

static int cuda_read_wait(gmsfs *g, void *reader, int slot)
{
	CUresult e = g->cu.cuEventSynchronize(((struct cuda_reader *)reader)->done[slot]);
	return e == CUDA_SUCCESS ? 0 : CU_ERR(e);
}

/* Pinned host memory for reads: huge pages where the kernel gives them, registered with
 * the driver (fresh pages are faulted in and zeroed: 2 MiB ones ~3x faster than
 * cuMemHostAlloc's 4 KiB ones, 128 MiB in ~25 ms against ~75 ms with its release on an
 * H200's host); cuMemHostAlloc where registering is refused. */
#define HUGE_PAGE (2ull << 20)

static int cuda_host_alloc(gmsfs *g, uint64_t size, void **p)
{
	uint64_t len = (size + HUGE_PAGE - 1) / HUGE_PAGE * HUGE_PAGE;
	char *m = mmap(NULL, len + HUGE_PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (m != MAP_FAILED) {
		char *at = (char *)(((uintptr_t)m + HUGE_PAGE - 1) & ~(uintptr_t)(HUGE_PAGE - 1));
		if (at > m) /* aligned: huge pages need whole 2 MiB ranges */
			munmap(m, (size_t)(at - m));
		if (at + len < m + len + HUGE_PAGE)
			munmap(at + len, (size_t)(m + len + HUGE_PAGE - (at + len)));
		(void)madvise(at, len, MADV_HUGEPAGE);
		if (g->cu.cuMemHostRegister(at, len, 0) == CUDA_SUCCESS) {
			*p = at;
			return 0;
		}
		munmap(at, len);
	}
	CUresult r = g->cu.cuMemHostAlloc(p, size, 0);
	return r == CUDA_SUCCESS ? 0 : CU_ERR(r);
}

static void cuda_host_free(gmsfs *g, void *p, uint64_t size)
{
	if (!p)
		return;
	if (g->cu.cuMemHostUnregister(p) == CUDA_SUCCESS)
		munmap(p, (size + HUGE_PAGE - 1) / HUGE_PAGE * HUGE_PAGE);
	else
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
	.reader_open = cuda_reader_open,
	.read_queue = cuda_read_queue,
	.read_wait = cuda_read_wait,
	.reader_close = cuda_reader_close,
	.host_alloc = cuda_host_alloc,
	.host_free = cuda_host_free,
	.hash_pieces = gm_cuda_hash_pieces,
};
#endif
