/* cuda_api.h: the CUDA driver API, loaded at run time (dlopen "libcuda.so.1"), so
 * that nothing links against libcuda and one binary runs with and without a GPU.
 * Not public: compiled into the daemon's cuda backend, libgmsfs, the tests and the
 * benchmarks (cu_ = the driver table).
 * Each user keeps its own table: no global state. */
#ifndef GMSFS_CUDA_API_H
#define GMSFS_CUDA_API_H

#include <cuda.h>
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

/* name in this table, exported symbol (cuda.h maps names to versioned ones) */
#define CU_FUNCS(X)                                                     \
	X(cuInit, "cuInit")                                             \
	X(cuGetErrorName, "cuGetErrorName")                             \
	X(cuDeviceGetCount, "cuDeviceGetCount")                         \
	X(cuDeviceGet, "cuDeviceGet")                                   \
	X(cuDeviceGetName, "cuDeviceGetName")                           \
	X(cuDeviceGetUuid, "cuDeviceGetUuid_v2")                        \
	X(cuDeviceGetAttribute, "cuDeviceGetAttribute")                 \
	X(cuDeviceTotalMem, "cuDeviceTotalMem_v2")                      \
	X(cuMemGetAllocationGranularity, "cuMemGetAllocationGranularity") \
	X(cuMemCreate, "cuMemCreate")                                   \
	X(cuMemRelease, "cuMemRelease")                                 \
	X(cuMemExportToShareableHandle, "cuMemExportToShareableHandle") \
	X(cuMemImportFromShareableHandle, "cuMemImportFromShareableHandle") \
	X(cuMemAddressReserve, "cuMemAddressReserve")                   \
	X(cuMemAddressFree, "cuMemAddressFree")                         \
	X(cuMemMap, "cuMemMap")                                         \
	X(cuMemUnmap, "cuMemUnmap")                                     \
	X(cuMemSetAccess, "cuMemSetAccess")                             \
	X(cuMemRetainAllocationHandle, "cuMemRetainAllocationHandle")   \
	X(cuThreadExchangeStreamCaptureMode, "cuThreadExchangeStreamCaptureMode") \
	X(cuCtxGetCurrent, "cuCtxGetCurrent")                           \
	X(cuCtxGetDevice, "cuCtxGetDevice")                             \
	X(cuMemAlloc, "cuMemAlloc_v2")                                  \
	X(cuMemFree, "cuMemFree_v2")                                    \
	X(cuMemcpyDtoD, "cuMemcpyDtoD_v2")                              \
	X(cuMemcpyDtoDAsync, "cuMemcpyDtoDAsync_v2")                    \
	X(cuDeviceCanAccessPeer, "cuDeviceCanAccessPeer")               \
	/* for gmsfs-mover: a batch's end on each stream, two batches in flight */ \
	X(cuEventCreate, "cuEventCreate")                               \
	X(cuEventRecord, "cuEventRecord")                               \
	X(cuEventQuery, "cuEventQuery")                                 \
	X(cuEventSynchronize, "cuEventSynchronize")                     \
	X(cuEventDestroy, "cuEventDestroy_v2")                          \
	/* for the tests and benchmarks, which make their own context */ \
	X(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain")         \
	X(cuCtxSetCurrent, "cuCtxSetCurrent")                           \
	X(cuCtxSynchronize, "cuCtxSynchronize")                         \
	X(cuMemGetInfo, "cuMemGetInfo_v2")                              \
	X(cuMemcpyHtoD, "cuMemcpyHtoD_v2")                              \
	X(cuMemcpyDtoH, "cuMemcpyDtoH_v2")                              \
	X(cuMemsetD8, "cuMemsetD8_v2")                                  \
	/* for the loader (gmsfs-load, gmsfs-save): pinned buffers, streams */ \
	X(cuMemHostAlloc, "cuMemHostAlloc")                             \
	X(cuMemFreeHost, "cuMemFreeHost")                               \
	X(cuMemHostRegister, "cuMemHostRegister_v2")                    \
	X(cuMemHostUnregister, "cuMemHostUnregister")                   \
	X(cuStreamCreate, "cuStreamCreate")                             \
	X(cuStreamDestroy, "cuStreamDestroy_v2")                        \
	X(cuStreamSynchronize, "cuStreamSynchronize")                   \
	X(cuStreamQuery, "cuStreamQuery")                               \
	X(cuMemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2")                    \
	X(cuMemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2")                    \
	X(cuModuleLoadData, "cuModuleLoadData")                         \
	X(cuModuleUnload, "cuModuleUnload")                             \
	X(cuModuleGetFunction, "cuModuleGetFunction")                   \
	X(cuLaunchKernel, "cuLaunchKernel")

struct cu_api {
	void *lib;
#define CU_MEMBER(name, sym) __typeof__(name) *name;
	CU_FUNCS(CU_MEMBER)
#undef CU_MEMBER
};

/* 0, or -1 with the reason in err. */
static inline int cu_load(struct cu_api *cu, char *err, size_t errlen)
{
	cu->lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
	if (!cu->lib) {
		snprintf(err, errlen, "libcuda.so.1 not found (no NVIDIA driver here)");
		return -1;
	}
#define CU_LOOKUP(name, sym)                                                        \
	if (!(cu->name = (__typeof__(name) *)dlsym(cu->lib, sym))) {                \
		snprintf(err, errlen, "libcuda.so.1 lacks %s (driver too old)", sym); \
		dlclose(cu->lib);                                                   \
		cu->lib = NULL;                                                     \
		return -1;                                                          \
	}
	CU_FUNCS(CU_LOOKUP)
#undef CU_LOOKUP
	return 0;
}

static inline void cu_unload(struct cu_api *cu)
{
	if (cu->lib)
		dlclose(cu->lib);
	cu->lib = NULL;
}

static inline const char *cu_name(const struct cu_api *cu, CUresult r)
{
	const char *s = NULL;
	if (cu->cuGetErrorName)
		cu->cuGetErrorName(r, &s);
	return s ? s : "CUDA_ERROR_?";
}

/* Device ordinal's primary context made current in this thread, as an engine's is: 0, or
 * the failing call's result.  dev and ctx (either may be NULL) get the device and context. */
static inline CUresult cu_primary_ctx(const struct cu_api *cu, int ordinal, CUdevice *dev, CUcontext *ctx)
{
	CUdevice d;
	CUcontext c;
	CUresult r = cu->cuInit(0);
	if (!r)
		r = cu->cuDeviceGet(&d, ordinal);
	if (!r)
		r = cu->cuDevicePrimaryCtxRetain(&c, d);
	if (!r)
		r = cu->cuCtxSetCurrent(c);
	if (!r && dev)
		*dev = d;
	if (!r && ctx)
		*ctx = c;
	return r;
}

/* For the benchmarks: a driver call that must succeed, or the program ends naming it. */
#define CU_MUST(cu, x)                                                                         \
	do {                                                                                   \
		CUresult r_ = (x);                                                             \
		if (r_) {                                                                      \
			fprintf(stderr, "%s: %s: %s\n", program_invocation_short_name, #x,     \
				cu_name(cu, r_));                                              \
			exit(1);                                                               \
		}                                                                              \
	} while (0)

#endif
