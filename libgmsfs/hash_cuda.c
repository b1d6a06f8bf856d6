/* hash_cuda: the pieces' XXH3-64 computed by the GPU that holds them (gmsfs_digest on the
 * cuda backend): the kernel of digest_gpu.cu, carried as PTX and loaded into the calling
 * thread's context for the call, eight threads a piece.  A 16 GiB store is read once by
 * the GPU at its memory's speed instead of copied to host memory over PCIe and hashed
 * there by the CPU. */
#include "internal.h"

#ifdef GMSFS_HAVE_CUDA
#include "digest_gpu_ptx.h"
#include "piece_hash.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define HASH_THREADS 256 /* a block: 32 pieces */
#define SHORT_MAX 240     /* a piece this short is hashed here (digest_gpu.cu) */

/* The pieces apart for the kernel: table holds the long ones' addresses, then their
 * lengths, then room for their hashes; which[i] is the piece of the i-th long one, and
 * after them of each short one, whose bytes come into bytes. */
struct split {
	uint64_t *table;
	size_t *which, nlong, nshort;
	unsigned char *bytes;
};

static int split_pieces(size_t n, const void *const *at, const uint64_t *len, struct split *s, char *err,
			size_t errlen)
{
	*s = (struct split){ 0 };
	for (size_t k = 0; k < n; k++) {
		if (len[k] <= SHORT_MAX)
			s->nshort++;
		else if ((uintptr_t)at[k] & 15)
			return snprintf(err, errlen, "a piece at %p, not a multiple of 16", at[k]), -EINVAL;
	}
	s->nlong = n - s->nshort;
	s->table = malloc((3 * s->nlong + 1) * sizeof *s->table);
	s->which = malloc((n + 1) * sizeof *s->which);
	s->bytes = malloc(s->nshort * SHORT_MAX + 1);
	if (!s->table || !s->which || !s->bytes)
		return snprintf(err, errlen, "out of memory"), -ENOMEM;
	for (size_t k = 0, i = 0, j = s->nlong; k < n; k++) {
		if (len[k] > SHORT_MAX) {
			s->table[i] = (uint64_t)(uintptr_t)at[k];
			s->table[s->nlong + i] = len[k];
			s->which[i++] = k;
		} else
			s->which[j++] = k;
	}
	return 0;
}

/* On stream st: the long pieces' table copied to d, the kernel, its hashes back, the
 * short pieces' bytes read; then waited for.  *what: the call that failed. */
static CUresult run(const struct cu_api *cu, CUfunction fn, CUstream st, CUdeviceptr d, struct split *s,
		    const void *const *at, const uint64_t *len, const char **what)
{
	size_t nl = s->nlong;
	CUdeviceptr d_at = d, d_len = d + nl * sizeof(uint64_t), d_out = d + 2 * nl * sizeof(uint64_t);
	unsigned count = (unsigned)nl, blocks = (unsigned)((8 * nl + HASH_THREADS - 1) / HASH_THREADS);
	void *args[] = { &d_at, &d_len, &d_out, &count };
	CUresult r = CUDA_SUCCESS;
	if (nl && (*what = "cuMemcpyHtoDAsync", 1))
		r = cu->cuMemcpyHtoDAsync(d, s->table, 2 * nl * sizeof(uint64_t), st);
	if (!r && nl && (*what = "cuLaunchKernel", 1))
		r = cu->cuLaunchKernel(fn, blocks, 1, 1, HASH_THREADS, 1, 1, 0, st, args, NULL);
	if (!r && nl && (*what = "cuMemcpyDtoHAsync", 1))
		r = cu->cuMemcpyDtoHAsync(s->table + 2 * nl, d_out, nl * sizeof(uint64_t), st);
	for (size_t i = 0; !r && i < s->nshort; i++) {
		size_t k = s->which[nl + i];
		if (len[k] && (*what = "cuMemcpyDtoHAsync", 1))
			r = cu->cuMemcpyDtoHAsync(s->bytes + i * SHORT_MAX, (CUdeviceptr)(uintptr_t)at[k], len[k], st);
	}
	if (!r && (*what = "the kernel", 1))
		r = cu->cuStreamSynchronize(st);
	return r;
}

int gm_cuda_hash_pieces(gmsfs *g, size_t n, const void *const *at, const uint64_t *len, uint64_t *out, char *err,
			size_t errlen)
{
	const struct cu_api *cu = &g->cu;
	if (!n)
		return snprintf(err, errlen, "no pieces"), 0;
	if (n > (1u << 28)) /* 8 threads a piece: the grid's count stays an unsigned */
		return snprintf(err, errlen, "%zu pieces", n), -E2BIG;
	struct split s;
	int e = split_pieces(n, at, len, &s, err, errlen);
	CUmodule mod = NULL;
	CUfunction fn = NULL;
	CUstream st = NULL;
	CUdeviceptr d = 0;
	const char *what = "cuModuleLoadData (the driver compiles the kernel's PTX)";
	double t0 = gm_us();
	CUresult r = e ? CUDA_SUCCESS : cu->cuModuleLoadData(&mod, gm_digest_ptx);
	if (!e && !r && (what = "cuModuleGetFunction", 1))
		r = cu->cuModuleGetFunction(&fn, mod, "gmsfs_xxh3_pieces");
	double t1 = gm_us();
	if (!e && !r && (what = "cuStreamCreate", 1)) /* not the caller's default stream: it may be busy */
		r = cu->cuStreamCreate(&st, CU_STREAM_NON_BLOCKING);
	if (!e && !r && s.nlong && (what = "cuMemAlloc", 1))
		r = cu->cuMemAlloc(&d, 3 * s.nlong * sizeof(uint64_t));
	if (!e && !r)
		r = run(cu, fn, st, d, &s, at, len, &what);
	if (!e && r)
		e = r == CUDA_ERROR_OUT_OF_MEMORY ? -ENOMEM : -EIO, snprintf(err, errlen, "%s: %s", what, cu_name(cu, r));
	else if (!e) /* what it did, for GMSFS_TRACE_IMPORT */
		snprintf(err, errlen, "the kernel loaded in %.0f us, %zu pieces on it and %zu here in %.0f us", t1 - t0,
			 s.nlong, s.nshort, gm_us() - t1);
	for (size_t i = 0; !e && i < s.nlong; i++)
		out[s.which[i]] = s.table[2 * s.nlong + i];
	for (size_t i = 0; !e && i < s.nshort; i++)
		out[s.which[s.nlong + i]] = piece_hash(s.bytes + i * SHORT_MAX, len[s.which[s.nlong + i]]);
	if (st)
		cu->cuStreamSynchronize(st); /* nothing still writes into what goes next */
	if (d)
		cu->cuMemFree(d);
	if (st)
		cu->cuStreamDestroy(st);
	if (mod)
		cu->cuModuleUnload(mod);
	free(s.table), free(s.which), free(s.bytes);
	return e;
}
#endif
