/* access_probe: what a change of access costs, one cuMemSetAccess per allocation against
 * one over neighbouring allocations (each its own cuMemMap, back to back in one
 * reservation), read-write and read-only, for 16 x 1 GiB (refit_gpu.py's store) and
 * 96 x 56 MiB; five rounds by turns, medians.  Temporary.
 *   gcc -O2 -Icommon -I/usr/local/cuda/include probe/access_probe.c -o build/access_probe -ldl */
#define _GNU_SOURCE
#include "cuda_api.h"
#include "clock.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

static struct cu_api cu;
#define CU(x) CU_MUST(&cu, x)

static int cmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

static double set(CUdeviceptr base, size_t size, int n, CUdevice dev, bool rw, bool one)
{
	CUmemAccessDesc d = { .location = { CU_MEM_LOCATION_TYPE_DEVICE, dev },
			      .flags = rw ? CU_MEM_ACCESS_FLAGS_PROT_READWRITE : CU_MEM_ACCESS_FLAGS_PROT_READ };
	uint64_t t = clock_mono_ns();
	if (one)
		CU(cu.cuMemSetAccess(base, size * (size_t)n, &d, 1));
	else
		for (int i = 0; i < n; i++)
			CU(cu.cuMemSetAccess(base + (size_t)i * size, size, &d, 1));
	return (clock_mono_ns() - t) / 1e3;
}

static void layout(const char *label, int n, size_t size, CUdevice dev)
{
	CUmemAllocationProp prop = { .type = CU_MEM_ALLOCATION_TYPE_PINNED,
				     .location = { CU_MEM_LOCATION_TYPE_DEVICE, dev },
				     .requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR };
	CUmemGenericAllocationHandle *h = calloc((size_t)n, sizeof *h);
	CUdeviceptr base;
	for (int i = 0; i < n; i++)
		CU(cu.cuMemCreate(&h[i], size, &prop, 0));
	CU(cu.cuMemAddressReserve(&base, size * (size_t)n, 2ull << 20, 0, 0));
	for (int i = 0; i < n; i++)
		CU(cu.cuMemMap(base + (size_t)i * size, size, 0, h[i], 0));
	set(base, size, n, dev, false, true);
	double t[4][5]; /* each rw, each ro, one rw, one ro */
	for (int round = 0; round < 5; round++)
		for (int one = 0; one < 2; one++) {
			t[2 * one][round] = set(base, size, n, dev, true, one);
			CU(cu.cuMemsetD8(base, 1, size * (size_t)n)); /* written: the access took */
			CU(cu.cuCtxSynchronize());
			t[2 * one + 1][round] = set(base, size, n, dev, false, one);
		}
	for (int k = 0; k < 4; k++)
		qsort(t[k], 5, sizeof **t, cmp);
	printf("%s: read-write one call each %.0f us, one call over all %.0f us; read-only each %.0f us, one %.0f us "
	       "(medians of 5)\n", label, t[0][2], t[2][2], t[1][2], t[3][2]);
	for (int i = 0; i < n; i++)
		CU(cu.cuMemUnmap(base + (size_t)i * size, size));
	CU(cu.cuMemAddressFree(base, size * (size_t)n));
	for (int i = 0; i < n; i++)
		CU(cu.cuMemRelease(h[i]));
	free(h);
}

int main(void)
{
	char err[256];
	if (cu_load(&cu, err, sizeof err))
		return fprintf(stderr, "%s\n", err), 1;
	CUdevice dev = 0;
	CU(cu_primary_ctx(&cu, 0, &dev, NULL));
	layout("16x1GiB", 16, 1ull << 30, dev);
	layout("96x56MiB", 96, 56ull << 20, dev);
	return 0;
}
