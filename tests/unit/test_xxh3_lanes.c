/* test_xxh3_lanes: the GPU's XXH3-64 (common/xxh3_lanes.h, compiled here as C, as
 * libgmsfs/digest_gpu.cu compiles it for the GPU) gives what libxxhash's XXH3_64bits
 * gives: every length past XXH3's short paths (241) to 4 KiB and around each block to
 * 2 MiB + 3, by eight lanes merged as the kernel merges them, at 16-byte starts (every
 * piece has one); and its tables are the secret's bytes.  (tests/layout.sh checks that the PTX libgmsfs carries
 * was made from these sources.) */
#include "xxh3_lanes.h"
#include "tap.h"

#include <stdint.h>
#include <stdlib.h>
#include <xxhash.h> /* the library's, linked */

static uint64_t lanes_hash(const unsigned char *p, uint64_t len)
{
	uint64_t acc[8];
	for (unsigned lane = 0; lane < 8; lane++)
		acc[lane] = xl_lane(p, len, lane);
	return xl_merge(acc, len);
}

static uint64_t le64(const unsigned char *p)
{
	uint64_t v;
	memcpy(&v, p, 8);
	return v;
}

int main(void)
{
	size_t n = (2u << 20) + 4096;
	unsigned char *raw = aligned_alloc(64, n + 64);
	for (size_t i = 0; i < n + 64; i++)
		raw[i] = (unsigned char)(i * 131 + (i >> 9) + (i >> 17) * 7);

	int tables = 1;
	for (int i = 0; i < 24; i++)
		tables &= xl_words[i] == le64(xl_secret + 8 * i);
	for (int i = 0; i < 8; i++)
		tables &= xl_last[i] == le64(xl_secret + 121 + 8 * i) && xl_merge_keys[i] == le64(xl_secret + 11 + 8 * i);
	ok(tables, "the long path's key words are the secret's bytes at 0, 121 and 11");

	size_t bad = 0, first = SIZE_MAX;
	for (size_t len = XL_MIDSIZE_MAX + 1; len <= 4096; len++)
		if (lanes_hash(raw, len) != XXH3_64bits(raw, len) && !bad++)
			first = len;
	ok(!bad, "every length 241 to 4096 at a 64-byte start: XXH3_64bits (%zu differ%s)", bad, bad ? ", the first said below" : "");
	if (bad)
		printf("#   the first: %zu bytes\n", first);

	bad = 0;
	for (size_t at = 16; at < 64; at += 16)
		for (size_t len = 241; len <= 3000; len += 7)
			bad += lanes_hash(raw + at, len) != XXH3_64bits(raw + at, len);
	ok(!bad, "long inputs at 16-byte starts: XXH3_64bits (%zu differ)", bad);

	static const size_t lens[] = { 1023, 1024, 1025, 1024 * 16 - 1, 65536 + 7, (1u << 20) + 63, (2u << 20) - 1,
				       2u << 20, (2u << 20) + 3 };
	bad = 0;
	for (size_t i = 0; i < sizeof lens / sizeof *lens; i++)
		bad += lanes_hash(raw, lens[i]) != XXH3_64bits(raw, lens[i]);
	ok(!bad, "around blocks up to a 2 MiB piece and past it: XXH3_64bits (%zu differ)", bad);

	/* A byte changed anywhere in a piece changes its hash: every lane sees its words. */
	size_t len = 2u << 20, missed = 0;
	uint64_t h = lanes_hash(raw, len);
	for (size_t at = 0; at < len; at += 65537) {
		raw[at] ^= 0x5a;
		missed += lanes_hash(raw, len) == h;
		raw[at] ^= 0x5a;
	}
	ok(!missed, "a byte changed anywhere in a 2 MiB piece changes its hash (%zu missed)", missed);
	free(raw);
	return tap_done();
}
