/* restore_open_probe GPU [MODE] | all: what a fresh gmsfs-snapshot restore (or save) pays before its
 * first byte, phase by phase, as loader/copy_cuda.c's cpc_open does it: the driver library
 * loaded, cuInit, the device found, its primary context retained and made current, the
 * pinned buffers (16 threads x 2 x a 2 MiB chunk) allocated.  MODE, how the pinned
 * buffers are made: one (one cuMemHostAlloc, as copy.c does), threads (each of the 16
 * threads its own two, at once: "first" is when the first thread has them), huge (one
 * anonymous mapping, madvise(MADV_HUGEPAGE), touched, then cuMemHostRegister), hugethreads
 * (the same, a mapping a thread).  Run several at once (one a
 * GPU, or several on one) to see which phase they share.  Temporary.
 *   gcc -O2 -Icommon -Iloader -I/usr/local/cuda/include probe/restore_open_probe.c -o build/restore_open_probe -ldl -pthread */
#define _GNU_SOURCE
#include "cuda_api.h"
#include "clock.h"
#include "copy.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

static struct cu_api cu;
static CUcontext ctx;
static const char *mode = "one";
static uint64_t t_start, t_first;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

/* bytes of pinned memory by mode's way: 0, or 1 on a failure. */
static int pin(size_t bytes)
{
	void *p;
	if (!strncmp(mode, "huge", 4)) {
		p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (p == MAP_FAILED)
			return 1;
		madvise(p, bytes, MADV_HUGEPAGE);
		memset(p, 0, bytes);
		if (cu.cuMemHostRegister(p, bytes, 0))
			return 1;
	} else if (cu.cuMemHostAlloc(&p, bytes, 0)) {
		return 1;
	}
	pthread_mutex_lock(&mu);
	if (!t_first)
		t_first = clock_mono_ns();
	pthread_mutex_unlock(&mu);
	return 0;
}

static void *thread_pin(void *arg)
{
	(void)arg;
	cu.cuCtxSetCurrent(ctx);
	return (void *)(intptr_t)pin(2 * CP_BUF);
}

/* GPU "all": one process, after one cuInit, a thread a device making its primary context
 * current at once (what a group's restore in one process would pay, where N processes make
 * theirs one after the other in the driver): each thread's time, from the threads' start. */
static uint64_t t_threads;

static void *one_device(void *arg)
{
	CUdevice d;
	CUcontext c;
	int i = (int)(intptr_t)arg;
	if (cu.cuDeviceGet(&d, i) || cu.cuDevicePrimaryCtxRetain(&c, d) || cu.cuCtxSetCurrent(c))
		return (void *)1;
	printf("  GPU %d: its primary context current after %.1f ms\n", i, (clock_mono_ns() - t_threads) / 1e6);
	return NULL;
}

static int all_devices(void)
{
	char err[256];
	uint64_t t0 = clock_mono_ns();
	int n = 0;
	if (cu_load(&cu, err, sizeof err) || cu.cuInit(0) || cu.cuDeviceGetCount(&n) || n < 1)
		return 1;
	t_threads = clock_mono_ns();
	pthread_t th[64];
	int bad = 0;
	for (int i = 0; i < n && i < 64; i++)
		pthread_create(&th[i], NULL, one_device, (void *)(intptr_t)i);
	for (int i = 0; i < n && i < 64; i++) {
		void *rc;
		pthread_join(th[i], &rc);
		bad |= rc != NULL;
	}
	printf("all %d GPUs in one process: library and cuInit %.1f ms, the contexts %.1f ms: %.1f ms in all\n", n,
	       (t_threads - t0) / 1e6, (clock_mono_ns() - t_threads) / 1e6, (clock_mono_ns() - t0) / 1e6);
	return bad;
}

int main(int argc, char **argv)
{
	char err[256];
	if (argc > 1 && !strcmp(argv[1], "all"))
		return all_devices();
	int gpu = argc > 1 ? atoi(argv[1]) : 0;
	if (argc > 2)
		mode = argv[2];
	uint64_t t[6];
	t[0] = clock_mono_ns();
	if (cu_load(&cu, err, sizeof err)) {
		fprintf(stderr, "%s\n", err);
		return 1;
	}
	t[1] = clock_mono_ns();
	CUdevice d;
	if (cu.cuInit(0))
		return 1;
	t[2] = clock_mono_ns();
	if (cu.cuDeviceGet(&d, gpu))
		return 1;
	t[3] = clock_mono_ns();
	if (cu.cuDevicePrimaryCtxRetain(&ctx, d) || cu.cuCtxSetCurrent(ctx))
		return 1;
	t[4] = clock_mono_ns();
	t_start = clock_mono_ns();
	if (strstr(mode, "threads")) {
		pthread_t th[CP_THREADS];
		void *rc;
		int bad = 0;
		for (int i = 0; i < CP_THREADS; i++)
			pthread_create(&th[i], NULL, thread_pin, NULL);
		for (int i = 0; i < CP_THREADS; i++)
			pthread_join(th[i], &rc), bad |= rc != NULL;
		if (bad)
			return 1;
	} else if (pin(CP_THREADS * 2 * CP_BUF)) {
		return 1;
	}
	t[5] = clock_mono_ns();
	printf("%s: the first thread's buffers after %.1f ms; ", mode, (t_first - t_start) / 1e6);
	printf("GPU %d: library %.1f ms, cuInit %.1f ms, device %.1f ms, primary context %.1f ms, pinned %.0f MiB %.1f ms: "
	       "%.1f ms in all\n", gpu, (t[1] - t[0]) / 1e6, (t[2] - t[1]) / 1e6, (t[3] - t[2]) / 1e6, (t[4] - t[3]) / 1e6,
	       CP_THREADS * 2.0 * CP_BUF / (1 << 20), (t[5] - t[4]) / 1e6, (t[5] - t[0]) / 1e6);
	return 0;
}
