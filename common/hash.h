/* hash.h: FNV-1a of a NUL-terminated name, for the open-addressing name indexes of
 * the daemon's directories and of libgmsfs's mappings and entries.  Names are short:
 * nothing stronger is needed, and nothing outside a process sees the values. */
#ifndef GMSFS_COMMON_HASH_H
#define GMSFS_COMMON_HASH_H

#include <stddef.h>
#include <stdint.h>

static inline uint64_t name_hash(const char *s)
{
	uint64_t h = 1469598103934665603ull;
	while (*s)
		h = (h ^ (unsigned char)*s++) * 1099511628211ull;
	return h;
}

/* The same over len bytes. */
static inline uint64_t name_hash_len(const char *s, size_t len)
{
	uint64_t h = 1469598103934665603ull;
	for (size_t i = 0; i < len; i++)
		h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
	return h;
}

#endif
