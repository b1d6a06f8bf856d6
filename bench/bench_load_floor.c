/* bench-load-floor FILE: the raw driver loop that gmsfs-load is measured against.  A fresh
 * process makes its CUDA context, allocates pinned buffers and device memory with
 * cuMemAlloc, and copies FILE to the GPU with the loader's threads and chunk size (pread
 * into two pinned buffers per thread, one stream per buffer): no store, no metadata, no
 * headers.  Prints "context_ms total_ms bytes". */
#include "cuda_api.h"

#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define CHUNK (2ull << 20) /* as loader/copy.c */
#define THREADS 14

static struct cu_api cu;
static CUcontext ctx;
static CUdeviceptr dev;
static char *pinned;
static int fd;
static uint64_t size;
static atomic_uint_fast64_t next;

#define CU(x) CU_MUST(&cu, x)

static double now_ms(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static void *worker(void *arg)
{
	size_t me = (size_t)(uintptr_t)arg;
	char *buf[2] = { pinned + 2 * me * CHUNK, pinned + (2 * me + 1) * CHUNK };
	CUstream st[2];
	CU(cu.cuCtxSetCurrent(ctx));
	CU(cu.cuStreamCreate(&st[0], CU_STREAM_NON_BLOCKING));
	CU(cu.cuStreamCreate(&st[1], CU_STREAM_NON_BLOCKING));
	for (int b = 0;; b ^= 1) {
		uint64_t off = atomic_fetch_add(&next, CHUNK);
		if (off >= size)
			break;
		uint64_t n = size - off < CHUNK ? size - off : CHUNK;
		CU(cu.cuStreamSynchronize(st[b]));
		for (uint64_t d = 0; d < n;) {
			ssize_t r = pread(fd, buf[b] + d, n - d, (off_t)(off + d));
			if (r <= 0) {
				perror("bench-load-floor: read");
				exit(1);
			}
			d += (uint64_t)r;
		}
		CU(cu.cuMemcpyHtoDAsync(dev + off, buf[b], n, st[b]));
	}
	for (int b = 0; b < 2; b++) {
		CU(cu.cuStreamSynchronize(st[b]));
		CU(cu.cuStreamDestroy(st[b]));
	}
	return NULL;
}

int main(int argc, char **argv)
{
	double t0 = now_ms();
	char err[256];
	struct stat s;
	if (argc != 2 || (fd = open(argv[1], O_RDONLY)) < 0 || fstat(fd, &s)) {
		fprintf(stderr, "usage: bench-load-floor FILE\n");
		return 2;
	}
	size = (uint64_t)s.st_size;
	if (cu_load(&cu, err, sizeof err)) {
		fprintf(stderr, "bench-load-floor: %s\n", err);
		return 1;
	}
	CU(cu_primary_ctx(&cu, 0, NULL, &ctx));
	CU(cu.cuMemHostAlloc((void **)&pinned, THREADS * 2 * CHUNK, 0));
	double t_ctx = now_ms(); /* context and pinned buffers: what gmsfs-load -v calls "device opened" */
	CU(cu.cuMemAlloc(&dev, size ? size : 1));
	pthread_t t[THREADS];
	for (size_t i = 0; i < THREADS; i++)
		pthread_create(&t[i], NULL, worker, (void *)(uintptr_t)i);
	for (size_t i = 0; i < THREADS; i++)
		pthread_join(t[i], NULL);
	printf("%.3f %.3f %llu\n", t_ctx - t0, now_ms() - t0, (unsigned long long)size);
	return 0;
}
