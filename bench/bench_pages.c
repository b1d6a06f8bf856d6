/* bench-pages STORE [PAGES]: a KV cache's pages mapped and unmapped through gmsfs
 * (gmsfs_pages_*, each page an allocation the daemon makes and exports) against the raw
 * driver loop in one process (cuMemCreate, cuMemMap, cuMemSetAccess; cuMemUnmap,
 * cuMemRelease), one page per call and in batches of 64, PAGES pages of the device's
 * granularity (2 MiB on a GPU; default 256).  STORE: an empty store of a mount (its
 * writer session holds the pages).  Prints microseconds per page and gmsfs's ratio to the
 * raw loop (on the host backend, gmsfs's figures alone).  Each figure is the best of 3
 * sessions: "fresh", a session's first pass, each page made for it; "again", its later
 * passes, the store's spare pages, those it gave back (a cache that grows again).
 * Twice: beyond the store's minimum (none set), and within it (user.gms.min set to the
 * range: its pages made at reserve and held in the engine's process between maps, where
 * they were); within it also "moved": the pages mapped again at other places. */
#include "gmsfs/gmsfs.h"
#ifdef GMSFS_HAVE_CUDA
#include "cuda_api.h"
#endif

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>

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

/* One pass over the range: {map, unmap} microseconds per page, n pages per call. */
static void pass(gmsfs_pages *p, const uint64_t *idx, uint64_t pages, size_t n, double out[2])
{
	double t = now_us();
	for (uint64_t i = 0; i < pages; i += n)
		MUST(gmsfs_pages_map(p, idx + i, n, 0));
	out[0] = (now_us() - t) / (double)pages;
	t = now_us();
	for (uint64_t i = 0; i < pages; i += n)
		MUST(gmsfs_pages_unmap(p, idx + i, n));
	out[1] = (now_us() - t) / (double)pages;
}

static void best(double to[2], const double run[2])
{
	for (int k = 0; k < 2; k++)
		to[k] = run[k] < to[k] ? run[k] : to[k];
}

/* gmsfs, n pages per call, the best of 3 sessions: fresh, a session's first pass (each page
 * made for it); again, its later passes (the store's spare pages, those it gave back);
 * moved: then the range's other half (within a minimum, the held pages moved there);
 * reserve: the range's reserve, per page (within a minimum it makes them). */
static void via_gmsfs(const char *store, uint64_t pages, uint64_t page, size_t n, double fresh[2], double again[2],
		      double moved[2], double *reserve)
{
	uint64_t *idx = malloc(2 * pages * sizeof *idx);
	for (uint64_t i = 0; i < 2 * pages; i++)
		idx[i] = i;
	fresh[0] = fresh[1] = again[0] = again[1] = moved[0] = moved[1] = 1e30;
	for (int run = 0; run < 3; run++) {
		gmsfs_pages *p;
		double t[2];
		MUST(gmsfs_connect(&g, store, GMSFS_RW, 30000));
		double r = now_us();
		MUST(gmsfs_pages_reserve(g, 2 * pages * page, page, &p));
		r = (now_us() - r) / (double)pages;
		*reserve = run && *reserve < r ? *reserve : r;
		pass(p, idx, pages, n, t);
		best(fresh, t);
		for (int k = 0; k < 2; k++) {
			pass(p, idx, pages, n, t);
			best(again, t);
		}
		pass(p, idx + pages, pages, n, t);
		best(moved, t);
		gmsfs_pages_free(p);
		gmsfs_disconnect(g); /* the session's end: its spare pages go */
		g = NULL;
	}
	free(idx);
}

/* The store's minimum (user.gms.min): bytes, 0 for none. */
static void set_min(const char *store, uint64_t bytes)
{
	char text[32];
	int n = snprintf(text, sizeof text, "%llu", (unsigned long long)bytes);
	int e = bytes ? setxattr(store, "user.gms.min", text, (size_t)n, 0) : removexattr(store, "user.gms.min");
	if (e && (bytes || errno != ENODATA)) {
		fprintf(stderr, "bench-pages: %s: user.gms.min: %s\n", store, strerror(errno));
		exit(1);
	}
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

/* Where a shared page's time goes, call by call (microseconds per page, n pages): the
 * steps of gmsfs's path in one process, with the exportable handle type the daemon uses. */
static void calls(uint64_t n, uint64_t page)
{
	enum { CREATE, EXPORT, IMPORT, MAP, ACCESS1, ACCESS64, UNMAP, REL_IMPORTED, REL_MADE, CLOSE, NSTEP };
	static const char *name[NSTEP] = { "create", "export", "import", "map", "access/page", "access/64",
					   "unmap", "release imported", "release made", "close fd" };
	double t[NSTEP] = { 0 }, s;
	CUdevice d;
	CU(cu.cuCtxGetDevice(&d));
	CUmemAllocationProp prop = { .type = CU_MEM_ALLOCATION_TYPE_PINNED,
				     .requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
				     .location = { .type = CU_MEM_LOCATION_TYPE_DEVICE, .id = d } };
	CUmemAccessDesc acc = { .location = prop.location, .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE };
	CUdeviceptr base;
	CU(cu.cuMemAddressReserve(&base, n * page, 0, 0, 0));
	CUmemGenericAllocationHandle *h = calloc(n, sizeof *h), *im = calloc(n, sizeof *im);
	int *fd = calloc(n, sizeof *fd);
#define STEP(k, x) do { s = now_us(); CU(x); t[k] += now_us() - s; } while (0)
	for (uint64_t i = 0; i < n; i++) {
		STEP(CREATE, cu.cuMemCreate(&h[i], page, &prop, 0));
		STEP(EXPORT, cu.cuMemExportToShareableHandle(&fd[i], h[i], CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
		STEP(IMPORT, cu.cuMemImportFromShareableHandle(&im[i], (void *)(uintptr_t)fd[i],
							       CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
		STEP(MAP, cu.cuMemMap(base + i * page, page, 0, im[i], 0));
		STEP(ACCESS1, cu.cuMemSetAccess(base + i * page, page, &acc, 1));
	}
	for (uint64_t i = 0; i < n; i += BATCH) /* again, over runs of 64 (the access is set anew) */
		STEP(ACCESS64, cu.cuMemSetAccess(base + i * page, BATCH * page, &acc, 1));
	for (uint64_t i = 0; i < n; i++) {
		STEP(UNMAP, cu.cuMemUnmap(base + i * page, page));
		STEP(REL_IMPORTED, cu.cuMemRelease(im[i]));
		STEP(REL_MADE, cu.cuMemRelease(h[i]));
		s = now_us();
		close(fd[i]);
		t[CLOSE] += now_us() - s;
	}
#undef STEP
	CU(cu.cuMemAddressFree(base, n * page));
	printf("calls, us/page:");
	for (int k = 0; k < NSTEP; k++)
		printf(" %s %.1f%s", name[k], t[k] / (double)n, k + 1 < NSTEP ? ";" : "\n");
	free(h);
	free(im);
	free(fd);
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
	if (gpu)
		CU(cu_primary_ctx(&cu, 0, NULL, NULL));
#endif
	MUST(gmsfs_connect(&g, argv[1], GMSFS_RW, 30000));
	bool cuda = gmsfs_backend(g) == GMSFS_BACKEND_CUDA;
	uint64_t page = 2ull << 20; /* kvcached's pages, a multiple of either backend's granularity */
	gmsfs_disconnect(g);
	g = NULL;
	/* Beyond the store's minimum (none set), then within it (user.gms.min the whole
	 * range): the pages made at reserve, and held in this process between maps. */
	double r[2][2][2][2], moved[2][2][2], reserve[2][2]; /* [within][batch][again][map, unmap], [within][batch] */
	for (int within = 0; within < 2; within++) {
		if (within)
			set_min(argv[1], pages * page);
		via_gmsfs(argv[1], BATCH, page, 1, r[within][0][0], r[within][0][1], moved[within][0],
			  &reserve[within][0]); /* first use */
		via_gmsfs(argv[1], pages, page, 1, r[within][0][0], r[within][0][1], moved[within][0], &reserve[within][0]);
		via_gmsfs(argv[1], pages, page, BATCH, r[within][1][0], r[within][1][1], moved[within][1],
			  &reserve[within][1]);
	}
	set_min(argv[1], 0);
	printf("pages: %llu of %llu KiB, backend %s\n", (unsigned long long)pages, (unsigned long long)(page >> 10),
	       cuda ? "cuda" : "host");
	static const char *const where[2] = { "beyond the minimum", "within the minimum" }, *const how[2] = { "fresh", "again" };
	for (int w = 0; w < 2; w++)
		for (int b = 0; b < 2; b++)
			for (int a = 0; a < 2; a++)
				printf("gmsfs  %s, %2d page%s a call, %s: map %7.1f us/page  unmap %7.1f us/page\n", where[w],
				       b ? BATCH : 1, b ? "s" : " ", how[a], r[w][b][a][0], r[w][b][a][1]);
	for (int b = 0; b < 2; b++)
		printf("gmsfs  within the minimum, %2d page%s a call, moved: map %7.1f us/page  unmap %7.1f us/page\n",
		       b ? BATCH : 1, b ? "s" : " ", moved[1][b][0], moved[1][b][1]);
	printf("gmsfs  reserve, within the minimum (the pages made then): %.1f us/page\n", reserve[1][1]);
#ifdef GMSFS_HAVE_CUDA
	if (gpu && cuda) {
		double raws[2][2];
		raw(BATCH, page, 1, raws[0]); /* warm */
		raw(pages, page, 1, raws[0]);
		raw(pages, page, BATCH, raws[1]);
		printf("raw    one page a call:        map %7.1f us/page  unmap %7.1f us/page\n", raws[0][0], raws[0][1]);
		printf("raw    %d pages a call:        map %7.1f us/page  unmap %7.1f us/page\n", BATCH, raws[1][0], raws[1][1]);
		calls(pages, page);
		for (int w = 0; w < 2; w++)
			for (int a = 0; a < 2; a++)
				printf("ratio gmsfs/raw, %s, %s: one page map %.2fx unmap %.2fx; %d pages map %.2fx unmap %.2fx\n",
				       where[w], how[a], r[w][0][a][0] / raws[0][0], r[w][0][a][1] / raws[0][1], BATCH,
				       r[w][1][a][0] / raws[1][0], r[w][1][a][1] / raws[1][1]);
		printf("ratio gmsfs/raw, within the minimum, moved: one page map %.2fx unmap %.2fx; %d pages map %.2fx "
		       "unmap %.2fx\n", moved[1][0][0] / raws[0][0], moved[1][0][1] / raws[0][1], BATCH,
		       moved[1][1][0] / raws[1][0], moved[1][1][1] / raws[1][1]);
		/* For tests/gpu/gate.py: within the minimum, at most 0.9x the raw driver loop. */
		printf("gate: pages-map %.4f %.4f 0.9 a map of %d pages within the store's minimum, again, against the "
		       "raw driver loop (us/page)\n", r[1][1][1][0], raws[1][0], BATCH);
		printf("gate: pages-unmap %.4f %.4f 0.9 an unmap of %d pages within the store's minimum, against the raw "
		       "driver loop (us/page)\n", r[1][1][1][1], raws[1][1], BATCH);
	}
#endif
	return 0;
}
