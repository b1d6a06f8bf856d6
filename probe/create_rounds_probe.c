/* create_rounds_probe [ROUNDS [COUNT [MIB [GAP_MS]]]] | __hold SECONDS GIB: does the driver make memory slower in a process
 * that made and freed as much before?  #83 item 1: in the gate's writer rounds, 16 x 1 GiB
 * made by the long-lived processes (the daemon, and the bench's own one-process floor) took
 * 4-7 ms for five rounds, then 15-35 ms from the sixth on, where a fresh process's stayed at
 * 4-7.  Here, with no daemon: ROUNDS rounds of COUNT allocations of MIB each, each round
 * made, exported, imported, mapped, its access set, then all of it undone, GAP_MS apart
 * (default 200; the gate's rounds follow each other in 10-40 ms);
 * three ways by turns: in this process (with its context, as the bench's floor), in this
 * process without the map (create and export only, as the daemon: it has no context), and
 * in a fresh child each round.  Prints each round's time of the making (ms), and after a
 * slash its undoing (the releases).  NO_CHILD=1: without the fresh child (whose start gives
 * the driver a pause), so that GAP_MS 0 makes and frees as fast as the driver lets it.
 * WARM=1: what makes the making fast again after GAP_MS idle (warm_rounds); WARM=2: for
 * how long, and which calls (warm_when).  __hold: another
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

static double undo_ms, first_ms; /* the last round's undoing, and its first allocation's making */

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
		if (!i)
			first_ms = (clock_mono_ns() - t0) / 1e6;
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
	uint64_t t1 = clock_mono_ns();
	for (int i = 0; i < count; i++) {
		if (map) {
			cu.cuMemUnmap(va[i], bytes);
			cu.cuMemAddressFree(va[i], bytes);
		}
		close(fd[i]);
		cu.cuMemRelease(h[i]);
	}
	undo_ms = (clock_mono_ns() - t1) / 1e6;
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

/* WARM=1: after GAP_MS idle, what brings the making back to a fresh process's pace?  Each
 * round, by turns: nothing, 20 ms of the CPU spinning, one 2 MiB allocation made and freed,
 * one 1 GiB made and freed; then COUNT x MIB made and exported (as the daemon makes them). */
static void warm_rounds(int rounds, int count, size_t bytes, useconds_t gap)
{
	static const char *way[] = { "idle", "cpu spun", "2 MiB made", "1 GiB made" };
	CUmemAllocationProp prop = { .type = CU_MEM_ALLOCATION_TYPE_PINNED,
				     .location = { CU_MEM_LOCATION_TYPE_DEVICE, dev },
				     .requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR };
	double t[4][64] = { { 0 } };
	for (int r = 0; r < rounds && r < 64; r++)
		for (int k = 0; k < 4; k++) {
			int w = (r + k) % 4;
			usleep(gap);
			if (w == 1) {
				uint64_t end = clock_mono_ns() + 20000000;
				while (clock_mono_ns() < end)
					;
			} else if (w > 1) {
				CUmemGenericAllocationHandle h;
				CK(cu.cuMemCreate(&h, w == 2 ? 2u << 20 : 1u << 30, &prop, 0));
				CK(cu.cuMemRelease(h));
			}
			t[w][r] = round_once(count, bytes, 0);
		}
	for (int w = 0; w < 4; w++) {
		printf("%-11s", way[w]);
		for (int r = 0; r < rounds && r < 64; r++)
			printf(" %6.2f", t[w][r]);
		printf("\n");
	}
}

/* WARM=2: how long the warmth lasts, and what gives it: after GAP_MS idle, by turns,
 * nothing; 2 MiB made and freed, then 20, 100 or 500 ms idle; 2 MiB made and held, then
 * 200 ms idle; cuMemGetInfo; then COUNT x MIB made and exported.  Prints each way's rounds,
 * and the first allocation's share of them. */
static void warm_when(int rounds, int count, size_t bytes, useconds_t gap)
{
	enum { WAYS = 6 };
	static const char *way[WAYS] = { "idle", "2 MiB, 20 ms", "2 MiB, 100 ms", "2 MiB, 500 ms", "2 MiB held",
					 "cuMemGetInfo" };
	static const useconds_t after[WAYS] = { 0, 20000, 100000, 500000, 200000, 0 };
	CUmemAllocationProp prop = { .type = CU_MEM_ALLOCATION_TYPE_PINNED,
				     .location = { CU_MEM_LOCATION_TYPE_DEVICE, dev },
				     .requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR };
	double t[WAYS][64] = { { 0 } }, f[WAYS][64] = { { 0 } };
	for (int r = 0; r < rounds && r < 64; r++)
		for (int k = 0; k < WAYS; k++) {
			int w = (r + k) % WAYS;
			CUmemGenericAllocationHandle h = 0;
			usleep(gap);
			if (w >= 1 && w <= 4) {
				CK(cu.cuMemCreate(&h, 2u << 20, &prop, 0));
				if (w != 4)
					CK(cu.cuMemRelease(h));
				usleep(after[w]);
			} else if (w == 5) {
				size_t fr, tot;
				CK(cu.cuMemGetInfo(&fr, &tot));
			}
			t[w][r] = round_once(count, bytes, 0);
			f[w][r] = first_ms;
			if (w == 4)
				CK(cu.cuMemRelease(h));
		}
	for (int w = 0; w < WAYS; w++) {
		printf("%-13s", way[w]);
		for (int r = 0; r < rounds && r < 64; r++)
			printf(" %5.2f(%4.2f)", t[w][r], f[w][r]);
		printf("\n");
	}
}

int main(int argc, char **argv)
{
	if (argc > 3 && !strcmp(argv[1], "__hold"))
		return hold(atoi(argv[2]), atoi(argv[3]));
	if (argc > 1 && !strcmp(argv[1], "__child")) { /* one round, mapped, in a fresh process */
		start(1);
		double ms = round_once(atoi(argv[2]), (size_t)atoll(argv[3]), 1);
		printf("%.2f/%.2f\n", ms, undo_ms);
		return 0;
	}
	int rounds = argc > 1 ? atoi(argv[1]) : 15, count = argc > 2 ? atoi(argv[2]) : 16;
	size_t bytes = (size_t)(argc > 3 ? atoll(argv[3]) : 1024) << 20;
	useconds_t gap = (useconds_t)(argc > 4 ? atoi(argv[4]) : 200) * 1000;
	if (count > 256)
		count = 256;
	start(1);
	char cs[16], bs[32];
	snprintf(cs, sizeof cs, "%d", count);
	snprintf(bs, sizeof bs, "%zu", bytes);
	if (getenv("WARM") && !strcmp(getenv("WARM"), "2")) {
		warm_when(rounds, count, bytes, gap);
		return 0;
	}
	if (getenv("WARM")) {
		warm_rounds(rounds, count, bytes, gap);
		return 0;
	}
	printf("round: this process (mapped) / this process (create + export) / a fresh process (mapped), ms made/undone, "
	       "%d x %zu MiB, %u ms apart\n", count, bytes >> 20, gap / 1000);
	for (int r = 0; r < rounds; r++) {
		double a = round_once(count, bytes, 1), ua = undo_ms;
		usleep(gap);
		double b = round_once(count, bytes, 0), ub = undo_ms;
		usleep(gap);
		if (getenv("NO_CHILD")) { /* this process alone, back to back: the driver's own pace */
			printf("%2d: %7.2f/%-6.2f %7.2f/%-6.2f\n", r + 1, a, ua, b, ub);
			continue;
		}
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
		printf("%2d: %7.2f/%-6.2f %7.2f/%-6.2f %13s\n", r + 1, a, ua, b, ub, buf);
		usleep(gap);
	}
	return 0;
}
