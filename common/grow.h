/* grow.h: room in a doubling array, shared by the daemon's modules and libgmsfs.
 * GROW(v, n, cap, first): room for one more; ROOM(v, need, cap, first): for need in
 * all.  0 or -ENOMEM, and v and cap are left as they were on failure. */
#ifndef GMSFS_GROW_H
#define GMSFS_GROW_H

#include <errno.h>
#include <stdlib.h>

static inline int grow_(void **v, size_t need, size_t *cap, size_t elem, size_t first)
{
	if (need <= *cap)
		return 0;
	size_t c = *cap ? *cap * 2 : first;
	while (c < need)
		c *= 2;
	void *p = realloc(*v, c * elem);
	if (!p)
		return -ENOMEM;
	*v = p;
	*cap = c;
	return 0;
}

#define GROW(v, n, cap, first) grow_((void **)&(v), (n) + 1, &(cap), sizeof *(v), (first))
/* ROOM(v, need, cap, first): room for need elements in all, so that adding them cannot fail. */
#define ROOM(v, need, cap, first) grow_((void **)&(v), (need), &(cap), sizeof *(v), (first))

#endif
