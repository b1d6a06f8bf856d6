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

#endif
