/* xxh3_lanes: XXH3-64 (seed 0, the default secret: what piece_hash computes) written so
 * that a GPU can compute it, compiled both as C (the tests check it against xxhash for
 * every length to 4 KiB and beyond) and as CUDA (libgmsfs/digest_gpu.cu, the content
 * hash at the GPU's speed).
 *
 * Past 240 bytes XXH3 keeps eight 64-bit accumulators, and lane i only ever takes the
 * input's words i and i^1 of each 64-byte stripe and its own secret words: the lanes are
 * independent until the merge.  So eight threads hash one piece, each its lane
 * (xl_lane), and one merges (xl_merge).  Inputs of 240 bytes or fewer take XXH3's short
 * paths, which the kernel leaves to the CPU (piece_hash). */
#ifndef GMSFS_COMMON_XXH3_LANES_H
#define GMSFS_COMMON_XXH3_LANES_H

#ifdef __CUDACC__
#define XL_FN static __device__ __forceinline__
#define XL_TABLE static __constant__ const
typedef unsigned long long xl_u64;
#else
#include <stdint.h>
#include <string.h>
#define XL_FN static inline
#define XL_TABLE static const
typedef uint64_t xl_u64;
#endif

#define XL_MIDSIZE_MAX 240 /* longer: the eight lanes */
#define XL_STRIPE 64
#define XL_BLOCK 1024 /* 16 stripes, then the accumulators scrambled */
#define XL_PRIME32_1 0x9E3779B1U
#define XL_PRIME32_2 0x85EBCA77U
#define XL_PRIME32_3 0xC2B2AE3DU
#define XL_PRIME64_1 0x9E3779B185EBCA87ULL
#define XL_PRIME64_2 0xC2B2AE3D27D4EB4FULL
#define XL_PRIME64_3 0x165667B19E3779F9ULL
#define XL_PRIME64_4 0x85EBCA77C2B2AE63ULL
#define XL_PRIME64_5 0x27D4EB2F165667C5ULL

/* XXH3's default secret (XXH3_kSecret), 192 bytes. */
XL_TABLE unsigned char xl_secret[192] = {
	0xb8, 0xfe, 0x6c, 0x39, 0x23, 0xa4, 0x4b, 0xbe, 0x7c, 0x01, 0x81, 0x2c, 0xf7, 0x21, 0xad, 0x1c,
	0xde, 0xd4, 0x6d, 0xe9, 0x83, 0x90, 0x97, 0xdb, 0x72, 0x40, 0xa4, 0xa4, 0xb7, 0xb3, 0x67, 0x1f,
	0xcb, 0x79, 0xe6, 0x4e, 0xcc, 0xc0, 0xe5, 0x78, 0x82, 0x5a, 0xd0, 0x7d, 0xcc, 0xff, 0x72, 0x21,
	0xb8, 0x08, 0x46, 0x74, 0xf7, 0x43, 0x24, 0x8e, 0xe0, 0x35, 0x90, 0xe6, 0x81, 0x3a, 0x26, 0x4c,
	0x3c, 0x28, 0x52, 0xbb, 0x91, 0xc3, 0x00, 0xcb, 0x88, 0xd0, 0x65, 0x8b, 0x1b, 0x53, 0x2e, 0xa3,
	0x71, 0x64, 0x48, 0x97, 0xa2, 0x0d, 0xf9, 0x4e, 0x38, 0x19, 0xef, 0x46, 0xa9, 0xde, 0xac, 0xd8,
	0xa8, 0xfa, 0x76, 0x3f, 0xe3, 0x9c, 0x34, 0x3f, 0xf9, 0xdc, 0xbb, 0xc7, 0xc7, 0x0b, 0x4f, 0x1d,
	0x8a, 0x51, 0xe0, 0x4b, 0xcd, 0xb4, 0x59, 0x31, 0xc8, 0x9f, 0x7e, 0xc9, 0xd9, 0x78, 0x73, 0x64,
	0xea, 0xc5, 0xac, 0x83, 0x34, 0xd3, 0xeb, 0xc3, 0xc5, 0x81, 0xa0, 0xff, 0xfa, 0x13, 0x63, 0xeb,
	0x17, 0x0d, 0xdd, 0x51, 0xb7, 0xf0, 0xda, 0x49, 0xd3, 0x16, 0x55, 0x26, 0x29, 0xd4, 0x68, 0x9e,
	0x2b, 0x16, 0xbe, 0x58, 0x7d, 0x47, 0xa1, 0xfc, 0x8f, 0xf8, 0xb8, 0xd1, 0x7a, 0xd0, 0x31, 0xce,
	0x45, 0xcb, 0x3a, 0x8f, 0x95, 0x16, 0x04, 0x28, 0xaf, 0xd7, 0xfb, 0xca, 0xbb, 0x4b, 0x40, 0x7e,
};
/* The secret as the long path reads it: its 24 words (a stripe's and the scramble's),
 * the last stripe's (at byte 121) and the merge's (at byte 11).  The tests check them
 * against xl_secret. */
XL_TABLE xl_u64 xl_words[24] = {
	0xbe4ba423396cfeb8ULL, 0x1cad21f72c81017cULL, 0xdb979083e96dd4deULL, 0x1f67b3b7a4a44072ULL,
	0x78e5c0cc4ee679cbULL, 0x2172ffcc7dd05a82ULL, 0x8e2443f7744608b8ULL, 0x4c263a81e69035e0ULL,
	0xcb00c391bb52283cULL, 0xa32e531b8b65d088ULL, 0x4ef90da297486471ULL, 0xd8acdea946ef1938ULL,
	0x3f349ce33f76faa8ULL, 0x1d4f0bc7c7bbdcf9ULL, 0x3159b4cd4be0518aULL, 0x647378d9c97e9fc8ULL,
	0xc3ebd33483acc5eaULL, 0xeb6313faffa081c5ULL, 0x49daf0b751dd0d17ULL, 0x9e68d429265516d3ULL,
	0xfca1477d58be162bULL, 0xce31d07ad1b8f88fULL, 0x280416958f3acb45ULL, 0x7e404bbbcafbd7afULL,
};
XL_TABLE xl_u64 xl_last[8] = {
	0xea647378d9c97e9fULL, 0xc5c3ebd33483acc5ULL, 0x17eb6313faffa081ULL, 0xd349daf0b751dd0dULL,
	0x2b9e68d429265516ULL, 0x8ffca1477d58be16ULL, 0x45ce31d07ad1b8f8ULL, 0xaf280416958f3acbULL,
};
XL_TABLE xl_u64 xl_merge_keys[8] = {
	0x6dd4de1cad21f72cULL, 0xa44072db979083e9ULL, 0xe679cb1f67b3b7a4ULL, 0xd05a8278e5c0cc4eULL,
	0x4608b82172ffcc7dULL, 0x9035e08e2443f774ULL, 0x52283c4c263a81e6ULL, 0x65d088cb00c391bbULL,
};
XL_TABLE xl_u64 xl_init[8] = { XL_PRIME32_3, XL_PRIME64_1, XL_PRIME64_2, XL_PRIME64_3,
			       XL_PRIME64_4, XL_PRIME32_2, XL_PRIME64_5, XL_PRIME32_1 };

/* A little-endian read at any address (the last stripe's may be odd). */
XL_FN xl_u64 xl_rd64(const unsigned char *p)
{
	xl_u64 v = 0;
	for (int i = 7; i >= 0; i--)
		v = v << 8 | p[i];
	return v;
}

/* The 128-bit product's halves xored. */
XL_FN xl_u64 xl_fold(xl_u64 a, xl_u64 b)
{
#ifdef __CUDACC__
	return (a * b) ^ __umul64hi(a, b);
#else
	unsigned __int128 p = (unsigned __int128)a * b;
	return (xl_u64)p ^ (xl_u64)(p >> 64);
#endif
}

XL_FN xl_u64 xl_avalanche(xl_u64 h)
{
	h ^= h >> 37;
	h *= 0x165667919E3779F9ULL;
	return h ^ (h >> 32);
}

/* ---- the long path, a lane at a time ---- */

/* One stripe's step for a lane: its word and its neighbour's (word i^1). */
XL_FN xl_u64 xl_round(xl_u64 acc, xl_u64 self, xl_u64 other, xl_u64 key)
{
	xl_u64 k = self ^ key;
	return acc + other + (k & 0xffffffffULL) * (k >> 32);
}

/* The 16 bytes of a stripe that hold lane's word and its neighbour's, at an address that
 * is a multiple of 16. */
XL_FN void xl_pair(const unsigned char *stripe, unsigned lane, xl_u64 *self, xl_u64 *other)
{
#ifdef __CUDACC__
	ulonglong2 v = __ldg((const ulonglong2 *)(stripe + 16 * (lane >> 1)));
	xl_u64 w[2] = { v.x, v.y };
#else
	xl_u64 w[2];
	memcpy(w, stripe + 16 * (lane >> 1), 16);
#endif
	*self = w[lane & 1];
	*other = w[(lane & 1) ^ 1];
}

/* A lane's accumulator scrambled, as after every block. */
XL_FN xl_u64 xl_scramble(xl_u64 acc, unsigned lane)
{
	acc ^= acc >> 47;
	acc ^= xl_words[16 + lane];
	return acc * XL_PRIME32_1;
}

/* The rest of lane's accumulator after the whole blocks, which end at q: the last
 * block's whole stripes, then the input's last 64 bytes. */
XL_FN xl_u64 xl_lane_tail(xl_u64 acc, const unsigned char *p, xl_u64 len, const unsigned char *q, unsigned lane)
{
	xl_u64 self, other;
	unsigned stripes = (unsigned)((p + len - 1 - q) / XL_STRIPE);
	for (unsigned n = 0; n < stripes; n++) {
		xl_pair(q + n * XL_STRIPE, lane, &self, &other);
		acc = xl_round(acc, self, other, xl_words[n + lane]);
	}
	const unsigned char *last = p + len - XL_STRIPE; /* anywhere: read byte by byte */
	return xl_round(acc, xl_rd64(last + 8 * lane), xl_rd64(last + 8 * (lane ^ 1)), xl_last[lane]);
}

/* Lane's accumulator over p[0, len), len > XL_MIDSIZE_MAX, p a multiple of 16, a block
 * at a time (the kernel's loop reads ahead instead; the same steps). */
XL_FN xl_u64 xl_lane(const unsigned char *p, xl_u64 len, unsigned lane)
{
	xl_u64 acc = xl_init[lane], blocks = (len - 1) / XL_BLOCK, self, other;
	const unsigned char *q = p;
	for (xl_u64 b = 0; b < blocks; b++, q += XL_BLOCK) {
		for (int n = 0; n < 16; n++) {
			xl_pair(q + n * XL_STRIPE, lane, &self, &other);
			acc = xl_round(acc, self, other, xl_words[n + lane]);
		}
		acc = xl_scramble(acc, lane);
	}
	return xl_lane_tail(acc, p, len, q, lane);
}

/* The hash of an input of len bytes whose lanes' accumulators are acc[0..7]. */
XL_FN xl_u64 xl_merge(const xl_u64 *acc, xl_u64 len)
{
	xl_u64 h = len * XL_PRIME64_1;
	for (int i = 0; i < 4; i++)
		h += xl_fold(acc[2 * i] ^ xl_merge_keys[2 * i], acc[2 * i + 1] ^ xl_merge_keys[2 * i + 1]);
	return xl_avalanche(h);
}

#endif
