// peer_probe N [first]: a GPU 0 -> GPU 1 copy of N x 1 GiB, by ways, on a machine of two GPUs:
// cudaMalloc + cudaMemcpyPeerAsync (the floor of gmsfs-snapshot copy), VMM (POSIX-fd) memory
// by the copy engine pulled and pushed, and by an SM kernel; with "first", VMM before any
// context's peer access, and VMM memory exported, imported and granted again as a reader maps
// it (BOTH=1: both devices in one cuMemSetAccess), with the grants timed.  Diagnostic probe
// (docs/benchmarks.md, "A store copied from a peer GPU"):
//   nvcc -O2 -arch=sm_90 -o /tmp/pp probe/peer_probe.cu -lcuda && /tmp/pp 16 && /tmp/pp 16 first
#include <cuda.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#define CK(x) do { CUresult r_ = (x); if (r_) { const char *s; cuGetErrorName(r_, &s); printf("%s: %s\n", #x, s); exit(1);} } while (0)
#define RK(x) do { cudaError_t r_ = (x); if (r_) { printf("%s: %s\n", #x, cudaGetErrorString(r_)); exit(1);} } while (0)
static double now() { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec / 1e9; }
__global__ void kcopy(const int4 *__restrict__ s, int4 *__restrict__ d, size_t n) {
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) d[i] = s[i];
}
static size_t G = 1ull << 30;
static int N = 16;
static CUdeviceptr vmm(int dev, int peer, int peer_flags) {
	CUmemAllocationProp p = {}; p.type = CU_MEM_ALLOCATION_TYPE_PINNED; p.location.type = CU_MEM_LOCATION_TYPE_DEVICE; p.location.id = dev;
	p.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
	CUdeviceptr base; CK(cuMemAddressReserve(&base, N * G, 0, 0, 0));
	for (int i = 0; i < N; i++) { CUmemGenericAllocationHandle h; CK(cuMemCreate(&h, G, &p, 0)); CK(cuMemMap(base + i * G, G, 0, h, 0)); }
	CUmemAccessDesc a[2] = {}; a[0].location.type = CU_MEM_LOCATION_TYPE_DEVICE; a[0].location.id = dev; a[0].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
	a[1].location.type = CU_MEM_LOCATION_TYPE_DEVICE; a[1].location.id = peer; a[1].flags = (CUmemAccess_flags)peer_flags;
	CK(cuMemSetAccess(base, N * G, a, 2));
	return base;
}
typedef void (*way)(int on, CUdeviceptr s, CUdeviceptr d, cudaStream_t st);
static void ce(int on, CUdeviceptr s, CUdeviceptr d, cudaStream_t st) { for (int i = 0; i < N; i++) CK(cuMemcpyDtoDAsync(d + i * G, s + i * G, G, (CUstream)st)); }
static void ceone(int on, CUdeviceptr s, CUdeviceptr d, cudaStream_t st) { CK(cuMemcpyDtoDAsync(d, s, N * G, (CUstream)st)); }
static int blocks = 0, threads = 512;
static void sm(int on, CUdeviceptr s, CUdeviceptr d, cudaStream_t st) { for (int i = 0; i < N; i++) kcopy<<<blocks, threads, 0, st>>>((const int4 *)(s + i * G), (int4 *)(d + i * G), G / 16); }
static void smone(int on, CUdeviceptr s, CUdeviceptr d, cudaStream_t st) { kcopy<<<blocks, threads, 0, st>>>((const int4 *)s, (int4 *)d, N * G / 16); }
static double timeit(const char *what, way w, int on, CUdeviceptr s, CUdeviceptr d) {
	RK(cudaSetDevice(on)); cudaStream_t st; RK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
	double best = 1e9, first = 0;
	for (int k = 0; k < 5; k++) { RK(cudaDeviceSynchronize()); double t = now(); w(on, s, d, st); RK(cudaStreamSynchronize(st)); t = now() - t; if (t < best) best = t; if (!k) first = t; }
	RK(cudaStreamDestroy(st));
	printf("%-58s %.4f s  %.0f GB/s (the first %.4f s)\n", what, best, N * G / best / 1e9, first); fflush(stdout);
	return best;
}
static CUdeviceptr imported(CUdeviceptr base, int dev, int peer) {
	// every 1 GiB of base's memory exported to a descriptor, imported and mapped again
	// elsewhere, read-only to dev and to peer: as a reader of another process maps it
	CUdeviceptr v; CK(cuMemAddressReserve(&v, N * G, 0, 0, 0));
	for (int i = 0; i < N; i++) {
		CUmemGenericAllocationHandle h, h2; CK(cuMemRetainAllocationHandle(&h, (void *)(base + i * G)));
		int fd; CK(cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
		CK(cuMemImportFromShareableHandle(&h2, (void *)(long)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
		CK(cuMemMap(v + i * G, G, 0, h2, 0));
	}
	CUmemAccessDesc a[2] = {}; a[0].location.type = CU_MEM_LOCATION_TYPE_DEVICE; a[0].location.id = dev; a[0].flags = CU_MEM_ACCESS_FLAGS_PROT_READ;
	a[1] = a[0]; a[1].location.id = peer;
	double t = now();
	if (getenv("BOTH")) { for (int i = 0; i < N; i++) CK(cuMemSetAccess(v + i * G, G, a, 2)); printf("imported: both devices' read granted in one call a GiB: %.4f s\n", now() - t); return v; }
	for (int i = 0; i < N; i++) CK(cuMemSetAccess(v + i * G, G, a, 1));
	double t1 = now();
	for (int i = 0; i < N; i++) CK(cuMemSetAccess(v + i * G, G, a + 1, 1));
	printf("imported: read granted to its device %.4f s, then to the peer %.4f s\n", t1 - t, now() - t1);
	return v;
}
int main(int argc, char **argv) {
	if (argc > 1) N = atoi(argv[1]);
	CK(cuInit(0)); RK(cudaSetDevice(0)); RK(cudaFree(0)); RK(cudaSetDevice(1)); RK(cudaFree(0));
	int sms; RK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 1)); blocks = sms * 4;
	if (argc > 2) { // VMM first: no context has peer access enabled yet
		CUdeviceptr s = vmm(0, 1, CU_MEM_ACCESS_FLAGS_PROT_READ), d = vmm(1, 0, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
		timeit("no peer access enabled: VMM CE on GPU1 (pull)", ce, 1, s, d);
		CUdeviceptr s2 = imported(s, 0, 1);
		timeit("no peer access enabled: VMM imported again, CE pull", ce, 1, s2, d);
		RK(cudaSetDevice(1)); RK(cudaDeviceEnablePeerAccess(0, 0));
		timeit("GPU1's context peer access on: VMM imported, CE pull", ce, 1, s2, d);
		RK(cudaSetDevice(0)); RK(cudaDeviceEnablePeerAccess(1, 0));
		timeit("both on: VMM imported, CE pull", ce, 1, s2, d);
		return 0;
	}
	// floor: cudaMalloc + peer copy
	void *a, *b; RK(cudaSetDevice(0)); RK(cudaMalloc(&a, N * G)); RK(cudaDeviceEnablePeerAccess(1, 0)); RK(cudaSetDevice(1)); RK(cudaMalloc(&b, N * G)); RK(cudaDeviceEnablePeerAccess(0, 0));
	double f = 1e9, f0 = 0;
	for (int k = 0; k < 5; k++) { RK(cudaSetDevice(1)); RK(cudaDeviceSynchronize()); double t = now(); RK(cudaMemcpyPeerAsync(b, 1, a, 0, N * G, 0)); RK(cudaDeviceSynchronize()); RK(cudaSetDevice(0)); RK(cudaDeviceSynchronize()); t = now() - t; if (t < f) f = t; if (!k) f0 = t; }
	printf("%-58s %.4f s  %.0f GB/s (the first %.4f s)\n", "floor: cudaMalloc, cudaMemcpyPeerAsync one call", f, N * G / f / 1e9, f0);
	timeit("cudaMalloc: cuMemcpyDtoDAsync on GPU1 (pull) 1 GiB each", ce, 1, (CUdeviceptr)a, (CUdeviceptr)b);
	timeit("cudaMalloc: SM kernel on GPU1 (pull)", sm, 1, (CUdeviceptr)a, (CUdeviceptr)b);
	timeit("cudaMalloc: SM kernel on GPU0 (push)", sm, 0, (CUdeviceptr)a, (CUdeviceptr)b);
	RK(cudaFree(a)); RK(cudaFree(b));
	CUdeviceptr s = vmm(0, 1, CU_MEM_ACCESS_FLAGS_PROT_READ), d = vmm(1, 0, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
	{
		CUdeviceptr s2 = vmm(0, 0, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
		CUmemAccessDesc r1 = {}; r1.location.type = CU_MEM_LOCATION_TYPE_DEVICE; r1.location.id = 1; r1.flags = CU_MEM_ACCESS_FLAGS_PROT_READ;
		double t = now();
		for (int i = 0; i < N; i++) CK(cuMemSetAccess(s2 + i * G, G, &r1, 1));
		printf("cuMemSetAccess: GPU1 granted read of %d GiB on GPU0, 1 GiB each: %.4f s\n", N, now() - t);
	}
	timeit("VMM src read-only to GPU1: CE on GPU1 (pull), 1 GiB each", ce, 1, s, d);
	timeit("VMM: CE on GPU1 (pull), one call over the range", ceone, 1, s, d);
	timeit("VMM: CE on GPU0 (push), 1 GiB each", ce, 0, s, d);
	timeit("VMM: SM kernel on GPU1 (pull)", sm, 1, s, d);
	timeit("VMM: SM kernel on GPU1 (pull), one launch", smone, 1, s, d);
	timeit("VMM: SM kernel on GPU0 (push)", sm, 0, s, d);
	threads = 1024; blocks *= 2;
	timeit("VMM: SM kernel on GPU1 (pull), 8 blocks/SM x1024", sm, 1, s, d);
	blocks /= 8; threads = 512;
	timeit("VMM: SM kernel on GPU1 (pull), 1 block/SM x512", sm, 1, s, d);
	return 0;
}
