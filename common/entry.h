/* entry.h: one metadata entry as the daemon and the library carry it (gmsfs(5),
 * "Metadata entries"): the codec parses and packs it, the daemon's store puts it, the
 * library keeps its copy of the layout's entries in it.  A new field is one edit here. */
#ifndef GMSFS_COMMON_ENTRY_H
#define GMSFS_COMMON_ENTRY_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

struct entry_rec {
	char *key;         /* below meta/ */
	char *alloc;       /* the allocation it describes, below allocs/ ("" in a manifest: none yet) */
	uint64_t offset;   /* where its extent starts in alloc (user.gms.offset) */
	uint64_t size;     /* the extent's bytes (user.gms.size); 0: none */
	uint32_t flags;    /* GMSFS_ENTRY_* */
	void *value;       /* value_len bytes, at most GMSFS_VALUE_MAX */
	size_t value_len;
	void *copy;        /* the library's: this process's copy of a private entry's extent */
};

/* What n records own (key, alloc, value) freed; the array is the caller's. */
static inline void entry_recs_clear(struct entry_rec *v, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		free(v[i].key);
		free(v[i].alloc);
		free(v[i].value);
	}
}

#endif
