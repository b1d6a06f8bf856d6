/* handle: connecting to a store, its lock, requests on its channel, errors.  Below the
 * mappings, entries and spaces: what acts on them together is layout.c. */
#include "internal.h"
#include "hash.h"
#include "why.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/xattr.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

#define STR_(x) #x
#define STR(x) STR_(x)

int gmsfs_version(void)
{
	return GMSFS_VERSION_NUMBER;
}

const char *gmsfs_version_string(void)
{
	return STR(GMSFS_VERSION_MAJOR) "." STR(GMSFS_VERSION_MINOR) "." STR(GMSFS_VERSION_PATCH);
}

int gm_error(gmsfs *g, int e, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	why_vfmt(g->err, sizeof g->err, e, fmt, ap);
	va_end(ap);
	return e;
}

/* The words of the calling thread's last call that takes no handle (gmsfs_errmsg(NULL)). */
static __thread char thread_err[1024];

const char *gmsfs_errmsg(const gmsfs *g)
{
	return g ? g->err : thread_err;
}

int gmsfs_seterr(gmsfs *g, int err, const char *fmt, ...)
{
	char *to = g ? g->err : thread_err;
	size_t len = g ? sizeof g->err : sizeof thread_err;
	to[0] = '\0';
	if (fmt) {
		va_list ap;
		va_start(ap, fmt);
		why_vfmt(to, len, err, fmt, ap);
		va_end(ap);
	}
	return err;
}

const char *gmsfs_strerror(int err)
{
	switch (err) {
	case 0: return "success";
	case -ESTALE: return "the committed layout changed";
	case -ETIMEDOUT: return "timed out waiting for the lock";
	case -EAGAIN: return "the lock is taken";
	case -EPERM: return "not allowed with this lock";
	case -EDEADLK: return "this process holds a read lock on the store";
	case -EBUSY: return "this process's writer session holds the store already";
	case -EPROTO: return "protocol error talking to the daemon";
	case -ENOLCK: return "the handle holds no lock";
	case -EUCLEAN: return "the store is torn: a writer wrote its committed bytes in place and did not commit";
	default: return strerror(err < 0 ? -err : err);
	}
}

bool gm_tracing(void)
{
	static int traced = -1;
	if (traced < 0)
		traced = getenv("GMSFS_TRACE_IMPORT") != NULL;
	return traced;
}

int gm_timed_consume(void *timed, struct ch_manifest *m, size_t from, size_t to)
{
	struct gm_timed *t = timed;
	double t0 = gm_us();
	if (!t->first)
		t->first = t0;
	int e = t->consume(t->ctx, m, from, to);
	t->busy += gm_us() - t0;
	return e;
}

int gm_need_lock(gmsfs *g, int want)
{
	if (!g->lock)
		return gm_error(g, -ENOLCK, "no lock: the handle is unmapped (remap_all first)");
	if (want == GMSFS_RW && g->lock != GMSFS_RW)
		return gm_error(g, -EPERM, "this handle holds a read lock: only a writer may change the store");
	return 0;
}

/* ---- the lock ---- */

static const struct gm_backend *backend_of(uint32_t backend)
{
	if (backend == GMSFS_BACKEND_HOST)
		return &gm_host_backend;
#ifdef GMSFS_HAVE_CUDA
	if (backend == GMSFS_BACKEND_CUDA)
		return &gm_cuda_backend;
#endif
	return NULL;
}


/* An open of the store directory given ms (more than 0): a daemon that is stopped or stuck
 * never answers its lookup, and holds the thread that asked in the kernel.  That thread is
 * a helper of ours, left behind (it closes what it opens late, and frees itself); the
 * caller gets -ETIMEDOUT and *stuck.  Without a thread to spare, a plain open. */
struct dir_open {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	char *path;
	int fd, err;
	bool done, abandoned;
};

static void dir_open_free(struct dir_open *d)
{
	pthread_mutex_destroy(&d->mu);
	pthread_cond_destroy(&d->cv);
	free(d->path);
	free(d);
}

static void *dir_open_run(void *arg)
{
	struct dir_open *d = arg;
	int fd = open(d->path, O_RDONLY | O_DIRECTORY | O_CLOEXEC), err = fd < 0 ? errno : 0;
	pthread_mutex_lock(&d->mu);
	bool late = d->abandoned;
	d->fd = fd, d->err = err, d->done = true;
	pthread_cond_signal(&d->cv);
	pthread_mutex_unlock(&d->mu);
	if (late) {
		if (fd >= 0)
			close(fd);
		dir_open_free(d);
	}
	return NULL;
}

static int open_dir_within(const char *dir, int ms, bool *stuck)
{
	struct dir_open *d = calloc(1, sizeof *d);
	pthread_attr_t attr;
	pthread_t t;
	if (!d || !(d->path = strdup(dir)) || pthread_attr_init(&attr)) {
		free(d ? d->path : NULL);
		free(d);
		int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		return fd < 0 ? -errno : fd;
	}
	pthread_mutex_init(&d->mu, NULL);
	pthread_condattr_t ca;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&d->cv, &ca);
	pthread_condattr_destroy(&ca);
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	int started = !pthread_create(&t, &attr, dir_open_run, d);
	pthread_attr_destroy(&attr);
	if (!started) {
		dir_open_free(d);
		int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		return fd < 0 ? -errno : fd;
	}
	struct timespec end;
	clock_gettime(CLOCK_MONOTONIC, &end);
	end.tv_sec += ms / 1000;
	end.tv_nsec += (long)(ms % 1000) * 1000000;
	if (end.tv_nsec >= 1000000000)
		end.tv_sec++, end.tv_nsec -= 1000000000;
	pthread_mutex_lock(&d->mu);
	while (!d->done && pthread_cond_timedwait(&d->cv, &d->mu, &end) != ETIMEDOUT)
		;
	if (!d->done) {
		d->abandoned = true; /* the helper frees it */
		pthread_mutex_unlock(&d->mu);
		*stuck = true;
		return -ETIMEDOUT;
	}
	int fd = d->fd < 0 ? -d->err : d->fd;
	pthread_mutex_unlock(&d->mu);
	dir_open_free(d);
	return fd;
}

/* The store directory's handle with the lock in mode, waiting up to timeout_ms.  A signal
 * ends the daemon's wait (FUSE answers EINTR): the wait goes on with what is left of the
 * timeout, as Python retries since PEP 475, unless the handle asked for -EINTR.  A daemon
 * replaced while it waits (gmsfs -o takeover) answers ESTALE: the path leads to its
 * successor now, so the directory is opened again (a few times: never for good).  The
 * handle kept since the last lock went (g->sleepfd) is asked first: a remap_all saves the
 * open's round trip.  Where it no longer leads to the store the path names (its daemon
 * gone or replaced, the store removed, perhaps made again), the directory is opened. */
static int lock_dir(gmsfs *g, int mode, int timeout_ms, struct gmsfs_ioc *io, bool *stuck)
{
	int64_t deadline = timeout_ms > 0 ? gm_now_ms() + timeout_ms : 0;
	for (int replaced = 0;;) {
		int left = timeout_ms;
		if (timeout_ms > 0 && (left = (int)(deadline - gm_now_ms())) <= 0)
			return -ETIMEDOUT;
		bool kept = g->sleepfd >= 0;
		int fd = kept	       ? g->sleepfd
			 : left > 0 ? open_dir_within(g->dir, left, stuck) /* a timeout is kept on a stopped daemon */
				    : open(g->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		g->sleepfd = -1;
		if (fd < 0)
			return left > 0 ? fd : -errno; /* open_dir_within says its own errno */
		lg_retry(fd, g->dir); /* what this process let go of while no daemon served: first */
		*io = (struct gmsfs_ioc){ .size = sizeof *io, .flags = g->own ? GMSFS_LOCK_OWN : 0, .mode = (uint32_t)mode,
					  .timeout_ms = left };
		if (!ioctl(fd, GMSFS_IOC_LOCK, io))
			return fd;
		int e = errno;
		close(fd);
		if (kept && (e == ENOTCONN || e == ECONNABORTED || e == ENOENT || e == ESTALE || e == EBUSY))
			continue;
		if (e == ESTALE && replaced++ < 50) {
			nanosleep(&(struct timespec){ 0, 20000000 }, NULL);
			continue;
		}
		if (e != EINTR || g->eintr)
			return -e;
	}
}

/* The store's last_error (its state file), for a refusal the daemon explains there. */
static void last_error_of(const char *dir, char *out, size_t size)
{
	char path[4200], buf[4096];
	out[0] = '\0';
	snprintf(path, sizeof path, "%s/state", dir);
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	ssize_t n = fd < 0 ? -1 : read(fd, buf, sizeof buf - 1);
	if (fd >= 0)
		close(fd);
	if (n <= 0)
		return;
	buf[n] = '\0';
	char *p = strstr(buf, "\nlast_error: ");
	if (p)
		snprintf(out, size, "%.*s", (int)strcspn(p + 13, "\n"), p + 13);
}

static const char *socket_here(const gmsfs *g, char *buf, size_t size);

int gm_take_lock(gmsfs *g, int mode, int timeout_ms)
{
	struct gmsfs_ioc io;
	double t0 = gm_tracing() ? gm_us() : 0;
	bool stuck = false;
	int fd = lock_dir(g, mode, timeout_ms, &io, &stuck);
	if (fd < 0) {
		int e = -fd;
		switch (e) {
		case ETIMEDOUT:
			return stuck ? gm_error(g, -e, "%s: its daemon does not answer within %d ms (stopped, or stuck)",
						g->dir, timeout_ms)
				     : gm_error(g, -e, "%s: lock not granted within %d ms", g->dir, timeout_ms);
		case EAGAIN: return gm_error(g, -e, "%s: the lock is taken", g->dir);
		case ENOTTY: return gm_error(g, -e, "%s: not a store of a gmsfs mount", g->dir);
		case EACCES: return gm_error(g, -e, "%s: no %s permission on its lock", g->dir,
					    mode == GMSFS_RO ? "read" : "write");
		case EBUSY: return gm_error(g, -e, "%s: this process's writer session holds it already "
						  "(one RW connection per session)", g->dir);
		case EDEADLK: return gm_error(g, -e, "%s: this process holds a read lock on it", g->dir);
		case EINTR: return gm_error(g, -e, "%s: a signal came while waiting for the lock", g->dir);
		case ENOSPC:
		case EUCLEAN: {
			char why[400];
			last_error_of(g->dir, why, sizeof why);
			return gm_error(g, -e, "%s: %s: %s", g->dir,
					e == ENOSPC ? "it cannot come back to the device" : "the store is torn",
					why[0] ? why : e == ENOSPC ? "no room (see its state)" : "see its state");
		}
		default: return gm_error(g, -e, "%s: lock: %s", g->dir, strerror(e));
		}
	}
	const struct gm_backend *be = backend_of(io.backend);
	if (!be) {
		close(fd);
		return gm_error(g, -ENOTSUP, "%s: backend %u is not supported by this libgmsfs", g->dir, io.backend);
	}
	char why[300] = "";
	double t1 = t0 ? gm_us() : 0;
	int e = be->attach(g, why, sizeof why);
	if (e) {
		close(fd);
		return gm_error(g, e, "%s: %s", g->dir, why);
	}
	/* A member's open of lock joins the session at once. */
	int lockfd = io.lock == GMSFS_RW ? openat(fd, "lock", O_WRONLY | O_CLOEXEC) : -1;
	if (io.lock == GMSFS_RW && lockfd < 0) {
		e = -errno;
		close(fd);
		return gm_error(g, e, "%s/lock: %s", g->dir, strerror(-e));
	}
	g->be = be;
	g->dirfd = fd;
	g->lockfd = lockfd;
	g->info = io;
	g->lock = (int)io.lock;
	g->committed = false;
	g->imported_all = false;
	g->said_in_place = false;
	g->granted_rw |= g->lock == GMSFS_RW;
	memcpy(g->ticket, io.ticket, sizeof g->ticket);
	g->have_ticket = true;
	/* The channel is bound now, its reply read by the first call: the daemon starts the
	 * connection while the caller goes on, and that call costs one round trip. */
	char ignored[160], here[sizeof g->info.socket];
	double t2 = t0 ? gm_us() : 0;
	if (!ch_bind_start(&g->ch, socket_here(g, here, sizeof here), g->ticket, ignored, sizeof ignored))
		g->have_ticket = false; /* spent; else the first call binds and says why not */
	if (t0)
		fprintf(stderr, "gmsfs lock: %.0f us: granted after %.0f us, attached %.0f us, bind sent %.0f us (from %.0f)\n",
			gm_us() - t0, t1 - t0, t2 - t1, gm_us() - t2, gm_trace_clock(t0));
	return 0;
}

/* unlocked: the daemon took the lock back already (a reader's UNLOCK by its socket). */
static void release_lock(gmsfs *g, bool unlocked)
{
	ch_close(&g->ch);
	if (g->left) { /* COMMIT_LEAVE: the daemon holds nothing for them; closes alone */
		if (g->lockfd >= 0)
			close(g->lockfd);
		if (g->dirfd >= 0)
			close(g->dirfd);
		g->left = false;
		g->dirfd = g->lockfd = -1;
	}
	/* Read holds: a reader's, or those a writer's commit left (whatever this handle heard
	 * after it); a daemon gone since it granted them (killed, or replaced by a takeover)
	 * left them to its successor, which keeps them until this process lets go. */
	bool reads = g->lock == GMSFS_RO || g->committed;
	unsigned kept = 0;
	struct gmsfs_ioc unlock = { .size = sizeof unlock };
	/* committed: lock's read hold goes now, not at its release */
	if (g->lockfd >= 0 && reads && ioctl(g->lockfd, GMSFS_IOC_UNLOCK, &unlock) && gm_gone(errno))
		kept++;
	if (g->lockfd >= 0)
		close(g->lockfd);
	if (g->dirfd >= 0) {
		/* Now, not when the release of close() reaches the daemon: a connect that follows
		 * at once must not find this process still holding the old lock. */
		struct gmsfs_ioc io = { .size = sizeof io };
		/* A writer that did not commit rolls back. */
		if (unlocked || !ioctl(g->dirfd, GMSFS_IOC_UNLOCK, &io)) {
			gm_forget_dir(g);
			g->sleepfd = g->dirfd; /* holds nothing now; the next lock is asked on it */
		} else {
			kept += reads && gm_gone(errno);
			lg_let_go(g->dir, &g->info, kept);
			close(g->dirfd);
		}
	}
	g->dirfd = g->lockfd = -1;
	g->lock = 0;
	g->committed = false;
	g->imported_all = false;
	g->said_in_place = false;
	g->have_ticket = false;
}

void gm_release_lock(gmsfs *g)
{
	release_lock(g, false);
}

int gm_unlock_send(gmsfs *g)
{
	return g->lock == GMSFS_RO && !g->left && g->lockfd < 0 && g->dirfd >= 0 ? ch_send(&g->ch, GMSFS_OP_UNLOCK)
										 : -EINVAL;
}

void gm_unlock_done(gmsfs *g, int sent)
{
	char why[256];
	release_lock(g, !sent && !ch_reply(&g->ch, why, sizeof why)); /* refused: by the ioctl, as before */
}

void gm_forget_dir(gmsfs *g)
{
	if (g->sleepfd >= 0)
		close(g->sleepfd);
	g->sleepfd = -1;
}

int gm_refresh(gmsfs *g)
{
	struct gmsfs_ioc io = { .size = sizeof io };
	if (g->dirfd < 0)
		return gm_error(g, -ENOLCK, "no lock: the handle is unmapped");
	if (ioctl(g->dirfd, GMSFS_IOC_INFO, &io) < 0)
		return gm_error(g, -errno, "info: %s", strerror(errno));
	g->info = io;
	if (g->lock != (int)io.lock)
		g->imported_all = false;
	g->lock = (int)io.lock;
	return 0;
}

/* ---- the channel ---- */

/* Where to reach the daemon's socket from here: the path it gives, as it sees it; or, where
 * this process sees the mount at another path (a pod's volume mounted elsewhere, a CSI
 * volume) and that path is not here, the socket of that name beside the mount as this
 * process sees it: the store's directory's parent's parent, through the open directory.
 * A wrong socket costs nothing: the daemon that answers must know the ticket. */
static const char *socket_here(const gmsfs *g, char *buf, size_t size)
{
	if (g->dirfd < 0 || !access(g->info.socket, F_OK) || errno != ENOENT)
		return g->info.socket;
	const char *base = strrchr(g->info.socket, '/');
	int n = snprintf(buf, size, "/proc/self/fd/%d/../../%s", g->dirfd, base ? base + 1 : g->info.socket);
	return n > 0 && (size_t)n < size ? buf : g->info.socket;
}

static int bind_channel(gmsfs *g)
{
	if (!g->have_ticket) {
		struct gmsfs_ioc io = { .size = sizeof io };
		if (ioctl(g->dirfd, GMSFS_IOC_CHANNEL, &io) < 0)
			return gm_error(g, -errno, "%s: channel: %s", g->dir, strerror(errno));
		memcpy(g->ticket, io.ticket, sizeof g->ticket);
		memcpy(g->info.socket, io.socket, sizeof io.socket);
	}
	g->have_ticket = false; /* spent, whatever happens */
	char here[sizeof g->info.socket];
	return ch_bind(&g->ch, socket_here(g, here, sizeof here), g->ticket, g->err, sizeof g->err);
}

/* The daemon that granted the lock is gone (killed, or replaced by gmsfs -o takeover)?
 * Its mount answers ENOTCONN from then on (ECONNABORTED, a request it had when it died). */
static bool daemon_gone(gmsfs *g)
{
	struct gmsfs_ioc io = { .size = sizeof io };
	return ioctl(g->dirfd, GMSFS_IOC_INFO, &io) < 0 && gm_gone(errno);
}

/* A writer whose daemon is gone: its session was rolled back (gmsfs(8), takeover), and
 * the memory it maps is no longer the store's.  Its mappings become read-only, so that
 * nothing it writes later looks like work that could still be committed. */
static int session_lost(gmsfs *g)
{
	for (size_t i = 0; i < g->nmaps; i++)
		if (g->slots[i].mapped && g->maps[i].writable) {
			g->be->allow(g, g->maps[i].ptr, g->maps[i].aligned, false);
			g->maps[i].writable = 0;
		}
	g->lock = GMSFS_RO;
	return gm_error(g, -EPERM, "%s: the daemon that granted this writer session is gone (killed, or replaced "
		       "by gmsfs -o takeover): the session was rolled back; connect again to write", g->dir);
}

int gm_call(gmsfs *g, enum gmsfs_op op, const void *body, size_t len, struct ch_manifest *m)
{
	if (g->dirfd < 0)
		return gm_error(g, -ENOLCK, "no lock: the handle is unmapped");
	int e = 0;
	/* The daemon closes idle connections before reading anything: then bind again and send again. */
	for (int tries = 0; tries < 2; tries++) {
		if (g->ch.sock < 0 && (e = bind_channel(g)))
			break;
		e = ch_call(&g->ch, op, body, len, m, g->err, sizeof g->err);
		if (e != -ENOTCONN)
			break;
	}
	if (e == -ENOTCONN && g->lock == GMSFS_RW && daemon_gone(g))
		return session_lost(g);
	return e;
}

/* ---- connect ---- */

int gmsfs_connect(gmsfs **out, const char *store_dir, int mode, int timeout_ms)
{
	if (!out)
		return -EINVAL;
	*out = NULL;
	int flags = mode & ~GMSFS_LOCK_MASK;
	mode &= GMSFS_LOCK_MASK;
	if (!store_dir || mode < GMSFS_RO || mode > GMSFS_RW_DATA || timeout_ms < -1 || (flags & ~(GMSFS_EINTR | GMSFS_OWN)))
		return -EINVAL;
	gmsfs *g = calloc(1, sizeof *g);
	if (!g || !(g->dir = strdup(store_dir))) {
		free(g);
		return -ENOMEM;
	}
	g->dirfd = g->lockfd = g->sleepfd = -1;
	g->ch.sock = -1;
	g->mode = mode;
	g->eintr = flags & GMSFS_EINTR;
	g->own = flags & GMSFS_OWN;
	*out = g; /* even on failure: gmsfs_errmsg says why */
	return gm_take_lock(g, mode, timeout_ms);
}

const char *gmsfs_store_path(const gmsfs *g)
{
	return g ? g->dir : NULL;
}

int gmsfs_lock_mode(const gmsfs *g)
{
	return g ? g->lock : 0;
}

int gmsfs_backend(const gmsfs *g)
{
	return g && g->be ? (int)g->info.backend : 0;
}

bool gm_device_ok(const gmsfs *g, int device)
{
#ifdef GMSFS_HAVE_CUDA
	if (g->info.backend == GMSFS_BACKEND_CUDA)
		return device == (int)g->cudev;
#endif
	return true;
}

uint64_t gmsfs_generation(const gmsfs *g)
{
	return g ? g->info.generation : 0;
}

int gmsfs_content_hash(gmsfs *g, char hex[33])
{
	if (!g || !hex)
		return g ? gm_error(g, -EINVAL, "content_hash: no place for the hash") : -EINVAL;
	hex[0] = '\0';
	char v[80];
	ssize_t n = getxattr(g->dir, GMSFS_XATTR_CONTENT, v, sizeof v - 1);
	if (n < 0)
		return errno == ENODATA ? -ENODATA : gm_error(g, -errno, "content_hash: %s", strerror(errno));
	v[n] = '\0';
	unsigned long long gen;
	char h[33];
	if (sscanf(v, "%llu %32s", &gen, h) != 2 || strlen(h) != 32 || strspn(h, "0123456789abcdef") != 32)
		return gm_error(g, -EIO, "content_hash: the daemon said \"%s\"", v);
	if (gen != g->info.generation)
		return -ENODATA; /* of another commit than the one this handle holds */
	memcpy(hex, h, 33);
	return 0;
}

int gmsfs_layout_hash(gmsfs *g, char hex[33])
{
	if (!g || !hex)
		return -EINVAL;
	int e = gm_refresh(g);
	if (e)
		return e;
	hex[0] = '\0';
	if (g->info.has_hash)
		hex_of(g->info.layout_hash, GMSFS_HASH_LEN, hex);
	return 0;
}
