/* bench-pages STORE [PAGES]: a KV cache's pages mapped and unmapped through gmsfs
 * (gmsfs_pages_*, each page an allocation the daemon makes and exports) against the raw
 * driver loop in one process (cuMemCreate, cuMemMap, cuMemSetAccess; cuMemUnmap,
 * cuMemRelease), one page per call and in batches of 64, PAGES pages of the device's
 * granularity (2 MiB on a GPU; default 256).  STORE: an empty store of a mount (its
 * writer session holds the pages).  Prints microseconds per page and gmsfs's ratio to the
 * raw loop (on the host backend, gmsfs's figures alone).  Each figure is the best of 3. */
#include "gmsfs/gmsfs.h"
#ifdef GMSFS_HAVE_CUDA
#include "cuda_api.h"
#endif

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define BATCH 64

static double now_us(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec * 1e6 + (double)t.tv_nsec / 1e3;
}

#define MUST(x)                                                                                         \
	do {                                                                                            \
		int e_ = (x);                                                                           \
		if (e_) {                                                                               \
			fprintf(stderr, "bench-pages: %s: %s (%s)\n", #x, gmsfs_strerror(e_), g ? gmsfs_errmsg(g) : ""); \
			exit(1);                                                                        \
		}                                                                                       \
	} while (0)

static gmsfs *g;

/* gmsfs: {map, unmap} microseconds per page, n pages per call. */
static void via_gmsfs(gmsfs_pages *p, uint64_t pages, size_t n, double out[2])
{
	uint64_t *idx = malloc(pages * sizeof *idx);
	for (uint64_t i = 0; i < pages; i++)
		idx[i] = i;
	out[0] = out[1] = 1e30;
	for (int run = 0; run < 3; run++) {
		double t = now_us();
		for (uint64_t i = 0; i < pages; i += n)
			MUST(gmsfs_pages_map(p, idx + i, n, 0));
		double m = (now_us() - t) / (double)pages;
		t = now_us();
		for (uint64_t i = 0; i < pages; i += n)
			MUST(gmsfs_pages_unmap(p, idx + i, n));
		double u = (now_us() - t) / (double)pages;
		out[0] = m < out[0] ? m : out[0];
		out[1] = u < out[1] ? u : out[1];
	}
	free(idx);
}

#ifdef GMSFS_HAVE_CUDA
static struct cu_api cu;
#define CU(x) CU_MUST(&cu, x)

/* The raw loop, in this process: the same pages made, mapped and given access; then unmapped
 * and released.  A batch sets the access of its run once, as a batching engine would. */
static void raw(uint64_t pages, uint64_t page, size_t n, double out[2])
{
	CUdevice d;
	CU(cu.cuCtxGetDevice(&d));
	CUmemAllocationProp prop = { .type = CU_MEM_ALLOCATION_TYPE_PINNED,
				     .location = { .type = CU_MEM_LOCATION_TYPE_DEVICE, .id = d } };
	CUmemAccessDesc acc = { .location = prop.location, .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE };
	CUdeviceptr base;
	CU(cu.cuMemAddressReserve(&base, pages * page, 0, 0, 0));
	CUmemGenericAllocationHandle *h = calloc(pages, sizeof *h);
	out[0] = out[1] = 1e30;
	for (int run = 0; run < 3; run++) {
		double t = now_us();
		for (uint64_t i = 0; i < pages; i += n) {
			for (uint64_t k = i; k < i + n; k++) {
				CU(cu.cuMemCreate(&h[k], page, &prop, 0));
				CU(cu.cuMemMap(base + k * page, page, 0, h[k], 0));
			}
			CU(cu.cuMemSetAccess(base + i * page, n * page, &acc, 1));
		}
		double m = (now_us() - t) / (double)pages;
		t = now_us();
		for (uint64_t i = 0; i < pages; i++) {
			CU(cu.cuMemUnmap(base + i * page, page));
			CU(cu.cuMemRelease(h[i]));
		}
		double u = (now_us() - t) / (double)pages;
		out[0] = m < out[0] ? m : out[0];
		out[1] = u < out[1] ? u : out[1];
	}
	CU(cu.cuMemAddressFree(base, pages * page));
	free(h);
}
#endif

int main(int argc, char **argv)
{
	uint64_t pages = argc > 2 ? strtoull(argv[2], NULL, 10) : 256;
	if (argc < 2 || argc > 3 || !pages || pages % BATCH) {
		fprintf(stderr, "usage: bench-pages STORE [PAGES, a multiple of %d]\n", BATCH);
		return 2;
	}
#ifdef GMSFS_HAVE_CUDA
	char err[256];
	bool gpu = !cu_load(&cu, err, sizeof err); /* a context first, as an engine has one */
	if (gpu) {
		CUdevice d;
		CUcontext ctx;
		CU(cu.cuInit(0));
		CU(cu.cuDeviceGet(&d, 0));
		CU(cu.cuDevicePrimaryCtxRetain(&ctx, d));
		CU(cu.cuCtxSetCurrent(ctx));
	}
#endif
	MUST(gmsfs_connect(&g, argv[1], GMSFS_RW, 30000));
	gmsfs_pages *p;
	MUST(gmsfs_pages_reserve(g, pages * (2ull << 20), 2ull << 20, &p)); /* kvcached's 2 MiB pages */
	uint64_t page = gmsfs_pages_size(p);
	double warm[2], one[2], batch[2];
	via_gmsfs(p, BATCH, 1, warm); /* first use of the path: not counted */
	via_gmsfs(p, pages, 1, one);
	via_gmsfs(p, pages, BATCH, batch);
	printf("pages: %llu of %llu KiB, backend %s\n", (unsigned long long)pages, (unsigned long long)(page >> 10),
	       gmsfs_backend(g) == GMSFS_BACKEND_CUDA ? "cuda" : "host");
	printf("gmsfs  one page a call:  map %7.1f us/page  unmap %7.1f us/page\n", one[0], one[1]);
	printf("gmsfs  %d pages a call:  map %7.1f us/page  unmap %7.1f us/page\n", BATCH, batch[0], batch[1]);
#ifdef GMSFS_HAVE_CUDA
	if (gpu && gmsfs_backend(g) == GMSFS_BACKEND_CUDA) {
		double r1[2], rb[2];
		raw(BATCH, page, 1, r1); /* warm */
		raw(pages, page, 1, r1);
		raw(pages, page, BATCH, rb);
		printf("raw    one page a call:  map %7.1f us/page  unmap %7.1f us/page\n", r1[0], r1[1]);
		printf("raw    %d pages a call:  map %7.1f us/page  unmap %7.1f us/page\n", BATCH, rb[0], rb[1]);
		printf("ratio gmsfs/raw: one page map %.2fx unmap %.2fx; %d pages map %.2fx unmap %.2fx\n", one[0] / r1[0],
		       one[1] / r1[1], BATCH, batch[0] / rb[0], batch[1] / rb[1]);
	}
#endif
	gmsfs_pages_free(p);
	gmsfs_disconnect(g);
	return 0;
}
