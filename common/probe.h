/* probe.h: a table of pointers by open addressing with linear probing, power-of-two
 * size, no tombstones: the name indexes of the daemon's directories, of a store's
 * interned strings, and of libgmsfs's mappings and entries.  home(p, ctx) is an entry's
 * hash (ctx: what the caller passed, for entries that are indexes into its arrays);
 * finding stays with the caller, who knows how to compare. */
#ifndef GMSFS_COMMON_PROBE_H
#define GMSFS_COMMON_PROBE_H

#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

typedef uint64_t (*probe_home_fn)(const void *entry, const void *ctx);

/* p into the first free slot from its home (there is one: the caller keeps the table
 * at most 3/4 full). */
static inline void probe_put(void **v, size_t cap, void *p, probe_home_fn home, const void *ctx)
{
	size_t mask = cap - 1, i = home(p, ctx) & mask;
	while (v[i])
		i = (i + 1) & mask;
	v[i] = p;
}

/* Twice the slots (first, for an empty table), every entry moved over; 0, or -ENOMEM
 * and the table as it was. */
static inline int probe_grow(void ***v, size_t *cap, size_t first, probe_home_fn home, const void *ctx)
{
	size_t c = *cap ? *cap * 2 : first;
	void **t = calloc(c, sizeof *t);
	if (!t)
		return -ENOMEM;
	for (size_t i = 0; i < *cap; i++)
		if ((*v)[i])
			probe_put(t, c, (*v)[i], home, ctx);
	free(*v);
	*v = t;
	*cap = c;
	return 0;
}

/* Empty slot i.  Backward-shift deletion keeps every probe chain whole. */
static inline void probe_del(void **v, size_t cap, size_t i, probe_home_fn home, const void *ctx)
{
	size_t mask = cap - 1, j = i;
	v[i] = NULL;
	for (;;) {
		j = (j + 1) & mask;
		if (!v[j])
			return;
		size_t h = home(v[j], ctx) & mask;
		/* Move it into the hole unless its home lies cyclically in (i, j]. */
		if (((j - h) & mask) >= ((j - i) & mask)) {
			v[i] = v[j];
			v[j] = NULL;
			i = j;
		}
	}
}

#endif
