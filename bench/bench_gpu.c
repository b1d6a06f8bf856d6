/* bench-gpu MOUNT [RUNS]: what an engine meets on the cuda backend, against the driver
 * floor measured in the same run, for 1000 x 2 MiB, 128 x 64 MiB, 16 x 1 GiB and the
 * tensors of Llama-3-8B (291, bf16).  Every timed import runs in a freshly exec'd
 * process, as an engine imports once after it starts; its CUDA context is made first
 * and reported apart.
 *
 *   floor      a fresh process receives the layout's descriptors from another process
 *              over SCM_RIGHTS (untimed), then imports, reserves, maps and sets
 *              read-only access for each (timed)
 *   import     a fresh process: gmsfs_import_all on a connected reader
 *   connect    the same, gmsfs_connect included
 *   per-file   a fresh process imports each allocation by name
 *   writer     gmsfs_create (create + map) per allocation, and gmsfs_create_many for
 *              all of them, against their own floor in the same process: cuMemCreate +
 *              export + import + reserve + map + access per allocation (medians of 5);
 *              and the same driver calls split as gmsfs splits them, since the daemon
 *              owns the memory: a fresh process with no context creates and exports,
 *              hands the fd over a socket, and the writer imports, reserves, maps and
 *              sets access, one allocation at a time; each of them timed once the device
 *              has its free memory back (the step before's releases done)
 *   metadata   a bulk put of one entry per allocation, per entry
 * Before the runs, a daemon that makes host memory ahead (-o host_ahead, the default) is
 * left to make the store's (settle): its pinning and first use are not a reader's import
 * (probe/ahead_tail_probe.sh measures readers beside them).
 * Medians of RUNS (default 5; per-file in the first PERFILE_RUNS only), the floor and the
 * import by turns, each first in every other run; ratios to the floor of the same runs, and
 * for the gate the fastest import and remap over the fastest floor of the same runs.
 *
 * bench-gpu floor STORE [RUNS]: the floor alone, for a store that exists (ms). */
#include <gmsfs/gmsfs.h>

#include "bench.h"
#include "cuda_api.h"
#include "fetch.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define PERFILE_RUNS 5
/* The writer's rounds: create, create_many, its floor and the split floor, by turns; the gate
 * takes the median of the rounds' ratios (a round now and then pays for the release before:
 * 16 GiB made again took 17-38 ms where it takes 4-6).  16 x 1 GiB, whose rounds take 5 ms,
 * has three times as many. */
#define WRITER_ROUNDS 5
#define WRITER_ROUNDS_MAX (3 * WRITER_ROUNDS)

static struct cu_api cu;
static CUdevice dev;
static const char *self;

#define CU(x) CU_MUST(&cu, x)
#define TRY(g, x)                                                                              \
	do {                                                                                   \
		int e_ = (x);                                                                  \
		if (e_) {                                                                      \
			fprintf(stderr, "bench-gpu: %s: %s (%s)\n", #x, gmsfs_strerror(e_),    \
				(g) ? gmsfs_errmsg(g) : "");                                   \
			exit(1);                                                               \
		}                                                                              \
	} while (0)

/* The context of a fresh process: its cost is reported apart. */
static double context(void)
{
	char err[256];
	double t0 = now_ms();
	if (cu_load(&cu, err, sizeof err)) {
		fprintf(stderr, "bench-gpu: %s\n", err);
		exit(1);
	}
	CU(cu_primary_ctx(&cu, 0, &dev, NULL));
	return now_ms() - t0;
}

/* ---- the children: one measurement each, "ctx=.. a=.. b=.." on stdout ---- */

/* k descriptors (at most GMSFS_FDS_PER_MSG) and their aligned sizes in one message of
 * a SOCK_SEQPACKET socket. */
static void send_fds(int sock, const int *fds, const uint64_t *sizes, size_t k)
{
	if (fdpass_send(sock, sizes, k * sizeof *sizes, fds, k)) {
		perror("bench-gpu: sending descriptors");
		exit(1);
	}
}

/* One message of send_fds: how many came (fds and sizes have room for GMSFS_FDS_PER_MSG). */
static size_t recv_fds(int sock, int *fds, uint64_t *sizes)
{
	struct fdpass_info info;
	if (fdpass_recv(sock, sizes, GMSFS_FDS_PER_MSG * sizeof *sizes, fds, GMSFS_FDS_PER_MSG, &info) <= 0 ||
	    !info.nfds) {
		fprintf(stderr, "bench-gpu: no descriptors came\n");
		exit(1);
	}
	return info.nfds;
}

static int child_floor(int sock)
{
	double ctx = context();
	size_t n;
	if (recv(sock, &n, sizeof n, 0) != sizeof n)
		return 1;
	int *fds = calloc(n, sizeof *fds);
	uint64_t *aligned = calloc(n, sizeof *aligned);
	for (size_t got = 0; got < n;) {
		int f[GMSFS_FDS_PER_MSG];
		uint64_t sizes[GMSFS_FDS_PER_MSG];
		size_t k = recv_fds(sock, f, sizes);
		if (k > n - got)
			return 1;
		memcpy(fds + got, f, k * sizeof *f);
		memcpy(aligned + got, sizes, k * sizeof *sizes);
		got += k;
	}
	CUdeviceptr *va = calloc(n, sizeof *va);
	CUmemAccessDesc d = { .location = { CU_MEM_LOCATION_TYPE_DEVICE, dev }, .flags = CU_MEM_ACCESS_FLAGS_PROT_READ };
	double t0 = now_ms();
	for (size_t i = 0; i < n; i++) {
		CUmemGenericAllocationHandle h;
		CU(cu.cuMemImportFromShareableHandle(&h, (void *)(uintptr_t)fds[i], CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
		CU(cu.cuMemAddressReserve(&va[i], aligned[i], 0, 0, 0));
		CU(cu.cuMemMap(va[i], aligned[i], 0, h, 0));
		CU(cu.cuMemRelease(h));
		CU(cu.cuMemSetAccess(va[i], aligned[i], &d, 1));
	}
	double t1 = now_ms();
	/* The remap cycle's floor: unmap everything (the reservations stay), then import,
	 * map and set the access again from the same descriptors. */
	for (size_t i = 0; i < n; i++)
		CU(cu.cuMemUnmap(va[i], aligned[i]));
	for (size_t i = 0; i < n; i++) {
		CUmemGenericAllocationHandle h;
		CU(cu.cuMemImportFromShareableHandle(&h, (void *)(uintptr_t)fds[i], CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
		CU(cu.cuMemMap(va[i], aligned[i], 0, h, 0));
		CU(cu.cuMemRelease(h));
		CU(cu.cuMemSetAccess(va[i], aligned[i], &d, 1));
	}
	printf("ctx=%.3f a=%.3f b=0 c=%.3f\n", ctx, t1 - t0, now_ms() - t1);
	return 0;
}

/* The creating half of the split writer loop, as the daemon is: no context; makes
 * and exports one allocation per size asked for, keeps them until the socket closes. */
static int child_creator(int sock)
{
	char err[256];
	if (cu_load(&cu, err, sizeof err))
		return 1;
	CU(cu.cuInit(0));
	CU(cu.cuDeviceGet(&dev, 0));
	CUmemAllocationProp prop = { .type = CU_MEM_ALLOCATION_TYPE_PINNED,
				     .location = { CU_MEM_LOCATION_TYPE_DEVICE, dev },
				     .requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR };
	size_t gran = 0, n = 0, cap = 0;
	CU(cu.cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
	CUmemGenericAllocationHandle *h = NULL;
	uint64_t size;
	while (recv(sock, &size, sizeof size, 0) == sizeof size) {
		if (n == cap && !(h = realloc(h, (cap = cap ? 2 * cap : 64) * sizeof *h)))
			return 1;
		int fd;
		uint64_t aligned = (size + gran - 1) / gran * gran;
		CU(cu.cuMemCreate(&h[n], aligned, &prop, 0));
		CU(cu.cuMemExportToShareableHandle(&fd, h[n++], CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
		send_fds(sock, &fd, &aligned, 1); /* fd is kept, as the daemon keeps it */
	}
	for (size_t i = 0; i < n; i++)
		cu.cuMemRelease(h[i]);
	free(h);
	return 0;
}

static int child_import(const char *store)
{
	double ctx = context();
	gmsfs *g;
	double t0 = now_ms();
	TRY(NULL, gmsfs_connect(&g, store, GMSFS_RO, 10000));
	double t1 = now_ms();
	/* GMSFS_BENCH_SETTLE_MS: a pause before the import (a probe: the channel's bind, sent
	 * at connect, then done; the connect + import figure then counts it). */
	const char *settle = getenv("GMSFS_BENCH_SETTLE_MS");
	if (settle) {
		usleep((useconds_t)(atoi(settle) * 1000));
		t1 = now_ms();
	}
	TRY(g, gmsfs_import_all(g));
	double t2 = now_ms();
	TRY(g, gmsfs_unmap_all(g)); /* the remap cycle: the lock given back, taken, the same addresses */
	TRY(g, gmsfs_remap_all(g, 10000));
	printf("ctx=%.3f a=%.3f b=%.3f c=%.3f\n", ctx, t2 - t1, t2 - t0, now_ms() - t2);
	gmsfs_disconnect(g);
	return 0;
}

static int child_perfile(const char *store, int count)
{
	double ctx = context();
	gmsfs *g;
	TRY(NULL, gmsfs_connect(&g, store, GMSFS_RO, 10000));
	double t0 = now_ms();
	for (int i = 0; i < count; i++) {
		char name[32];
		void *p;
		snprintf(name, sizeof name, "t%05d", i);
		TRY(g, gmsfs_import(g, name, &p));
	}
	printf("ctx=%.3f a=%.3f b=0 c=0\n", ctx, now_ms() - t0);
	gmsfs_disconnect(g);
	return 0;
}

/* ---- the parent ---- */

struct result {
	double ctx, a, b, c;
};

/* Run this program again as a child; with fetched, hand it the store's descriptors. */
static struct result run_child(char *const argv[], const struct fetched *fetched)
{
	int out[2], sp[2] = { -1, -1 };
	if (pipe(out) || (fetched && socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sp)))
		exit(1);
	pid_t pid = fork();
	if (pid == 0) {
		dup2(out[1], 1);
		if (fetched) {
			char fd[16];
			snprintf(fd, sizeof fd, "%d", sp[1]);
			execl(self, self, "__floor", fd, (char *)NULL);
		}
		execv(self, argv);
		_exit(127);
	}
	close(out[1]);
	if (fetched) {
		close(sp[1]);
		send(sp[0], &fetched->n, sizeof fetched->n, 0);
		for (size_t i = 0; i < fetched->n; i += GMSFS_FDS_PER_MSG) {
			size_t k = fetched->n - i < GMSFS_FDS_PER_MSG ? fetched->n - i : GMSFS_FDS_PER_MSG;
			send_fds(sp[0], fetched->fds + i, fetched->aligned + i, k);
		}
		close(sp[0]);
	}
	char buf[256] = "";
	ssize_t n = read(out[0], buf, sizeof buf - 1);
	close(out[0]);
	int st;
	waitpid(pid, &st, 0);
	struct result r = { -1, -1, -1, -1 };
	if (n <= 0 || !WIFEXITED(st) || WEXITSTATUS(st) ||
	    sscanf(buf, "ctx=%lf a=%lf b=%lf c=%lf", &r.ctx, &r.a, &r.b, &r.c) != 4) {
		fprintf(stderr, "bench-gpu: child %s failed\n", argv[1]);
		exit(1);
	}
	return r;
}

/* The writer's floor: create + export + import + reserve + map + access in one process. */
static double writer_floor(const uint64_t *sizes, int count)
{
	CUmemAllocationProp prop = { .type = CU_MEM_ALLOCATION_TYPE_PINNED,
				     .location = { CU_MEM_LOCATION_TYPE_DEVICE, dev },
				     .requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR };
	CUmemAccessDesc d = { .location = { CU_MEM_LOCATION_TYPE_DEVICE, dev }, .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE };
	size_t gran = 0;
	CU(cu.cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
	CUmemGenericAllocationHandle *h = calloc((size_t)count, sizeof *h);
	CUdeviceptr *va = calloc((size_t)count, sizeof *va);
	int *fd = calloc((size_t)count, sizeof *fd);
	uint64_t *al = calloc((size_t)count, sizeof *al);
	double t0 = now_ms();
	for (int i = 0; i < count; i++) {
		CUmemGenericAllocationHandle imp;
		al[i] = (sizes[i] + gran - 1) / gran * gran;
		CU(cu.cuMemCreate(&h[i], al[i], &prop, 0));
		CU(cu.cuMemExportToShareableHandle(&fd[i], h[i], CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
		CU(cu.cuMemImportFromShareableHandle(&imp, (void *)(uintptr_t)fd[i], CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
		CU(cu.cuMemAddressReserve(&va[i], al[i], 0, 0, 0));
		CU(cu.cuMemMap(va[i], al[i], 0, imp, 0));
		CU(cu.cuMemRelease(imp));
		CU(cu.cuMemSetAccess(va[i], al[i], &d, 1));
	}
	double t = now_ms() - t0;
	for (int i = 0; i < count; i++) {
		cu.cuMemUnmap(va[i], al[i]);
		cu.cuMemAddressFree(va[i], al[i]);
		cu.cuMemRelease(h[i]);
		close(fd[i]);
	}
	free(h), free(va), free(fd), free(al);
	return t;
}

/* One allocation of the split: ask the creator, import, reserve, map, access. */
static void split_one(int sock, uint64_t size, CUdeviceptr *va, uint64_t *al)
{
	CUmemAccessDesc d = { .location = { CU_MEM_LOCATION_TYPE_DEVICE, dev }, .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE };
	CUmemGenericAllocationHandle h;
	if (send(sock, &size, sizeof size, 0) != sizeof size)
		exit(1);
	int f[GMSFS_FDS_PER_MSG];
	uint64_t sizes[GMSFS_FDS_PER_MSG];
	if (recv_fds(sock, f, sizes) != 1)
		exit(1);
	int fd = f[0];
	*al = sizes[0];
	CU(cu.cuMemImportFromShareableHandle(&h, (void *)(uintptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
	CU(cu.cuMemAddressReserve(va, *al, 0, 0, 0));
	CU(cu.cuMemMap(*va, *al, 0, h, 0));
	CU(cu.cuMemRelease(h));
	CU(cu.cuMemSetAccess(*va, *al, &d, 1));
	close(fd);
}

/* The writer's calls split over two processes: a creator (child_creator) makes each
 * allocation on request and hands its fd over; this process imports, reserves, maps and
 * sets access.  One allocation first, untimed: the daemon it stands for is warm, a fresh
 * process is not; then as long a pause as every other timing has before it (pause_us), so
 * that each starts from the same state of the driver's (quiet_device). */
static double writer_split(const uint64_t *sizes, int count, useconds_t pause)
{
	int sp[2];
	if (socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sp))
		exit(1);
	pid_t pid = fork();
	if (pid == 0) {
		char fd[16];
		close(sp[0]);
		snprintf(fd, sizeof fd, "%d", sp[1]);
		execl(self, self, "__creator", fd, (char *)NULL);
		_exit(127);
	}
	close(sp[1]);
	CUdeviceptr *va = calloc((size_t)count + 1, sizeof *va);
	uint64_t *al = calloc((size_t)count + 1, sizeof *al);
	split_one(sp[0], sizes[0], &va[count], &al[count]);
	usleep(pause);
	double t0 = now_ms();
	for (int i = 0; i < count; i++)
		split_one(sp[0], sizes[i], &va[i], &al[i]);
	double t = now_ms() - t0;
	for (int i = 0; i <= count; i++) {
		cu.cuMemUnmap(va[i], al[i]);
		cu.cuMemAddressFree(va[i], al[i]);
	}
	close(sp[0]);
	int st;
	if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st)) {
		fprintf(stderr, "bench-gpu: the creator process failed\n");
		exit(1);
	}
	free(va), free(al);
	return t;
}

/* A writer's create + map of the layout under scratch names (freed after, untimed). */
static double time_create(gmsfs *w, const uint64_t *sizes, int count, bool many)
{
	struct gmsfs_new *v = calloc((size_t)count, sizeof *v);
	char (*names)[32] = calloc((size_t)count, sizeof *names);
	for (int i = 0; i < count; i++) {
		snprintf(names[i], sizeof names[i], "scratch/%05d", i);
		v[i] = (struct gmsfs_new){ .name = names[i], .size = sizes[i], .tag = "weights" };
	}
	double t0 = now_ms();
	if (many)
		TRY(w, gmsfs_create_many(w, v, (size_t)count));
	else
		for (int i = 0; i < count; i++)
			TRY(w, gmsfs_create(w, v[i].name, v[i].size, v[i].tag, &v[i].ptr));
	double t = now_ms() - t0;
	for (int i = 0; i < count; i++)
		TRY(w, gmsfs_free(w, v[i].ptr));
	free(v), free(names);
	return t;
}

static void line(const char *what, double ms, double floor, int count)
{
	printf("  %-44s %9.2f ms  %5.2fx  %7.1f us/alloc\n", what, ms, ms / floor, ms * 1e3 / count);
}

/* A field of MOUNT/device ("NAME: VALUE"), into buf; false if none. */
static bool device_field(const char *mnt, const char *name, char *buf, size_t len)
{
	char path[4096], line[1024];
	snprintf(path, sizeof path, "%s/device", mnt);
	FILE *f = fopen(path, "r");
	bool found = false;
	size_t n = strlen(name);
	while (f && !found && fgets(line, sizeof line, f))
		if (!strncmp(line, name, n) && line[n] == ':' && line[n + 1] == ' ') {
			snprintf(buf, len, "%s", line + n + 2);
			buf[strcspn(buf, "\n")] = '\0';
			found = true;
		}
	if (f)
		fclose(f);
	return found;
}

/* With host memory made ahead (the mount's options say host_ahead), wait until the daemon
 * has made bytes of it and released what went before (a store removed: its pinned memory),
 * at most 30 s; says how long it took. */
static void settle(const char *mnt, uint64_t bytes)
{
	char opts[1024], standby[64] = "?";
	if (!device_field(mnt, "options", opts, sizeof opts) || !strstr(opts, "host_ahead") ||
	    strstr(opts, "no_host_ahead"))
		return;
	double t0 = now_ms();
	char going[64] = "0";
	while (now_ms() - t0 < 30000 && device_field(mnt, "host_standby_bytes", standby, sizeof standby) &&
	       (strtoull(standby, NULL, 10) < bytes ||
		(device_field(mnt, "releasing_bytes", going, sizeof going) && strcmp(going, "0"))))
		usleep(20000);
	printf("  (the daemon's host memory made ahead of the store after %.1f s: %s of %llu bytes)\n",
	       (now_ms() - t0) / 1e3, standby, (unsigned long long)bytes);
}

/* The daemon's releases done (the device file's releasing_bytes 0: a store removed gives
 * back gigabytes of pinned host memory) and the device's free memory back to free0 (within
 * 256 MiB: a creator process's end), at most 3 s: what the step before freed is released
 * before the next is timed, so that no writer figure pays for another's release.  Then a
 * pause for what the driver does after a release, behind it: made and freed back to back,
 * 16 x 1 GiB took 1.7-3.3 ms to make for five rounds, then 25-35 ms from the sixth on, once
 * the device's free memory had been made and freed once over (probe/create_rounds_probe.c,
 * NO_CHILD=1, GAP_MS 0, H200); the split floor's creator, a fresh process, gets that pause
 * from its own start (its cuInit and context), so every timing gets as much (pause_us).
 * And in a process that released memory, the first cuMemCreate 50 ms or more later paid
 * 4-6 ms more, unless a small allocation was made and freed in between (WARM=2): the daemon
 * does that 100 ms after its releases (vmm.h, settle), the fresh creator never released
 * any, and this process does it for its own floor (prime). */
static useconds_t pause_us(uint64_t bytes)
{
	return (useconds_t)(120000 + bytes / 200000); /* 120 ms, and a millisecond per 200 MB freed */
}

static void prime(void)
{
	CUmemAllocationProp prop = { .type = CU_MEM_ALLOCATION_TYPE_PINNED,
				     .location = { CU_MEM_LOCATION_TYPE_DEVICE, dev },
				     .requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR };
	CUmemGenericAllocationHandle h;
	if (cu.cuMemCreate(&h, 2u << 20, &prop, 0) == CUDA_SUCCESS)
		cu.cuMemRelease(h);
}

static void quiet_device(const char *mnt, size_t free0, uint64_t bytes)
{
	double t0 = now_ms();
	size_t fr = 0, total = 0;
	char going[64] = "0";
	while (now_ms() - t0 < 3000 && ((device_field(mnt, "releasing_bytes", going, sizeof going) && strcmp(going, "0")) ||
					 (!cu.cuMemGetInfo(&fr, &total) && fr + (256u << 20) < free0)))
		usleep(1000);
	usleep(100000); /* the driver's work behind the releases done, as the daemon waits for it */
	prime();
	usleep(pause_us(bytes) - 100000);
}

/* Whether GMSFS_BENCH_ONLY (only; NULL: every layout) names label. */
static bool wanted(const char *only, const char *label)
{
	size_t n = strlen(label);
	for (const char *p = only; p && *p; p += strcspn(p, ","), p += *p == ',')
		if (!strncmp(p, label, n) && (p[n] == ',' || !p[n]))
			return true;
	return !only;
}

/* The daemon's copy helper (gmsfs-mover, its child) running: its pid, else 0. */
static long mover_pid(const char *mnt)
{
	char buf[64], path[64], stat[512];
	if (!device_field(mnt, "pid", buf, sizeof buf))
		return 0;
	long daemon = atol(buf);
	snprintf(path, sizeof path, "/proc/%ld/task/%ld/children", daemon, daemon);
	FILE *f = fopen(path, "r");
	long pid = 0, found = 0;
	while (f && !found && fscanf(f, "%ld", &pid) == 1) {
		snprintf(path, sizeof path, "/proc/%ld/stat", pid);
		FILE *s = fopen(path, "r");
		if (s && fgets(stat, sizeof stat, s) && strstr(stat, "(gmsfs-mover)"))
			found = pid;
		if (s)
			fclose(s);
	}
	if (f)
		fclose(f);
	return found;
}

/* GMSFS_BENCH_TRACE: one writer timing and what the daemon was doing around it. */
static void trace_round(const char *mnt, int r, int k, double ms, double t_layout)
{
	static const char *what[] = { "create", "many", "floor", "split" };
	char used[32] = "?", host[32] = "?", standby[32] = "?", going[32] = "?";
	device_field(mnt, "used_bytes", used, sizeof used);
	device_field(mnt, "host_used_bytes", host, sizeof host);
	device_field(mnt, "host_standby_bytes", standby, sizeof standby);
	device_field(mnt, "releasing_bytes", going, sizeof going);
	size_t fr = 0, total = 0;
	cu.cuMemGetInfo(&fr, &total);
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	printf("#   round %2d %-6s %8.2f ms at +%.2f s (%ld.%03ld): used %s host %s standby %s releasing %s free %zu MiB "
	       "mover %ld\n", r, what[k], ms, (now_ms() - t_layout) / 1e3, (long)ts.tv_sec, ts.tv_nsec / 1000000, used,
	       host, standby, going, fr >> 20, mover_pid(mnt));
	fflush(stdout);
}

static void layout(const char *mnt, const char *label, const uint64_t *sizes, int count, int runs, int rounds)
{
	char store[4096];
	snprintf(store, sizeof store, "%s/bench-%s", mnt, label);
	if (mkdir(store, 0755) < 0 && errno != EEXIST) {
		perror(store);
		exit(1);
	}
	/* The writer, and its floor beside it. */
	gmsfs *w;
	TRY(NULL, gmsfs_connect(&w, store, GMSFS_RW, 10000));
	double wf[WRITER_ROUNDS_MAX], wc[WRITER_ROUNDS_MAX], wm[WRITER_ROUNDS_MAX], w2[WRITER_ROUNDS_MAX];
	double rc[WRITER_ROUNDS_MAX], rmany[WRITER_ROUNDS_MAX]; /* each round's create and create_many over its split */
	size_t free0 = 0, device_total = 0;
	CU(cu.cuMemGetInfo(&free0, &device_total));
	const char *tr = getenv("GMSFS_BENCH_TRACE");
	bool trace = tr && *tr && strcmp(tr, "0");
	double t_layout = now_ms();
	uint64_t layout_bytes = 0;
	for (int i = 0; i < count; i++)
		layout_bytes += sizes[i];
	for (int r = 0; r < rounds; r++) {
		/* Each round starts at another of the four: the first after a release pays most. */
		for (int k = 0; k < 4; k++) {
			quiet_device(mnt, free0, layout_bytes);
			double *at = NULL;
			switch ((r + k) % 4) {
			case 0: *(at = &wc[r]) = time_create(w, sizes, count, false); break;
			case 1: *(at = &wm[r]) = time_create(w, sizes, count, true); break;
			case 2: *(at = &wf[r]) = writer_floor(sizes, count); break;
			default: *(at = &w2[r]) = writer_split(sizes, count, pause_us(layout_bytes));
			}
			if (trace)
				trace_round(mnt, r, (r + k) % 4, *at, t_layout);
		}
		rc[r] = wc[r] / w2[r];
		rmany[r] = wm[r] / w2[r];
	}
	char said[WRITER_ROUNDS_MAX * 48] = "";
	for (int r = 0, n = 0; r < rounds; r++) /* in the order they ran: median() sorts */
		n += snprintf(said + n, sizeof said - (size_t)n, "%s %.2f %.2f %.2f %.2f", r ? ";" : "", wc[r], wm[r], wf[r],
			      w2[r]);
	double t_create = median(wc, rounds), t_many = median(wm, rounds), t_wfloor = median(wf, rounds);
	double t_two = median(w2, rounds), r_create = median(rc, rounds), r_many = median(rmany, rounds);
	struct gmsfs_new *v = calloc((size_t)count, sizeof *v);
	char (*names)[32] = calloc((size_t)count, sizeof *names);
	for (int i = 0; i < count; i++) {
		snprintf(names[i], sizeof names[i], "t%05d", i);
		v[i] = (struct gmsfs_new){ .name = names[i], .size = sizes[i], .tag = "weights" };
	}
	TRY(w, gmsfs_create_many(w, v, (size_t)count));
	free(v), free(names);
	const struct gmsfs_mapping *m;
	size_t nm = gmsfs_mappings(w, &m);
	for (size_t i = 0; i < nm; i++)
		CU(cu.cuMemsetD8((CUdeviceptr)(uintptr_t)m[i].ptr, (unsigned char)i, m[i].aligned));
	CU(cu.cuCtxSynchronize());
	struct gmsfs_entry *e = calloc((size_t)count, sizeof *e);
	char (*keys)[48] = calloc((size_t)count, sizeof *keys);
	for (int i = 0; i < count; i++) {
		snprintf(keys[i], sizeof keys[i], "tensors/t%05d", i);
		e[i] = (struct gmsfs_entry){ .key = keys[i], .alloc = m[i].name, .size = sizes[i],
					     .value = "{\"dtype\":\"bfloat16\",\"shape\":[4096,4096]}", .value_len = 40 };
	}
	double t0 = now_ms();
	TRY(w, gmsfs_meta_put_many(w, e, (size_t)count));
	double t_meta = now_ms() - t0;
	TRY(w, gmsfs_commit(w));
	uint64_t total = 0;
	for (size_t i = 0; i < nm; i++)
		total += m[i].aligned;
	gmsfs_disconnect(w);
	free(e);
	free(keys);
	settle(mnt, total);

	double *tf = calloc((size_t)runs, sizeof(double)), *ti = calloc((size_t)runs, sizeof(double));
	double *tc = calloc((size_t)runs, sizeof(double)), *tp = calloc((size_t)runs, sizeof(double));
	double *cx = calloc((size_t)runs, sizeof(double));
	double *rf = calloc((size_t)runs, sizeof(double)), *rm = calloc((size_t)runs, sizeof(double));
	double *qi = calloc((size_t)runs, sizeof(double)), *qr = calloc((size_t)runs, sizeof(double));
	char countarg[16];
	snprintf(countarg, sizeof countarg, "%d", count);
	for (int r = 0; r < runs; r++) {
		struct fetched f;
		if (fetch_all(store, &f)) {
			fprintf(stderr, "bench-gpu: fetching the descriptors of %s failed\n", store);
			exit(1);
		}
		/* The floor and the import by turns, each first in every other run: a process's
		 * end (its context torn down) must not weigh on one side only. */
		char *none[] = { (char *)self, "__floor", NULL };
		char *imp[] = { (char *)self, "__import", store, NULL };
		struct result fr, ir;
		if (r % 2)
			ir = run_child(imp, NULL);
		fr = run_child(none, &f);
		fetched_free(&f);
		if (!(r % 2))
			ir = run_child(imp, NULL);
		/* Per-file imports are said, not gated: a few runs of them are enough. */
		if (r < PERFILE_RUNS) {
			char *per[] = { (char *)self, "__perfile", store, countarg, NULL };
			tp[r] = run_child(per, NULL).a;
		}
		tf[r] = fr.a, ti[r] = ir.a, tc[r] = ir.b, cx[r] = ir.ctx;
		rf[r] = fr.c, rm[r] = ir.c;
		qi[r] = ti[r] / tf[r], qr[r] = rm[r] / rf[r];
	}
	/* The gate takes the median of the pairs' ratios: a pair is two runs, the floor first
	 * in one and the import first in the other, so its ratio sees the machine as it was
	 * for both sides, and a floor that moves between runs (19% between two gates ten
	 * minutes apart on an H200, 2026-11-28) moves the import with it.  The fastest import
	 * over the fastest floor, which the gate took before, puts the two extremes of
	 * different runs against each other: one lucky floor run failed a gate in two or three
	 * on unchanged code (1.137x, then 1.036x).  The fastest of the runs is printed beside. */
	int pairs = runs / 2;
	double *pi = calloc((size_t)pairs + 1, sizeof(double)), *pq = calloc((size_t)pairs + 1, sizeof(double));
	for (int k = 0; k < pairs; k++) {
		pi[k] = (ti[2 * k] + ti[2 * k + 1]) / (tf[2 * k] + tf[2 * k + 1]);
		pq[k] = (rm[2 * k] + rm[2 * k + 1]) / (rf[2 * k] + rf[2 * k + 1]);
	}
	printf("  %-44s", "the runs' import ratios (floor first: 1st, 3rd...)");
	for (int r = 0; r < runs; r++)
		printf(" %.2f", qi[r]);
	printf("\n");
	double pairs_import = pairs ? median(pi, pairs) : median(qi, runs);
	double pairs_remap = pairs ? median(pq, pairs) : median(qr, runs);
	double f = median(tf, runs);
	printf("bench-gpu: %s (%d allocations), median of %d fresh processes (their CUDA context apart: %.1f ms)\n",
	       label, count, runs, median(cx, runs));
	line("floor: fresh process, fds from another", f, f, count);
	line("first import_all in a fresh process", median(ti, runs), f, count);
	line("connect + import_all in a fresh process", median(tc, runs), f, count);
	line("per-file gmsfs_import in a fresh process", median(tp, runs < PERFILE_RUNS ? runs : PERFILE_RUNS), f,
	     count);
	double remap_floor = median(rf, runs), remap = median(rm, runs);
	line("remap floor: unmap, import, map again", remap_floor, remap_floor, count);
	line("remap cycle: unmap_all + remap_all", remap, remap_floor, count);
	line("writer floor: one process, create to access", t_wfloor, t_wfloor, count);
	line("the same calls split over two processes", t_two, t_wfloor, count);
	printf("  %-44s %9.2f ms  %5.2fx  %7.1f us/alloc (%.2fx the split)\n",
	       "writer: gmsfs_create (create + map)", t_create, t_create / t_wfloor, t_create * 1e3 / count,
	       t_create / t_two);
	printf("  %-44s %9.2f ms  %5.2fx  %7.1f us/alloc\n", "writer: gmsfs_create_many (one request)", t_many,
	       t_many / t_wfloor, t_many * 1e3 / count);
	printf("  %-44s %9.2f ms         %7.2f us/entry\n", "metadata: one bulk put", t_meta, t_meta * 1e3 / count);
	printf("  %-44s%s\n", "the writer's rounds (ms): create, many, floor, split", said);
	printf("  %-44s %9.2fx (import) %5.2fx (remap)\n", pairs ? "median of the pairs' ratios" : "median of the runs' ratios",
	       pairs_import, pairs_remap);
	printf("  %-44s", "the pairs' import ratios, sorted");
	for (int k = 0; k < pairs; k++)
		printf(" %.2f", pi[k]);
	printf("\n");
	double fi = least(tf, runs), ii = least(ti, runs), fr = least(rf, runs), rr = least(rm, runs);
	printf("  %-44s %9.2f ms against %.2f ms: %.2fx (import); %.2f ms against %.2f ms: %.2fx (remap)\n",
	       "fastest of the runs, ours against the floor", ii, fi, ii / fi, rr, fr, rr / fr);
	/* For tests/gpu/gate.py: value, floor, the most value / floor may be (the value the
	 * median floor times the pairs' median ratio).  The writer's 16 x 1 GiB read 1.12-3.5x
	 * the split floor until the daemon settled its driver after releases (vmm.h, settle) and
	 * every timing started from the same pause (quiet_device): 1.04x and 1.08x then. */
	printf("gate: import-%s %.4f %.4f 1.1 a reader's import_all in a fresh process, %s, median of %d pairs of "
	       "runs by turns (ms)\n", label, pairs_import * f, f, label, pairs ? pairs : runs);
	printf("gate: remap-%s %.4f %.4f 1.2 a reader's remap cycle, unmap_all + remap_all, %s, median of %d pairs of "
	       "runs by turns (ms)\n", label, pairs_remap * remap_floor, remap_floor, label, pairs ? pairs : runs);
	printf("gate: create-%s %.4f %.4f 1.2 a writer's gmsfs_create one allocation at a time, %s, against the same "
	       "driver calls split over two processes as the daemon and its writer make them, median of %d rounds by "
	       "turns (ms)\n", label, r_create * t_two, t_two, label, rounds);
	printf("gate: create-many-%s %.4f %.4f 1.2 a writer's gmsfs_create_many of the layout, %s, against the same "
	       "split driver calls, median of %d rounds by turns (ms)\n", label, r_many * t_two, t_two, label, rounds);
	fflush(stdout);
	free(tf), free(ti), free(tc), free(tp), free(cx), free(rf), free(rm), free(qi), free(qr), free(pi), free(pq);
	/* Free the store for the next layout: a writer empties it, then rmdir. */
	TRY(NULL, gmsfs_connect(&w, store, GMSFS_RW, 10000));
	TRY(w, gmsfs_import_all(w));
	while (gmsfs_mappings(w, &m))
		TRY(w, gmsfs_free(w, m[0].ptr));
	TRY(w, gmsfs_commit(w));
	gmsfs_disconnect(w);
	if (rmdir(store) < 0)
		perror("rmdir");
}

/* The 291 tensors of Llama-3-8B, bf16. */
static int llama8b(uint64_t *s)
{
	const uint64_t h = 4096, kv = 1024, ffn = 14336, vocab = 128256, b = 2;
	int n = 0;
	s[n++] = vocab * h * b;
	for (int l = 0; l < 32; l++) {
		s[n++] = h * h * b, s[n++] = kv * h * b, s[n++] = kv * h * b, s[n++] = h * h * b;
		s[n++] = ffn * h * b, s[n++] = ffn * h * b, s[n++] = h * ffn * b;
		s[n++] = h * b, s[n++] = h * b;
	}
	s[n++] = h * b;
	s[n++] = vocab * h * b;
	return n;
}

int main(int argc, char **argv)
{
	static char exe[4096];
	ssize_t k = readlink("/proc/self/exe", exe, sizeof exe - 1);
	self = k > 0 ? (exe[k] = '\0', exe) : argv[0];
	if (argc == 3 && !strcmp(argv[1], "__floor"))
		return child_floor(atoi(argv[2]));
	if (argc == 3 && !strcmp(argv[1], "__creator"))
		return child_creator(atoi(argv[2]));
	if (argc == 3 && !strcmp(argv[1], "__import"))
		return child_import(argv[2]);
	if (argc == 4 && !strcmp(argv[1], "__perfile"))
		return child_perfile(argv[2], atoi(argv[3]));
	if (argc >= 3 && !strcmp(argv[1], "floor")) {
		/* The floor of an existing store's layout: the median ms, alone on a line. */
		int runs = argc > 3 ? atoi(argv[3]) : 5;
		double *t = calloc((size_t)runs, sizeof *t);
		for (int r = 0; r < runs; r++) {
			struct fetched f;
			if (fetch_all(argv[2], &f))
				return 1;
			char *none[] = { (char *)self, "__floor", NULL };
			t[r] = run_child(none, &f).a;
			fetched_free(&f);
		}
		printf("%.2f\n", median(t, runs));
		return 0;
	}
	if (argc < 2) {
		fprintf(stderr, "usage: %s MOUNT [RUNS] | floor STORE [RUNS]\n", argv[0]);
		return 2;
	}
	int runs = argc > 2 ? atoi(argv[2]) : 5;
	context();
	static uint64_t s[1000];
	for (int i = 0; i < 1000; i++)
		s[i] = 2ull << 20;
	/* GMSFS_BENCH_ONLY=LABEL[,LABEL...]: those layouts alone, in the usual order (a probe). */
	const char *only = getenv("GMSFS_BENCH_ONLY");
	if (only && !*only)
		only = NULL;
#define LAYOUT(label, n) \
	if (wanted(only, label)) \
		layout(argv[1], label, s, n, runs, WRITER_ROUNDS)
	LAYOUT("1000x2MiB", 1000);
	for (int i = 0; i < 128; i++)
		s[i] = 64ull << 20;
	/* Twice the runs: its import, about 7 ms, read 1.105x of its 1.1x in one gate and
	 * 1.000x and 1.001x alone on the same machine right after (2026-11-30, unchanged
	 * import path); 16 pairs move less. */
	if (wanted(only, "128x64MiB"))
		layout(argv[1], "128x64MiB", s, 128, 2 * runs, WRITER_ROUNDS);
	for (int i = 0; i < 16; i++)
		s[i] = 1ull << 30;
	/* Three times the runs: its figures are about 2 ms, where the machine's noise and the
	 * remap cycle's fixed lock hand-back and retake (about 0.2 ms of FUSE round trips the
	 * driver loop has not) weigh most; the fastest of more runs moves least (gates on
	 * unchanged code read 1.14x and 1.21x of a 1.2x limit with 16). */
	if (wanted(only, "16x1GiB"))
		layout(argv[1], "16x1GiB", s, 16, 3 * runs, WRITER_ROUNDS_MAX);
	/* Twice the runs: its pairs' ratios spread 0.89-1.24 in one gate (median 1.13x of 1.1x),
	 * 0.93x in the one before, on the same library code; 16 pairs move less. */
	if (wanted(only, "llama3-8b"))
		layout(argv[1], "llama3-8b", s, llama8b(s), 2 * runs, WRITER_ROUNDS);
#undef LAYOUT
	return 0;
}
