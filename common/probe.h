/* probe.h: a table of pointers by open addressing with linear probing, power-of-two
 * size, no tombstones: the name indexes of the daemon's directories and of a store's
 * interned strings.  home(p) is an entry's hash; finding stays with the caller, who
 * knows how to compare. */
#ifndef GMSFS_COMMON_PROBE_H
#define GMSFS_COMMON_PROBE_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

typedef uint64_t (*probe_home_fn)(const void *entry);

/* p into the first free slot from its home (there is one: the caller keeps the table
 * at most 3/4 full). */
static inline void probe_put(void **v, size_t cap, void *p, probe_home_fn home)
{
	size_t mask = cap - 1, i = home(p) & mask;
	while (v[i])
		i = (i + 1) & mask;
	v[i] = p;
}

/* A table of cap slots holding every entry of old (oldcap slots), or NULL. */
static inline void **probe_rehash(void **old, size_t oldcap, size_t cap, probe_home_fn home)
{
	void **v = calloc(cap, sizeof *v);
	for (size_t i = 0; v && i < oldcap; i++)
		if (old[i])
			probe_put(v, cap, old[i], home);
	return v;
}

/* Empty slot i.  Backward-shift deletion keeps every probe chain whole. */
static inline void probe_del(void **v, size_t cap, size_t i, probe_home_fn home)
{
	size_t mask = cap - 1, j = i;
	v[i] = NULL;
	for (;;) {
		j = (j + 1) & mask;
		if (!v[j])
			return;
		size_t h = home(v[j]) & mask;
		/* Move it into the hole unless its home lies cyclically in (i, j]. */
		if (((j - h) & mask) >= ((j - i) & mask)) {
			v[i] = v[j];
			v[j] = NULL;
			i = j;
		}
	}
}

#endif
