/* vmm_pages: an elastic store's page made: one of its pool's spares (vmm_spare.c) first, for
 * making and exporting a page is most of what a new one costs; else a new one. */
#include "vmm.h"
#include "vmm_internal.h"

#include <errno.h>

int vmm_alloc_page(struct vmm_pool *pool, uint64_t size, struct vmm_buf **out)
{
	int e = vmm_spare_use(pool, vmm_align(pool->vmm, size), out);
	if (e == -ENOENT && !(e = vmm_alloc_one(pool, size, out))) /* a page is never in pieces */
		(*out)->page = true;
	return e;
}

int vmm_spare_use(struct vmm_pool *pool, uint64_t aligned, struct vmm_buf **out)
{
	struct vmm *v = pool->vmm;
	struct vmm_buf *b = vmm_spare_take(pool, aligned);
	if (!b)
		return -ENOENT;
	/* Its memory is held already (the spare pages' sum with used_bytes does not change):
	 * within the quota and the others' minimums, as new memory after every spare page
	 * was given up. */
	int e = 0;
	if (!vmm_reserve(&pool->used, atomic_load(&pool->quota), aligned))
		e = -EDQUOT;
	else if (!vmm_device_take(v, pool, aligned, 0))
		atomic_fetch_sub(&pool->used, aligned), e = -ENOSPC;
	if (e) {
		vmm_spare_return(b);
		return e;
	}
	atomic_fetch_sub(&v->pages_spare, aligned);
	atomic_fetch_sub(&pool->pages_spare, aligned);
	vmm_pool_get(pool);
	vmm_note_peak(pool);
	atomic_store(&b->refs, 1);
	*out = b;
	return 0;
}
