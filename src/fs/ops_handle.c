/* ops_handle: what every family of FUSE operations shares (ops_handle.h): open files'
 * handles are made and freed here, as only the ops make them, and an inode is resolved
 * as the request's caller sees it. */
#include "ops_handle.h"
#include "lock.h"
#include "store.h"
#include "export/export.h"

#include <errno.h>
#include <stdlib.h>

int ops_resolve(fuse_req_t req, struct fs *fs, fuse_ino_t ino, struct obj *o)
{
	int e = node_resolve(fs, ino, o);
	if (e || !o->m)
		return e;
	o->committed = lock_outside(req, o->st);
	return o->committed && !meta_committed(o->m) ? -ENOENT : 0;
}

struct fs_handle *ops_handle_new(struct store *st)
{
	struct fs_handle *h = calloc(1, sizeof *h);
	if (h && (h->store = st))
		store_get(st);
	return h;
}

void ops_drop_refused(struct fs_handle *h)
{
	struct meta_node *m = h->node;
	if (!h->size_refused || !m || !m->linked || m->kind != META_ALLOC || m->size || h->hold != HOLD_SESSION)
		return;
	h->size_refused = false;
	meta_remove(m);
	store_notify(h->store);
}

void ops_listing_drop(struct fs *fs, struct fs_handle *h)
{
	for (size_t i = 0; i < h->nlisting; i++)
		node_forget(fs, node_ino(fs, h->listing[i]), 1);
	free(h->listing);
	h->listing = NULL;
	h->nlisting = 0;
}

void ops_handle_free(struct fs_handle *h)
{
	if (!h)
		return;
	struct store *st = h->store;
	if (h->listing)
		ops_listing_drop(st->fs, h);
	if (h->x)
		export_handle_free(st->fs, h);
	ops_drop_refused(h);
	if (st && (h->hold != HOLD_NONE || h->paused))
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
