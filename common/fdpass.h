/* fdpass.h: one message with descriptors over an AF_UNIX socket (SCM_RIGHTS), sent and
 * received in one place for the daemon, the library, the benches and the test helpers.
 * Descriptors received are O_CLOEXEC. */
#ifndef GMSFS_COMMON_FDPASS_H
#define GMSFS_COMMON_FDPASS_H

#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define FDPASS_MAX 253 /* SCM_MAX_FD: the kernel's limit for one message */

/* $NOTIFY_SOCKET, the service manager's (systemd's, gmsfs-keeper's) datagram socket, as an
 * address: a path, or an abstract name after '@'.  Its length, or 0 when it is unset or
 * not one (a is then as it was). */
static inline socklen_t fdpass_notify_addr(struct sockaddr_un *a)
{
	const char *path = getenv("NOTIFY_SOCKET");
	size_t n = path ? strlen(path) : 0;
	if (!n || n >= sizeof a->sun_path || (path[0] != '/' && path[0] != '@'))
		return 0;
	a->sun_family = AF_UNIX;
	memcpy(a->sun_path, path, n);
	if (path[0] == '@')
		a->sun_path[0] = '\0';
	return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n);
}

/* len bytes and nfds (at most FDPASS_MAX) descriptors in one message.  0 or -errno. */
static inline int fdpass_send(int sock, const void *data, size_t len, const int *fds, size_t nfds)
{
	union {
		char buf[CMSG_SPACE(sizeof(int) * FDPASS_MAX)];
		struct cmsghdr align;
	} u;
	struct iovec iov = { (void *)data, len };
	struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1 };
	if (nfds > FDPASS_MAX)
		return -EINVAL;
	if (nfds) {
		memset(u.buf, 0, CMSG_SPACE(sizeof(int) * nfds)); /* the padding too */
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

/* Up to spin_ns spent polling sock before a blocking receive: a reply (or a client's next
 * request) that comes within it is taken without the thread sleeping and being woken,
 * which on an idle machine of many cores costs tens of microseconds each way.  Returns at
 * once when spin_ns is 0. */
static inline void fdpass_spin_readable(int sock, long spin_ns)
{
	if (spin_ns <= 0)
		return;
	struct timespec t0, t;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	struct pollfd p = { .fd = sock, .events = POLLIN };
	for (;;) {
		if (poll(&p, 1, 0) != 0)
			return; /* readable, closed, or an error the receive will say */
		clock_gettime(CLOCK_MONOTONIC, &t);
		if ((t.tv_sec - t0.tv_sec) * 1000000000L + (t.tv_nsec - t0.tv_nsec) >= spin_ns)
			return;
#if defined(__x86_64__) || defined(__i386__)
		__builtin_ia32_pause();
#endif
	}
}

/* The spin's length in ns from GMSFS_SPIN_US (default 200 us; 0, or out of range: none),
 * whether the environment asked for it, and the cores this process may run on (one
 * system call, no file read): the library and the daemon decide from these. */
static inline long fdpass_spin_config(bool *asked, int *cores)
{
	cpu_set_t cpus;
	*cores = sched_getaffinity(0, sizeof cpus, &cpus) ? 0 : CPU_COUNT(&cpus);
	const char *env = getenv("GMSFS_SPIN_US");
	*asked = env != NULL;
	long us = env ? atol(env) : 200;
	return us > 0 && us <= 100000 ? us * 1000 : 0;
}

/* What came with a message besides its bytes. */
struct fdpass_info {
	size_t nfds;         /* descriptors received into fds (those past max are closed) */
	bool truncated;      /* the bytes or the descriptors did not all fit */
	bool has_cred;       /* cred holds the sender's SCM_CREDENTIALS (SO_PASSCRED) */
	struct ucred cred;
};

/* One message into buf: its length, 0 when the peer closed, or -errno. */
static inline ssize_t fdpass_recv(int sock, void *buf, size_t size, int *fds, size_t max, struct fdpass_info *info)
{
	union {
		char b[CMSG_SPACE(sizeof(struct ucred)) + CMSG_SPACE(sizeof(int) * FDPASS_MAX)];
		struct cmsghdr align;
	} u;
	struct iovec iov = { buf, size };
	struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.b, .msg_controllen = sizeof u.b };
	*info = (struct fdpass_info){0};
	ssize_t n = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
	if (n < 0)
		return -errno;
	info->truncated = (msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) != 0;
	for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
		if (c->cmsg_level != SOL_SOCKET)
			continue;
		if (c->cmsg_type == SCM_CREDENTIALS && c->cmsg_len == CMSG_LEN(sizeof info->cred)) {
			memcpy(&info->cred, CMSG_DATA(c), sizeof info->cred);
			info->has_cred = true;
		} else if (c->cmsg_type == SCM_RIGHTS) {
			size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
			const int *in = (const int *)(void *)CMSG_DATA(c);
			for (size_t i = 0; i < k; i++) {
				if (info->nfds < max)
					fds[info->nfds++] = in[i];
				else
					close(in[i]), info->truncated = true;
			}
		}
	}
	return n;
}

#endif
