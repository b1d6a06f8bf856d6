/* grow.h: room for one more element of a doubling array, shared by the
 * daemon's modules and libgmsfs.  GROW(v, n, cap, first): 0 or -ENOMEM, and
 * v and cap are left as they were on failure. */
#ifndef GMSFS_GROW_H
#define GMSFS_GROW_H

#include <errno.h>
#include <stdlib.h>

static inline int grow_(void **v, size_t n, size_t *cap, size_t elem, size_t first)
{
	if (n < *cap)
		return 0;
	size_t c = *cap ? *cap * 2 : first;
	void *p = realloc(*v, c * elem);
	if (!p)
		return -ENOMEM;
	*v = p;
	*cap = c;
	return 0;
}

#define GROW(v, n, cap, first) grow_((void **)&(v), (n), &(cap), sizeof *(v), (first))

#endif
