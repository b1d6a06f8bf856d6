/* sock_accept: the daemon's listening socket (sock.c serves what it accepts): threads
 * take turns at accept(2), the one the kernel wakes serving its connection; the socket's
 * start and stop, and the sweep of dead daemons' sockets. */
#include "export_internal.h"
#include "../log.h"
#include "clock.h"
#include "fdpass.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#define SOCK_EXPECT_SPIN_NS 1000000 /* an announced connection is watched for this long */
#define SOCK_SPARES 2               /* threads parked to take the acceptor's role, at most */

static int start_thread(void *(*fn)(void *), void *arg)
{
	pthread_t t;
	pthread_attr_t attr;
	pthread_attr_init(&attr);
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	pthread_attr_setstacksize(&attr, 256 * 1024);
	int e = pthread_create(&t, &attr, fn, arg);
	pthread_attr_destroy(&attr);
	return e;
}

static void *worker_main(void *arg);

/* One more thread of the pool: counted under fs->mu (count_worker), made after it is
 * let go, never while it is held (a thread's start costs tens of microseconds that every
 * request would wait for); false: none could be made. */
static void count_worker(struct export *ex)
{
	ex->threads++;
	ex->starting++;
}

static bool spawn_worker(struct fs *fs)
{
	struct export *ex = fs->ex;
	if (!start_thread(worker_main, fs))
		return true;
	pthread_mutex_lock(&fs->mu);
	ex->threads--;
	ex->starting--;
	pthread_mutex_unlock(&fs->mu);
	return false;
}

/* Out of descriptors, a connection would wait in the backlog for ever: a descriptor kept
 * for this (ex->reserve_fd, the acceptor's alone) lets us accept it, say why, and close it. */
static void refuse_one(struct fs *fs)
{
	struct export *ex = fs->ex;
	close(ex->reserve_fd);
	int s = accept4(ex->sock_fd, NULL, NULL, SOCK_CLOEXEC);
	if (s >= 0) {
		char why[300];
		vmm_why(fs->vmm, -EMFILE, why, sizeof why);
		fuse_log(FUSE_LOG_WARNING, "gmsfs: socket: a connection refused: %s\n", why);
		sock_send_error(s, EMFILE, why);
		close(s);
	}
	ex->reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
	if (ex->reserve_fd < 0)
		usleep(10000);
}

/* GMSFS_TRACE_RPC: when the last lock was granted and its announcement woke the acceptor,
 * for the log line of the connection that follows (where the first request's wait went). */
static _Atomic uint64_t expected_ns, woken_ns;

/* Where the daemon spins (sock_spin_ns: 8 cores, or GMSFS_SPIN_US), the listening socket
 * does not block: the acceptor sleeps here until a connection comes or one is announced.
 * A lock just granted (sock_expect) is a connection a few hundred microseconds away: the
 * acceptor wakes now, while the lock's reply travels and the client dials, and watches
 * for it (up to 1 ms), so that the client's bind does not wait for a thread to wake.
 * false: the socket was shut down (the stop). */
static bool wait_for_connection(struct export *ex)
{
	struct pollfd p[2] = { { .fd = ex->sock_fd, .events = POLLIN }, { .fd = ex->expect_fd, .events = POLLIN } };
	if (poll(p, 2, -1) < 0)
		return true;
	if (p[0].revents & (POLLHUP | POLLERR | POLLNVAL))
		return false; /* shut down (a listener's accept says EAGAIN then, not an error) */
	uint64_t n;
	if ((p[1].revents & POLLIN) && !(p[0].revents & POLLIN) && read(ex->expect_fd, &n, sizeof n) == sizeof n) {
		woken_ns = clock_mono_ns();
		fdpass_spin_readable(ex->sock_fd, SOCK_EXPECT_SPIN_NS);
	}
	return true;
}

void sock_expect(struct fs *fs)
{
	uint64_t one = 1;
	expected_ns = clock_mono_ns();
	if (fs->ex && fs->ex->expect_fd >= 0 && write(fs->ex->expect_fd, &one, sizeof one) < 0)
		return; /* full (never, in practice): the acceptor is awake anyway */
}

/* The next connection, accepted (or one refused when out of descriptors); -1: the
 * socket was shut down (the stop). */
static int accept_one(struct fs *fs)
{
	struct export *ex = fs->ex;
	for (;;) {
		int s = accept4(ex->sock_fd, NULL, NULL, SOCK_CLOEXEC);
		if (s >= 0)
			return s;
		if (errno == EAGAIN || errno == EWOULDBLOCK) {
			if (!wait_for_connection(ex))
				return -1;
		} else if ((errno == EMFILE || errno == ENFILE) && ex->reserve_fd >= 0)
			refuse_one(fs);
		else if (errno == EMFILE || errno == ENFILE || errno == ENOMEM || errno == ENOBUFS)
			usleep(10000);
		else if (errno != EINTR && errno != ECONNABORTED)
			return -1; /* shut down */
	}
}

/* Threads take turns at accept(2) (a leader and followers): the one waiting there accepts
 * the next connection, hands the role to a thread parked for it and serves its
 * connection itself, then parks again (SOCK_SPARES at most; the others end).  The first
 * request of a connection is then served by the thread the kernel woke for it, not after
 * that thread wakes a second one or makes one (on a virtual machine a wake-up costs
 * hundreds of microseconds, a thread's start tens).  The spare is made while nobody
 * waits for it, when a thread takes the role and none is parked; threads that served
 * park again, so that in the end the same few take turns, their stacks and buffers
 * already in memory.  A buffer is made before its connection comes. */
static void *worker_main(void *arg)
{
	struct fs *fs = arg;
	struct export *ex = fs->ex;
	pthread_mutex_lock(&fs->mu);
	ex->starting--;
	for (;;) {
		while (ex->acceptor && !ex->exiting) {
			ex->parked++;
			pthread_cond_wait(&ex->spare_cv, &fs->mu);
			ex->parked--;
		}
		if (ex->exiting)
			break;
		ex->acceptor = true;
		bool spare = !ex->parked && !ex->starting;
		if (spare)
			count_worker(ex);
		pthread_mutex_unlock(&fs->mu);
		if (spare)
			spawn_worker(fs); /* if it fails, the next connection makes one (below) */
		uint8_t *buf = malloc(SOCK_BUF_SIZE);
		int s = accept_one(fs);
		uint64_t accepted = s >= 0 && log_trace_rpc() ? clock_mono_ns() : 0;
		pthread_mutex_lock(&fs->mu);
		ex->acceptor = false;
		if (s < 0) {
			free(buf);
			break;
		}
		bool next = ex->parked || ex->starting || ex->exiting, make = !next;
		if (make)
			count_worker(ex);
		if (ex->parked)
			pthread_cond_signal(&ex->spare_cv);
		pthread_mutex_unlock(&fs->mu);
		if (make)
			next = spawn_worker(fs);
		if (accepted) {
			uint64_t t = expected_ns, w = woken_ns;
			fuse_log(FUSE_LOG_INFO, "gmsfs: socket: accepted %.0f us after the last lock's grant (the acceptor "
				 "woke after %.0f us), the next acceptor ready in %.0f us (at %llu)\n", (accepted - t) / 1e3,
				 w > t ? (w - t) / 1e3 : -1.0, (clock_mono_ns() - accepted) / 1e3,
				 (unsigned long long)(accepted / 1000 % 1000000000));
		}
		if (next) {
			struct sock_conn *c = sock_conn_start(fs, s);
			if (c)
				sock_serve(c, buf); /* frees buf */
			else
				free(buf);
		} else {
			/* No thread for the next connection: this one is refused, and this thread
			 * waits at accept(2) again, so that nobody waits in the backlog unanswered. */
			sock_send_error(s, EAGAIN, "the daemon could not make a thread to serve it: try again");
			close(s);
			free(buf);
		}
		pthread_mutex_lock(&fs->mu);
		if (ex->parked >= SOCK_SPARES)
			break; /* enough wait already: this thread is not needed */
	}
	ex->threads--;
	pthread_cond_broadcast(&ex->cv);
	pthread_mutex_unlock(&fs->mu);
	return NULL;
}

const char *export_socket(const struct fs *fs)
{
	return fs->ex->socket_path;
}

void export_rename(struct fs *fs, const char *path)
{
	struct export *ex = fs->ex;
	if (rename(ex->socket_path, path)) {
		fprintf(stderr, "gmsfs: socket %s: renaming it %s: %s (it keeps its name)\n", ex->socket_path, path,
			strerror(errno));
		return;
	}
	pthread_mutex_lock(&fs->mu);
	snprintf(ex->socket_path, sizeof ex->socket_path, "%s", path);
	pthread_mutex_unlock(&fs->mu);
}

/* The default sockets (DIR/gmsfs-PID.sock) of daemons that died without unlinking theirs:
 * each is asked, and one nobody listens on (ECONNREFUSED) is removed, so they do not pile
 * up in /run/gmsfs.  A live daemon's answers and stays. */
static void sweep_dead_sockets(const char *dir)
{
	DIR *d = opendir(dir);
	if (!d)
		return;
	for (struct dirent *e; (e = readdir(d));) {
		size_t n = strlen(e->d_name);
		if (strncmp(e->d_name, "gmsfs-", 6) || n < 11 || strcmp(e->d_name + n - 5, ".sock"))
			continue;
		struct sockaddr_un a = { .sun_family = AF_UNIX };
		if (snprintf(a.sun_path, sizeof a.sun_path, "%s/%s", dir, e->d_name) >= (int)sizeof a.sun_path)
			continue;
		/* Not blocking: a listener that does not accept (stopped, or stuck) and whose
		 * backlog is full would hold this start until it went (EAGAIN: a live one). */
		int s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
		if (s >= 0 && connect(s, (struct sockaddr *)&a, sizeof a) < 0 && errno == ECONNREFUSED)
			unlink(a.sun_path);
		if (s >= 0)
			close(s);
	}
	closedir(d);
}

int sock_start(struct fs *fs, const char *path, sock_serve_fn *serve, char *err, size_t errlen)
{
	struct export *ex = calloc(1, sizeof *ex);
	if (!ex) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	ex->sock_fd = ex->reserve_fd = ex->expect_fd = -1;
	ex->serve = serve;
	pthread_cond_init(&ex->cv, NULL);
	pthread_cond_init(&ex->spare_cv, NULL);
	fs->ex = ex;
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
		sweep_dead_sockets(dir);
		snprintf(a.sun_path, sizeof a.sun_path, "%s/gmsfs-%d.sock", dir, (int)getpid());
	}
	int s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (s < 0) {
		snprintf(err, errlen, "socket: %s", strerror(errno));
		return -errno;
	}
	/* A socket someone answers on is a live daemon's: never take it over. */
	int probe = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (probe >= 0 && (connect(probe, (struct sockaddr *)&a, sizeof a) == 0 || errno == EAGAIN)) {
		close(probe);
		close(s);
		snprintf(err, errlen, "socket %s is served by a live daemon already: one daemon per socket", a.sun_path);
		return -EADDRINUSE;
	}
	if (probe >= 0)
		close(probe);
	unlink(a.sun_path); /* a stale socket of a dead daemon */
	int one = 1;
	setsockopt(s, SOL_SOCKET, SO_PASSCRED, &one, sizeof one);
	/* Created with the final mode: no window in which anyone else may connect. */
	mode_t old = umask(fs->allow_other ? 0111 : 0177);
	int r = bind(s, (struct sockaddr *)&a, sizeof a);
	umask(old);
	if (r < 0 || listen(s, 128) < 0) {
		int e = errno;
		snprintf(err, errlen, "socket %s: %s", a.sun_path, strerror(e));
		close(s);
		return -e;
	}
	snprintf(ex->socket_path, sizeof ex->socket_path, "%s", a.sun_path);
	ex->sock_fd = s;
	ex->reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
	if (sock_spin_ns(NULL) && (ex->expect_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) >= 0)
		fcntl(s, F_SETFL, fcntl(s, F_GETFL) | O_NONBLOCK); /* accepted sockets block still */
	pthread_mutex_lock(&fs->mu);
	count_worker(ex);
	pthread_mutex_unlock(&fs->mu);
	if (!spawn_worker(fs)) {
		snprintf(err, errlen, "socket: no thread");
		close(s);
		ex->sock_fd = -1;
		unlink(ex->socket_path);
		return -EAGAIN;
	}
	return 0;
}

void export_stop(struct fs *fs)
{
	struct export *ex = fs->ex;
	if (!ex)
		return;
	if (ex->sock_fd >= 0) {
		pthread_mutex_lock(&fs->mu);
		ex->exiting = true; /* no acceptor is made from now on, no connection admitted */
		pthread_mutex_unlock(&fs->mu);
		shutdown(ex->sock_fd, SHUT_RDWR); /* the acceptor's accept(2) ends */
		sock_expect(fs);                  /* and its poll(2), where it sleeps there */
		/* End every connection and wait for every thread to leave (the parked ones too). */
		pthread_mutex_lock(&fs->mu);
		pthread_cond_broadcast(&ex->spare_cv);
		sock_shutdown_all(fs);
		while (ex->threads)
			pthread_cond_wait(&ex->cv, &fs->mu);
		pthread_mutex_unlock(&fs->mu);
		close(ex->sock_fd);
		unlink(ex->socket_path);
	}
	if (ex->reserve_fd >= 0)
		close(ex->reserve_fd);
	if (ex->expect_fd >= 0)
		close(ex->expect_fd);
	free(ex->uids);
	pthread_cond_destroy(&ex->cv);
	pthread_cond_destroy(&ex->spare_cv);
	free(ex);
	fs->ex = NULL;
}
