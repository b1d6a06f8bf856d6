/* bench-duplex BYTES: the copy engines' limit a switch is measured against.  A fresh
 * process with the driver alone: pinned host memory and device memory made first (not
 * timed), then BYTES copied device-to-host, BYTES host-to-device, and both at once on two
 * streams (a switch's two halves), in one call each.  Prints "d2h_s h2d_s both_s" (the
 * best of three). */
#include "cuda_api.h"

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static struct cu_api cu;

#define CU(x) CU_MUST(&cu, x)

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
	double best[3] = { 1e9, 1e9, 1e9 };
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
	printf("%.4f %.4f %.4f\n", best[0], best[1], best[2]);
	return 0;
}
