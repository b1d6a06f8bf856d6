/* export: from an open file to a descriptor in the client's hands (gmsfs(5), "Export").
 * FUSE cannot return a descriptor, so an ioctl hands out a one-time ticket (ticket.c)
 * that the client presents on the daemon's socket (sock.c); what a socket request does
 * is rpc.c.  Each stands on the ones before it: sock (connections), ticket (which
 * handle a ticket buys; revoking one unbinds its connections), rpc (the requests; it
 * starts the socket with itself as the handler).  This is what the rest of the daemon
 * sees of it. */
#ifndef GMSFS_FS_EXPORT_H
#define GMSFS_FS_EXPORT_H

#include "../fs.h"

struct fs_handle;

enum ticket_kind { TICKET_NONE, TICKET_EXPORT, TICKET_EXPORT_ALL, TICKET_CHANNEL };

/* path NULL: /run/gmsfs/gmsfs-PID.sock as root, else under $XDG_RUNTIME_DIR or /tmp. */
int export_start(struct fs *fs, const char *path, char *err, size_t errlen);
/* Close the socket and end every connection (fs->mu not held). */
void export_stop(struct fs *fs);
/* The socket's path (fixed once started, but for export_rename; read it under fs->mu). */
const char *export_socket(const struct fs *fs);
/* A takeover's: the socket takes the name path (its old daemon's, gone now). */
void export_rename(struct fs *fs, const char *path);
/* fs->mu held: a ticket for h of this kind, bound to tgid and uid, replacing any other. */
int export_ticket(struct fs *fs, struct fs_handle *h, enum ticket_kind kind, pid_t tgid, uid_t uid,
		  uint8_t out[GMSFS_TICKET_LEN]);
/* fs->mu held: h's ticket is revoked and its connections answer ENOLCK from now on. */
void export_revoke(struct fs *fs, struct fs_handle *h);
/* fs->mu held: the same, and h's export state freed (h is going). */
void export_handle_free(struct fs *fs, struct fs_handle *h);

#endif
