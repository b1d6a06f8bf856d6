/* bench-duplex BYTES: the copy engines' limit a switch is measured against.  A fresh
 * process with the driver alone: pinned host memory and device memory made first (not
 * timed), then BYTES copied device-to-host, BYTES host-to-device, and both at once on two
 * streams (a switch's two halves), in one call each; then both at once again, into device
 * memory made just before (cuMemCreate in 1 GiB pieces, not timed), as a switch's ins
 * are: the driver's first use of new memory is slower (on an H200 ~10%), and a switch
 * cannot reuse the memory of the store going out, whose readers may keep its descriptors.
 * Prints "d2h_s h2d_s both_s both_fresh_s" (the best of three). */
#include "cuda_api.h"

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static struct cu_api cu;

#define CU(x) CU_MUST(&cu, x)

/* BYTES of new device memory (pieces of at most 1 GiB) at one address, mapped. */
struct fresh {
	CUdeviceptr va;
	size_t n, piece, total;
	CUmemGenericAllocationHandle h[4096];
};

static void fresh_make(struct fresh *f, unsigned long long bytes)
{
	CUdevice dev;
	CU(cu.cuCtxGetDevice(&dev));
	CUmemAllocationProp p = { .type = CU_MEM_ALLOCATION_TYPE_PINNED,
				  .location = { .type = CU_MEM_LOCATION_TYPE_DEVICE, .id = (int)dev } };
	size_t gran = 0;
	CU(cu.cuMemGetAllocationGranularity(&gran, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
	f->piece = 1ull << 30;
	size_t total = f->total = (bytes + gran - 1) / gran * gran;
	f->n = (total + f->piece - 1) / f->piece;
	if (f->n > sizeof f->h / sizeof f->h[0]) {
		fprintf(stderr, "bench-duplex: %llu bytes: too many for the fresh copy\n", bytes);
		exit(1);
	}
	CU(cu.cuMemAddressReserve(&f->va, f->n * f->piece, 0, 0, 0));
	CUmemAccessDesc a = { .location = p.location, .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE };
	for (size_t i = 0; i < f->n; i++) {
		size_t size = i + 1 < f->n ? f->piece : total - i * f->piece;
		CU(cu.cuMemCreate(&f->h[i], size, &p, 0));
		CU(cu.cuMemMap(f->va + i * f->piece, size, 0, f->h[i], 0));
		CU(cu.cuMemSetAccess(f->va + i * f->piece, size, &a, 1));
	}
}

static void fresh_drop(struct fresh *f)
{
	for (size_t i = 0; i < f->n; i++) {
		size_t size = i + 1 < f->n ? f->piece : f->total - i * f->piece;
		CU(cu.cuMemUnmap(f->va + i * f->piece, size));
		CU(cu.cuMemRelease(f->h[i]));
	}
	CU(cu.cuMemAddressFree(f->va, f->n * f->piece));
}

static double now_s(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
	char err[256], *end = NULL;
	unsigned long long bytes = argc == 2 ? strtoull(argv[1], &end, 10) : 0;
	if (!bytes || !end || *end) {
		fprintf(stderr, "usage: bench-duplex BYTES\n");
		return 2;
	}
	if (cu_load(&cu, err, sizeof err)) {
		fprintf(stderr, "bench-duplex: %s\n", err);
		return 1;
	}
	CU(cu_primary_ctx(&cu, 0, NULL, NULL));
	void *out_host, *in_host;
	CUdeviceptr out_dev, in_dev;
	CUstream st[2];
	CU(cu.cuMemHostAlloc(&out_host, bytes, 0));
	CU(cu.cuMemHostAlloc(&in_host, bytes, 0));
	CU(cu.cuMemAlloc(&out_dev, bytes));
	CU(cu.cuMemAlloc(&in_dev, bytes));
	CU(cu.cuStreamCreate(&st[0], CU_STREAM_NON_BLOCKING));
	CU(cu.cuStreamCreate(&st[1], CU_STREAM_NON_BLOCKING));
	/* Touched once: the first use of new memory is slower than the next ones. */
	CU(cu.cuMemcpyDtoHAsync(out_host, out_dev, bytes, st[0]));
	CU(cu.cuMemcpyHtoDAsync(in_dev, in_host, bytes, st[1]));
	CU(cu.cuStreamSynchronize(st[0]));
	CU(cu.cuStreamSynchronize(st[1]));
	double best[4] = { 1e9, 1e9, 1e9, 1e9 };
	for (int run = 0; run < 3; run++) {
		for (int what = 0; what < 3; what++) { /* 0: out alone, 1: in alone, 2: both */
			double t = now_s();
			if (what != 1)
				CU(cu.cuMemcpyDtoHAsync(out_host, out_dev, bytes, st[0]));
			if (what != 0)
				CU(cu.cuMemcpyHtoDAsync(in_dev, in_host, bytes, st[1]));
			CU(cu.cuStreamSynchronize(st[0]));
			CU(cu.cuStreamSynchronize(st[1]));
			t = now_s() - t;
			best[what] = t < best[what] ? t : best[what];
		}
	}
	CU(cu.cuMemFree(in_dev));
	static struct fresh f;
	for (int run = 0; run < 3; run++) {
		fresh_make(&f, bytes);
		double t = now_s();
		CU(cu.cuMemcpyDtoHAsync(out_host, out_dev, bytes, st[0]));
		CU(cu.cuMemcpyHtoDAsync(f.va, in_host, bytes, st[1]));
		CU(cu.cuStreamSynchronize(st[0]));
		CU(cu.cuStreamSynchronize(st[1]));
		t = now_s() - t;
		best[3] = t < best[3] ? t : best[3];
		fresh_drop(&f);
	}
	printf("%.4f %.4f %.4f %.4f\n", best[0], best[1], best[2], best[3]);
	return 0;
}
