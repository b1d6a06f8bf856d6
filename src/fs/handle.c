/* handle: an open file of the mount (a FUSE file handle), and what it holds. */
#include "handle.h"
#include "store.h"
#include "export/export.h"

#include <stdlib.h>

struct fs_handle *handle_new(struct store *st)
{
	struct fs_handle *h = calloc(1, sizeof *h);
	if (h && (h->store = st))
		store_get(st);
	return h;
}

void handle_free(struct fs_handle *h)
{
	if (!h)
		return;
	struct store *st = h->store;
	if (h->x)
		export_handle_free(st->fs, h);
	if (st && h->hold != HOLD_NONE)
		lock_release(h);
	store_untrack(h);
	if (h->ph) {
		fuse_pollhandle_destroy(h->ph);
		st->pollers--;
	}
	if (h->node)
		meta_drop(h->node);
	if (st)
		store_put(st, 1);
	free(h->text);
	free(h);
}
