/* keep: what a restart keeps, under a service manager with a descriptor store (systemd's
 * FileDescriptorStoreMax=; gmsfs(5), RESTART).  With -o state=DIR, every descriptor that
 * holds a store's memory is handed to the manager (FDSTORE=1, a name each) and the store's
 * image (image.h) is written to DIR/NAME.image before a commit, move, mkdir, quota or
 * priority change returns, and the processes that read it to DIR/NAME.readers when they
 * change.  A daemon killed (SIGKILL too) or restarted gets the descriptors back
 * (LISTEN_FDS, LISTEN_FDNAMES), rebuilds each store from its image, checked by its
 * layout hash, and keeps the read locks of its readers that still run; a store that
 * fails is named in the log and in status.json and never served half.  A descriptor
 * leaves the manager's store (FDSTOREREMOVE=1) once it is closed and no image on disk
 * names it; no memory an image on disk names is given back (keep answers the stores'
 * question, fs->persist).  Everything under fs->mu but keep_start and keep_stop. */
#ifndef GMSFS_FS_KEEP_H
#define GMSFS_FS_KEEP_H

#include "fs.h"

#include <stdio.h>

struct store;

/* Before the mount: dir for the images, max_fds the manager keeps (its
 * FileDescriptorStoreMax=).  The stores a manager passed back are restored now; from
 * then on the stores write their images through fs->persist.  0, or -errno and err (no
 * manager to keep descriptors: -ENOTSUP). */
int keep_start(struct fs *fs, const char *dir, unsigned max_fds, char *err, size_t errlen);
/* At the end, before the stores go: nothing is taken out of the manager's store (a
 * restart gives it back; a stop of the service frees it). */
void keep_stop(struct fs *fs);

/* The device's facts the daemon before kept in dir (DIR/device, vmm_facts.c), where the
 * manager passed the service's mark back to this process: a restart, never a start after
 * a stop or a reboot (the devices may differ then, and no memory waits to be served).
 * 0, or -errno (-ENOENT: none to use). */
int keep_device_facts(const char *dir, struct vmm_known *k);
/* This daemon's device's facts into dir for the next start (cuda: its cuInit then runs
 * behind the start); on another backend the file goes.  Failures are said. */
void keep_device_remember(const char *dir, const struct vmm *v);

/* status.json: "keep": {...} of the mount (nothing when keep is off). */
void keep_status(struct fs *fs, FILE *f);
/* Whether the stores are kept across a restart now: 1, 0 (the manager's store went or
 * refused a descriptor: keep_watch.c hands everything again when it can), -1 without
 * state=. */
int keep_armed(struct fs *fs);

#endif
