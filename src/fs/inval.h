/* inval: the kernel keeps layout names and attributes LAYOUT_TIMEOUT seconds; changes
 * made behind its back are sent to it by a thread of its own. */
#ifndef GMSFS_FS_INVAL_H
#define GMSFS_FS_INVAL_H

#include "fs.h"

#define LAYOUT_TIMEOUT 10.0

/* Report the changes to the layout nodes of m, a store's (fs->mu held). */
void inval_watch(struct fs *fs, struct meta_store *m);
int inval_start(struct fs *fs);
/* fs->mu not held, never in a FUSE handler whose kernel locks the notices may need (a
 * write to a layout file); returns once what was queued before it has been sent. */
void inval_flush(struct fs *fs);
/* Stop the thread; what is queued is dropped and later changes are not reported.
 * inval_free once no store is left (after the socket's stop too). */
void inval_stop(struct fs *fs);
void inval_free(struct fs *fs);

#endif
