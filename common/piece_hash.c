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

void piece_hash_update_sse2(void *xxh3, const void *p, size_t n)
{
	XXH3_64bits_update(xxh3, p, n);
}

_Static_assert(sizeof(XXH3_state_t) <= sizeof(struct piece_hash_state), "XXH3's state fits");
_Static_assert(_Alignof(XXH3_state_t) <= _Alignof(struct piece_hash_state), "XXH3's state is aligned");

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

static uint64_t (*the_kind(void))(const void *, size_t)
{
	uint64_t (*f)(const void *, size_t) = kind;
	if (!f)
		kind = f = chosen();
	return f;
}

uint64_t piece_hash(const void *p, size_t n)
{
	return the_kind()(p, n);
}

void piece_hash_begin(struct piece_hash_state *s)
{
	XXH3_INITSTATE((XXH3_state_t *)s->xxh3);
	XXH3_64bits_reset((XXH3_state_t *)s->xxh3);
}

void piece_hash_update(struct piece_hash_state *s, const void *p, size_t n)
{
	uint64_t (*f)(const void *, size_t) = the_kind();
	(f == piece_hash_avx512 ? piece_hash_update_avx512 : f == piece_hash_avx2 ? piece_hash_update_avx2
										    : piece_hash_update_sse2)(s->xxh3, p, n);
}

uint64_t piece_hash_end(struct piece_hash_state *s)
{
	return XXH3_64bits_digest((XXH3_state_t *)s->xxh3);
}

const char *piece_hash_kind(void)
{
	uint64_t (*f)(const void *, size_t) = chosen();
	return f == piece_hash_avx512 ? "avx512" : f == piece_hash_avx2 ? "avx2" : "sse2";
}
