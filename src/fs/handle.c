/* handle: an open file of the mount (a FUSE file handle), and what it holds. */
#include "fs.h"

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
	if (h->ticket != TICKET_NONE)
		ticket_revoke(st->fs, h);
	if (h->conns)
		sock_unbind_all(h);
	if (st && h->hold != HOLD_NONE)
		store_release(st, h);
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

uint32_t handle_lock(const struct fs_handle *h)
{
	if (h->hold == HOLD_SESSION)
		return h->writable ? GMSFS_RW : GMSFS_RO;
	return h->hold == HOLD_READ ? GMSFS_RO : 0;
}

bool handle_writes(const struct fs_handle *h)
{
	return h->hold == HOLD_SESSION && h->writable;
}
