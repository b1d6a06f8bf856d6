/* clock.h: the monotonic clock in nanoseconds, for durations and "last used" stamps, and
 * deadlines for timed waits; shared by the daemon's modules, libgmsfs and gmsfs-mover. */
#ifndef GMSFS_CLOCK_H
#define GMSFS_CLOCK_H

#include <stdint.h>
#include <time.h>

static inline uint64_t clock_mono_ns(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

/* Seconds since t0 (CLOCK_MONOTONIC): what a command says a step took. */
static inline double clock_since_s(const struct timespec *t0)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)(t.tv_sec - t0->tv_sec) + (double)(t.tv_nsec - t0->tv_nsec) / 1e9;
}

/* The time ms milliseconds from now on clock c: a deadline for a timed wait. */
static inline struct timespec clock_after_ms(clockid_t c, long ms)
{
	struct timespec t;
	clock_gettime(c, &t);
	t.tv_sec += ms / 1000;
	t.tv_nsec += (ms % 1000) * 1000000L;
	if (t.tv_nsec >= 1000000000L) {
		t.tv_sec++;
		t.tv_nsec -= 1000000000L;
	}
	return t;
}

#endif
