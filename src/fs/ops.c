/* ops: the table of FUSE operations.  Unsupported ones are left out (ENOSYS), but
 * rename, which is refused explicitly: names are fixed for a node's life. */
#include "fs.h"
#include "lock.h"
#include "ops.h"
#include "store.h"
#include "export/export.h"

#include <errno.h>
#include <stdlib.h>

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
