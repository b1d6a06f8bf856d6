/* faults: a holder or importer killed, abort cycles, the daemon killed. */
#include "scenario.h"

/* __hog STORE OUT BYTES [import]: a writer that creates BYTES (in allocations of at most
 * 1 GiB), fills them, reports on OUT and waits to be killed; with import, it maps the
 * last commit first (read-only to it: it never says it writes it in place). */
int role_hog(int argc, char **argv)
{
	int out = atoi(argv[3]);
	uint64_t left = strtoull(argv[4], NULL, 0);
	gmsfs *g;
	CALL(g, gmsfs_connect(&g, store, GMSFS_RW, 1000));
	if (argc > 5)
		CALL(g, gmsfs_import_all(g));
	for (int k = 0; left; k++) {
		uint64_t n = left < (1ull << 30) ? left : 1ull << 30;
		char name[32];
		void *p;
		snprintf(name, sizeof name, "hog/%d", k);
		CALL(g, gmsfs_create(g, name, n, NULL, &p));
		if (fill(p, k, n, 11))
			return 1;
		left -= n;
	}
	CHECK(write(out, "x", 1) == 1, "report");
	pause();
	return 0;
}

/* A writer killed with SIGKILL: the memory it held through its mappings comes back
 * once it is gone, and the store is exactly at its last commit.  import: the writer
 * mapped the last commit too (a publisher that reads the old model first): COMMITTED
 * still, not TORN, and a reader that waited behind it is granted. */
static int dead_holder(bool import)
{
	const uint64_t size = cuda ? 4ull << 30 : 256ull << 20;
	char h1[33], h2[33];
	if (publish(2, 4096, 12, h1))
		return 1;
	long long before = mem_used();
	int p[2];
	if (pipe(p))
		return 1;
	pid_t w = fork();
	if (w == 0) {
		close_others(p[1], -1);
		char out[16], bytes[32];
		snprintf(out, sizeof out, "%d", p[1]);
		snprintf(bytes, sizeof bytes, "%llu", (unsigned long long)size);
		execl(self, self, "__hog", store, out, bytes, import ? "import" : NULL, (char *)NULL);
		_exit(127);
	}
	close(p[1]);
	char c;
	CHECK(read(p[0], &c, 1) == 1, "writer filled its allocations");
	close(p[0]);
	long long during = mem_used();
	/* A reader behind the writer, granted the last commit once it dies: forked, on the host
	 * backend (a CUDA context does not survive a fork: on a GPU the reader below stands
	 * for it). */
	bool waiter = import && !cuda;
	pid_t r = waiter ? fork() : 0;
	if (r == 0 && waiter) {
		gmsfs *x;
		_exit(gmsfs_connect(&x, store, GMSFS_RO, 10000) || gmsfs_import_all(x) || verify(x, 2, 12));
	}
	CHECK(!waiter || wait_for(state_val, "waiting_readers", 1, 5000), "a reader waits behind the writer");
	kill(w, SIGKILL);
	waitpid(w, NULL, 0);
	int st = 0;
	CHECK(!waiter || (waitpid(r, &st, 0) == r && WIFEXITED(st) && !WEXITSTATUS(st)), "the waiting reader got the last commit");
	/* The waiting reader's read lock goes with the kernel's release of its files, after its
	 * exit (valgrind's daemon met it still there): RO until then. */
	CHECK(wait_for(state_val, "writer", 0, 5000) && wait_for(state_val, "readers", 0, 5000) && state_is("COMMITTED"),
	      "writer gone, store COMMITTED");
	long long after = mem_used();
	for (int t = 0; t < 250 && after - before > (64 << 20); t++, msleep(20))
		after = mem_used();
	printf("memory in use: %lld MiB before, %lld during, %lld after\n", before >> 20, during >> 20, after >> 20);
	CHECK(during - before >= (long long)size * 9 / 10, "the allocation showed: %lld -> %lld", before, during);
	CHECK(after - before < (64 << 20), "memory back: %lld before, %lld during, %lld after", before, during, after);
	gmsfs *g;
	CALL(g, gmsfs_connect(&g, store, GMSFS_RO, 1000));
	CALL(g, gmsfs_import_all(g));
	CALL(g, gmsfs_layout_hash(g, h2));
	CHECK(!strcmp(h1, h2), "layout intact: %s, was %s", h2, h1);
	if (verify(g, 2, 12))
		return 1;
	gmsfs_disconnect(g);
	return 0;
}

int sc_dead_holder_memory(void)
{
	return dead_holder(false);
}

int sc_importer_killed(void)
{
	return dead_holder(true);
}

/* 100 writers create and leave without commit: nothing leaks, in the daemon or the device. */
int sc_abort_cycles(void)
{
	const uint64_t size = cuda ? 64ull << 20 : 1ull << 20;
	char h1[33], h2[33];
	if (publish(1, 4096, 13, h1))
		return 1;
	long committed = state_val("aligned_bytes");
	long long before = mem_used();
	for (int i = 0; i < 100; i++) {
		gmsfs *g;
		void *p;
		CALL(g, gmsfs_connect(&g, store, GMSFS_RW, 2000));
		CALL(g, gmsfs_create(g, "tmp/a", size, NULL, &p));
		CALL(g, gmsfs_create(g, "tmp/b", size, NULL, &p));
		gmsfs_disconnect(g);
	}
	CHECK(wait_for(state_val, "writer", 0, 3000), "last writer gone");
	long long after = mem_used();
	for (int t = 0; t < 100 && after - before > (32 << 20); t++, msleep(20))
		after = mem_used();
	printf("memory in use: %lld MiB before 100 cycles of 2 x %llu MiB, %lld after\n", before >> 20,
	       (unsigned long long)(size >> 20), after >> 20);
	CHECK(after - before < (32 << 20), "memory back: %lld, was %lld", after, before);
	CHECK(state_val("aligned_bytes") == committed, "daemon holds %ld, committed %ld", state_val("aligned_bytes"), committed);
	gmsfs *g;
	CALL(g, gmsfs_connect(&g, store, GMSFS_RO, 1000));
	CALL(g, gmsfs_layout_hash(g, h2));
	CHECK(!strcmp(h1, h2), "layout intact");
	gmsfs_disconnect(g);
	return 0;
}

/* The daemon dies (GMSFS_DAEMON_PID, SIGKILL): a reader keeps reading what it mapped. */
int sc_daemon_killed(void)
{
	const char *pid = getenv("GMSFS_DAEMON_PID");
	CHECK(pid && atoi(pid) > 0, "GMSFS_DAEMON_PID is not set");
	if (publish(4, 1 << 20, 14, NULL))
		return 1;
	gmsfs *g;
	CALL(g, gmsfs_connect(&g, store, GMSFS_RO, 1000));
	CALL(g, gmsfs_import_all(g));
	CHECK(kill(atoi(pid), SIGKILL) == 0, "kill %s", pid);
	char path[4200];
	snprintf(path, sizeof path, "%s/state", store);
	for (int t = 0; t < 200 && (access(path, F_OK) == 0 || errno != ENOTCONN); t++)
		msleep(10);
	CHECK(access(path, F_OK) < 0 && errno == ENOTCONN, "the mount is dead");
	if (verify(g, 4, 14))
		return 1;
	gmsfs_disconnect(g); /* unmaps; the lock went with the daemon */
	return 0;
}

/* ---- bulk metadata (one contract in one place) ---- */
