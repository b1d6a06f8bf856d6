/* unmap_probe: does one cuMemUnmap over neighbouring mappings (each its own cuMemMap of
 * its own allocation, in one reservation) undo them all, and what does it cost against
 * one cuMemUnmap each?  For layouts of 16 x 1 GiB, 96 x 56 MiB (a rank of group_gpu.py)
 * and 1000 x 2 MiB: map all, set the access in one call, then unmap one by one or all in
 * one call, five rounds by turns; after the one call, each allocation is mapped again at
 * its address (refused where the call left it mapped).  Temporary.
 *   gcc -O2 -Icommon -I/usr/local/cuda/include probe/unmap_probe.c -o build/unmap_probe -ldl */
#define _GNU_SOURCE
#include "cuda_api.h"
#include "clock.h"

#include <stdint.h>
#include <stdlib.h>

static struct cu_api cu;
#define CU(x) CU_MUST(&cu, x)

static int cmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

static void layout(const char *label, int n, size_t size, CUdevice dev)
{
	CUmemAllocationProp prop = { .type = CU_MEM_ALLOCATION_TYPE_PINNED,
				     .location = { CU_MEM_LOCATION_TYPE_DEVICE, dev },
				     .requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR };
	CUmemAccessDesc d = { .location = { CU_MEM_LOCATION_TYPE_DEVICE, dev }, .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE };
	CUmemGenericAllocationHandle *h = calloc((size_t)n, sizeof *h);
	CUdeviceptr base;
	size_t total = (size_t)n * size;
	for (int i = 0; i < n; i++)
		CU(cu.cuMemCreate(&h[i], size, &prop, 0));
	CU(cu.cuMemAddressReserve(&base, total, 2ull << 20, 0, 0));
	double each[5], one[5];
	for (int round = 0; round < 5; round++) {
		for (int way = 0; way < 2; way++) {
			for (int i = 0; i < n; i++)
				CU(cu.cuMemMap(base + (size_t)i * size, size, 0, h[i], 0));
			CU(cu.cuMemSetAccess(base, total, &d, 1));
			CU(cu.cuMemsetD8(base, 1, total));
			CU(cu.cuCtxSynchronize());
			uint64_t t = clock_mono_ns();
			if (way == 0)
				for (int i = 0; i < n; i++)
					CU(cu.cuMemUnmap(base + (size_t)i * size, size));
			else {
				CUresult r = cu.cuMemUnmap(base, total);
				if (r) {
					printf("%s: one cuMemUnmap over %d mappings: refused (%d); one each instead\n", label, n, r);
					for (int i = 0; i < n; i++)
						CU(cu.cuMemUnmap(base + (size_t)i * size, size));
				}
			}
			double us = (clock_mono_ns() - t) / 1e3;
			(way ? one : each)[round] = us;
			if (way == 1) { /* every one unmapped: each maps again at its address */
				for (int i = 0; i < n; i++) {
					CUresult r = cu.cuMemMap(base + (size_t)i * size, size, 0, h[i], 0);
					if (r) {
						printf("%s: round %d: mapping %d still mapped after the one call (%d)\n", label,
						       round, i, r);
						exit(1);
					}
				}
				for (int i = 0; i < n; i++)
					CU(cu.cuMemUnmap(base + (size_t)i * size, size));
			}
		}
	}
	qsort(each, 5, sizeof *each, cmp);
	qsort(one, 5, sizeof *one, cmp);
	printf("%s: unmap one by one %.0f us (median; %.0f-%.0f), one call over all %.0f us (%.0f-%.0f): %.2fx\n", label,
	       each[2], each[0], each[4], one[2], one[0], one[4], one[2] / each[2]);
	CU(cu.cuMemAddressFree(base, total));
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
	layout("1000x2MiB", 1000, 2ull << 20, dev);
	return 0;
}
