/* create_rounds_probe [ROUNDS [COUNT [MIB]]] | __hold SECONDS GIB: does the driver make memory slower in a process
 * that made and freed as much before?  #83 item 1: in the gate's writer rounds, 16 x 1 GiB
 * made by the long-lived processes (the daemon, and the bench's own one-process floor) took
 * 4-7 ms for five rounds, then 15-35 ms from the sixth on, where a fresh process's stayed at
 * 4-7.  Here, with no daemon: ROUNDS rounds of COUNT allocations of MIB each, each round
 * made, exported, imported, mapped, its access set, then all of it undone, 0.2 s apart;
 * three ways by turns: in this process (with its context, as the bench's floor), in this
 * process without the map (create and export only, as the daemon: it has no context), and
 * in a fresh child each round.  Prints each round's time of the making (ms).  __hold: another
 * process's context beside it (run it in the background first), as the daemon's copier's.
 * Temporary.
 *   gcc -O2 -Icommon -I/usr/local/cuda/include probe/create_rounds_probe.c -o build/create_rounds_probe -ldl */
#define _GNU_SOURCE
#include "cuda_api.h"
#include "clock.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static struct cu_api cu;
static CUdevice dev;

#define CK(x) do { CUresult r_ = (x); if (r_) { fprintf(stderr, "%s: %d\n", #x, (int)r_); exit(1); } } while (0)

/* One round: ms of the making (create + export, then with map: import, reserve, map, access). */
static double round_once(int count, size_t bytes, int map)
{
	CUmemAllocationProp prop = { .type = CU_MEM_ALLOCATION_TYPE_PINNED,
				     .location = { CU_MEM_LOCATION_TYPE_DEVICE, dev },
				     .requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR };
	CUmemAccessDesc d = { .location = { CU_MEM_LOCATION_TYPE_DEVICE, dev }, .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE };
	CUmemGenericAllocationHandle h[256];
	CUdeviceptr va[256];
	int fd[256];
	uint64_t t0 = clock_mono_ns();
	for (int i = 0; i < count; i++) {
		CK(cu.cuMemCreate(&h[i], bytes, &prop, 0));
		CK(cu.cuMemExportToShareableHandle(&fd[i], h[i], CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
		if (map) {
			CUmemGenericAllocationHandle imp;
			CK(cu.cuMemImportFromShareableHandle(&imp, (void *)(uintptr_t)fd[i], CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
			CK(cu.cuMemAddressReserve(&va[i], bytes, 0, 0, 0));
			CK(cu.cuMemMap(va[i], bytes, 0, imp, 0));
			CK(cu.cuMemRelease(imp));
			CK(cu.cuMemSetAccess(va[i], bytes, &d, 1));
		}
	}
	double ms = (clock_mono_ns() - t0) / 1e6;
	for (int i = 0; i < count; i++) {
		if (map) {
			cu.cuMemUnmap(va[i], bytes);
			cu.cuMemAddressFree(va[i], bytes);
		}
		close(fd[i]);
		cu.cuMemRelease(h[i]);
	}
	return ms;
}

static void start(int context)
{
	char err[256];
	if (cu_load(&cu, err, sizeof err)) {
		fprintf(stderr, "%s\n", err);
		exit(1);
	}
	CK(cu.cuInit(0));
	CK(cu.cuDeviceGet(&dev, 0));
	if (context) {
		CUcontext ctx;
		CK(cu.cuDevicePrimaryCtxRetain(&ctx, dev));
		CK(cu.cuCtxSetCurrent(ctx));
	}
}

/* Another process with a context, as gmsfs-mover is, holding GIB of host memory (made on the
 * host's NUMA node, mapped, its access set: as the mover keeps the host memory made ahead),
 * for SECONDS. */
static int hold(int seconds, int gib)
{
	start(1);
	int numa = 0;
	cu.cuDeviceGetAttribute(&numa, CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID, dev);
	CUmemAllocationProp prop = { .type = CU_MEM_ALLOCATION_TYPE_PINNED,
				     .location = { CU_MEM_LOCATION_TYPE_HOST_NUMA, numa > 0 ? numa : 0 },
				     .requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR };
	CUmemAccessDesc d = { .location = { CU_MEM_LOCATION_TYPE_DEVICE, dev }, .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE };
	for (int i = 0; i < gib; i++) {
		CUmemGenericAllocationHandle h;
		CUdeviceptr va;
		CK(cu.cuMemCreate(&h, 1ull << 30, &prop, 0));
		CK(cu.cuMemAddressReserve(&va, 1ull << 30, 0, 0, 0));
		CK(cu.cuMemMap(va, 1ull << 30, 0, h, 0));
		CK(cu.cuMemSetAccess(va, 1ull << 30, &d, 1));
	}
	printf("holding\n");
	fflush(stdout);
	sleep((unsigned)seconds);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc > 3 && !strcmp(argv[1], "__hold"))
		return hold(atoi(argv[2]), atoi(argv[3]));
	if (argc > 1 && !strcmp(argv[1], "__child")) { /* one round, mapped, in a fresh process */
		start(1);
		printf("%.2f\n", round_once(atoi(argv[2]), (size_t)atoll(argv[3]), 1));
		return 0;
	}
	int rounds = argc > 1 ? atoi(argv[1]) : 15, count = argc > 2 ? atoi(argv[2]) : 16;
	size_t bytes = (size_t)(argc > 3 ? atoll(argv[3]) : 1024) << 20;
	if (count > 256)
		count = 256;
	start(1);
	char cs[16], bs[32];
	snprintf(cs, sizeof cs, "%d", count);
	snprintf(bs, sizeof bs, "%zu", bytes);
	printf("round: this process (mapped) / this process (create + export) / a fresh process (mapped), ms, %d x %zu MiB\n",
	       count, bytes >> 20);
	for (int r = 0; r < rounds; r++) {
		double a = round_once(count, bytes, 1);
		usleep(200000);
		double b = round_once(count, bytes, 0);
		usleep(200000);
		int p[2];
		if (pipe(p))
			return 1;
		fflush(stdout);
		pid_t pid = fork();
		if (!pid) {
			dup2(p[1], 1);
			execl("/proc/self/exe", argv[0], "__child", cs, bs, (char *)NULL);
			_exit(127);
		}
		close(p[1]);
		char buf[64] = "";
		ssize_t n = read(p[0], buf, sizeof buf - 1);
		close(p[0]);
		waitpid(pid, NULL, 0);
		buf[n > 0 ? n : 0] = '\0';
		buf[strcspn(buf, "\n")] = '\0';
		printf("%2d: %7.2f %7.2f %7s\n", r + 1, a, b, buf);
		usleep(200000);
	}
	return 0;
}
