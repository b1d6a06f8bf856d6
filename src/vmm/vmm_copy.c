/* vmm_copy: a buffer of another's shape, and the bytes of one copied into the other (a
 * store's next version: the memory made through the daemon's door, then filled here); the
 * memory of the next one made ahead, as spares of the store's pool. */
#include "vmm.h"
#include "vmm_internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* One piece of aligned bytes: a spare made ahead for it if p has one (no longer a page:
 * a version's memory is released at its end, never kept), else new. */
static int piece_like(struct vmm_pool *p, uint64_t aligned, struct vmm_buf **out)
{
	if (!vmm_spare_use(p, aligned, out)) {
		(*out)->page = false;
		return 0;
	}
	return vmm_alloc_one(p, aligned, out);
}

int vmm_alloc_like(struct vmm_pool *p, const struct vmm_buf *like, struct vmm_buf **out)
{
	*out = NULL;
	size_t n = vmm_npieces(like), made = 0;
	if (n == 1)
		return vmm_piece((struct vmm_buf *)like, 0)->host ? -EINVAL : piece_like(p, like->size, out);
	struct vmm_buf **twins = calloc(n, sizeof *twins);
	int e = twins ? 0 : -ENOMEM;
	for (; !e && made < n; made += !e) {
		const struct vmm_buf *piece = vmm_piece((struct vmm_buf *)like, made);
		e = piece->host ? -EINVAL : piece_like(p, piece->size, &twins[made]);
	}
	if (!e)
		e = vmm_compound(twins, n, out);
	if (e)
		vmm_release_all(twins, twins ? made : 0);
	else
		free(twins);
	return e;
}

/* One spare of aligned bytes made for p, in room nobody holds and within its quota. */
static int make_spare(struct vmm_pool *p, uint64_t aligned)
{
	struct vmm *v = p->vmm;
	uint64_t quota = atomic_load(&p->quota);
	if (atomic_load(&v->frozen))
		return -EAGAIN;
	if (quota && atomic_load(&p->used) + atomic_load(&p->pages_spare) + aligned > quota)
		return -EDQUOT;
	/* Not where memory still being released would have to go first: this runs on the
	 * releaser thread, which never waits for itself (vmm_released_for). */
	if (!vmm_device_take(v, p, aligned, atomic_load(&v->pages_spare) + atomic_load(&v->releasing)))
		return -ENOSPC;
	struct vmm_buf *b;
	int e = v->ops->create(p, aligned, &b);
	if (e) {
		atomic_fetch_sub(&v->used_bytes, aligned);
		return e;
	}
	atomic_fetch_add(&p->used, aligned); /* as vmm_alloc_one counts it; its put makes it a spare */
	vmm_pool_get(p);
	b->vmm = v, b->pool = p, b->size = aligned, b->page = true;
	atomic_init(&b->ro_fd, -1);
	atomic_init(&b->refs, 1);
	vmm_buf_put(b); /* a spare of p now (vmm_spare_page), or released where p may keep none */
	return 0;
}

struct ahead {
	struct vmm_pool *pool;
	struct vmm_buf **like;
	size_t n;
};

/* On the releaser thread: the spares of each like's pieces, until one cannot be made. */
static void make_ahead(void *arg)
{
	struct ahead *a = arg;
	int e = 0;
	for (size_t i = 0; i < a->n; i++) {
		for (size_t k = 0; !e && k < vmm_npieces(a->like[i]); k++) {
			const struct vmm_buf *piece = vmm_piece(a->like[i], k);
			e = piece->host ? -EINVAL : make_spare(a->pool, piece->size);
		}
		vmm_buf_put(a->like[i]);
	}
	vmm_pool_put(a->pool);
	free(a->like);
	free(a);
}

void vmm_spare_make_like_later(struct vmm_pool *p, struct vmm_buf *const *like, size_t n)
{
	struct ahead *a = n ? calloc(1, sizeof *a) : NULL;
	if (a && !(a->like = calloc(n, sizeof *a->like))) {
		free(a);
		a = NULL;
	}
	if (!a)
		return; /* nothing made ahead: the next version's memory is made when it is asked */
	a->pool = p, a->n = n;
	vmm_pool_get(p);
	for (size_t i = 0; i < n; i++) {
		a->like[i] = like[i];
		vmm_buf_get(like[i]);
	}
	vmm_release_later(p->vmm, make_ahead, a);
}

int vmm_copy(struct vmm_buf *from, struct vmm_buf *to, char *err, size_t errlen)
{
	struct vmm *v = from->vmm;
	if (!v->ops->copy) {
		snprintf(err, errlen, "the %s backend cannot copy", v->dev.backend);
		return -EOPNOTSUPP;
	}
	size_t n = vmm_npieces(from);
	bool same = n == vmm_npieces(to);
	for (size_t i = 0; same && i < n; i++)
		same = vmm_piece(from, i)->size == vmm_piece(to, i)->size;
	if (!same) {
		snprintf(err, errlen, "the copy is not of the allocation's shape (vmm_alloc_like makes one)");
		return -EINVAL;
	}
	struct vmm_buf **src = calloc(n, sizeof *src), **dst = calloc(n, sizeof *dst);
	int e = src && dst ? 0 : -ENOMEM;
	for (size_t i = 0; !e && i < n; i++)
		src[i] = vmm_piece(from, i), dst[i] = vmm_piece(to, i);
	if (!e)
		e = v->ops->copy(v, src, dst, n, err, errlen);
	free(src);
	free(dst);
	return e;
}
