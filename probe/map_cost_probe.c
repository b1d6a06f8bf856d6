/* map_cost_probe: what the driver charges by call, and what by mapping and byte.  For
 * 16 x 1 GiB (refit_gpu.py's store), 96 x 56 MiB (a rank of group_gpu.py) and 1000 x 2 MiB,
 * each allocation its own cuMemMap, back to back in one reservation, five rounds by turns,
 * medians:
 *   - an access change (cuMemSetAccess read-write, then read-only), one call per
 *     allocation against one call over them all;
 *   - the unmap, one cuMemUnmap per allocation against one over them all; after the one
 *     call each allocation is mapped again at its address (refused where it was left
 *     mapped).  Temporary.
 *   gcc -O2 -Icommon -I/usr/local/cuda/include probe/map_cost_probe.c -o build/map_cost_probe -ldl */
#define _GNU_SOURCE
#include "cuda_api.h"
#include "clock.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

static struct cu_api cu;
#define CU(x) CU_MUST(&cu, x)

struct layout {
	const char *label;
	int n;
	size_t size;
	CUdevice dev;
	CUdeviceptr base;
	CUmemGenericAllocationHandle *h;
};

static int cmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

static double median5(double *t)
{
	qsort(t, 5, sizeof *t, cmp);
	return t[2];
}

static void map_all(const struct layout *l)
{
	for (int i = 0; i < l->n; i++)
		CU(cu.cuMemMap(l->base + (size_t)i * l->size, l->size, 0, l->h[i], 0));
}

static void unmap_each(const struct layout *l)
{
	for (int i = 0; i < l->n; i++)
		CU(cu.cuMemUnmap(l->base + (size_t)i * l->size, l->size));
}

static double set_access(const struct layout *l, bool rw, bool one)
{
	CUmemAccessDesc d = { .location = { CU_MEM_LOCATION_TYPE_DEVICE, l->dev },
			      .flags = rw ? CU_MEM_ACCESS_FLAGS_PROT_READWRITE : CU_MEM_ACCESS_FLAGS_PROT_READ };
	uint64_t t = clock_mono_ns();
	if (one)
		CU(cu.cuMemSetAccess(l->base, l->size * (size_t)l->n, &d, 1));
	else
		for (int i = 0; i < l->n; i++)
			CU(cu.cuMemSetAccess(l->base + (size_t)i * l->size, l->size, &d, 1));
	return (clock_mono_ns() - t) / 1e3;
}

static void access_costs(const struct layout *l)
{
	double t[4][5]; /* each rw, each ro, one rw, one ro */
	map_all(l);
	for (int round = 0; round < 5; round++)
		for (int one = 0; one < 2; one++) {
			t[2 * one][round] = set_access(l, true, one);
			CU(cu.cuMemsetD8(l->base, 1, l->size * (size_t)l->n)); /* written: the access took */
			CU(cu.cuCtxSynchronize());
			t[2 * one + 1][round] = set_access(l, false, one);
		}
	unmap_each(l);
	printf("%s: access read-write one call each %.0f us, one call over all %.0f us; read-only each %.0f us, one %.0f "
	       "us\n", l->label, median5(t[0]), median5(t[2]), median5(t[1]), median5(t[3]));
}

static void unmap_costs(const struct layout *l)
{
	double each[5], one[5];
	for (int round = 0; round < 5; round++)
		for (int way = 0; way < 2; way++) {
			map_all(l);
			set_access(l, true, true);
			uint64_t t = clock_mono_ns();
			if (way == 0)
				unmap_each(l);
			else if (cu.cuMemUnmap(l->base, l->size * (size_t)l->n)) {
				printf("%s: one cuMemUnmap over %d mappings: refused\n", l->label, l->n);
				unmap_each(l);
			}
			(way ? one : each)[round] = (clock_mono_ns() - t) / 1e3;
			if (way == 1) { /* every one unmapped: each maps again at its address */
				map_all(l);
				unmap_each(l);
			}
		}
	printf("%s: unmap one by one %.0f us, one call over all %.0f us: %.2fx\n", l->label, median5(each), median5(one),
	       median5(one) / median5(each));
}

static void layout(const char *label, int n, size_t size, CUdevice dev)
{
	CUmemAllocationProp prop = { .type = CU_MEM_ALLOCATION_TYPE_PINNED,
				     .location = { CU_MEM_LOCATION_TYPE_DEVICE, dev },
				     .requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR };
	struct layout l = { label, n, size, dev, 0, calloc((size_t)n, sizeof *l.h) };
	for (int i = 0; i < n; i++)
		CU(cu.cuMemCreate(&l.h[i], size, &prop, 0));
	CU(cu.cuMemAddressReserve(&l.base, size * (size_t)n, 2ull << 20, 0, 0));
	access_costs(&l);
	unmap_costs(&l);
	CU(cu.cuMemAddressFree(l.base, size * (size_t)n));
	for (int i = 0; i < n; i++)
		CU(cu.cuMemRelease(l.h[i]));
	free(l.h);
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
