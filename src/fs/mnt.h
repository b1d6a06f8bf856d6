/* mnt: the mount point, before the daemon mounts on it.  No state. */
#ifndef GMSFS_FS_MNT_H
#define GMSFS_FS_MNT_H

#include <stdbool.h>
#include <stddef.h>

/* Is dir a gmsfs mount now?  Its source (fsname) into src when it is. */
bool mnt_is_gmsfs(const char *dir, char *src, size_t srclen);
/* A gmsfs mount on dir whose daemon died answers ENOTCONN: lift it (umount -l).  0; or
 * -EBUSY when a live daemon serves dir: one daemon per mount point (why says so). */
int mnt_prepare(const char *dir, char *why, size_t whylen);
/* A new FUSE mount of fsname under the one on dir (Linux 6.5's MOVE_MOUNT_BENEATH): lifting
 * the top one later (mnt_lift) uncovers it, so dir never stands empty.  *devfd: its
 * /dev/fuse, for fuse_session_mount(se, "/dev/fd/N").  -errno and why. */
int mnt_beneath(const char *dir, const char *fsname, bool allow_other, int *devfd, char *why, size_t whylen);
/* The top mount on dir, detached (umount -l). */
int mnt_lift(const char *dir);

#endif
