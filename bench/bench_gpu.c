/* bench-gpu MOUNT [RUNS]: a reader's import of a layout on the cuda backend,
 * against the driver floor, for 1000 x 2 MiB, 128 x 64 MiB and 16 x 1 GiB.
 *
 *   floor     one process imports descriptors it already holds and maps them:
 *             cuMemImportFromShareableHandle + cuMemAddressReserve + cuMemMap +
 *             cuMemRelease + cuMemSetAccess(read-only), per allocation.  The
 *             descriptors come from the daemon beforehand (untimed).
 *   bulk      gmsfs_import_all on a connected reader.
 *   connect   gmsfs_connect + gmsfs_import_all.
 *   per-file  gmsfs_import of each allocation by name.
 * Median of RUNS (default 5), each as time and as a ratio to the floor of the same
 * run.  Needs a CUDA context: it makes the primary one of device 0. */
#include <gmsfs/gmsfs.h>

#include "bench.h"
#include "cuda_api.h"
#include "fetch.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static struct cu_api cu;

#define TRY(g, x)                                                                              \
	do {                                                                                   \
		int e_ = (x);                                                                  \
		if (e_) {                                                                      \
			fprintf(stderr, "bench-gpu: %s: %s (%s)\n", #x, gmsfs_strerror(e_),    \
				(g) ? gmsfs_errmsg(g) : "");                                   \
			exit(1);                                                               \
		}                                                                              \
	} while (0)
#define CU(x)                                                                                  \
	do {                                                                                   \
		CUresult r_ = (x);                                                             \
		if (r_) {                                                                      \
			fprintf(stderr, "bench-gpu: %s: %s\n", #x, cu_name(&cu, r_));          \
			exit(1);                                                               \
		}                                                                              \
	} while (0)

/* The floor: map n held descriptors read-only in this process. */
static double floor_run(const struct fetched *x, size_t n, CUdevice dev)
{
	CUdeviceptr *va = calloc(n, sizeof *va);
	CUmemAccessDesc d = { .location = { CU_MEM_LOCATION_TYPE_DEVICE, dev }, .flags = CU_MEM_ACCESS_FLAGS_PROT_READ };
	double t0 = now_ms();
	for (size_t i = 0; i < n; i++) {
		CUmemGenericAllocationHandle h;
		CU(cu.cuMemImportFromShareableHandle(&h, (void *)(uintptr_t)x->fds[i], CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
		CU(cu.cuMemAddressReserve(&va[i], x->aligned[i], 0, 0, 0));
		CU(cu.cuMemMap(va[i], x->aligned[i], 0, h, 0));
		CU(cu.cuMemRelease(h));
		CU(cu.cuMemSetAccess(va[i], x->aligned[i], &d, 1));
	}
	double t = now_ms() - t0;
	for (size_t i = 0; i < n; i++) {
		cu.cuMemUnmap(va[i], x->aligned[i]);
		cu.cuMemAddressFree(va[i], x->aligned[i]);
	}
	free(va);
	return t;
}

static void layout(const char *mnt, int count, uint64_t bytes, int runs, CUdevice dev)
{
	char store[4096];
	snprintf(store, sizeof store, "%s/bench-%dx%lluM", mnt, count, (unsigned long long)(bytes >> 20));
	if (mkdir(store, 0755) < 0 && errno != EEXIST) {
		perror(store);
		exit(1);
	}
	gmsfs *w;
	TRY(NULL, gmsfs_connect(&w, store, GMSFS_RW, 10000));
	char **names = calloc((size_t)count, sizeof *names);
	double t0 = now_ms();
	for (int i = 0; i < count; i++) {
		char name[32];
		void *p;
		snprintf(name, sizeof name, "t%05d", i);
		names[i] = strdup(name);
		TRY(w, gmsfs_create(w, name, bytes, "weights", &p));
	}
	double t_create = now_ms() - t0;
	const struct gmsfs_mapping *m;
	size_t nm = gmsfs_mappings(w, &m);
	for (size_t i = 0; i < nm; i++)
		CU(cu.cuMemsetD8((CUdeviceptr)(uintptr_t)m[i].ptr, (unsigned char)i, m[i].aligned));
	CU(cu.cuCtxSynchronize());
	TRY(w, gmsfs_commit(w));
	gmsfs_disconnect(w);

	double *tf = calloc((size_t)runs, sizeof(double)), *tb = calloc((size_t)runs, sizeof(double));
	double *tc = calloc((size_t)runs, sizeof(double)), *tp = calloc((size_t)runs, sizeof(double));
	for (int r = 0; r < runs; r++) {
		gmsfs *g;
		struct fetched x;
		if (fetch_all(store, &x)) {
			fprintf(stderr, "bench-gpu: fetching the descriptors of %s failed\n", store);
			exit(1);
		}
		tf[r] = floor_run(&x, x.n, dev);
		fetched_free(&x);

		t0 = now_ms();
		TRY(NULL, gmsfs_connect(&g, store, GMSFS_RO, 10000));
		double t1 = now_ms();
		TRY(g, gmsfs_import_all(g));
		double t2 = now_ms();
		tb[r] = t2 - t1;
		tc[r] = t2 - t0;
		gmsfs_disconnect(g);

		TRY(NULL, gmsfs_connect(&g, store, GMSFS_RO, 10000));
		t0 = now_ms();
		for (int i = 0; i < count; i++) {
			void *p;
			TRY(g, gmsfs_import(g, names[i], &p));
		}
		tp[r] = now_ms() - t0;
		gmsfs_disconnect(g);
	}
	double f = median(tf, runs), b = median(tb, runs), c = median(tc, runs), p = median(tp, runs);
	printf("bench-gpu: %d x %llu MiB, median of %d (create: %.1f us per allocation)\n", count,
	       (unsigned long long)(bytes >> 20), runs, t_create * 1e3 / count);
	printf("  %-40s %9.2f ms  %5.2fx  %7.1f us/alloc\n", "floor: import+map held fds", f, 1.0, f * 1e3 / count);
	printf("  %-40s %9.2f ms  %5.2fx  %7.1f us/alloc\n", "libgmsfs bulk import (import_all)", b, b / f, b * 1e3 / count);
	printf("  %-40s %9.2f ms  %5.2fx  %7.1f us/alloc\n", "libgmsfs connect + import_all", c, c / f, c * 1e3 / count);
	printf("  %-40s %9.2f ms  %5.2fx  %7.1f us/alloc\n", "libgmsfs per-file import", p, p / f, p * 1e3 / count);
	fflush(stdout);
	for (int i = 0; i < count; i++)
		free(names[i]);
	free(names);
	free(tf), free(tb), free(tc), free(tp);
	if (rmdir(store) < 0)
		perror("rmdir");
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		fprintf(stderr, "usage: %s MOUNT [RUNS]\n", argv[0]);
		return 2;
	}
	int runs = argc > 2 ? atoi(argv[2]) : 5;
	char err[256];
	if (cu_load(&cu, err, sizeof err)) {
		fprintf(stderr, "bench-gpu: %s\n", err);
		return 1;
	}
	CUdevice dev;
	CUcontext ctx;
	CU(cu.cuInit(0));
	CU(cu.cuDeviceGet(&dev, 0));
	CU(cu.cuDevicePrimaryCtxRetain(&ctx, dev));
	CU(cu.cuCtxSetCurrent(ctx));
	layout(argv[1], 1000, 2ull << 20, runs, dev);
	layout(argv[1], 128, 64ull << 20, runs, dev);
	layout(argv[1], 16, 1ull << 30, runs, dev);
	return 0;
}
