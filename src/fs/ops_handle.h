/* ops_handle: what the families of FUSE operations share: their handles, and an inode
 * resolved as the caller sees it. */
#ifndef GMSFS_FS_OPS_HANDLE_H
#define GMSFS_FS_OPS_HANDLE_H

#include "fs.h"
#include "node.h"

/* ino as the request's caller sees it: a layout node in the last commit's view when the
 * caller is outside the store's writer session (gmsfs(5), "What a session shows"), and
 * -ENOENT for a node made in that session, which it cannot see.  fs->mu held. */
int ops_resolve(fuse_req_t req, struct fs *fs, fuse_ino_t ino, struct obj *o);
/* A handle of st (NULL: the root's), holding st. */
struct fs_handle *ops_handle_new(struct store *st);
/* Give back a directory handle's listing: its references, then the list. */
void ops_listing_drop(struct fs *fs, struct fs_handle *h);
/* Give back its lock, listing, ticket, connections and poller; the last handle of a removed store frees it. */
void ops_handle_free(struct fs_handle *h);
/* A file its open made, refused a size and never sized since: removed (a session's
 * change), at the close of its descriptor or its release: truncate -s N of a new file
 * that was refused leaves nothing behind, and the descriptor may ask another size
 * until then. */
void ops_drop_refused(struct fs_handle *h);

#endif
