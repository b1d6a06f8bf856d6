/* vmm_fork: a copy of a buffer (its pieces too), for a store's next version: new memory
 * counted as an allocation's, the bytes copied by the backend. */
#include "vmm.h"
#include "vmm_internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int vmm_fork(struct vmm_buf *b, struct vmm_buf **out, char *err, size_t errlen)
{
	*out = NULL;
	struct vmm *v = b->vmm;
	if (!v->ops->copy) {
		snprintf(err, errlen, "the %s backend cannot copy", v->dev.backend);
		return -EOPNOTSUPP;
	}
	size_t n = vmm_npieces(b), made = 0;
	struct vmm_buf **src = calloc(n, sizeof *src), **twins = calloc(n, sizeof *twins);
	int e = src && twins ? 0 : -ENOMEM;
	for (; !e && made < n; made += !e) {
		src[made] = vmm_piece(b, made);
		/* New memory in the pool's quota and the device's budget, as any allocation's. */
		e = src[made]->host ? -EINVAL : vmm_alloc_one(b->pool, src[made]->size, &twins[made]);
		if (e == -EDQUOT || e == -ENOSPC)
			vmm_pool_why(b->pool, e, src[made]->size, err, errlen);
	}
	if (!e)
		e = v->ops->copy(v, src, twins, n, err, errlen);
	if (!e && n > 1)
		e = vmm_compound(twins, n, out);
	else if (!e)
		*out = twins[0];
	if (e)
		vmm_release_all(twins, twins ? made : 0);
	else
		free(twins);
	free(src);
	return e;
}
