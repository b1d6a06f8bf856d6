/* handover: a daemon gives its stores to the one that replaces it (gmsfs -o takeover,
 * gmsfs(8)), copying nothing: the descriptors that hold the memory pass over the old
 * daemon's socket, with an image of each store (image.h).  The new daemon mounts
 * beneath the old mount (mnt_beneath) and lifts the old one off, so the mount point never
 * stands empty; the old daemon answers its waiting opens with ESTALE (libgmsfs opens
 * again) and ends.  Committed layouts come across; a writer's session does not (as if its
 * writer had died), and while the handover runs the old daemon commits, makes, removes
 * and moves no store (ESTALE, EAGAIN).
 *
 *   new daemon                      old daemon (the socket's HANDOVER request)
 *   connect, HANDOVER      ->
 *                          <-       images (a memfd) and every memory descriptor
 *   restore, mount beneath, lift the old mount
 *   MOUNTED                ->
 *                          <-       BYE: waiters answered, then it exits
 */
#ifndef GMSFS_FS_HANDOVER_H
#define GMSFS_FS_HANDOVER_H

#include "fs.h"

#include <sys/types.h>

/* The old side, on a socket connection's thread: a HANDOVER request from uid (only the
 * daemon's own user, or root).  Returns only when the handover failed (the daemon serves
 * on, unfrozen); on success the process ends. */
void handover_give(struct fs *fs, int sock, uid_t uid, const char *socket_path);

/* The new side, before it mounts.  What the daemon serving mountpoint says of itself
 * (its device file): backend, device uuid, socket. */
struct handover_peer {
	char backend[16], uuid[64], socket[108];
	char options[2048];      /* its -o options in effect (the device file's options line) */
	char fsname[256];        /* its mount's source */
	char socket_final[108];  /* this daemon takes the old one's socket name once it ends */
	int conn;        /* the socket connection, once handover_take has run */
	pid_t pid;
	struct vmm_known known;  /* its device's facts (no uuid: none, or not a cuda device's) */
	bool mounted_by_libfuse; /* the old mount was lifted first (no mount beneath here) */
};
int handover_peer(const char *mountpoint, struct handover_peer *p, char *err, size_t errlen);
/* Every store of the old daemon, restored into fs (nothing is mounted yet). */
int handover_take(struct fs *fs, const char *mountpoint, struct handover_peer *p, char *err, size_t errlen);
/* This daemon is mounted beneath the old one on mountpoint: lift the old mount, let the
 * old daemon go and wait until it has (or ok false: the new mount failed, the old daemon
 * serves on). */
int handover_finish(struct fs *fs, struct handover_peer *p, const char *mountpoint, bool ok, char *err,
		    size_t errlen);

#endif
