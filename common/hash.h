/* hash.h: FNV-1a of a NUL-terminated name, for the open-addressing name indexes of
 * the daemon's directories and of libgmsfs's mappings and entries; hex of a digest.  Names are short:
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

/* n bytes as 2n lowercase hex digits and a NUL (layout hashes, as state shows them). */
static inline void hex_of(const uint8_t *b, size_t n, char *out)
{
	static const char digits[] = "0123456789abcdef";
	for (size_t i = 0; i < n; i++) {
		out[2 * i] = digits[b[i] >> 4];
		out[2 * i + 1] = digits[b[i] & 15];
	}
	out[2 * n] = '\0';
}

#endif
