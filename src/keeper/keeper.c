/* gmsfs-keeper: systemd's descriptor store for gmsfs daemons where there is no systemd (a
 * container), in a process of its own, so that stores outlive their daemon, the daemon's
 * container and its image (gmsfs-keeper(8)).
 *
 *   gmsfs-keeper DIR                       keep: serve DIR/keeper.sock until SIGTERM
 *   gmsfs-keeper --exec DIR NAME CMD...     start a daemon: NAME's kept descriptors from 3
 *                                           on, LISTEN_FDS, LISTEN_FDNAMES, LISTEN_PID,
 *                                           NOTIFY_SOCKET=DIR/NAME.notify; then exec CMD
 *   gmsfs-keeper --check DIR               a probe: 0 when DIR's keeper answers within 2 s
 *
 * The keeper speaks systemd's side of sd_notify(3) on DIR/NAME.notify (FDSTORE=1 with
 * FDNAME=, FDSTOREREMOVE=1; the rest is ignored), one datagram socket per daemon name, so a
 * daemon is known by the socket it writes to.  --exec asks over DIR/keeper.sock
 * (SOCK_SEQPACKET): it sends NAME; the keeper first takes every datagram NAME's socket
 * holds (what a dead daemon sent before it died, as systemd reads a service's messages
 * before it handles its end), then answers with batches of at most FDPASS_MAX descriptors,
 * each message their names, newline-separated, and ends with the message ".".  Only the
 * keeper's own uid may ask (SO_PEERCRED); DIR is 0700.  Descriptors stay until the daemon
 * removes them or the keeper ends: ending the keeper frees what they hold.
 *
 * A keeper that starts where one served before (killed, restarted by the kubelet) binds
 * every NAME.notify it finds again at once: the daemons still running see a new socket
 * there (another inode) and hand it every descriptor again (gmsfs(8), keep.c's watch),
 * since the old keeper's went with it.  A probe (--check) sends "?" and is answered
 * "ok DAEMONS DESCRIPTORS". */
#include "fdpass.h"

#include <errno.h>
#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#define KEEPER_NAME_MAX 100   /* a daemon's name: a GPU's uuid, say */
#define KEEPER_FDNAME_MAX 255 /* systemd's limit for FDNAME= */
#define KEEPER_MAX_NAMES 64   /* daemons one keeper serves: GPUs of a node */

struct kept {
	char name[KEEPER_FDNAME_MAX + 1];
	int fd;
};

struct daemon_slot {
	char name[KEEPER_NAME_MAX + 1];
	int sock; /* DIR/NAME.notify */
	struct kept *v;
	size_t n, cap;
};

static struct daemon_slot slots[KEEPER_MAX_NAMES];
static size_t nslots;
static const char *dir;
static volatile sig_atomic_t stopping;

static void on_stop(int sig)
{
	(void)sig;
	stopping = 1;
}

/* Descriptors from 3 on, as systemd passes thousands: the soft limit up to the hard one. */
static void raise_nofile(void)
{
	struct rlimit r;
	if (!getrlimit(RLIMIT_NOFILE, &r) && r.rlim_cur < r.rlim_max) {
		r.rlim_cur = r.rlim_max;
		setrlimit(RLIMIT_NOFILE, &r);
	}
}

static bool valid_name(const char *s, size_t max)
{
	size_t n = strlen(s);
	if (!n || n > max || !strcmp(s, ".") || !strcmp(s, ".."))
		return false;
	for (; *s; s++)
		if (!(*s >= 'a' && *s <= 'z') && !(*s >= 'A' && *s <= 'Z') && !(*s >= '0' && *s <= '9') && !strchr("._-", *s))
			return false;
	return true;
}

static int sock_path(struct sockaddr_un *a, const char *name, const char *suffix)
{
	*a = (struct sockaddr_un){ .sun_family = AF_UNIX };
	int n = snprintf(a->sun_path, sizeof a->sun_path, "%s/%s%s", dir, name, suffix);
	return n < 0 || (size_t)n >= sizeof a->sun_path ? -ENAMETOOLONG : 0;
}

/* ---- the store ---- */

static void drop(struct daemon_slot *d, const char *fdname)
{
	for (size_t i = 0; i < d->n; i++)
		if (!strcmp(d->v[i].name, fdname)) {
			close(d->v[i].fd);
			d->v[i] = d->v[--d->n];
			return;
		}
}

static int keep_fd(struct daemon_slot *d, const char *fdname, int fd)
{
	drop(d, fdname); /* a name is one descriptor: the newer one replaces it */
	if (d->n == d->cap) {
		size_t cap = d->cap ? 2 * d->cap : 64;
		struct kept *v = realloc(d->v, cap * sizeof *v);
		if (!v)
			return -ENOMEM;
		d->v = v, d->cap = cap;
	}
	snprintf(d->v[d->n].name, sizeof d->v[d->n].name, "%s", fdname);
	d->v[d->n++].fd = fd;
	return 0;
}

/* One datagram of sd_notify: "K=V" lines; FDSTORE=1 keeps what came with it. */
static void take_datagram(struct daemon_slot *d, char *msg, const int *fds, size_t nfds)
{
	bool store = false, remove = false;
	const char *fdname = "stored"; /* systemd's default */
	for (char *line = strtok(msg, "\n"); line; line = strtok(NULL, "\n")) {
		if (!strcmp(line, "FDSTORE=1"))
			store = true;
		else if (!strcmp(line, "FDSTOREREMOVE=1"))
			remove = true;
		else if (!strncmp(line, "FDNAME=", 7))
			fdname = line + 7;
	}
	size_t used = 0;
	if (!valid_name(fdname, KEEPER_FDNAME_MAX)) {
		fprintf(stderr, "gmsfs-keeper: %s: an invalid FDNAME ignored\n", d->name);
	} else if (store && nfds == 1) {
		if (keep_fd(d, fdname, fds[0]))
			fprintf(stderr, "gmsfs-keeper: %s: %s not kept: out of memory\n", d->name, fdname);
		else
			used = 1;
	} else if (store) {
		fprintf(stderr, "gmsfs-keeper: %s: FDSTORE=1 with %zu descriptors ignored (one per name)\n", d->name, nfds);
	} else if (remove) {
		drop(d, fdname);
	}
	for (size_t i = used; i < nfds; i++)
		close(fds[i]);
}

/* Everything NAME's socket holds now. */
static void drain(struct daemon_slot *d)
{
	for (;;) {
		char buf[4096];
		int fds[FDPASS_MAX];
		struct fdpass_info info;
		int fl = fcntl(d->sock, F_GETFL);
		fcntl(d->sock, F_SETFL, fl | O_NONBLOCK);
		ssize_t n = fdpass_recv(d->sock, buf, sizeof buf - 1, fds, FDPASS_MAX, &info);
		fcntl(d->sock, F_SETFL, fl);
		if (n < 0 && (n == -EAGAIN || n == -EWOULDBLOCK))
			return;
		if (n < 0) {
			fprintf(stderr, "gmsfs-keeper: %s: %s\n", d->name, strerror((int)-n));
			return;
		}
		buf[n] = '\0';
		if (info.truncated) { /* a message cut short is not half-kept */
			fprintf(stderr, "gmsfs-keeper: %s: a truncated message ignored\n", d->name);
			for (size_t i = 0; i < info.nfds; i++)
				close(fds[i]);
			continue;
		}
		take_datagram(d, buf, fds, info.nfds);
	}
}

static struct daemon_slot *slot(const char *name)
{
	for (size_t i = 0; i < nslots; i++)
		if (!strcmp(slots[i].name, name))
			return &slots[i];
	if (nslots == KEEPER_MAX_NAMES)
		return NULL;
	struct sockaddr_un a;
	if (sock_path(&a, name, ".notify"))
		return NULL;
	int s = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	unlink(a.sun_path); /* a dead keeper's: its descriptors went with it */
	if (s < 0 || bind(s, (struct sockaddr *)&a, sizeof a) || chmod(a.sun_path, 0600)) {
		fprintf(stderr, "gmsfs-keeper: %s: %s\n", a.sun_path, strerror(errno));
		if (s >= 0)
			close(s);
		return NULL;
	}
	struct daemon_slot *d = &slots[nslots++];
	*d = (struct daemon_slot){ .sock = s };
	snprintf(d->name, sizeof d->name, "%.*s", KEEPER_NAME_MAX, name);
	fprintf(stderr, "gmsfs-keeper: keeping %s's descriptors (%s)\n", name, a.sun_path);
	return d;
}

/* The NAME.notify sockets a keeper before this one bound in DIR, bound again (their
 * daemons hand everything again when they see it: another inode at that path). */
static void rebind_all(void)
{
	DIR *d = opendir(dir);
	for (struct dirent *e; d && (e = readdir(d));) {
		size_t n = strlen(e->d_name);
		char name[KEEPER_NAME_MAX + 1];
		if (n <= 7 || n - 7 > KEEPER_NAME_MAX || strcmp(e->d_name + n - 7, ".notify"))
			continue;
		snprintf(name, sizeof name, "%.*s", (int)(n - 7), e->d_name);
		if (valid_name(name, KEEPER_NAME_MAX))
			slot(name);
	}
	if (d)
		closedir(d);
}

/* One --exec's question, answered: NAME's descriptors, then "."; or a probe's "?". */
static void answer(int c)
{
	struct ucred cred = { .pid = 0, .uid = (uid_t)-1 };
	socklen_t len = sizeof cred;
	char name[KEEPER_NAME_MAX + 2];
	ssize_t n = recv(c, name, sizeof name - 1, 0);
	if (getsockopt(c, SOL_SOCKET, SO_PEERCRED, &cred, &len) || cred.uid != getuid()) {
		fprintf(stderr, "gmsfs-keeper: a request from uid %d refused\n", (int)cred.uid);
		return;
	}
	if (n <= 0)
		return;
	name[n] = '\0';
	if (!strcmp(name, "?")) {
		size_t kept = 0;
		for (size_t i = 0; i < nslots; i++)
			kept += slots[i].n;
		char ok[64];
		snprintf(ok, sizeof ok, "ok %zu %zu", nslots, kept);
		send(c, ok, strlen(ok), MSG_NOSIGNAL);
		return;
	}
	struct daemon_slot *d = valid_name(name, KEEPER_NAME_MAX) ? slot(name) : NULL;
	if (!d) {
		const char *e = "!no such name";
		send(c, e, strlen(e), MSG_NOSIGNAL);
		return;
	}
	drain(d);
	for (size_t i = 0; i < d->n;) {
		char buf[FDPASS_MAX * (KEEPER_FDNAME_MAX + 1)];
		int fds[FDPASS_MAX];
		size_t k = 0, off = 0;
		for (; k < FDPASS_MAX && i < d->n; k++, i++) {
			off += (size_t)sprintf(buf + off, "%s%s", k ? "\n" : "", d->v[i].name);
			fds[k] = d->v[i].fd;
		}
		if (fdpass_send(c, buf, off, fds, k))
			return;
	}
	send(c, ".", 1, MSG_NOSIGNAL);
	fprintf(stderr, "gmsfs-keeper: %s: %zu descriptors handed to pid %d\n", d->name, d->n, (int)cred.pid);
}

static int serve(void)
{
	struct sockaddr_un a;
	if (mkdir(dir, 0700) && errno != EEXIST) {
		fprintf(stderr, "gmsfs-keeper: %s: %s\n", dir, strerror(errno));
		return 1;
	}
	chmod(dir, 0700);
	if (sock_path(&a, "keeper", ".sock")) {
		fprintf(stderr, "gmsfs-keeper: %s: path too long\n", dir);
		return 1;
	}
	int l = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (l >= 0 && !connect(l, (struct sockaddr *)&a, sizeof a)) {
		fprintf(stderr, "gmsfs-keeper: %s: a keeper serves it already\n", a.sun_path);
		return 1;
	}
	close(l);
	l = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	unlink(a.sun_path);
	if (l < 0 || bind(l, (struct sockaddr *)&a, sizeof a) || chmod(a.sun_path, 0600) || listen(l, 16)) {
		fprintf(stderr, "gmsfs-keeper: %s: %s\n", a.sun_path, strerror(errno));
		return 1;
	}
	struct sigaction sa = { .sa_handler = on_stop };
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGINT, &sa, NULL);
	signal(SIGPIPE, SIG_IGN);
	fprintf(stderr, "gmsfs-keeper: serving %s\n", a.sun_path);
	rebind_all();
	while (!stopping) {
		struct pollfd p[1 + KEEPER_MAX_NAMES];
		p[0] = (struct pollfd){ .fd = l, .events = POLLIN };
		for (size_t i = 0; i < nslots; i++)
			p[1 + i] = (struct pollfd){ .fd = slots[i].sock, .events = POLLIN };
		if (poll(p, 1 + nslots, -1) < 0)
			continue; /* EINTR: a signal, looked at above */
		for (size_t i = 0; i < nslots; i++)
			if (p[1 + i].revents & POLLIN)
				drain(&slots[i]);
		if (p[0].revents & POLLIN) {
			int c = accept4(l, NULL, NULL, SOCK_CLOEXEC);
			if (c >= 0) {
				struct timeval t = { 5, 0 }; /* nobody holds the keeper up */
				setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &t, sizeof t);
				setsockopt(c, SOL_SOCKET, SO_SNDTIMEO, &t, sizeof t);
				answer(c);
				close(c);
			}
		}
	}
	size_t kept = 0;
	for (size_t i = 0; i < nslots; i++)
		kept += slots[i].n;
	fprintf(stderr, "gmsfs-keeper: ending: %zu descriptors let go\n", kept);
	unlink(a.sun_path);
	return 0;
}

/* ---- --exec ---- */

static int fail(const char *what, int e)
{
	fprintf(stderr, "gmsfs-keeper --exec: %s: %s\n", what, strerror(e));
	return 1;
}

static int exec_daemon(const char *name, char **argv)
{
	struct sockaddr_un a;
	if (!valid_name(name, KEEPER_NAME_MAX))
		return fail(name, EINVAL);
	if (sock_path(&a, "keeper", ".sock"))
		return fail(dir, ENAMETOOLONG);
	int c = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (c < 0 || connect(c, (struct sockaddr *)&a, sizeof a))
		return fail(a.sun_path, errno);
	if (send(c, name, strlen(name), MSG_NOSIGNAL) < 0)
		return fail(a.sun_path, errno);
	int *fds = NULL;
	size_t n = 0, cap = 0, nlen = 0;
	char *names = NULL; /* LISTEN_FDNAMES: colon-separated */
	for (;;) {
		static char buf[FDPASS_MAX * (KEEPER_FDNAME_MAX + 1) + 1];
		int got[FDPASS_MAX];
		struct fdpass_info info;
		ssize_t r = fdpass_recv(c, buf, sizeof buf - 1, got, FDPASS_MAX, &info);
		if (r < 0)
			return fail(a.sun_path, (int)-r);
		if (r == 0 && !info.nfds) /* hung up before the end: refused, or the keeper went */
			return fail("the keeper did not answer (another uid?)", ECONNRESET);
		buf[r] = '\0';
		if (r == 1 && buf[0] == '.' && !info.nfds)
			break; /* the end */
		if (buf[0] == '!')
			return fail(name, EINVAL);
		if (n + info.nfds > cap) {
			cap = (n + info.nfds) * 2;
			fds = realloc(fds, cap * sizeof *fds);
		}
		char *more = realloc(names, nlen + (size_t)r + 2);
		if (!fds || !more)
			return fail("the descriptors", ENOMEM);
		names = more;
		size_t lines = 1;
		for (char *s = buf; *s; s++)
			if (*s == '\n')
				*s = ':', lines++;
		if (info.truncated || lines != info.nfds)
			return fail(a.sun_path, EPROTO);
		nlen += (size_t)sprintf(names + nlen, "%s%s", nlen ? ":" : "", buf);
		memcpy(fds + n, got, info.nfds * sizeof *got);
		n += info.nfds;
	}
	close(c);
	/* Out of the way of 3..3+n first, then into place (dup2 clears close-on-exec). */
	for (size_t i = 0; i < n; i++) {
		int hi = fcntl(fds[i], F_DUPFD_CLOEXEC, (int)(3 + n));
		if (hi < 0)
			return fail("the descriptors", errno);
		close(fds[i]);
		fds[i] = hi;
	}
	for (size_t i = 0; i < n; i++) {
		if (dup2(fds[i], (int)(3 + i)) < 0)
			return fail("the descriptors", errno);
		close(fds[i]);
	}
	char num[32];
	if (n) {
		snprintf(num, sizeof num, "%zu", n);
		setenv("LISTEN_FDS", num, 1);
		setenv("LISTEN_FDNAMES", names, 1);
		snprintf(num, sizeof num, "%d", (int)getpid()); /* exec keeps the pid */
		setenv("LISTEN_PID", num, 1);
	} else {
		unsetenv("LISTEN_FDS");
		unsetenv("LISTEN_FDNAMES");
		unsetenv("LISTEN_PID");
	}
	if (sock_path(&a, name, ".notify"))
		return fail(name, ENAMETOOLONG);
	setenv("NOTIFY_SOCKET", a.sun_path, 1);
	fprintf(stderr, "gmsfs-keeper --exec: %s: %zu descriptors back\n", name, n);
	execvp(argv[0], argv);
	return fail(argv[0], errno);
}

/* --check: the keeper of DIR answers a probe within 2 s (the kubelet's liveness probe). */
static int check(void)
{
	struct sockaddr_un a;
	char buf[64];
	if (sock_path(&a, "keeper", ".sock"))
		return fail(dir, ENAMETOOLONG);
	int c = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	struct timeval t = { 2, 0 };
	if (c < 0 || setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &t, sizeof t) || connect(c, (struct sockaddr *)&a, sizeof a) ||
	    send(c, "?", 1, MSG_NOSIGNAL) != 1)
		return fail(a.sun_path, errno);
	ssize_t n = recv(c, buf, sizeof buf - 1, 0);
	close(c);
	if (n < 3 || strncmp(buf, "ok ", 3)) {
		fprintf(stderr, "gmsfs-keeper --check: %s: no answer within 2 s\n", a.sun_path);
		return 1;
	}
	buf[n] = '\0';
	printf("gmsfs-keeper: %s: daemons, descriptors: %s\n", a.sun_path, buf + 3);
	return 0;
}

static int usage(void)
{
	fputs("usage: gmsfs-keeper DIR\n"
	      "       gmsfs-keeper --check DIR\n"
	      "       gmsfs-keeper --exec DIR NAME COMMAND [ARG]...\n"
	      "       gmsfs-keeper --version\n",
	      stderr);
	return 2;
}

int main(int argc, char **argv)
{
	raise_nofile();
	if (argc == 2 && !strcmp(argv[1], "--version")) {
		printf("gmsfs-keeper %s\n", GMSFS_VERSION);
		return 0;
	}
	if (argc == 2 && argv[1][0] != '-') {
		dir = argv[1];
		return serve();
	}
	if (argc == 3 && !strcmp(argv[1], "--check")) {
		dir = argv[2];
		return check();
	}
	if (argc >= 5 && !strcmp(argv[1], "--exec")) {
		dir = argv[2];
		return exec_daemon(argv[3], argv + 4);
	}
	return usage();
}
