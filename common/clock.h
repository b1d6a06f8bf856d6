/* clock.h: the monotonic clock in nanoseconds, for durations and "last used" stamps,
 * shared by the daemon's modules and gmsfs-mover. */
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

#endif
