/* copy_cuda: see copy_cuda.h. */
#include "copy_cuda.h"
#include "store_files.h"

#include <stdlib.h>
#include <string.h>

/* Two H200, each held by its daemon, two restores of 5.77 GB at once, a process each:
 * 0.512-0.537 s shown their own GPU only, 0.541-0.551 s shown both (tests/gpu/tp_gpu.py,
 * by turns); the driver's cuInit sets up every device it is shown. */
#define SHOW_READ_MS 250

const char *cpc_show_only(const char *const *stores, size_t n)
{
	static char list[1024];
	size_t at = 0;
	list[0] = 0;
	if (getenv("CUDA_VISIBLE_DEVICES") || !n)
		return NULL; /* the caller's choice stands */
	for (size_t i = 0; i < n; i++) {
		char backend[64], uuid[128];
		/* A mount that does not answer at once is left to the command's own read, which
		 * says so after SF_READ_MS: this one must not add its wait to that one. */
		if (sf_field_within(stores[i], "../device", "backend", backend, sizeof backend, SHOW_READ_MS) ||
		    strcmp(backend, "cuda") ||
		    sf_field_within(stores[i], "../device", "uuid", uuid, sizeof uuid, SHOW_READ_MS) ||
		    strncmp(uuid, "GPU-", 4) || strpbrk(uuid, ", "))
			return NULL;
		char *seen = strstr(list, uuid); /* a GPU named by two stores: once */
		if (at && seen && (seen[strlen(uuid)] == ',' || !seen[strlen(uuid)]))
			continue;
		int k = snprintf(list + at, sizeof list - at, "%s%s", at ? "," : "", uuid);
		if (k < 0 || (size_t)k >= sizeof list - at)
			return NULL;
		at += (size_t)k;
	}
	return setenv("CUDA_VISIBLE_DEVICES", list, 0) ? NULL : list;
}

/* An H200 held by its daemon, 16 GiB restored from /dev/shm by turns, 3 rounds: with one
 * queue the context took 0.079-0.083 s and the restore 0.475-0.488 s; with the driver's
 * 8, 0.131-0.146 s and 0.593-0.602 s; with 16, 0.28-0.29 s (probe/context_env_probe.py).
 * The copies lose nothing: each thread's wait for its own last copy is in queue order. */
void cpc_one_queue(void)
{
	setenv("CUDA_DEVICE_MAX_CONNECTIONS", "1", 0);
}

#ifdef GMSFS_HAVE_CUDA
#include <errno.h>
#include <stdio.h>
#include <sys/mman.h>

static int fail(struct cu_api *cu, char *err, size_t errlen, const char *what, CUresult r)
{
	snprintf(err, errlen, "%s: %s", what, cu_name(cu, r));
	return -EIO;
}

int cpc_open(struct cu_api *cu, const char *uuid, CUcontext *ctx, char *err, size_t errlen)
{
	if (cu_load(cu, err, errlen))
		return -ENOTSUP;
	CUresult r = cu->cuInit(0);
	int n = 0;
	if (r || (r = cu->cuDeviceGetCount(&n)))
		return fail(cu, err, errlen, "cuInit", r);
	for (int i = 0; i < n; i++) {
		CUdevice d;
		CUuuid u;
		char s[48];
		if (cu->cuDeviceGet(&d, i) || cu->cuDeviceGetUuid(&u, d))
			continue;
		const unsigned char *b = (const unsigned char *)u.bytes;
		snprintf(s, sizeof s, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1],
			 b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
		if (strcmp(s, uuid))
			continue;
		if ((r = cu->cuDevicePrimaryCtxRetain(ctx, d)) || (r = cu->cuCtxSetCurrent(*ctx)))
			return fail(cu, err, errlen, "the GPU's context", r);
		return 0;
	}
	snprintf(err, errlen, "the store's GPU %s is not among this process's %d CUDA devices", uuid, n);
	return -ENODEV;
}

char *cpc_pinned(struct cu_api *cu, size_t bytes, char *err, size_t errlen)
{
	void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED) {
		snprintf(err, errlen, "pinned buffers: %s", strerror(errno));
		return NULL;
	}
	madvise(p, bytes, MADV_HUGEPAGE); /* a hint: without it, 4 KiB pages */
	memset(p, 0, bytes);              /* its pages now, by this thread */
	CUresult r = cu->cuMemHostRegister(p, bytes, 0);
	if (r) {
		munmap(p, bytes);
		fail(cu, err, errlen, "pinned buffers", r);
		return NULL;
	}
	return p;
}

void cpc_unpin(struct cu_api *cu, CUcontext ctx, char *p, size_t bytes)
{
	cu->cuCtxSetCurrent(ctx);
	cu->cuMemHostUnregister(p);
	munmap(p, bytes);
}
#endif
