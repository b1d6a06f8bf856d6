// register_probe DIR N: N x 1 GiB between the GPU and tmpfs files, way by way, a thread a
// file: read()/write() through pinned buffers (what gmsfs-snapshot does) against the
// file's own pages mapped and registered with the driver (cuMemHostRegister), so that the
// copy engines read and write tmpfs's pages with no memcpy.  Diagnostic probe
// (docs/benchmarks.md, "Snapshots"):
//   nvcc -O2 -o /tmp/rp probe/register_probe.cu -lcuda -lpthread && /tmp/rp /mnt/tmpfs 16
#include <cuda.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
#define CK(x) do { CUresult r_ = (x); if (r_) { const char *s; cuGetErrorName(r_, &s); printf("%s: %s\n", #x, s); exit(1);} } while (0)
static const size_t G = 1ull << 30, CH = 2ull << 20;
static const char *dir;
static int n, way;
static CUcontext ctx;
static CUdeviceptr dev;
static double t_reg[64], t_copy[64];
static double now() { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec / 1e9; }
static void *work(void *arg) {
	long i = (long)arg;
	CK(cuCtxSetCurrent(ctx));
	char path[512]; snprintf(path, sizeof path, "%s/rp.%ld", dir, i);
	CUstream s; CK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
	int save = way == 0 || way == 2;
	int fd = open(path, save ? O_RDWR | O_CREAT | O_TRUNC : O_RDONLY, 0600);
	if (fd < 0) { perror(path); exit(1); }
	double t0 = now();
	if (way < 2) { // through two pinned buffers of 2 MiB
		char *b; CK(cuMemHostAlloc((void **)&b, 2 * CH, 0));
		for (size_t at = 0, k = 0; at < G; at += CH, k ^= 1) {
			char *p = b + k * CH;
			if (save) { CK(cuMemcpyDtoH(p, dev + i * G + at, CH)); if (pwrite(fd, p, CH, at) != (ssize_t)CH) perror("w"); }
			else { if (pread(fd, p, CH, at) != (ssize_t)CH) perror("r"); CK(cuMemcpyHtoDAsync(dev + i * G + at, p, CH, s)); CK(cuStreamSynchronize(s)); }
		}
		t_copy[i] = now() - t0;
		cuMemFreeHost(b);
	} else { // the file's pages registered
		if (save && ftruncate(fd, G)) perror("ftruncate");
		char *m = (char *)mmap(NULL, G, save ? PROT_READ | PROT_WRITE : PROT_READ, MAP_SHARED | MAP_POPULATE, fd, 0);
		if (m == MAP_FAILED) { perror("mmap"); exit(1); }
		CUresult r = cuMemHostRegister(m, G, save ? 0 : CU_MEMHOSTREGISTER_READ_ONLY);
		if (r) { const char *e; cuGetErrorName(r, &e); printf("cuMemHostRegister: %s\n", e); exit(1); }
		t_reg[i] = now() - t0;
		double t1 = now();
		if (save) CK(cuMemcpyDtoHAsync(m, dev + i * G, G, s)); else CK(cuMemcpyHtoDAsync(dev + i * G, m, G, s));
		CK(cuStreamSynchronize(s));
		t_copy[i] = now() - t1;
		CK(cuMemHostUnregister(m));
		munmap(m, G);
	}
	close(fd);
	cuStreamDestroy(s);
	return NULL;
}
int main(int argc, char **argv) {
	dir = argv[1]; n = atoi(argv[2]);
	CK(cuInit(0)); CUdevice d; CK(cuDeviceGet(&d, 0)); CK(cuDevicePrimaryCtxRetain(&ctx, d)); CK(cuCtxSetCurrent(ctx));
	CK(cuMemAlloc(&dev, n * G)); CK(cuMemsetD8(dev, 7, n * G)); CK(cuCtxSynchronize());
	const char *what[] = { "save: D2H to pinned, pwrite", "restore: pread to pinned, H2D",
			       "save: file mapped, MAP_POPULATE, registered, D2H into it", "restore: file mapped, registered read-only, H2D" };
	int order[] = { 0, 1, 2, 3, 0, 1, 2, 3 };
	for (int k = 0; k < 8; k++) {
		way = order[k];
		pthread_t t[64];
		double t0 = now();
		for (long i = 0; i < n; i++) pthread_create(&t[i], NULL, work, (void *)i);
		for (int i = 0; i < n; i++) pthread_join(t[i], NULL);
		double s = now() - t0, reg = 0, cp = 0;
		for (int i = 0; i < n; i++) { reg = t_reg[i] > reg ? t_reg[i] : reg; cp = t_copy[i] > cp ? t_copy[i] : cp; }
		printf("%-58s %d GiB: %.3f s, %.1f GB/s (slowest thread: registering %.3f s, copying %.3f s)\n", what[way], n, s, n * G / s / 1e9, reg, cp);
		fflush(stdout);
		memset(t_reg, 0, sizeof t_reg);
	}
	return 0;
}
