/* gmsfs-probe: speak the raw ioctl and socket protocol (gmsfs/abi.h), right
 * and wrong, and print what the daemon answered: "ok ..." or an errno name.
 *
 *   gmsfs-probe ioctl FILE CMD [size=N] [flags=N] [reserved=N] [mode=N] [timeout=N]
 *       CMD: info, lock, export, export_all, channel, unlock, unknown, oldsize (a struct of another size)
 *   gmsfs-probe redeem FILE CMD HOW
 *       HOW: ok, forged, replay, child, child-sameconn, closed, uid, short, long,
 *            badmagic, badflags, withfds, bind (an export ticket presented to BIND)
 *   gmsfs-probe hog SOCKET N MS
 *       open N connections and say nothing: how many the daemon refused at once, and how
 *       many of the others it closed within MS milliseconds of silence
 *   gmsfs-probe connect SOCKET      connect: "ok" or the errno name
 *   gmsfs-probe bind FILE HOW
 *       HOW: export, unbound, child, create, redeem (a channel ticket presented to REDEEM),
 *            ticketed-op, commit-body, op-switch, garbage-body, closed, unlock (then EXPORT
 *            and the UNLOCK ioctl), unlock-unbound, unlock-body
 * FILE is opened O_RDONLY (O_DIRECTORY for a directory; O_RDWR with an "rw:" prefix; lock
 * first for lock-holders with "lock:MODE" as FILE prefix, e.g. lock:1:/mnt/store). */
#include <gmsfs/abi.h>

#include "fdpass.h"
#include "wire.h"

#include <errno.h>
#include <stdbool.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

static int say_err(int e)
{
	printf("%s\n", strerrorname_np(e) ? strerrorname_np(e) : "E?");
	return 0;
}

static int open_target(const char *spec)
{
	int mode = 0, acc = O_RDONLY;
	if (!strncmp(spec, "rw:", 3)) {
		acc = O_RDWR;
		spec += 3;
	}
	if (!strncmp(spec, "lock:", 5)) {
		mode = atoi(spec + 5);
		spec = strchr(spec + 5, ':') + 1;
	}
	struct stat s;
	if (stat(spec, &s) < 0) {
		perror(spec);
		exit(2);
	}
	int fd = open(spec, acc | O_CLOEXEC | (S_ISDIR(s.st_mode) ? O_DIRECTORY : 0));
	if (fd < 0) {
		perror(spec);
		exit(2);
	}
	if (mode) {
		struct gmsfs_ioc io = { .size = sizeof io, .mode = (uint32_t)mode, .timeout_ms = 2000 };
		if (ioctl(fd, GMSFS_IOC_LOCK, &io) < 0) {
			perror("lock");
			exit(2);
		}
	}
	return fd;
}

static unsigned long cmd_of(const char *name)
{
	if (!strcmp(name, "info")) return GMSFS_IOC_INFO;
	if (!strcmp(name, "lock")) return GMSFS_IOC_LOCK;
	if (!strcmp(name, "export")) return GMSFS_IOC_EXPORT;
	if (!strcmp(name, "export_all")) return GMSFS_IOC_EXPORT_ALL;
	if (!strcmp(name, "channel")) return GMSFS_IOC_CHANNEL;
	if (!strcmp(name, "unlock")) return GMSFS_IOC_UNLOCK;
	if (!strcmp(name, "unknown")) return _IOWR(GMSFS_IOC_MAGIC, 99, struct gmsfs_ioc);
	if (!strcmp(name, "oldsize")) return _IOWR(GMSFS_IOC_MAGIC, 3, uint64_t[16]);
	fprintf(stderr, "unknown command %s\n", name);
	exit(2);
}

static int do_ioctl(int argc, char **argv)
{
	int fd = open_target(argv[2]);
	unsigned long cmd = cmd_of(argv[3]);
	union {
		struct gmsfs_ioc io;
		char pad[512];
	} u = { .io = { .size = sizeof u.io } };
	if (!strcmp(argv[3], "lock"))
		u.io.mode = GMSFS_RO, u.io.timeout_ms = 1000;
	for (int i = 4; i < argc; i++) {
		long long v = strtoll(strchr(argv[i], '=') + 1, NULL, 0);
		if (!strncmp(argv[i], "size=", 5)) u.io.size = (uint32_t)v;
		else if (!strncmp(argv[i], "flags=", 6)) u.io.flags = (uint32_t)v;
		else if (!strncmp(argv[i], "reserved=", 9)) u.io.reserved[3] = (uint64_t)v;
		else if (!strncmp(argv[i], "mode=", 5)) u.io.mode = (uint32_t)v;
		else if (!strncmp(argv[i], "timeout=", 8)) u.io.timeout_ms = (int32_t)v;
	}
	if (ioctl(fd, cmd, &u) < 0)
		return say_err(errno);
	printf("ok lock=%u count=%llu has_hash=%u socket=%s\n", u.io.lock, (unsigned long long)u.io.count,
	       u.io.has_hash, u.io.socket);
	return 0;
}

static int connect_to(const char *path)
{
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	snprintf(a.sun_path, sizeof a.sun_path, "%s", path);
	int s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (s < 0 || connect(s, (struct sockaddr *)&a, sizeof a) < 0) {
		perror("connect");
		exit(2);
	}
	return s;
}

/* Read replies until "last" or an error; print the outcome. */
static int read_reply(int s, bool quiet)
{
	static char buf[GMSFS_MSG_MAX + 1];
	int total = 0, ro = 0, rw = 0, entries = 0;
	for (;;) {
		int fds[GMSFS_FDS_PER_MSG], nfds;
		struct fdpass_info info;
		ssize_t n = fdpass_recv(s, buf, sizeof buf, fds, GMSFS_FDS_PER_MSG, &info);
		if (n <= 0) {
			if (!quiet)
				printf("closed\n");
			return 1;
		}
		nfds = (int)info.nfds;
		struct wire_reply r;
		char why[160];
		if (wire_parse_reply(buf, (size_t)n, &r, why, sizeof why)) {
			printf("malformed reply: %s\n", why);
			return 1;
		}
		if (r.err) {
			if (!quiet)
				say_err(r.err);
			return 0;
		}
		/* Can each allocation's descriptor be mapped writable? */
		for (size_t i = 0; i < r.nallocs; i++) {
			void *p = mmap(NULL, r.allocs[i].aligned, PROT_READ | PROT_WRITE, MAP_SHARED, fds[r.allocs[i].fd],
				       (off_t)r.allocs[i].fd_offset);
			if (p == MAP_FAILED)
				ro++;
			else
				rw++, munmap(p, r.allocs[i].aligned);
		}
		for (int i = 0; i < nfds; i++)
			close(fds[i]);
		total += (int)r.nallocs;
		for (size_t i = 0; i < r.nchunks; i++)
			entries += r.chunks[i].voff == 0;
		bool last = !r.manifest || r.last;
		wire_reply_free(&r);
		if (last)
			break;
	}
	if (!quiet)
		printf("ok n=%d readonly=%d writable=%d entries=%d\n", total, ro, rw, entries);
	return 0;
}

static void send_req(int s, const void *req, size_t len, int fd)
{
	int e = fdpass_send(s, req, len, &fd, fd >= 0 ? 1 : 0);
	if (e)
		fprintf(stderr, "sendmsg: %s\n", strerror(-e));
}

static int do_redeem(int argc, char **argv)
{
	if (argc != 5)
		return 2;
	int fd = open_target(argv[2]);
	const char *how = argv[4];
	struct gmsfs_ioc io = { .size = sizeof io };
	if (ioctl(fd, cmd_of(argv[3]), &io) < 0)
		return say_err(errno);
	struct gmsfs_sock_req req;
	wire_req_init(&req, !strcmp(how, "bind") ? GMSFS_OP_BIND : GMSFS_OP_REDEEM, io.ticket, 0, 0);
	int s;
	if (!strcmp(how, "uid")) {
		/* The ticket's own process, as another user (the saved uid lets it come back). */
		s = connect_to(io.socket);
		if (setresuid(65534, 65534, 0) < 0) {
			perror("setresuid");
			return 2;
		}
		send_req(s, &req, sizeof req, -1);
		read_reply(s, false);
		if (setresuid(0, 0, 0) < 0)
			return 2;
		send_req(s, &req, sizeof req, -1);
		printf("owner: ");
		return read_reply(s, false);
	}
	if (!strcmp(how, "child") || !strcmp(how, "child-sameconn")) {
		s = !strcmp(how, "child-sameconn") ? connect_to(io.socket) : -1;
		pid_t p = fork();
		if (p == 0) {
			if (s < 0)
				s = connect_to(io.socket);
			send_req(s, &req, sizeof req, -1);
			int r = read_reply(s, false);
			fflush(stdout);
			_exit(r);
		}
		int st;
		waitpid(p, &st, 0);
		/* The ticket is still its owner's. */
		int s2 = connect_to(io.socket);
		send_req(s2, &req, sizeof req, -1);
		printf("owner: ");
		return read_reply(s2, false);
	}
	s = connect_to(io.socket);
	if (!strcmp(how, "ok") || !strcmp(how, "replay") || !strcmp(how, "bind")) {
		send_req(s, &req, sizeof req, -1);
		if (!strcmp(how, "replay")) {
			read_reply(s, true);
			send_req(s, &req, sizeof req, -1);
		}
	} else if (!strcmp(how, "forged")) {
		for (int i = 0; i < 16; i++)
			req.ticket[i] ^= 0x5a;
		send_req(s, &req, sizeof req, -1);
	} else if (!strcmp(how, "closed")) {
		close(fd);
		usleep(200000); /* RELEASE reaches the daemon after close() returned */
		send_req(s, &req, sizeof req, -1);
	} else if (!strcmp(how, "short")) {
		send_req(s, &req, 5, -1);
	} else if (!strcmp(how, "long")) { /* a body on an op that takes none */
		char big[200] = {0};
		req.body_len = sizeof big - sizeof req;
		memcpy(big, &req, sizeof req);
		send_req(s, big, sizeof big, -1);
	} else if (!strcmp(how, "badmagic")) {
		req.magic ^= 1;
		send_req(s, &req, sizeof req, -1);
	} else if (!strcmp(how, "badflags")) {
		req.flags = 2;
		send_req(s, &req, sizeof req, -1);
	} else if (!strcmp(how, "withfds")) {
		send_req(s, &req, sizeof req, 0);
	} else {
		fprintf(stderr, "unknown HOW %s\n", how);
		return 2;
	}
	int r = read_reply(s, false);
	/* After a malformed message the daemon hangs up: the next read sees it. */
	if (!strcmp(how, "short") || !strcmp(how, "long") || !strcmp(how, "badmagic") || !strcmp(how, "badflags") ||
	    !strcmp(how, "withfds"))
		read_reply(s, false);
	return r;
}

/* One request: header plus body in one message. */
static void send_op(int s, enum gmsfs_op op, const uint8_t *ticket, uint32_t flags, const void *body, size_t len)
{
	char msg[sizeof(struct gmsfs_sock_req) + 4096];
	struct gmsfs_sock_req hd;
	wire_req_init(&hd, op, ticket, flags, (uint32_t)len);
	memcpy(msg, &hd, sizeof hd);
	if (len)
		memcpy(msg + sizeof hd, body, len);
	send_req(s, msg, sizeof hd + len, -1);
}

/* A channel: BIND the LOCK ticket of FILE's lock, then one request, right or wrong. */
/* The lines of the store's state that say who holds its lock. */
static void print_state(int dirfd)
{
	char text[4096];
	int st = openat(dirfd, "state", O_RDONLY | O_CLOEXEC);
	ssize_t n = st < 0 ? -1 : read(st, text, sizeof text - 1);
	if (st >= 0)
		close(st);
	text[n > 0 ? n : 0] = '\0';
	for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n"))
		if (!strncmp(line, "state: ", 7) || !strncmp(line, "writer: ", 8) || !strncmp(line, "readers: ", 9))
			printf("%s\n", line);
}

static int do_bind(int argc, char **argv)
{
	if (argc != 4)
		return 2;
	const char *how = argv[3];
	int mode = 1;
	const char *spec = argv[2];
	if (!strncmp(spec, "lock:", 5)) {
		mode = atoi(spec + 5);
		spec = strchr(spec + 5, ':') + 1;
	}
	int fd = open(spec, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	struct gmsfs_ioc io = { .size = sizeof io, .mode = (uint32_t)mode, .timeout_ms = 2000 };
	if (fd < 0 || ioctl(fd, GMSFS_IOC_LOCK, &io) < 0)
		return say_err(errno);
	int s = connect_to(io.socket);
	msgpack_sbuffer sb;
	msgpack_sbuffer_init(&sb);
	wire_pack_export(&sb, NULL, 0, true, true);
	if (!strcmp(how, "redeem")) {
		msgpack_sbuffer_destroy(&sb);
		send_op(s, GMSFS_OP_REDEEM, io.ticket, 0, NULL, 0);
		return read_reply(s, false);
	}
	if (strcmp(how, "unbound") && strcmp(how, "soon-unbound") && strcmp(how, "unlock-unbound")) {
		send_op(s, GMSFS_OP_BIND, io.ticket, 0, NULL, 0);
		read_reply(s, true);
	}
	if (!strcmp(how, "export") || !strcmp(how, "unbound")) {
		send_op(s, GMSFS_OP_EXPORT, NULL, 0, sb.data, sb.size);
	} else if (!strcmp(how, "closed")) {
		close(fd);
		usleep(200000); /* RELEASE reaches the daemon after close() returned */
		send_op(s, GMSFS_OP_EXPORT, NULL, 0, sb.data, sb.size);
	} else if (!strcmp(how, "child")) {
		pid_t p = fork();
		if (p == 0) {
			send_op(s, GMSFS_OP_EXPORT, NULL, 0, sb.data, sb.size);
			int r = read_reply(s, false);
			fflush(stdout);
			_exit(r);
		}
		int st;
		waitpid(p, &st, 0);
		printf("owner: ");
		send_op(s, GMSFS_OP_EXPORT, NULL, 0, sb.data, sb.size);
	} else if (!strcmp(how, "create")) {
		struct wire_alloc a = { .path = "probe", .size = 4096 };
		msgpack_sbuffer_clear(&sb);
		wire_pack_create(&sb, &a, 1);
		send_op(s, GMSFS_OP_CREATE, NULL, 0, sb.data, sb.size);
	} else if (!strcmp(how, "ticketed-op")) {
		send_op(s, GMSFS_OP_EXPORT, io.ticket, 0, sb.data, sb.size);
	} else if (!strcmp(how, "commit-body")) {
		send_op(s, GMSFS_OP_COMMIT, NULL, 0, sb.data, sb.size);
	} else if (!strcmp(how, "soon-body")) {
		send_op(s, GMSFS_OP_SOON, NULL, 0, sb.data, sb.size);
	} else if (!strcmp(how, "op-switch")) {
		send_op(s, GMSFS_OP_EXPORT, NULL, GMSFS_REQ_MORE, sb.data, 2);
		send_op(s, GMSFS_OP_CREATE, NULL, 0, (const char *)sb.data + 2, sb.size - 2);
	} else if (!strcmp(how, "garbage-body")) {
		send_op(s, GMSFS_OP_EXPORT, NULL, 0, "\xdd\xff\xff\xff\xff", 5);
	} else if (!strcmp(how, "soon-unbound") || !strcmp(how, "soon-alone")) {
		send_op(s, GMSFS_OP_SOON, NULL, 0, NULL, 0); /* the refusal's reply, or none ever */
	} else if (!strcmp(how, "soon")) {
		/* SOON gets no reply: the next one read is the EXPORT's, or a refusal's. */
		send_op(s, GMSFS_OP_SOON, NULL, 0, NULL, 0);
		send_op(s, GMSFS_OP_SOON, NULL, 0, NULL, 0);
		send_op(s, GMSFS_OP_EXPORT, NULL, 0, sb.data, sb.size);
	} else if (!strcmp(how, "commit-leave")) {
		/* The reply, then (the directory still open, no UNLOCK sent) what state says. */
		msgpack_sbuffer_clear(&sb);
		wire_pack_commit_named(&sb, NULL);
		send_op(s, GMSFS_OP_COMMIT_LEAVE, NULL, 0, sb.data, sb.size);
		msgpack_sbuffer_destroy(&sb);
		int r = read_reply(s, false);
		print_state(fd);
		return r;
	} else if (!strcmp(how, "unlock") || !strcmp(how, "unlock-unbound") || !strcmp(how, "unlock-body")) {
		/* The reply, what state says, then the connection's next EXPORT and the directory's
		 * own UNLOCK ioctl: each finds the lock gone where the UNLOCK was done. */
		bool body = !strcmp(how, "unlock-body");
		send_op(s, GMSFS_OP_UNLOCK, NULL, 0, body ? sb.data : NULL, body ? sb.size : 0);
		int r = read_reply(s, false);
		if (body) {
			msgpack_sbuffer_destroy(&sb);
			return r;
		}
		print_state(fd);
		printf("export: ");
		send_op(s, GMSFS_OP_EXPORT, NULL, 0, sb.data, sb.size);
		read_reply(s, false);
		struct gmsfs_ioc un = { .size = sizeof un };
		printf("ioctl unlock: ");
		if (ioctl(fd, GMSFS_IOC_UNLOCK, &un) < 0)
			say_err(errno);
		else
			printf("ok\n");
		msgpack_sbuffer_destroy(&sb);
		return r;
	} else {
		fprintf(stderr, "unknown HOW %s\n", how);
		msgpack_sbuffer_destroy(&sb);
		return 2;
	}
	msgpack_sbuffer_destroy(&sb);
	return read_reply(s, false);
}

/* Has the daemon closed s (after an error message, or on a timeout)?  Waits up to ms. */
static bool closed_by_daemon(int s, int ms)
{
	struct pollfd p = { s, POLLIN, 0 };
	if (poll(&p, 1, ms) <= 0)
		return false;
	char buf[512];
	while (recv(s, buf, sizeof buf, MSG_DONTWAIT) > 0)
		; /* the refusal's message */
	return recv(s, buf, sizeof buf, MSG_DONTWAIT) == 0;
}

static int do_hog(int argc, char **argv)
{
	int n = atoi(argv[3]), ms = atoi(argv[4]), refused = 0, closed = 0, open_ = 0;
	int *s = calloc((size_t)n, sizeof *s);
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	snprintf(a.sun_path, sizeof a.sun_path, "%s", argv[2]);
	for (int i = 0; i < n; i++) {
		s[i] = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
		if (connect(s[i], (struct sockaddr *)&a, sizeof a) < 0)
			return say_err(errno);
	}
	usleep(300000); /* a refusal comes at once: look at them all after a moment */
	for (int i = 0; i < n; i++)
		if (closed_by_daemon(s[i], 0))
			refused++, s[i] = -1;
		else
			open_++;
	printf("open=%d refused=%d\n", open_, refused);
	fflush(stdout);
	usleep((useconds_t)ms * 1000);
	for (int i = 0; i < n; i++)
		if (s[i] >= 0 && closed_by_daemon(s[i], 0))
			closed++;
	printf("closed after %d ms of silence: %d\n", ms, closed);
	free(s);
	return 0;
}

static int do_connect(const char *path)
{
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	snprintf(a.sun_path, sizeof a.sun_path, "%s", path);
	int s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (connect(s, (struct sockaddr *)&a, sizeof a) < 0)
		return say_err(errno);
	printf("ok\n");
	return 0;
}

int main(int argc, char **argv)
{
	if (argc == 5 && !strcmp(argv[1], "hog"))
		return do_hog(argc, argv);
	if (argc == 3 && !strcmp(argv[1], "connect"))
		return do_connect(argv[2]);
	if (argc >= 4 && !strcmp(argv[1], "bind"))
		return do_bind(argc, argv);
	if (argc >= 4 && !strcmp(argv[1], "ioctl"))
		return do_ioctl(argc, argv);
	if (argc >= 4 && !strcmp(argv[1], "redeem"))
		return do_redeem(argc, argv);
	fprintf(stderr, "usage: see the top of gmsfs-probe.c\n");
	return 2;
}
