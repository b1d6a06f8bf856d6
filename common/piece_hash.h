/* piece_hash: XXH3-64 of a store's 2 MiB pieces with the CPU's widest vectors.  xxhash's
 * header, as the loader and libgmsfs include it (nothing linked), compiles for SSE2 only:
 * 21 GB/s a core where AVX2 hashes 64 and AVX-512 92 (a 2 MiB piece in cache, an EPYC).
 * The loader, the snapshots and gmsfs_digest hash every byte they move: a quarter of the
 * CPU time, for cores an engine's host shares.  The same value whichever is used;
 * GMSFS_PIECE_HASH=sse2|avx2 asks for a narrower kind than the CPU has. */
#ifndef GMSFS_COMMON_PIECE_HASH_H
#define GMSFS_COMMON_PIECE_HASH_H

#include <stddef.h>
#include <stdint.h>

uint64_t piece_hash(const void *p, size_t n);

/* The same over bytes given in runs (each hashed as it lands, while in the core's cache):
 * begin, update for each run in order, end.  The state is XXH3's, opaque here. */
struct piece_hash_state {
	_Alignas(64) unsigned char xxh3[640];
};
void piece_hash_begin(struct piece_hash_state *s);
void piece_hash_update(struct piece_hash_state *s, const void *p, size_t n);
uint64_t piece_hash_end(struct piece_hash_state *s);

/* What piece_hash chooses from, for piece_hash.c and the tests only. */
uint64_t piece_hash_avx2(const void *p, size_t n);
uint64_t piece_hash_avx512(const void *p, size_t n);
uint64_t piece_hash_sse2(const void *p, size_t n);
void piece_hash_update_avx2(void *xxh3, const void *p, size_t n);
void piece_hash_update_avx512(void *xxh3, const void *p, size_t n);
void piece_hash_update_sse2(void *xxh3, const void *p, size_t n);
/* "avx512", "avx2" or "sse2": what this CPU uses. */
const char *piece_hash_kind(void);

#endif
