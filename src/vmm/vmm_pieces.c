/* vmm_pieces: allocations made of several buffers.  One allocation of 16 GB in one piece
 * of memory can only move or be freed whole: a switch of two such models could not make
 * room for a piece coming in by a piece going out, and would copy all out, then all in.
 * Past the mount's piece size (piece_bytes), an allocation is pieces of that size (the
 * last one smaller), each a buffer of its own (exported, kept, moved as any), that
 * clients map side by side at one address. */
#include "vmm.h"
#include "vmm_internal.h"
#include <gmsfs/abi.h>

#include <errno.h>
#include <stdlib.h>
#include <string.h>

uint64_t vmm_piece_of(const struct vmm *v, uint64_t aligned)
{
	uint64_t piece = v->piece_bytes, g = v->dev.granularity;
	if (!piece || aligned <= piece)
		return 0;
	uint64_t least = aligned / GMSFS_PIECES_MAX + (aligned % GMSFS_PIECES_MAX != 0);
	if (least > piece)
		piece = least; /* at most GMSFS_PIECES_MAX pieces: bigger ones */
	piece = (piece + g - 1) / g * g;
	return aligned <= piece ? 0 : piece;
}

int vmm_compound(struct vmm_buf *const *pieces, size_t n, struct vmm_buf **out)
{
	if (n < 2 || n > GMSFS_PIECES_MAX)
		return -EINVAL;
	uint64_t size = 0;
	for (size_t i = 0; i < n; i++) {
		const struct vmm_buf *k = pieces[i];
		if (k->npieces || k->pool != pieces[0]->pool ||
		    (i + 1 < n ? k->size != pieces[0]->size : !k->size || k->size > pieces[0]->size))
			return -EINVAL;
		size += k->size;
	}
	struct vmm_buf *b = calloc(1, sizeof *b);
	if (!b || !(b->pieces = malloc(n * sizeof *b->pieces))) {
		free(b);
		return -ENOMEM;
	}
	memcpy(b->pieces, pieces, n * sizeof *pieces);
	b->npieces = (uint32_t)n;
	atomic_fetch_add(&pieces[0]->pool->pieces, (unsigned)n);
	b->vmm = pieces[0]->vmm;
	b->pool = pieces[0]->pool; /* alive while its pieces are */
	b->size = size;
	b->fd = -1;
	atomic_init(&b->ro_fd, -1);
	atomic_init(&b->refs, 1);
	*out = b;
	return 0;
}

int vmm_alloc(struct vmm_pool *pool, uint64_t size, struct vmm_buf **out)
{
	uint64_t aligned = vmm_align(pool->vmm, size), piece = aligned ? vmm_piece_of(pool->vmm, aligned) : 0;
	if (!piece)
		return vmm_alloc_one(pool, size, out);
	size_t n = (size_t)(aligned / piece + (aligned % piece != 0));
	struct vmm_buf **v = calloc(n, sizeof *v);
	if (!v)
		return -ENOMEM;
	int e = 0;
	for (size_t i = 0; i < n && !e; i++)
		e = vmm_alloc_one(pool, i + 1 < n ? piece : aligned - piece * (n - 1), &v[i]);
	if (!e)
		e = vmm_compound(v, n, out);
	if (e) {
		vmm_release_all(v, n); /* all or nothing */
		return e;
	}
	free(v);
	return 0;
}
