/* ops: the table of FUSE operations.  Unsupported ones are left out (ENOSYS), but
 * rename, which is refused explicitly: names are fixed for a node's life.  Open files'
 * handles are made and freed here: only the ops make them. */
#include "fs.h"
#include "lock.h"
#include "ops.h"
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

void ops_handle_free(struct fs_handle *h)
{
	if (!h)
		return;
	struct store *st = h->store;
	if (h->x)
		export_handle_free(st->fs, h);
	ops_drop_refused(h);
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

static void fs_init(void *userdata, struct fuse_conn_info *conn)
{
	/* echo > commit arrives as an open with O_TRUNC. */
	if (conn->capable & FUSE_CAP_ATOMIC_O_TRUNC)
		conn->want |= FUSE_CAP_ATOMIC_O_TRUNC;
	/* No late writes with pid 0 through another handle. */
	conn->want &= ~FUSE_CAP_WRITEBACK_CACHE;
}

const struct fuse_lowlevel_ops fs_ops = {
	.init = fs_init,
	.lookup = fs_lookup,
	.forget = fs_forget,
	.forget_multi = fs_forget_multi,
	.getattr = fs_getattr,
	.setattr = fs_setattr,
	.mkdir = fs_mkdir,
	.rmdir = fs_rmdir,
	.unlink = fs_unlink,
	.rename = fs_rename,
	.open = fs_open,
	.create = fs_create,
	.read = fs_read,
	.write = fs_write,
	.flush = fs_flush,
	.release = fs_release,
	.poll = fs_poll,
	.opendir = fs_opendir,
	.releasedir = fs_release,
	.readdir = fs_readdir,
	.readdirplus = fs_readdirplus,
	.getxattr = fs_getxattr,
	.listxattr = fs_listxattr,
	.setxattr = fs_setxattr,
	.removexattr = fs_removexattr,
	.statfs = fs_statfs,
	.ioctl = fs_ioctl,
};
