/* hostbuf_probe: what a digest's read buffers cost to make (issue 84): cuMemHostAlloc of
 * 128 / 64 / 32 MiB, and 128 MiB of transparent huge pages registered with
 * cuMemHostRegister, three times each; then a 32 MiB copy into each kind.  Temporary. */
#define _GNU_SOURCE
#include "cuda_api.h"
#include "clock.h"

#include <stdint.h>
#include <string.h>
#include <sys/mman.h>

static struct cu_api cu;
#define CU(x) CU_MUST(&cu, x)
typedef CUresult (*reg_fn)(void *, size_t, unsigned);
typedef CUresult (*unreg_fn)(void *);

int main(void)
{
	char err[256];
	if (cu_load(&cu, err, sizeof err))
		return fprintf(stderr, "%s\n", err), 1;
	CU(cu_primary_ctx(&cu, 0, NULL, NULL));
	reg_fn reg = (reg_fn)dlsym(cu.lib, "cuMemHostRegister_v2");
	unreg_fn unreg = (unreg_fn)dlsym(cu.lib, "cuMemHostUnregister");
	CUdeviceptr dev;
	CU(cu.cuMemAlloc(&dev, 32 << 20));
	for (int rep = 0; rep < 3; rep++) {
		for (size_t mib = 128; mib >= 32; mib /= 2) {
			void *p;
			uint64_t t = clock_mono_ns();
			CU(cu.cuMemHostAlloc(&p, mib << 20, 0));
			double made = (double)(clock_mono_ns() - t) / 1e6;
			t = clock_mono_ns();
			CU(cu.cuMemcpyDtoH(p, dev, 32 << 20));
			double copied = (double)(clock_mono_ns() - t) / 1e6;
			t = clock_mono_ns();
			CU(cu.cuMemFreeHost(p));
			printf("cuMemHostAlloc %3zu MiB: %.2f ms, freed %.2f ms, 32 MiB copied in %.3f ms\n", mib, made,
			       (double)(clock_mono_ns() - t) / 1e6, copied);
		}
		for (int huge = 0; huge < 2; huge++) {
			size_t n = 128 << 20;
			uint64_t t = clock_mono_ns();
			char *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
			if (huge)
				madvise(p, n, MADV_HUGEPAGE);
			memset(p, 0, n);
			double touched = (double)(clock_mono_ns() - t) / 1e6;
			t = clock_mono_ns();
			CUresult r = reg ? reg(p, n, 0) : CUDA_ERROR_NOT_FOUND;
			double made = (double)(clock_mono_ns() - t) / 1e6;
			t = clock_mono_ns();
			if (!r)
				CU(cu.cuMemcpyDtoH(p, dev, 32 << 20));
			double copied = (double)(clock_mono_ns() - t) / 1e6;
			if (!r)
				unreg(p);
			munmap(p, n);
			printf("mmap%s + touch %.2f ms + cuMemHostRegister 128 MiB: %.2f ms (%d), 32 MiB copied in %.3f ms\n",
			       huge ? " MADV_HUGEPAGE" : "", touched, made, (int)r, copied);
		}
	}
	return 0;
}
