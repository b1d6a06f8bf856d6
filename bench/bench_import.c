/* bench-import STORE [COUNT [BYTES [RUNS]]]: what a reader pays to import a layout.
 *
 * Publishes COUNT allocations of BYTES in STORE (an empty store of a live mount), then
 * measures, median of RUNS:
 *   floor     the same work done directly, in one process, on descriptors it already
 *             holds: reserve an address range, map the memfd read-only over it (fstat
 *             as the library does), for every allocation.  No daemon, no lock, no socket.
 *   bulk      gmsfs_import_all on a connected reader (one ioctl, one socket round trip
 *             per 253 allocations, then the same mapping work).
 *   connect   gmsfs_connect + gmsfs_import_all: the lock round trip included.
 *   per-file  gmsfs_import of each allocation by name.
 * Each as time and as a ratio to the floor measured in the same run. */
#include <gmsfs/gmsfs.h>

#include "bench.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static void die(gmsfs *g, const char *what, int e)
{
	fprintf(stderr, "bench-import: %s: %s (%s)\n", what, gmsfs_strerror(e), g ? gmsfs_errmsg(g) : "");
	exit(1);
}

/* The floor: map count read-only memfds of bytes each, already open. */
static double floor_run(const int *fds, int count, uint64_t bytes)
{
	void **va = calloc((size_t)count, sizeof *va);
	double t0 = now_ms();
	for (int i = 0; i < count; i++) {
		struct stat s;
		va[i] = mmap(NULL, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
		if (va[i] == MAP_FAILED || fstat(fds[i], &s) < 0 ||
		    mmap(va[i], bytes, PROT_READ, MAP_SHARED | MAP_FIXED, fds[i], 0) == MAP_FAILED) {
			perror("floor");
			exit(1);
		}
	}
	double t = now_ms() - t0;
	for (int i = 0; i < count; i++)
		munmap(va[i], bytes);
	free(va);
	return t;
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		fprintf(stderr, "usage: %s STORE [COUNT [BYTES [RUNS]]]\n", argv[0]);
		return 2;
	}
	const char *store = argv[1];
	int count = argc > 2 ? atoi(argv[2]) : 1000;
	uint64_t bytes = argc > 3 ? strtoull(argv[3], NULL, 0) : 65536;
	int runs = argc > 4 ? atoi(argv[4]) : 7;
	long page = sysconf(_SC_PAGESIZE);
	bytes = (bytes + (uint64_t)page - 1) / (uint64_t)page * (uint64_t)page;

	gmsfs *w;
	int e = gmsfs_connect(&w, store, GMSFS_RW, 5000);
	if (e)
		die(w, "connect RW", e);
	char **names = calloc((size_t)count, sizeof *names);
	for (int i = 0; i < count; i++) {
		char name[64];
		void *p;
		snprintf(name, sizeof name, "layer%04d", i);
		names[i] = strdup(name);
		if ((e = gmsfs_create(w, name, bytes, "weights", &p)))
			die(w, "create", e);
		memset(p, i & 0xff, bytes);
	}
	if ((e = gmsfs_commit(w)))
		die(w, "commit", e);
	gmsfs_disconnect(w);

	/* The floor's descriptors: sealed memfds as the host backend makes them, read-only reopens. */
	int *fds = calloc((size_t)count, sizeof *fds);
	for (int i = 0; i < count; i++) {
		int m = memfd_create("floor", MFD_CLOEXEC | MFD_ALLOW_SEALING);
		char path[64];
		snprintf(path, sizeof path, "/proc/self/fd/%d", m);
		if (m < 0 || ftruncate(m, (off_t)bytes) < 0 || fcntl(m, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) < 0 ||
		    (fds[i] = open(path, O_RDONLY | O_CLOEXEC)) < 0) {
			perror("memfd");
			return 1;
		}
		close(m);
	}

	double *t_floor = calloc((size_t)runs, sizeof(double)), *t_bulk = calloc((size_t)runs, sizeof(double));
	double *t_conn = calloc((size_t)runs, sizeof(double)), *t_file = calloc((size_t)runs, sizeof(double));
	for (int r = 0; r < runs; r++) {
		t_floor[r] = floor_run(fds, count, bytes);

		gmsfs *g;
		double t0 = now_ms();
		if ((e = gmsfs_connect(&g, store, GMSFS_RO, 5000)))
			die(g, "connect RO", e);
		double t1 = now_ms();
		if ((e = gmsfs_import_all(g)))
			die(g, "import_all", e);
		double t2 = now_ms();
		t_bulk[r] = t2 - t1;
		t_conn[r] = t2 - t0;
		gmsfs_disconnect(g);

		if ((e = gmsfs_connect(&g, store, GMSFS_RO, 5000)))
			die(g, "connect RO", e);
		t0 = now_ms();
		for (int i = 0; i < count; i++) {
			void *p;
			if ((e = gmsfs_import(g, names[i], &p)))
				die(g, "import", e);
		}
		t_file[r] = now_ms() - t0;
		gmsfs_disconnect(g);
	}
	double f = median(t_floor, runs), b = median(t_bulk, runs), c = median(t_conn, runs), p = median(t_file, runs);
	printf("bench-import: %d x %llu bytes, host backend, median of %d runs\n", count, (unsigned long long)bytes, runs);
	printf("  %-44s %9.3f ms  %6.2fx\n", "floor: map already-held memfds, one process", f, 1.0);
	printf("  %-44s %9.3f ms  %6.2fx\n", "libgmsfs bulk import (import_all)", b, b / f);
	printf("  %-44s %9.3f ms  %6.2fx\n", "libgmsfs connect + import_all", c, c / f);
	printf("  %-44s %9.3f ms  %6.2fx\n", "libgmsfs per-file import", p, p / f);
	printf("  per allocation: floor %.1f us, bulk %.1f us, per-file %.1f us\n", f * 1e3 / count, b * 1e3 / count,
	       p * 1e3 / count);
	return 0;
}
