/* piece_hash's avx2 kind: xxhash's XXH3 built for avx2 in this file alone (piece_hash.c
 * calls it only where the CPU has it).  Not x86-64: never called, the SSE2 kind's code. */
#include "piece_hash.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2"))), apply_to = function)
#else
#pragma GCC target("avx2")
#endif
#define XXH_VECTOR XXH_AVX2
#include <immintrin.h>
#endif
#define XXH_INLINE_ALL
#include <xxhash.h>

uint64_t piece_hash_avx2(const void *p, size_t n)
{
	return XXH3_64bits(p, n);
}

void piece_hash_update_avx2(void *xxh3, const void *p, size_t n)
{
	XXH3_64bits_update(xxh3, p, n);
}
#if defined(__x86_64__) && defined(__clang__)
#pragma clang attribute pop
#endif
