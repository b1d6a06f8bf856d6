/* copy_probe GIB: where a switch's copies lose against bench-duplex.  Both ways at once,
 * GIB GiB each way, best and median of 5, in one process:
 *   plain:  cuMemHostAlloc + cuMemAlloc, one call each way (bench-duplex's floor)
 *   vmm:    VMM memory (host HOST_NUMA, device) in 1 GiB allocations, every copy queued
 *   rounds: the same, in rounds of 1 GiB each way, two in flight (what gmsfs-mover does)
 *   fresh:  rounds into device memory made just before (as a switch's ins are)
 *   settled: the same, a second after the memory was made
 * Temporary probe (issue 83). */
#define _GNU_SOURCE
#include "cuda_api.h"
#include "clock.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

static struct cu_api cu;
#define CU(x) CU_MUST(&cu, x)
#define MAXN 64

struct side {
	CUmemGenericAllocationHandle h[MAXN];
	CUdeviceptr va;
};

static CUdevice dev;
static size_t n;
static const size_t G = 1ull << 30;

static void make(struct side *s, bool host)
{
	CUmemAllocationProp p = { .type = CU_MEM_ALLOCATION_TYPE_PINNED };
	int numa = 0;
	cu.cuDeviceGetAttribute(&numa, CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID, dev);
	p.location.type = host ? CU_MEM_LOCATION_TYPE_HOST_NUMA : CU_MEM_LOCATION_TYPE_DEVICE;
	p.location.id = host ? (numa > 0 ? numa : 0) : (int)dev;
	p.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
	CU(cu.cuMemAddressReserve(&s->va, n * G, 0, 0, 0));
	CUmemAccessDesc a = { .location = { .type = CU_MEM_LOCATION_TYPE_DEVICE, .id = (int)dev },
			      .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE };
	for (size_t i = 0; i < n; i++) {
		CU(cu.cuMemCreate(&s->h[i], G, &p, 0));
		CU(cu.cuMemMap(s->va + i * G, G, 0, s->h[i], 0));
		CU(cu.cuMemSetAccess(s->va + i * G, G, &a, 1));
	}
}

static void drop(struct side *s)
{
	for (size_t i = 0; i < n; i++) {
		CU(cu.cuMemUnmap(s->va + i * G, G));
		CU(cu.cuMemRelease(s->h[i]));
	}
	CU(cu.cuMemAddressFree(s->va, n * G));
}

static CUstream st[2];

/* rounds: 0 = every copy queued at once; else two rounds in flight, each waited for on both
 * streams before the next is queued. */
static double copy(CUdeviceptr out_dst, CUdeviceptr out_src, CUdeviceptr in_dst, CUdeviceptr in_src, bool rounds)
{
	uint64_t t = clock_mono_ns();
	CUevent ev[MAXN][2];
	for (size_t i = 0; i < n; i++) {
		CU(cu.cuMemcpyDtoDAsync(out_dst + i * G, out_src + i * G, G, st[0]));
		CU(cu.cuMemcpyDtoDAsync(in_dst + i * G, in_src + i * G, G, st[1]));
		if (!rounds)
			continue;
		for (int k = 0; k < 2; k++) {
			CU(cu.cuEventCreate(&ev[i][k], CU_EVENT_DISABLE_TIMING));
			CU(cu.cuEventRecord(ev[i][k], st[k]));
		}
		if (i >= 1)
			for (int k = 0; k < 2; k++) {
				CU(cu.cuEventSynchronize(ev[i - 1][k]));
				CU(cu.cuEventDestroy(ev[i - 1][k]));
			}
	}
	CU(cu.cuStreamSynchronize(st[0]));
	CU(cu.cuStreamSynchronize(st[1]));
	if (rounds)
		for (int k = 0; k < 2; k++)
			CU(cu.cuEventDestroy(ev[n - 1][k]));
	return (double)(clock_mono_ns() - t) / 1e9;
}

static int cmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

static void say(const char *what, double *t, int k)
{
	qsort(t, k, sizeof *t, cmp);
	printf("%-8s best %.4f s  median %.4f s  (%.1f GB/s each way)\n", what, t[0], t[k / 2],
	       (double)(n * G) / t[k / 2] / 1e9);
	fflush(stdout);
}

int main(int argc, char **argv)
{
	char err[256];
	n = argc == 2 ? strtoul(argv[1], NULL, 10) : 16;
	if (!n || n > MAXN || cu_load(&cu, err, sizeof err))
		return fprintf(stderr, "usage: copy_probe GIB (1-%d), a driver\n", MAXN), 2;
	CU(cu_primary_ctx(&cu, 0, NULL, NULL));
	CU(cu.cuCtxGetDevice(&dev));
	CU(cu.cuStreamCreate(&st[0], CU_STREAM_NON_BLOCKING));
	CU(cu.cuStreamCreate(&st[1], CU_STREAM_NON_BLOCKING));
	double t[5];
	for (int pass = 0; pass < 1; pass++) {
		void *oh, *ih;
		CUdeviceptr od, id;
		CU(cu.cuMemHostAlloc(&oh, n * G, 0));
		CU(cu.cuMemHostAlloc(&ih, n * G, 0));
		CU(cu.cuMemAlloc(&od, n * G));
		CU(cu.cuMemAlloc(&id, n * G));
		copy((CUdeviceptr)oh, od, id, (CUdeviceptr)ih, false);
		for (int i = 0; i < 5; i++)
			t[i] = copy((CUdeviceptr)oh, od, id, (CUdeviceptr)ih, false);
		say("plain", t, 5);
		CU(cu.cuMemFreeHost(oh));
		CU(cu.cuMemFreeHost(ih));
		CU(cu.cuMemFree(od));
		CU(cu.cuMemFree(id));

		struct side ho, hi, dout, din;
		make(&ho, true);
		make(&hi, true);
		make(&dout, false);
		make(&din, false);
		copy(ho.va, dout.va, din.va, hi.va, false);
		for (int i = 0; i < 5; i++)
			t[i] = copy(ho.va, dout.va, din.va, hi.va, false);
		say("vmm", t, 5);
		for (int i = 0; i < 5; i++)
			t[i] = copy(ho.va, dout.va, din.va, hi.va, true);
		say("rounds", t, 5);
		for (int i = 0; i < 5; i++) {
			drop(&din);
			make(&din, false);
			t[i] = copy(ho.va, dout.va, din.va, hi.va, true);
		}
		say("fresh", t, 5);
		for (int i = 0; i < 5; i++) {
			drop(&din);
			make(&din, false);
			usleep(1000000);
			t[i] = copy(ho.va, dout.va, din.va, hi.va, true);
		}
		say("settled", t, 5);
		drop(&ho);
		drop(&hi);
		drop(&dout);
		drop(&din);
	}
	return 0;
}
