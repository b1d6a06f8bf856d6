/* sock: the daemon's socket's connections, AF_UNIX SOCK_SEQPACKET, a thread per
 * connection (sock_accept.c accepts them: the thread the kernel wakes serves its own).
 *
 * Reachable only by the users the mount admits: mode 0600 (the daemon's uid; root
 * passes anyway) unless the mount has allow_other, then 0666.  No uid can crowd out
 * another: connections are counted per peer uid (SO_PEERCRED at accept) against
 * SOCK_MAX_PER_UID, a connection that has bound no handle must present a ticket within
 * SOCK_AUTH_TIMEOUT_S, and a bound one is closed after SOCK_IDLE_TIMEOUT_S of silence
 * (the client binds again).  The sender of every message is read from SCM_CREDENTIALS,
 * so a forked child cannot use its parent's connection. */
#include "export_internal.h"
#include "../log.h"
#include "clock.h"
#include "fdpass.h"
#include "grow.h"
#include "wire.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define SOCK_MAX_CONNS 4096
#define SOCK_MAX_PER_UID 64
#define SOCK_AUTH_TIMEOUT_S 2
#define SOCK_IDLE_TIMEOUT_S 30
#define SOCK_SEND_TIMEOUT_S 10

struct sock_conn {
	struct fs *fs;
	int fd;
	uid_t uid;                   /* the peer at connect */
	struct export_handle *x;     /* bound handle's export state (fs->mu); NULL: unbound, or the handle is gone */
	pid_t pid;                   /* who bound it: only they may use it */
	uid_t buid;
	bool bound;                  /* it was bound once: an idle timeout applies, not the auth one */
	bool soon;                   /* a SOON came: watch for the next request a while (spin_a_moment) */
	bool after_soon;             /* the last request served was a SOON */
	struct sock_conn *hnext;     /* in x->conns */
	struct sock_conn *next;      /* in the export's list: every connection, for the stop */
	/* A body arriving in several messages (GMSFS_REQ_MORE). */
	uint8_t *body;
	size_t body_len, body_cap;
	uint16_t body_op;
};

/* ---- accounting, fs->mu held ---- */

static struct sock_uid *uid_slot(struct fs *fs, uid_t uid, bool add)
{
	struct export *ex = fs->ex;
	for (size_t i = 0; i < ex->nuids; i++)
		if (ex->uids[i].uid == uid)
			return &ex->uids[i];
	if (!add || GROW(ex->uids, ex->nuids, ex->uids_cap, 8))
		return NULL;
	ex->uids[ex->nuids] = (struct sock_uid){ uid, 0 };
	return &ex->uids[ex->nuids++];
}

static int admit(struct fs *fs, uid_t uid)
{
	struct sock_uid *u = uid_slot(fs, uid, true);
	if (!u || fs->ex->conns >= SOCK_MAX_CONNS)
		return -EMFILE;
	if (u->conns >= SOCK_MAX_PER_UID)
		return -EUSERS;
	u->conns++;
	fs->ex->conns++;
	return 0;
}

static void unbind(struct sock_conn *c)
{
	if (!c->x)
		return;
	for (struct sock_conn **p = &c->x->conns; *p; p = &(*p)->hnext)
		if (*p == c) {
			*p = c->hnext;
			break;
		}
	c->x = NULL;
	c->hnext = NULL;
}

static void leave(struct sock_conn *c)
{
	struct fs *fs = c->fs;
	struct export *ex = fs->ex;
	pthread_mutex_lock(&fs->mu);
	unbind(c);
	struct sock_uid *u = uid_slot(fs, c->uid, false);
	if (u)
		u->conns--;
	ex->conns--;
	for (struct sock_conn **p = &ex->list; *p; p = &(*p)->next)
		if (*p == c) {
			*p = c->next;
			break;
		}
	pthread_cond_broadcast(&ex->cv);
	pthread_mutex_unlock(&fs->mu);
	close(c->fd);
	free(c->body);
	free(c);
}

void sock_shutdown_all(struct fs *fs)
{
	for (struct sock_conn *c = fs->ex->list; c; c = c->next)
		shutdown(c->fd, SHUT_RDWR);
}

int sock_bind(struct fs *fs, struct sock_conn *c, struct fs_handle *h, pid_t pid, uid_t uid)
{
	if (!h->x && !(h->x = calloc(1, sizeof *h->x)))
		return -ENOMEM;
	unbind(c);
	c->x = h->x;
	c->x->h = h;
	c->pid = pid;
	c->buid = uid;
	c->hnext = c->x->conns;
	c->x->conns = c;
	c->bound = true;
	return 0;
}

void sock_unbind_all(struct export_handle *x)
{
	while (x->conns)
		unbind(x->conns);
}

struct fs_handle *sock_handle(struct sock_conn *c, pid_t pid, uid_t uid, int *err)
{
	if (!c->x) {
		*err = -ENOLCK;
		return NULL;
	}
	if (c->pid != pid || c->buid != uid) {
		*err = -EPERM;
		return NULL;
	}
	return c->x->h;
}

/* ---- messages ---- */

int sock_send(int sock, const void *data, size_t len, const int *fds, size_t nfds)
{
	return fdpass_send(sock, data, len, fds, nfds);
}

void sock_send_error(int sock, int err, const char *why)
{
	msgpack_sbuffer sb;
	msgpack_sbuffer_init(&sb);
	struct wire_head h = { .err = err, .msg = why };
	if (!wire_pack_reply(&sb, &h, NULL, 0, NULL, 0))
		sock_send(sock, sb.data, sb.size, NULL, 0);
	msgpack_sbuffer_destroy(&sb);
}

/* Receive one message.  >0: its length; 0: the peer closed; <0: -errno (-EAGAIN: the
 * timeout).  Descriptors sent to us are closed and flagged. */
static ssize_t receive(int sock, void *buf, size_t size, struct ucred *cred, bool *had_fds, bool *truncated)
{
	int fds[FDPASS_MAX];
	struct fdpass_info info;
	ssize_t n = fdpass_recv(sock, buf, size, fds, FDPASS_MAX, &info);
	for (size_t i = 0; i < info.nfds; i++)
		close(fds[i]);
	*had_fds = info.nfds > 0;
	*truncated = info.truncated;
	cred->pid = info.has_cred ? info.cred.pid : 0;
	cred->uid = info.cred.uid;
	return n;
}

/* Add one message's body to the request being assembled.  0, or -EINVAL. */
static int assemble(struct sock_conn *c, const struct gmsfs_sock_req *hd, const uint8_t *body, char *why, size_t whylen)
{
	if (c->body_len && hd->op != c->body_op) {
		snprintf(why, whylen, "op %u in the middle of a body of op %u", (unsigned)hd->op, (unsigned)c->body_op);
		return -EINVAL;
	}
	if (hd->body_len > GMSFS_REQ_BODY_MAX - c->body_len) {
		snprintf(why, whylen, "a body of more than %u bytes", GMSFS_REQ_BODY_MAX);
		return -EINVAL;
	}
	if (c->body_len + hd->body_len > c->body_cap) {
		size_t cap = c->body_cap ? c->body_cap : 65536;
		while (cap < c->body_len + hd->body_len)
			cap *= 2;
		uint8_t *p = realloc(c->body, cap);
		if (!p) {
			snprintf(why, whylen, "out of memory");
			return -ENOMEM;
		}
		c->body = p;
		c->body_cap = cap;
	}
	memcpy(c->body + c->body_len, body, hd->body_len);
	c->body_len += hd->body_len;
	c->body_op = hd->op;
	return 0;
}

void sock_soon(struct sock_conn *c)
{
	c->soon = !c->after_soon; /* one watch a request served: a SOON after a SOON is not one */
	c->after_soon = true;
}

/* One message: >0 go on, 0 close (peer gone, idle, or broke the protocol). */
static int serve_one(struct sock_conn *c, uint8_t *buf, size_t size)
{
	struct ucred cred = { .pid = 0 };
	bool had_fds = false, truncated = false;
	ssize_t n = receive(c->fd, buf, size, &cred, &had_fds, &truncated);
	if (n <= 0)
		return 0; /* closed, or silent past its timeout */
	char why[256] = "";
	struct gmsfs_sock_req hd;
	int e = 0;
	if (truncated) {
		snprintf(why, sizeof why, "message longer than %zu bytes", size - 1);
		e = -EINVAL;
	} else if (had_fds) {
		snprintf(why, sizeof why, "descriptors sent to the daemon");
		e = -EINVAL;
	} else {
		e = wire_req_parse(buf, (size_t)n, &hd, why, sizeof why);
	}
	if (!e && (hd.flags & GMSFS_REQ_MORE || c->body_len))
		e = assemble(c, &hd, buf + sizeof hd, why, sizeof why);
	if (e) {
		fuse_log(FUSE_LOG_WARNING, "gmsfs: socket: %s\n", why);
		sock_send_error(c->fd, -e, why);
		return 0; /* malformed: drop the connection */
	}
	if (hd.flags & GMSFS_REQ_MORE)
		return 1; /* the rest of the body comes next */
	if (cred.pid <= 0) {
		sock_send_error(c->fd, EPERM, "sender unknown (outside the daemon's pid namespace?)");
		return 1;
	}
	bool whole = c->body_len != 0;
	struct rpc_req r = {
		.conn = c, .sock = c->fd, .pid = cred.pid, .uid = cred.uid, .op = (enum gmsfs_op)hd.op,
		.ticket = hd.ticket, .body = whole ? c->body : buf + sizeof hd,
		.body_len = whole ? c->body_len : hd.body_len,
	};
	bool traced = log_trace_rpc() && hd.op != GMSFS_OP_SOON;
	uint64_t t0 = traced ? clock_mono_ns() : 0;
	if (hd.op != GMSFS_OP_SOON)
		c->after_soon = false;
	int keep = c->fs->ex->serve(c->fs, &r);
	if (traced)
		fuse_log(FUSE_LOG_INFO, "gmsfs: socket: op %u of pid %d served in %.0f us (from %llu)\n", (unsigned)hd.op,
			 (int)cred.pid, (clock_mono_ns() - t0) / 1e3, (unsigned long long)(t0 / 1000 % 1000000000));
	explicit_bzero(&hd, sizeof hd);
	c->body_len = 0;
	if (c->body_cap > (1u << 20)) { /* do not keep a large buffer for an idle connection */
		free(c->body);
		c->body = NULL;
		c->body_cap = 0;
	}
	return keep;
}

static void set_timeout(int fd, int opt, int seconds)
{
	struct timeval tv = { seconds, 0 };
	setsockopt(fd, SOL_SOCKET, opt, &tv, sizeof tv);
}


/* A connection's thread watches its socket a moment (200 us) before it sleeps: a client's
 * next request, often right behind the last reply (an import after the bind sent at
 * connect), is served without a wake-up.  At most one thread in eight cores watches at a
 * time (at least one where GMSFS_SPIN_US asks for it), and none where there are fewer
 * than eight: the spin must never take a core a client needs. */
/* The spin's length (0: never) and how many threads may spin at once, fixed at the start. */
long sock_spin_ns(int *most_out)
{
	static int most = -1;
	static long ns;
	if (most < 0) {
		bool asked;
		int n;
		ns = fdpass_spin_config(&asked, &n);
		most = !ns ? 0 : n >= 8 ? n / 8 : asked ? 1 : 0;
	}
	if (most_out)
		*most_out = most;
	return most ? ns : 0;
}

/* After a SOON, up to GMSFS_SOON_WATCH_MS (a commit that follows copies of gigabytes),
 * within the same limit of threads at once. */
static void spin_a_moment(struct sock_conn *c)
{
	static atomic_int spinning;
	int most;
	long ns = sock_spin_ns(&most);
	bool soon = c->soon;
	c->soon = false;
	if (!ns)
		return;
	if (soon)
		ns = GMSFS_SOON_WATCH_MS * 1000000L;
	uint64_t t0 = soon && log_trace_rpc() ? clock_mono_ns() : 0;
	if (atomic_fetch_add(&spinning, 1) < most)
		fdpass_spin_readable(c->fd, ns);
	atomic_fetch_sub(&spinning, 1);
	if (t0) /* GMSFS_TRACE_RPC: how long the watch took (its cap: nothing came) */
		fuse_log(FUSE_LOG_INFO, "gmsfs: socket: after a SOON, watched %.0f us for the next request\n",
			 (clock_mono_ns() - t0) / 1e3);
}

/* Serve c until it ends; buf (SOCK_BUF_SIZE, or NULL) is freed. */
void sock_serve(struct sock_conn *c, uint8_t *buf)
{
	size_t size = SOCK_BUF_SIZE;
	bool bound = false;
	set_timeout(c->fd, SO_RCVTIMEO, SOCK_AUTH_TIMEOUT_S);
	while (buf && (spin_a_moment(c), serve_one(c, buf, size) > 0)) {
		if (c->bound != bound) {
			bound = c->bound;
			set_timeout(c->fd, SO_RCVTIMEO, SOCK_IDLE_TIMEOUT_S);
		}
	}
	free(buf);
	leave(c);
}

/* A connection accepted: counted against its uid, or refused with why. */
struct sock_conn *sock_conn_start(struct fs *fs, int s)
{
	struct ucred peer;
	socklen_t len = sizeof peer;
	if (getsockopt(s, SOL_SOCKET, SO_PEERCRED, &peer, &len) < 0) {
		close(s);
		return NULL;
	}
	struct export *ex = fs->ex;
	struct sock_conn *c = calloc(1, sizeof *c);
	pthread_mutex_lock(&fs->mu);
	int e = c ? admit(fs, peer.uid) : -ENOMEM;
	if (!e && ex->exiting)
		e = -ESHUTDOWN;
	if (!e) {
		*c = (struct sock_conn){ .fs = fs, .fd = s, .uid = peer.uid, .next = ex->list };
		ex->list = c;
	}
	pthread_mutex_unlock(&fs->mu);
	if (e) {
		fuse_log(FUSE_LOG_WARNING, "gmsfs: socket: uid %u refused: %s\n", (unsigned)peer.uid,
			 e == -EUSERS ? "too many connections of that uid" : strerror(-e));
		sock_send_error(s, -e, e == -EUSERS ? "too many connections of this uid" : strerror(-e));
		free(c);
		close(s);
		return NULL;
	}
	int one = 1;
	setsockopt(s, SOL_SOCKET, SO_PASSCRED, &one, sizeof one);
	set_timeout(s, SO_SNDTIMEO, SOCK_SEND_TIMEOUT_S);
	return c;
}
