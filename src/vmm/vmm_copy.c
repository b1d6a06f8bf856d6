/* vmm_copy: a buffer of another's shape, and the bytes of one copied into the other (a
 * store's next version: the memory made through the daemon's door, then filled here). */
#include "vmm.h"
#include "vmm_internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int vmm_alloc_like(struct vmm_pool *p, const struct vmm_buf *like, struct vmm_buf **out)
{
	*out = NULL;
	size_t n = vmm_npieces(like), made = 0;
	if (n == 1)
		return vmm_piece((struct vmm_buf *)like, 0)->host ? -EINVAL : vmm_alloc_one(p, like->size, out);
	struct vmm_buf **twins = calloc(n, sizeof *twins);
	int e = twins ? 0 : -ENOMEM;
	for (; !e && made < n; made += !e) {
		const struct vmm_buf *piece = vmm_piece((struct vmm_buf *)like, made);
		e = piece->host ? -EINVAL : vmm_alloc_one(p, piece->size, &twins[made]);
	}
	if (!e)
		e = vmm_compound(twins, n, out);
	if (e)
		vmm_release_all(twins, twins ? made : 0);
	else
		free(twins);
	return e;
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
