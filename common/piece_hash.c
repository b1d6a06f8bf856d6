/* piece_hash: see piece_hash.h.  The widest kind the CPU has, chosen once. */
#include "piece_hash.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

uint64_t piece_hash_sse2(const void *p, size_t n)
{
	return XXH3_64bits(p, n);
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
static uint64_t (*chosen(void))(const void *, size_t)
{
	const char *want = getenv("GMSFS_PIECE_HASH"); /* a narrower kind than the CPU has, or none */
	__builtin_cpu_init();
	bool avx2 = __builtin_cpu_supports("avx2"), avx512 = avx2 && __builtin_cpu_supports("avx512f") &&
							 __builtin_cpu_supports("avx512bw");
	if (want && !strcmp(want, "sse2"))
		avx2 = avx512 = false;
	if (want && !strcmp(want, "avx2"))
		avx512 = false;
	return avx512 ? piece_hash_avx512 : avx2 ? piece_hash_avx2 : piece_hash_sse2;
}
#else
static uint64_t (*chosen(void))(const void *, size_t)
{
	return piece_hash_sse2;
}
#endif

static uint64_t (*_Atomic kind)(const void *, size_t); /* set once; a race sets it twice alike */

uint64_t piece_hash(const void *p, size_t n)
{
	uint64_t (*f)(const void *, size_t) = kind;
	if (!f)
		kind = f = chosen();
	return f(p, n);
}

const char *piece_hash_kind(void)
{
	uint64_t (*f)(const void *, size_t) = chosen();
	return f == piece_hash_avx512 ? "avx512" : f == piece_hash_avx2 ? "avx2" : "sse2";
}
