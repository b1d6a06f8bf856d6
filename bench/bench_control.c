/* bench-control STORE MINFS [COUNT [RUNS]]: gmsfs's control files against the same
 * operations on bench-minfs (a minimal low-level FUSE file system) mounted at MINFS.
 *
 * STORE is a committed store of a live gmsfs mount.  Each operation is done COUNT
 * times in a row, RUNS times; the median run gives the time per operation:
 *   cat state        open, read to the end, close (what `cat STORE/state` costs)
 *   read lock        open lock O_RDONLY, close (a shared lock taken and given back)
 *   write lock       open lock O_WRONLY, close (the writer session, left with nothing
 *                    written, is rolled back at close: an abort)
 * Printed as time and as a ratio to the same operation on minfs. */
#include "bench.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void die(const char *what, const char *path)
{
	fprintf(stderr, "bench-control: %s %s: ", what, path);
	perror(NULL);
	exit(1);
}

static void cat(const char *path)
{
	char buf[4096];
	int fd = open(path, O_RDONLY);
	if (fd < 0)
		die("open", path);
	ssize_t r;
	while ((r = read(fd, buf, sizeof buf)) > 0)
		;
	if (r < 0)
		die("read", path);
	close(fd);
}

static void open_close(const char *path, int flags)
{
	int fd = open(path, flags);
	if (fd < 0)
		die("open", path);
	close(fd);
}

enum op { CAT, READ_LOCK, WRITE_LOCK };

/* Microseconds per operation, over count operations in a row. */
static double time_op(enum op op, const char *dir, int count)
{
	char path[4096];
	snprintf(path, sizeof path, "%s/%s", dir, op == CAT ? "state" : "lock");
	double t0 = now_ms();
	for (int i = 0; i < count; i++)
		if (op == CAT)
			cat(path);
		else
			open_close(path, op == READ_LOCK ? O_RDONLY : O_WRONLY);
	return (now_ms() - t0) * 1e3 / count;
}

int main(int argc, char **argv)
{
	if (argc < 3) {
		fprintf(stderr, "usage: %s STORE MINFS [COUNT [RUNS]]\n", argv[0]);
		return 2;
	}
	int count = argc > 3 ? atoi(argv[3]) : 2000, runs = argc > 4 ? atoi(argv[4]) : 5;
	if (count < 1 || runs < 1) {
		fprintf(stderr, "bench-control: COUNT and RUNS are at least 1\n");
		return 2;
	}
	static const char *const names[] = { "cat state (open, read, close)", "lock: open O_RDONLY, close",
					      "lock: open O_WRONLY, close" };
	printf("bench-control: %d operations in a row, median of %d runs taken in turn with those of a minimal FUSE file system\n",
	       count, runs);
	for (enum op op = CAT; op <= WRITE_LOCK; op++) {
		time_op(op, argv[1], count / 10 + 1); /* warm both: lookups, worker threads */
		time_op(op, argv[2], count / 10 + 1);
		/* The two in turn, so that what the machine does meanwhile weighs on both. */
		double *tb = calloc((size_t)runs, sizeof *tb), *tm = calloc((size_t)runs, sizeof *tm);
		for (int r = 0; r < runs; r++) {
			tb[r] = time_op(op, argv[2], count);
			tm[r] = time_op(op, argv[1], count);
		}
		double base = median(tb, runs), mine = median(tm, runs);
		free(tb);
		free(tm);
		printf("  %-32s minfs %7.1f us   gmsfs %7.1f us   %5.2fx\n", names[op], base, mine, mine / base);
	}
	return 0;
}
