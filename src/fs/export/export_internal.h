/* Shared by the files of src/fs/export; not part of the module's interface. */
#ifndef GMSFS_FS_EXPORT_INTERNAL_H
#define GMSFS_FS_EXPORT_INTERNAL_H

#include "export.h"
#include "../handle.h"

#include <sys/types.h>

struct sock_conn;
struct rpc_req;
/* One request of a connection; the reply is sent.  >0: keep the connection, 0: close it
 * (the peer broke the protocol). */
typedef int sock_serve_fn(struct fs *fs, const struct rpc_req *r);

/* A handle's ticket and the connections bound to it, under fs->mu. */
struct export_handle {
	struct fs_handle *h;           /* whose */
	enum ticket_kind ticket;       /* live until presented or the handle is released */
	uint8_t bytes[GMSFS_TICKET_LEN];
	pid_t tgid;
	uid_t uid;
	struct export_handle *tnext;   /* in the live tickets */
	struct sock_conn *conns;       /* socket connections bound to the handle */
};

/* The module's state, under fs->mu unless marked. */
struct export {
	char socket_path[108];         /* fixed once started */
	sock_serve_fn *serve;          /* what a request does (rpc.c); fixed once started */
	int sock_fd;                   /* fixed once started; the stop shuts it down */
	int reserve_fd;                /* kept to refuse a connection with when out of descriptors */
	int expect_fd;                 /* an eventfd: a connection is coming (sock_expect); -1: none */
	pthread_cond_t cv;             /* a connection or a thread left */
	unsigned conns;                /* open connections */
	/* The thread waiting in accept(2) for the next connection, which it then serves
	 * (acceptor: one waits there); the threads parked to take that role next (spare_cv),
	 * those made and not yet parked, and all of them (serving ones too), for the stop. */
	bool acceptor;
	pthread_cond_t spare_cv;
	unsigned parked, starting, threads;
	struct sock_conn *list;        /* all of them, for the stop */
	struct sock_uid { uid_t uid; unsigned conns; } *uids; /* per peer uid */
	size_t nuids, uids_cap;
	bool exiting;
	struct export_handle *tickets; /* the live ones */
};

/* ticket.c, fs->mu held.  The handle of a ticket presented by pid/uid, spent; or NULL
 * with -EACCES (no such live ticket) or -EPERM (another process or user: the ticket
 * stays for its owner), and why. */
struct fs_handle *ticket_redeem(struct fs *fs, const uint8_t t[GMSFS_TICKET_LEN], pid_t pid, uid_t uid,
				enum ticket_kind *kind, int *err, char *why, size_t whylen);
void ticket_revoke(struct fs *fs, struct export_handle *x);

/* sock.c: the socket at path (export_start's), each request served by serve. */
int sock_start(struct fs *fs, const char *path, sock_serve_fn *serve, char *err, size_t errlen);
/* A client was just given a channel's ticket: it dials in a moment (the acceptor wakes
 * and watches for it, where it spins at all). */
void sock_expect(struct fs *fs);

/* sock.c, for sock_accept.c: a connection's receive buffer; a connection accepted,
 * counted against its uid (NULL: refused, and told why); c served until it ends (buf
 * freed); a refusal sent; the spin's length in ns (0: none) and how many may spin. */
#define SOCK_BUF_SIZE (sizeof(struct gmsfs_sock_req) + GMSFS_MSG_MAX + 1)
struct sock_conn *sock_conn_start(struct fs *fs, int s);
void sock_serve(struct sock_conn *c, uint8_t *buf);
void sock_send_error(int sock, int err, const char *why);
long sock_spin_ns(int *most);
/* fs->mu held: every connection shut down (the stop; their threads then leave). */
void sock_shutdown_all(struct fs *fs);
/* sock.c, fs->mu held: bind c to h for pid and uid; the handle c is bound to, for the
 * sender pid/uid (NULL with -ENOLCK: none, or it was released; -EPERM: bound by another). */
int sock_bind(struct fs *fs, struct sock_conn *c, struct fs_handle *h, pid_t pid, uid_t uid);
struct fs_handle *sock_handle(struct sock_conn *c, pid_t pid, uid_t uid, int *err);
/* A SOON served (rpc.c checked it): the connection's thread watches for the next request
 * (GMSFS_SOON_WATCH_MS), once a request served. */
void sock_soon(struct sock_conn *c);
void sock_unbind_all(struct export_handle *x);
/* Send one reply message with descriptors; 0 or -errno. */
int sock_send(int sock, const void *data, size_t len, const int *fds, size_t nfds);

/* A request as the socket received it, for rpc.c. */
struct rpc_req {
	struct sock_conn *conn;
	int sock;
	pid_t pid;
	uid_t uid;
	enum gmsfs_op op;
	const uint8_t *ticket;
	const uint8_t *body;
	size_t body_len;
};

#endif
