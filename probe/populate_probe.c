/* populate_probe: how fast a fresh host-backend store's memory (one memfd, as vmm_host.c
 * makes it) gets its pages, by threads each MADV_POPULATE_WRITE'ing its part, with or
 * without a fallocate of the whole first: the floor of a pull into a host mount.
 *   cc -O2 -pthread probe/populate_probe.c -o populate_probe && ./populate_probe GIB */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

static char *base;
static size_t bytes, threads;

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

static void *populate(void *arg)
{
	size_t k = (size_t)arg, per = bytes / threads;
	for (size_t o = 0; o < per; o += 32 << 20)
		madvise(base + k * per + o, per - o < (32u << 20) ? per - o : 32 << 20, 23 /* MADV_POPULATE_WRITE */);
	return NULL;
}

int main(int argc, char **argv)
{
	bytes = (size_t)(argc > 1 ? atoi(argv[1]) : 4) << 30;
	for (int falloc = 0; falloc < 2; falloc++)
		for (threads = 1; threads <= 16; threads *= 2) {
			int fd = memfd_create("populate_probe", 0);
			if (fd < 0 || ftruncate(fd, (off_t)bytes))
				return 1;
			base = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
			double t0 = now();
			if (falloc && fallocate(fd, 0, 0, (off_t)bytes))
				return 1;
			double t1 = now();
			pthread_t t[16];
			for (size_t k = 0; k < threads; k++)
				pthread_create(&t[k], NULL, populate, (void *)k);
			for (size_t k = 0; k < threads; k++)
				pthread_join(t[k], NULL);
			double t2 = now();
			printf("populate_probe: %zu GiB, %s%zu threads: %.3f s (fallocate %.3f s), %.2f GB/s\n", bytes >> 30,
			       falloc ? "fallocate, then " : "", threads, t2 - t0, t1 - t0, bytes / 1e9 / (t2 - t0));
			munmap(base, bytes);
			close(fd);
		}
	return 0;
}
