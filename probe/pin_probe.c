/* pin_probe GIB THREADS...: cuMemCreate of GIB x 1 GiB pinned host memory (HOST_NUMA),
 * spread over THREADS threads; the wall time.  Temporary probe. */
#include "cuda_api.h"
#include "clock.h"
#include <pthread.h>
#include <stdint.h>
static struct cu_api cu;
static CUmemAllocationProp prop;
static int per;
static CUmemGenericAllocationHandle hs[256];
static void *work(void *a)
{
	int t = (int)(intptr_t)a;
	for (int i = 0; i < per; i++)
		if (cu.cuMemCreate(&hs[t * per + i], 1ull << 30, &prop, 0)) fprintf(stderr, "fail\n");
	return NULL;
}
int main(int argc, char **argv)
{
	char err[256];
	cu_load(&cu, err, sizeof err); cu.cuInit(0);
	prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
	prop.location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
	prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
	int gib = atoi(argv[1]);
	for (int a = 2; a < argc; a++) {
		int n = atoi(argv[a]);
		per = gib / n;
		pthread_t th[64];
		uint64_t t0 = clock_mono_ns();
		for (int i = 0; i < n; i++) pthread_create(&th[i], NULL, work, (void *)(intptr_t)i);
		for (int i = 0; i < n; i++) pthread_join(th[i], NULL);
		uint64_t t1 = clock_mono_ns();
		for (int i = 0; i < per * n; i++) cu.cuMemRelease(hs[i]);
		printf("pin %d GiB host memory with %d threads: %.3f s (%.1f GB/s); released in %.3f s\n", per * n, n,
		       (t1 - t0) / 1e9, per * n * 1.073741824 / ((t1 - t0) / 1e9), (clock_mono_ns() - t1) / 1e9);
	}
	return 0;
}
