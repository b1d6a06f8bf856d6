/* export: from an ioctl's ticket to descriptors in the client's hands.
 *
 * FUSE cannot return a file descriptor, so GMSFS_IOC_EXPORT{,_ALL} hands out a
 * one-time ticket bound to the handle, the caller's thread group and uid; the
 * client presents it on this Unix socket and receives the descriptors with
 * SCM_RIGHTS.  The sender of every request is known from SCM_CREDENTIALS (the
 * kernel fills it in, per message), so a forked child cannot use its parent's
 * ticket even over its parent's connection. */
#include "fs.h"
#include "../grow.h"

#include <errno.h>
#include <fcntl.h>
#include <msgpack.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#define EXPORT_MAX_CONNS 128
#define EXPORT_IO_TIMEOUT_S 10

/* ---- tickets (fs->mu held) ---- */

int export_ticket(struct fs *fs, struct fs_handle *h, bool all, pid_t tgid, uid_t uid, uint8_t out[16])
{
	if (getrandom(h->ticket, sizeof h->ticket, 0) != (ssize_t)sizeof h->ticket)
		return -EAGAIN;
	if (!h->ticket_live) {
		h->tnext = fs->tickets;
		fs->tickets = h;
	}
	h->ticket_live = true;
	h->ticket_all = all;
	h->ticket_tgid = tgid;
	h->ticket_uid = uid;
	memcpy(out, h->ticket, sizeof h->ticket);
	return 0;
}

void export_revoke(struct fs *fs, struct fs_handle *h)
{
	if (!h->ticket_live)
		return;
	for (struct fs_handle **p = &fs->tickets; *p; p = &(*p)->tnext)
		if (*p == h) {
			*p = h->tnext;
			break;
		}
	h->ticket_live = false;
	h->tnext = NULL;
	explicit_bzero(h->ticket, sizeof h->ticket);
}

/* Compare without an early exit, so timing tells nothing about a ticket. */
static bool ticket_eq(const uint8_t *a, const uint8_t *b)
{
	uint8_t d = 0;
	for (int i = 0; i < 16; i++)
		d |= a[i] ^ b[i];
	return d == 0;
}

/* ---- what one ticket buys ---- */

struct export_item {
	char *path, *tag;
	uint64_t size, aligned;
	struct vmm_buf *buf; /* a reference, put when sent */
};

struct export_set {
	struct export_item *v;
	size_t n, cap;
	bool read_only;
};

static void set_free(struct export_set *s)
{
	for (size_t i = 0; i < s->n; i++) {
		free(s->v[i].path);
		free(s->v[i].tag);
		if (s->v[i].buf)
			vmm_buf_put(s->v[i].buf);
	}
	free(s->v);
	*s = (struct export_set){0};
}

static int set_add(struct meta_node *n, void *arg)
{
	struct export_set *s = arg;
	if (n->kind != META_ALLOC || !n->buf)
		return 0; /* directories, and allocations not sized yet: no memory to send */
	if (GROW(s->v, s->n, s->cap, 64))
		return -ENOMEM;
	char path[META_PATH_MAX + 1];
	int e = meta_path(n, path, sizeof path);
	if (e < 0)
		return e;
	struct export_item *it = &s->v[s->n];
	*it = (struct export_item){ .size = n->size, .aligned = n->aligned, .buf = n->buf };
	it->path = strdup(path);
	it->tag = strdup(n->tag ? n->tag : "");
	if (!it->path || !it->tag) {
		free(it->path);
		free(it->tag);
		return -ENOMEM;
	}
	vmm_buf_get(it->buf);
	s->n++;
	return 0;
}

/* Find and spend a ticket.  -EACCES: no such live ticket (forged, used, revoked);
 * -EPERM: presented by another process or user (the ticket stays for its owner). */
static int redeem(struct fs *fs, const uint8_t ticket[16], pid_t pid, uid_t uid, struct export_set *out,
		  char *why, size_t whylen)
{
	pthread_mutex_lock(&fs->mu);
	struct fs_handle *h = fs->tickets;
	while (h && !ticket_eq(h->ticket, ticket))
		h = h->tnext;
	int e = 0;
	if (!h || fs->exiting) {
		snprintf(why, whylen, "unknown ticket (forged, already used, or its file was closed)");
		e = -EACCES;
	} else if (h->ticket_tgid != pid || h->ticket_uid != uid) {
		snprintf(why, whylen, "ticket belongs to pid %d uid %u, presented by pid %d uid %u",
			 (int)h->ticket_tgid, (unsigned)h->ticket_uid, (int)pid, (unsigned)uid);
		e = -EPERM;
	} else if (h->store->removed || h->hold == HOLD_NONE) {
		snprintf(why, whylen, "the store or the lock is gone");
		e = -ENOENT;
	}
	if (!e) {
		bool all = h->ticket_all;
		export_revoke(fs, h);
		out->read_only = h->hold != HOLD_SESSION;
		if (all) {
			e = meta_walk(meta_root(h->store->meta, META_AREA_ALLOCS), set_add, out);
		} else if (!h->node->linked) {
			snprintf(why, whylen, "the allocation was removed");
			e = -ESTALE;
		} else {
			e = set_add(h->node, out);
		}
		if (e && !why[0])
			snprintf(why, whylen, "%s", strerror(-e));
	}
	pthread_mutex_unlock(&fs->mu);
	if (e)
		set_free(out);
	return e;
}

/* ---- the wire ---- */

int export_parse_request(const void *buf, size_t len, struct gmsfs_sock_req *out, char *why, size_t whylen)
{
	if (len != sizeof *out) {
		snprintf(why, whylen, "request of %zu bytes, expected %zu", len, sizeof *out);
		return -EINVAL;
	}
	memcpy(out, buf, sizeof *out);
	if (out->magic != GMSFS_SOCK_MAGIC || out->version != GMSFS_SOCK_VERSION) {
		snprintf(why, whylen, "bad magic or version");
		return -EINVAL;
	}
	if (out->op != GMSFS_SOCK_OP_REDEEM || out->reserved) {
		snprintf(why, whylen, "unknown op %u or reserved bits set", (unsigned)out->op);
		return -EINVAL;
	}
	return 0;
}

static void pack_str(msgpack_packer *pk, const char *s)
{
	size_t n = strlen(s);
	msgpack_pack_str(pk, n);
	msgpack_pack_str_body(pk, s, n);
}

static int send_msg(int sock, const void *data, size_t len, const int *fds, size_t nfds)
{
	struct iovec iov = { (void *)data, len };
	union {
		char buf[CMSG_SPACE(sizeof(int) * GMSFS_FDS_PER_MSG)];
		struct cmsghdr align;
	} u;
	struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1 };
	if (nfds) {
		msg.msg_control = u.buf;
		msg.msg_controllen = CMSG_SPACE(sizeof(int) * nfds);
		struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(sizeof(int) * nfds);
		memcpy(CMSG_DATA(c), fds, sizeof(int) * nfds);
	}
	ssize_t r = sendmsg(sock, &msg, MSG_NOSIGNAL);
	return r == (ssize_t)len ? 0 : -(r < 0 ? errno : EIO);
}

static int send_error(int sock, int err, const char *why)
{
	msgpack_sbuffer sb;
	msgpack_packer pk;
	msgpack_sbuffer_init(&sb);
	msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
	msgpack_pack_map(&pk, 3);
	pack_str(&pk, "v"), msgpack_pack_int(&pk, 1);
	pack_str(&pk, "err"), msgpack_pack_int(&pk, err);
	pack_str(&pk, "msg"), pack_str(&pk, why);
	int e = send_msg(sock, sb.data, sb.size, NULL, 0);
	msgpack_sbuffer_destroy(&sb);
	return e;
}

/* Items [first, first+n) as one message: manifest plus descriptors. */
static int send_batch(int sock, const struct export_set *s, size_t first, size_t n, bool last)
{
	int fds[GMSFS_FDS_PER_MSG];
	bool owned[GMSFS_FDS_PER_MSG];
	size_t nfds = 0;
	int e = 0;
	msgpack_sbuffer sb;
	msgpack_packer pk;
	msgpack_sbuffer_init(&sb);
	msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
	msgpack_pack_map(&pk, 6);
	pack_str(&pk, "v"), msgpack_pack_int(&pk, 1);
	pack_str(&pk, "err"), msgpack_pack_int(&pk, 0);
	pack_str(&pk, "total"), msgpack_pack_uint64(&pk, s->n);
	pack_str(&pk, "first"), msgpack_pack_uint64(&pk, first);
	pack_str(&pk, "last"), last ? msgpack_pack_true(&pk) : msgpack_pack_false(&pk);
	pack_str(&pk, "allocs"), msgpack_pack_array(&pk, n);
	for (size_t i = first; i < first + n; i++) {
		const struct export_item *it = &s->v[i];
		msgpack_pack_map(&pk, 4);
		pack_str(&pk, "path"), pack_str(&pk, it->path);
		pack_str(&pk, "size"), msgpack_pack_uint64(&pk, it->size);
		pack_str(&pk, "aligned"), msgpack_pack_uint64(&pk, it->aligned);
		pack_str(&pk, "tag"), pack_str(&pk, it->tag);
		int fd = vmm_export(it->buf, s->read_only, &owned[nfds]);
		if (fd < 0) {
			e = fd;
			break;
		}
		fds[nfds++] = fd;
	}
	if (!e)
		e = send_msg(sock, sb.data, sb.size, fds, nfds);
	for (size_t i = 0; i < nfds; i++)
		if (owned[i])
			close(fds[i]);
	msgpack_sbuffer_destroy(&sb);
	return e;
}

/* Split into messages of at most GMSFS_FDS_PER_MSG descriptors and about
 * GMSFS_MANIFEST_MAX bytes of manifest (paths can be long). */
static int send_set(int sock, const struct export_set *s)
{
	size_t first = 0;
	do {
		size_t n = 0, bytes = 64;
		while (first + n < s->n && n < GMSFS_FDS_PER_MSG) {
			size_t b = 64 + strlen(s->v[first + n].path) + strlen(s->v[first + n].tag);
			if (n && bytes + b > GMSFS_MANIFEST_MAX)
				break;
			bytes += b;
			n++;
		}
		int e = send_batch(sock, s, first, n, first + n == s->n);
		if (e)
			return e;
		first += n;
	} while (first < s->n);
	return 0;
}

/* One request: read, check, answer.  >0: keep the connection; 0: peer closed; <0: drop it. */
static int serve_one(struct fs *fs, int sock)
{
	char buf[sizeof(struct gmsfs_sock_req) + 1];
	union {
		char b[CMSG_SPACE(sizeof(struct ucred)) + CMSG_SPACE(sizeof(int) * GMSFS_FDS_PER_MSG)];
		struct cmsghdr align;
	} u;
	struct iovec iov = { buf, sizeof buf };
	struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.b, .msg_controllen = sizeof u.b };
	ssize_t n = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
	if (n <= 0)
		return n == 0 ? 0 : -errno;
	struct ucred cred = { .pid = 0 };
	bool have_cred = false, had_fds = false;
	for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
		if (c->cmsg_level != SOL_SOCKET)
			continue;
		if (c->cmsg_type == SCM_CREDENTIALS && c->cmsg_len == CMSG_LEN(sizeof cred)) {
			memcpy(&cred, CMSG_DATA(c), sizeof cred);
			have_cred = true;
		} else if (c->cmsg_type == SCM_RIGHTS) {
			/* Nobody sends us descriptors: close what came. */
			size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
			int *fds = (int *)CMSG_DATA(c);
			for (size_t i = 0; i < k; i++)
				close(fds[i]);
			had_fds = true;
		}
	}
	char why[256] = "";
	struct gmsfs_sock_req req;
	int e = 0;
	if (msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) {
		snprintf(why, sizeof why, "message too long");
		e = -EINVAL;
	} else if (had_fds) {
		snprintf(why, sizeof why, "descriptors sent to the daemon");
		e = -EINVAL;
	} else {
		e = export_parse_request(buf, (size_t)n, &req, why, sizeof why);
	}
	if (e) {
		fuse_log(FUSE_LOG_WARNING, "gmsfs: export socket: %s\n", why);
		send_error(sock, -e, why);
		return e; /* malformed: drop the connection */
	}
	if (!have_cred || cred.pid <= 0) {
		snprintf(why, sizeof why, "sender unknown (outside the daemon's pid namespace?)");
		send_error(sock, EPERM, why);
		return 1;
	}
	struct export_set set = {0};
	e = redeem(fs, req.ticket, cred.pid, cred.uid, &set, why, sizeof why);
	explicit_bzero(&req, sizeof req);
	if (e) {
		fuse_log(FUSE_LOG_WARNING, "gmsfs: export socket: pid %d: %s\n", (int)cred.pid, why);
		send_error(sock, -e, why);
		return 1;
	}
	e = send_set(sock, &set);
	if (e)
		fuse_log(FUSE_LOG_WARNING, "gmsfs: export socket: pid %d: sending %zu descriptors: %s\n",
			 (int)cred.pid, set.n, strerror(-e));
	set_free(&set);
	return e ? e : 1;
}

struct conn {
	struct fs *fs;
	int sock;
};

static void *conn_main(void *arg)
{
	struct conn *c = arg;
	while (serve_one(c->fs, c->sock) > 0)
		;
	close(c->sock);
	atomic_fetch_sub(&c->fs->export_conns, 1);
	free(c);
	return NULL;
}

static void *accept_main(void *arg)
{
	struct fs *fs = arg;
	for (;;) {
		int s = accept4(fs->export_fd, NULL, NULL, SOCK_CLOEXEC);
		if (s < 0) {
			if (errno == EINTR || errno == ECONNABORTED || errno == EMFILE || errno == ENFILE) {
				if (errno == EMFILE || errno == ENFILE)
					usleep(10000);
				continue;
			}
			return NULL; /* shut down */
		}
		int one = 1;
		struct timeval tv = { EXPORT_IO_TIMEOUT_S, 0 };
		setsockopt(s, SOL_SOCKET, SO_PASSCRED, &one, sizeof one);
		setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
		setsockopt(s, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
		struct conn *c = malloc(sizeof *c);
		pthread_t t;
		pthread_attr_t attr;
		if (!c || atomic_fetch_add(&fs->export_conns, 1) >= EXPORT_MAX_CONNS) {
			if (c)
				atomic_fetch_sub(&fs->export_conns, 1);
			fuse_log(FUSE_LOG_WARNING, "gmsfs: export socket: too many connections\n");
			free(c);
			close(s);
			continue;
		}
		*c = (struct conn){ fs, s };
		pthread_attr_init(&attr);
		pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
		if (pthread_create(&t, &attr, conn_main, c)) {
			atomic_fetch_sub(&fs->export_conns, 1);
			close(s);
			free(c);
		}
		pthread_attr_destroy(&attr);
	}
}

int export_start(struct fs *fs, const char *path, char *err, size_t errlen)
{
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	if (path) {
		if (strlen(path) >= sizeof a.sun_path) {
			snprintf(err, errlen, "socket=%s: longer than %zu bytes", path, sizeof a.sun_path - 1);
			return -ENAMETOOLONG;
		}
		snprintf(a.sun_path, sizeof a.sun_path, "%s", path);
	} else {
		const char *dir = getuid() == 0 ? "/run/gmsfs" : getenv("XDG_RUNTIME_DIR");
		if (!dir || !*dir || strlen(dir) > 80)
			dir = "/tmp";
		mkdir(dir, 0755);
		snprintf(a.sun_path, sizeof a.sun_path, "%s/gmsfs-%d.sock", dir, (int)getpid());
	}
	int s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (s < 0) {
		snprintf(err, errlen, "export socket: %s", strerror(errno));
		return -errno;
	}
	unlink(a.sun_path); /* a stale socket of a dead daemon */
	int one = 1;
	setsockopt(s, SOL_SOCKET, SO_PASSCRED, &one, sizeof one);
	/* Anyone who can reach the mount may connect: tickets and credentials decide. */
	mode_t old = umask(0);
	int r = bind(s, (struct sockaddr *)&a, sizeof a);
	umask(old);
	if (r < 0 || listen(s, 128) < 0) {
		int e = errno;
		snprintf(err, errlen, "export socket %s: %s", a.sun_path, strerror(e));
		close(s);
		return -e;
	}
	snprintf(fs->socket_path, sizeof fs->socket_path, "%s", a.sun_path);
	fs->export_fd = s;
	if (pthread_create(&fs->export_thread, NULL, accept_main, fs)) {
		snprintf(err, errlen, "export socket: no thread");
		close(s);
		unlink(fs->socket_path);
		return -EAGAIN;
	}
	return 0;
}

void export_stop(struct fs *fs)
{
	if (fs->export_fd < 0)
		return;
	pthread_mutex_lock(&fs->mu);
	fs->exiting = true;
	pthread_mutex_unlock(&fs->mu);
	shutdown(fs->export_fd, SHUT_RDWR);
	pthread_join(fs->export_thread, NULL);
	close(fs->export_fd);
	fs->export_fd = -1;
	unlink(fs->socket_path);
}
