/* restore_open_probe GPU: what a fresh gmsfs-snapshot restore (or save) pays before its
 * first byte, phase by phase, as loader/copy.c's cuda_open does it: the driver library
 * loaded, cuInit, the device found, its primary context retained and made current, the
 * pinned buffers (16 threads x 2 x a 2 MiB chunk) allocated.  Run several at once (one a
 * GPU, or several on one) to see which phase they share.  Temporary.
 *   gcc -O2 -Icommon -Iloader -I/usr/local/cuda/include probe/restore_open_probe.c -o build/restore_open_probe -ldl */
#define _GNU_SOURCE
#include "cuda_api.h"
#include "clock.h"
#include "copy.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv)
{
	struct cu_api cu;
	char err[256];
	int gpu = argc > 1 ? atoi(argv[1]) : 0;
	uint64_t t[6];
	t[0] = clock_mono_ns();
	if (cu_load(&cu, err, sizeof err)) {
		fprintf(stderr, "%s\n", err);
		return 1;
	}
	t[1] = clock_mono_ns();
	CUdevice d;
	CUcontext ctx;
	void *pinned;
	if (cu.cuInit(0))
		return 1;
	t[2] = clock_mono_ns();
	if (cu.cuDeviceGet(&d, gpu))
		return 1;
	t[3] = clock_mono_ns();
	if (cu.cuDevicePrimaryCtxRetain(&ctx, d) || cu.cuCtxSetCurrent(ctx))
		return 1;
	t[4] = clock_mono_ns();
	if (cu.cuMemHostAlloc(&pinned, CP_THREADS * 2 * CP_BUF, 0))
		return 1;
	t[5] = clock_mono_ns();
	printf("GPU %d: library %.1f ms, cuInit %.1f ms, device %.1f ms, primary context %.1f ms, pinned %.0f MiB %.1f ms: "
	       "%.1f ms in all\n", gpu, (t[1] - t[0]) / 1e6, (t[2] - t[1]) / 1e6, (t[3] - t[2]) / 1e6, (t[4] - t[3]) / 1e6,
	       CP_THREADS * 2.0 * CP_BUF / (1 << 20), (t[5] - t[4]) / 1e6, (t[5] - t[0]) / 1e6);
	return 0;
}
