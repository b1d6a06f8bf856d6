/* tmpfs_probe DIR GIB THREADS: how fast a tmpfs takes and gives back bytes, way by way, from
 * memory already touched (the pinned buffers a snapshot's copies land in).  The floor under
 * gmsfs-snapshot save and restore on tmpfs (docs/benchmarks.md, "Snapshots").  Diagnostic:
 *   cc -O2 -pthread -o /tmp/tp probe/tmpfs_probe.c && /tmp/tp /dev/shm 14 14 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define CHUNK (2ul << 20)
static const char *dir;
static size_t per; /* bytes a thread */
static int nt, way;
static char *src;  /* CHUNK x threads, touched */

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

static void *work(void *arg)
{
	long me = (long)arg;
	char path[512], *buf = src + me * CHUNK;
	/* ways 0-3 write file me (4-5: one file for all, at me's part); 6-8 read file me */
	snprintf(path, sizeof path, "%s/tp.%ld", dir, way == 4 || way == 5 ? 0 : me);
	int fd = open(path, way >= 6 ? O_RDONLY : O_RDWR | O_CREAT, 0600);
	if (fd < 0)
		return perror(path), NULL;
	size_t base = way == 4 || way == 5 ? me * per : 0;
	if (way == 0 || way == 6) { /* pwrite / pread a chunk at a time */
		for (size_t at = 0; at < per; at += CHUNK)
			if ((way ? pread(fd, buf, CHUNK, at) : pwrite(fd, buf, CHUNK, at)) != (ssize_t)CHUNK)
				perror("io");
	} else if (way == 1 || way == 2 || way == 4 || way == 5) { /* mapped: memcpy in (2, 5: fallocate first) */
		if (way == 2 || way == 5)
			fallocate(fd, 0, base, per);
		else if ((way == 1 || way == 4) && ftruncate(fd, way == 4 ? per * nt : per))
			perror("ftruncate");
		char *m = mmap(NULL, per, PROT_READ | PROT_WRITE, MAP_SHARED, fd, base);
		if (m == MAP_FAILED)
			return perror("mmap"), NULL;
		for (size_t at = 0; at < per; at += CHUNK)
			memcpy(m + at, buf, CHUNK);
		munmap(m, per);
	} else if (way == 3) { /* fallocate, then pwrite */
		fallocate(fd, 0, 0, per);
		for (size_t at = 0; at < per; at += CHUNK)
			if (pwrite(fd, buf, CHUNK, at) != (ssize_t)CHUNK)
				perror("io");
	} else if (way == 7 || way == 8) { /* mapped: memcpy out (8: MAP_POPULATE) */
		char *m = mmap(NULL, per, PROT_READ, MAP_SHARED | (way == 8 ? MAP_POPULATE : 0), fd, 0);
		if (m == MAP_FAILED)
			return perror("mmap"), NULL;
		for (size_t at = 0; at < per; at += CHUNK)
			memcpy(buf, m + at, CHUNK);
		munmap(m, per);
	}
	close(fd);
	return NULL;
}

static void clean(void)
{
	char path[512];
	for (int i = 0; i < nt; i++) {
		snprintf(path, sizeof path, "%s/tp.%d", dir, i);
		unlink(path);
	}
}

int main(int argc, char **argv)
{
	if (argc < 4)
		return fprintf(stderr, "usage: tmpfs_probe DIR GIB THREADS\n"), 2;
	dir = argv[1];
	nt = atoi(argv[3]);
	per = (size_t)(atof(argv[2]) * (1ul << 30) / nt) / CHUNK * CHUNK;
	src = aligned_alloc(4096, CHUNK * nt);
	memset(src, 7, CHUNK * nt);
	static const char *what[] = { "write: pwrite, a file a thread", "write: mmap + memcpy, a file a thread",
				      "write: fallocate, mmap + memcpy", "write: fallocate, then pwrite",
				      "write: mmap + memcpy, one file, all threads",
				      "write: fallocate, mmap + memcpy, one file", "read: pread, a file a thread",
				      "read: mmap + memcpy", "read: mmap MAP_POPULATE + memcpy" };
	int order[] = { 0, 6, 7, 8, 1, 6, 2, 3, 4, 5 };
	for (size_t k = 0; k < sizeof order / sizeof *order; k++) {
		way = order[k];
		pthread_t t[256];
		double t0 = now();
		for (long i = 0; i < nt; i++)
			pthread_create(&t[i], NULL, work, (void *)i);
		for (int i = 0; i < nt; i++)
			pthread_join(t[i], NULL);
		double s = now() - t0;
		printf("%-46s %d threads %.1f GB: %.3f s, %.1f GB/s\n", what[way], nt, per * nt / 1e9, s, per * nt / s / 1e9);
		fflush(stdout);
		if (way < 6 && order[k + 1 < sizeof order / sizeof *order ? k + 1 : k] < 6)
			clean();
		if (way == 4 || way == 5)
			clean();
		else if (way >= 6 && k + 1 < sizeof order / sizeof *order && order[k + 1] < 6)
			clean();
	}
	clean();
	return 0;
}
