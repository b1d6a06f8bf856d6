/* test_piece_hash: each kind of piece_hash (SSE2, AVX2, AVX-512, where this CPU has them)
 * gives what libxxhash's own XXH3_64bits gives, for lengths around every branch of XXH3
 * (0, 1-3, 4-8, 9-16, 17-128, 129-240, stripes, blocks, a whole 2 MiB piece) and
 * unaligned starts; and piece_hash itself is the kind this CPU is said to use. */
#include "piece_hash.h"
#include "tap.h"

#include <stdint.h>
#include <stdlib.h>
#include <xxhash.h> /* the library's, linked: an implementation apart from the header's */

static int cpu_has(const char *kind)
{
#if defined(__x86_64__)
	__builtin_cpu_init();
	if (!strcmp(kind, "avx512"))
		return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
	if (!strcmp(kind, "avx2"))
		return __builtin_cpu_supports("avx2");
#endif
	return !strcmp(kind, "sse2");
}

int main(void)
{
	size_t n = (2u << 20) + 64;
	unsigned char *b = malloc(n);
	for (size_t i = 0; i < n; i++)
		b[i] = (unsigned char)(i * 131 + (i >> 9));
	static const size_t lens[] = { 0, 1, 3, 4, 8, 9, 16, 17, 128, 129, 240, 241, 1024, 1025, 65536 + 7, 2u << 20 };
	const char *kinds[] = { "sse2", "avx2", "avx512" };
	uint64_t (*fn[])(const void *, size_t) = { piece_hash_sse2, piece_hash_avx2, piece_hash_avx512 };
	for (int k = 0; k < 3; k++) {
		if (!cpu_has(kinds[k])) {
			printf("# %s: this CPU has none\n", kinds[k]);
			continue;
		}
		int same = 1;
		for (size_t i = 0; i < sizeof lens / sizeof *lens; i++)
			for (size_t at = 0; at < 4; at++)
				same &= fn[k](b + at * 17, lens[i]) == XXH3_64bits(b + at * 17, lens[i]);
		ok(same, "%s: the same as libxxhash's XXH3_64bits, every length and start", kinds[k]);
	}
	ok(piece_hash(b, 2u << 20) == XXH3_64bits(b, 2u << 20), "piece_hash (%s here): a 2 MiB piece's XXH3_64bits",
	   piece_hash_kind());
	ok(cpu_has(piece_hash_kind()), "the kind piece_hash chose is one this CPU has");
	int same = 1;
	for (size_t i = 0; i < sizeof lens / sizeof *lens; i++) { /* in runs of 1, 7, 4096 and 65536 + 3 */
		static const size_t runs[] = { 1, 7, 4096, 65539 };
		for (size_t r = 0; r < 4; r++) {
			struct piece_hash_state st;
			piece_hash_begin(&st);
			for (size_t at = 0; at < lens[i]; at += runs[r])
				piece_hash_update(&st, b + 5 + at, lens[i] - at < runs[r] ? lens[i] - at : runs[r]);
			same &= piece_hash_end(&st) == XXH3_64bits(b + 5, lens[i]);
		}
	}
	ok(same, "begin, update in runs, end: the same as one XXH3_64bits");
	free(b);
	return tap_done();
}
