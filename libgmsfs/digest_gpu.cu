/* digest_gpu.cu: the pieces' XXH3-64 on the GPU that holds them (gmsfs_digest), eight
 * threads a piece, one lane each (common/xxh3_lanes.h), merged by a warp's shuffles.
 * libgmsfs carries it as PTX (libgmsfs/digest_gpu_ptx.h, made by scripts/ptx.sh where
 * nvcc is) and the driver compiles it for its GPU when the library first loads it: no
 * build here needs nvcc. */
#include "xxh3_lanes.h"

/* Lane's accumulator over a piece (xl_lane's steps), its eight threads together (mask):
 * each reads its own word of every stripe, the next block's while it hashes this one (a
 * block at a time, each thread would wait for memory 2048 times a piece), and takes its
 * neighbour's word from the neighbour. */
static __device__ xl_u64 lane_of_piece(const unsigned char *p, xl_u64 len, unsigned lane, unsigned mask)
{
	xl_u64 acc = xl_init[lane], key[16], cur[16], next[16], blocks = (len - 1) / XL_BLOCK;
#pragma unroll
	for (int n = 0; n < 16; n++)
		key[n] = xl_words[n + lane];
	const unsigned long long *w = (const unsigned long long *)p + lane;
	if (blocks) {
#pragma unroll
		for (int n = 0; n < 16; n++)
			cur[n] = __ldg(w + 8 * n);
	}
	for (xl_u64 b = 0; b < blocks; b++) {
		if (b + 1 < blocks) {
#pragma unroll
			for (int n = 0; n < 16; n++)
				next[n] = __ldg(w + (b + 1) * (XL_BLOCK / 8) + 8 * n);
		}
#pragma unroll
		for (int n = 0; n < 16; n++)
			acc = xl_round(acc, cur[n], __shfl_xor_sync(mask, cur[n], 1), key[n]);
		acc = xl_scramble(acc, lane);
#pragma unroll
		for (int n = 0; n < 16; n++)
			cur[n] = next[n];
	}
	return xl_lane_tail(acc, p, len, p + blocks * XL_BLOCK, lane);
}

/* Piece k: its bytes at at[k] (device memory this context maps, a multiple of 16),
 * len[k] of them, more than 240 (a shorter piece is the caller's: XXH3's short paths
 * would make the PTX twice as long, and the driver's compile of it five times as slow);
 * its hash into out[k].  Blocks of a multiple of 32 threads, 8 * n threads or more. */
extern "C" __global__ void gmsfs_xxh3_pieces(const unsigned long long *at, const unsigned long long *len,
					     unsigned long long *out, unsigned n)
{
	unsigned t = blockIdx.x * blockDim.x + threadIdx.x, k = t / 8, lane = t % 8;
	unsigned first = (threadIdx.x & 31) & ~7u; /* the piece's threads in the warp */
	xl_u64 acc = 0, l = k < n ? len[k] : 0;
	if (k < n)
		acc = lane_of_piece((const unsigned char *)at[k], l, lane, 0xffu << first);
	xl_u64 all[8]; /* every thread of the warp takes part in these shuffles */
	for (int i = 0; i < 8; i++)
		all[i] = __shfl_sync(0xffffffffu, acc, first + i);
	if (k < n && lane == 0)
		out[k] = xl_merge(all, l);
}
