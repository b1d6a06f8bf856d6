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

int gm_cuda_hash_pieces(gmsfs *g, size_t n, const void *const *at, const uint64_t *len, uint64_t *out, char *err,
			size_t errlen)
{
	const struct cu_api *cu = &g->cu;
	if (!n)
		return 0;
	if (n > (1u << 28)) /* 8 threads a piece: the grid's count stays an unsigned */
		return snprintf(err, errlen, "%zu pieces", n), -E2BIG;
	/* The long pieces go to the kernel (long[i]: which piece); the short ones' bytes are
	 * read into host memory behind it and hashed here. */
	size_t nlong = 0, nshort = 0;
	for (size_t k = 0; k < n; k++) {
		if (len[k] <= SHORT_MAX)
			nshort++;
		else if ((uintptr_t)at[k] & 15)
			return snprintf(err, errlen, "a piece at %p, not a multiple of 16", at[k]), -EINVAL;
	}
	nlong = n - nshort;
	uint64_t *table = malloc((3 * nlong + 1) * sizeof *table);
	size_t *which = malloc((nlong + nshort + 1) * sizeof *which);
	unsigned char *bytes = malloc(nshort * SHORT_MAX + 1);
	if (!table || !which || !bytes) {
		free(table), free(which), free(bytes);
		return snprintf(err, errlen, "out of memory"), -ENOMEM;
	}
	for (size_t k = 0, i = 0, j = nlong; k < n; k++) {
		if (len[k] > SHORT_MAX) {
			table[i] = (uint64_t)(uintptr_t)at[k];
			table[nlong + i] = len[k];
			which[i++] = k;
		} else
			which[j++] = k;
	}
	CUmodule mod = NULL;
	CUfunction fn = NULL;
	CUstream s = NULL;
	CUdeviceptr d = 0;
	const char *what = "cuModuleLoadData (the driver compiles the kernel's PTX)";
	double t0 = gm_us();
	CUresult r = cu->cuModuleLoadData(&mod, gm_digest_ptx);
	if (!r && (what = "cuModuleGetFunction", 1))
		r = cu->cuModuleGetFunction(&fn, mod, "gmsfs_xxh3_pieces");
	double t1 = gm_us();
	if (!r && (what = "cuStreamCreate", 1)) /* not the caller's default stream: it may be busy */
		r = cu->cuStreamCreate(&s, CU_STREAM_NON_BLOCKING);
	if (!r && nlong && (what = "cuMemAlloc", 1))
		r = cu->cuMemAlloc(&d, 3 * nlong * sizeof(uint64_t));
	CUdeviceptr d_at = d, d_len = d + nlong * sizeof(uint64_t), d_out = d + 2 * nlong * sizeof(uint64_t);
	unsigned count = (unsigned)nlong, blocks = (unsigned)((8 * nlong + HASH_THREADS - 1) / HASH_THREADS);
	void *args[] = { &d_at, &d_len, &d_out, &count };
	if (!r && nlong && (what = "cuMemcpyHtoDAsync", 1))
		r = cu->cuMemcpyHtoDAsync(d, table, 2 * nlong * sizeof(uint64_t), s);
	if (!r && nlong && (what = "cuLaunchKernel", 1))
		r = cu->cuLaunchKernel(fn, blocks, 1, 1, HASH_THREADS, 1, 1, 0, s, args, NULL);
	if (!r && nlong && (what = "cuMemcpyDtoHAsync", 1))
		r = cu->cuMemcpyDtoHAsync(table + 2 * nlong, d_out, nlong * sizeof(uint64_t), s);
	for (size_t i = 0; !r && i < nshort; i++) {
		size_t k = which[nlong + i];
		what = "cuMemcpyDtoHAsync";
		if (len[k])
			r = cu->cuMemcpyDtoHAsync(bytes + i * SHORT_MAX, (CUdeviceptr)(uintptr_t)at[k], len[k], s);
	}
	if (!r && (what = "the kernel", 1))
		r = cu->cuStreamSynchronize(s);
	if (r)
		snprintf(err, errlen, "%s: %s", what, cu_name(cu, r));
	if (gm_tracing())
		fprintf(stderr, "gmsfs: digest: the kernel loaded in %.0f us, %zu pieces on it and %zu here in %.0f us\n",
			t1 - t0, nlong, nshort, gm_us() - t1);
	for (size_t i = 0; !r && i < nlong; i++)
		out[which[i]] = table[2 * nlong + i];
	for (size_t i = 0; !r && i < nshort; i++)
		out[which[nlong + i]] = piece_hash(bytes + i * SHORT_MAX, len[which[nlong + i]]);
	if (s)
		cu->cuStreamSynchronize(s); /* nothing still writes into what goes next */
	if (d)
		cu->cuMemFree(d);
	if (s)
		cu->cuStreamDestroy(s);
	if (mod)
		cu->cuModuleUnload(mod);
	free(table), free(which), free(bytes);
	return r == CUDA_SUCCESS ? 0 : r == CUDA_ERROR_OUT_OF_MEMORY ? -ENOMEM : -EIO;
}
#endif
