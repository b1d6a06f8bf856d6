/* size.h: a size as people write it, "4096", "64M", "2G" (binary suffixes K, M, G, T):
 * the daemon's options and a store's quota. */
#ifndef GMSFS_COMMON_SIZE_H
#define GMSFS_COMMON_SIZE_H

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>

/* 0, or -EINVAL for anything but digits and one suffix. */
static inline int size_parse(const char *s, uint64_t *out)
{
	char *end;
	errno = 0;
	if (!s || *s < '0' || *s > '9')
		return -EINVAL;
	unsigned long long v = strtoull(s, &end, 10);
	if (errno || end == s)
		return -EINVAL;
	int shift = 0;
	switch (*end) {
	case '\0': break;
	case 'K': case 'k': shift = 10; end++; break;
	case 'M': case 'm': shift = 20; end++; break;
	case 'G': case 'g': shift = 30; end++; break;
	case 'T': case 't': shift = 40; end++; break;
	default: return -EINVAL;
	}
	if (*end || (shift && v > (UINT64_MAX >> shift)))
		return -EINVAL;
	*out = (uint64_t)v << shift;
	return 0;
}

#endif
