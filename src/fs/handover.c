/* handover: both sides of gmsfs -o takeover (handover.h). */
#include "handover.h"
#include "clock.h"
#include "image.h"
#include "mnt.h"
#include "store.h"
#include "wait.h"
#include "fdpass.h"
#include "why.h"
#include "wire.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <limits.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define HO_MAGIC 0x564f4847u /* "GHOV" */
#ifndef FUSE_SUPER_MAGIC
#define FUSE_SUPER_MAGIC 0x65735546
#endif
#define HO_TIMEOUT_S 120     /* the new daemon restores and mounts meanwhile */
#define HO_READ_S 5          /* the old daemon's device file, read before anything else */

enum ho_kind { HO_IMAGES = 1, HO_FDS, HO_MOUNTED, HO_BYE, HO_FAIL };

/* Every message between the two daemons; descriptors ride along with IMAGES (the
 * images' memfd) and FDS (count of the memory's, in order). */
struct ho_msg {
	uint32_t magic, kind;
	uint64_t count, bytes;  /* IMAGES: stores, the memfd's bytes; FDS: descriptors here */
	uint64_t nfds;          /* IMAGES: descriptors that follow in FDS messages */
	char why[256];          /* FAIL */
};

static int send_msg(int sock, uint32_t kind, uint64_t count, uint64_t bytes, uint64_t nfds, const int *fds,
		    size_t n, const char *why)
{
	struct ho_msg m = { .magic = HO_MAGIC, .kind = kind, .count = count, .bytes = bytes, .nfds = nfds };
	if (why)
		snprintf(m.why, sizeof m.why, "%s", why);
	return fdpass_send(sock, &m, sizeof m, fds, n);
}

/* One message of kind want (FAIL says why instead); its descriptors into fds. */
static int recv_msg(int sock, uint32_t want, struct ho_msg *m, int *fds, size_t max, size_t *nfds, char *err,
		    size_t errlen)
{
	struct fdpass_info info;
	ssize_t n = fdpass_recv(sock, m, sizeof *m, fds, max, &info);
	if (nfds)
		*nfds = info.nfds;
	else
		for (size_t i = 0; i < info.nfds; i++)
			close(fds[i]);
	if (n <= 0)
		return why_fmt(err, errlen, n ? (int)n : -ECONNRESET, "the other daemon %s",
			       n ? strerror((int)-n) : "hung up");
	m->why[sizeof m->why - 1] = '\0';
	if ((size_t)n != sizeof *m || m->magic != HO_MAGIC || info.truncated)
		return why_fmt(err, errlen, -EPROTO, "a malformed handover message");
	if (m->kind == HO_FAIL)
		return why_fmt(err, errlen, -EIO, "the other daemon: %s", m->why);
	if (m->kind != want)
		return why_fmt(err, errlen, -EPROTO, "handover message %u where %u was due", m->kind, want);
	return 0;
}

static void set_timeout(int fd, int seconds)
{
	struct timeval tv = { seconds, 0 };
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
	setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

/* ---- the old daemon ---- */

/* fs->mu held: every store's image into sb and its memory's descriptors into fds; -EBUSY
 * while a store moves (tried again), else 0 or -errno with why. */
static int pack_all(struct fs *fs, msgpack_sbuffer *sb, struct image_fds *fds, char *why, size_t whylen)
{
	msgpack_sbuffer_clear(sb);
	fds->n = fds->nrefs = 0;
	for (size_t i = 0; i < fs->stores->n; i++) {
		struct store *st = fs->stores->v[i];
		/* Its readers go along: their descriptors of this mount die with this daemon, but
		 * they still map the store, which the next daemon must keep for them. */
		if (st->tier.at == TIER_TO_HOST || st->tier.at == TIER_TO_DEVICE)
			return why_fmt(why, whylen, -EBUSY, "store %s: moving", st->name);
		int e = image_pack(st, sb, fds, &(struct image_pack_opts){ .readers = true, .standby = true });
		if (e)
			return why_fmt(why, whylen, e, "store %s: %s", st->name, strerror(-e));
	}
	return 0;
}

/* A store whose writer session the handover rolls back, and the memory its committed
 * allocations had (the writer's mappings), swapped out for a copy. */
struct renewal {
	struct store *st;
	struct vmm_bufs bufs;
	struct vmm_buf **old;
};

static bool moving(struct fs *fs)
{
	for (size_t i = 0; i < fs->stores->n; i++)
		if (fs->stores->v[i]->tier.at == TIER_TO_HOST || fs->stores->v[i]->tier.at == TIER_TO_DEVICE)
			return true;
	return false;
}

/* fs->mu held (let go while bytes are copied).  Every store with a writer session: its
 * writer may have mapped the committed allocations writable (in-place updates), and
 * would go on writing into what the successor serves after its session is rolled back.
 * Their bytes are copied into memory of their own, which the store takes; the writer's
 * mappings keep the old.  -ENOSPC (why) when there is no room for a copy. */
static int renew_sessions(struct fs *fs, struct renewal **out, size_t *nout, char *why, size_t whylen)
{
	struct store_table *t = fs->stores;
	struct renewal *r = calloc(t->n + 1, sizeof *r);
	size_t n = 0;
	int e = r ? 0 : -ENOMEM;
	for (size_t i = 0; !e && i < t->n; i++) {
		struct store *st = t->v[i];
		if (!store_lock(st)->fsm.leader || !store_lock(st)->fsm.committed || store_lock(st)->fsm.beside)
			continue; /* beside the readers, the writer maps copies, never the commit */
		struct renewal *x = &r[n];
		if ((e = image_committed_bufs(st, &x->bufs)) || !x->bufs.n)
			continue;
		store_get(st);
		x->st = st;
		n++;
		char err[200] = "";
		pthread_mutex_unlock(&fs->mu);
		e = vmm_renew(x->bufs.v, x->bufs.n, &x->old, err, sizeof err);
		pthread_mutex_lock(&fs->mu);
		if (e)
			why_fmt(why, whylen, e, "store %s has a writer session, and its committed allocations could not be "
				"copied away from its writer's mappings (%s): commit or abort it, then take over",
				st->name, err[0] ? err : strerror(-e));
		else
			fuse_log(FUSE_LOG_INFO, "gmsfs: %s: its writer's session ends here: its %zu committed allocations "
						"are copied away from its mappings\n", st->name, x->bufs.n);
	}
	*out = r;
	*nout = n;
	return e;
}

/* fs->mu held: the handover is done (keep: the writers' old memory goes with this
 * process) or failed (undo: the stores take their memory back). */
static void renewals_end(struct renewal *r, size_t n, bool undo)
{
	for (size_t i = 0; i < n; i++) {
		if (undo && r[i].old)
			vmm_unrenew(r[i].bufs.v, r[i].old, r[i].bufs.n);
		else
			vmm_release_all(r[i].old, r[i].old ? r[i].bufs.n : 0);
		vmm_bufs_release(&r[i].bufs);
		store_put(r[i].st, 1);
	}
	free(r);
}

static void unfreeze(struct fs *fs)
{
	pthread_mutex_lock(&fs->mu);
	fs->handing_over = false;
	atomic_store(&fs->vmm->frozen, false);
	pthread_cond_broadcast(&fs->tier_wake); /* moves asked for meanwhile */
	pthread_mutex_unlock(&fs->mu);
}

/* The images in a memfd of their own: the receiver maps it whole. */
static int images_fd(const msgpack_sbuffer *sb)
{
	int fd = memfd_create("gmsfs-handover", MFD_CLOEXEC);
	if (fd < 0)
		return -errno;
	for (size_t off = 0; off < sb->size;) {
		ssize_t n = write(fd, sb->data + off, sb->size - off);
		if (n <= 0) {
			int e = n ? -errno : -EIO;
			close(fd);
			return e;
		}
		off += (size_t)n;
	}
	return fd;
}

void handover_give(struct fs *fs, int sock, uid_t uid, const char *socket_path)
{
	char why[256] = "";
	if (uid != 0 && uid != geteuid()) {
		send_msg(sock, HO_FAIL, 0, 0, 0, NULL, 0, "a handover is for the daemon's own user or root");
		return;
	}
	set_timeout(sock, HO_TIMEOUT_S);
	uint64_t t[6] = { clock_mono_ns() }; /* asked, locked, moves over, packed, sent, mounted: the log says */
	msgpack_sbuffer sb;
	msgpack_sbuffer_init(&sb);
	struct image_fds fds = {0};
	int e = 0;
	pthread_mutex_lock(&fs->mu);
	if (fs->handing_over) {
		pthread_mutex_unlock(&fs->mu);
		send_msg(sock, HO_FAIL, 0, 0, 0, NULL, 0, "another handover is under way");
		return;
	}
	fs->handing_over = true; /* from here on nothing is committed, made, removed or moved */
	t[1] = clock_mono_ns();
	for (int tries = 0; moving(fs) && tries < 6000; tries++) {
		pthread_mutex_unlock(&fs->mu); /* a move under way ends (moves take seconds at most) */
		nanosleep(&(struct timespec){ 0, 10000000 }, NULL);
		pthread_mutex_lock(&fs->mu);
	}
	struct renewal *renewed = NULL;
	size_t nrenewed = 0;
	t[2] = clock_mono_ns();
	e = renew_sessions(fs, &renewed, &nrenewed, why, sizeof why);
	atomic_store(&fs->vmm->frozen, true); /* nor any memory made: the successor's come after the files' ends */
	size_t nstores = fs->stores->n;
	if (!e) /* -EBUSY: a move outlasted the wait above (none starts while handing over) */
		e = pack_all(fs, &sb, &fds, why, sizeof why);
	pthread_mutex_unlock(&fs->mu);
	t[3] = clock_mono_ns();
	int memfd = e ? -1 : images_fd(&sb);
	if (!e && memfd < 0)
		e = why_fmt(why, sizeof why, memfd, "a memfd for the images: %s", strerror(-memfd));
	if (!e)
		e = send_msg(sock, HO_IMAGES, nstores, sb.size, fds.n, &memfd, 1, NULL);
	if (memfd >= 0)
		close(memfd);
	for (size_t i = 0; !e && i < fds.n; i += FDPASS_MAX) {
		size_t k = fds.n - i < FDPASS_MAX ? fds.n - i : FDPASS_MAX;
		e = send_msg(sock, HO_FDS, k, 0, 0, fds.v + i, k, NULL);
	}
	msgpack_sbuffer_destroy(&sb);
	image_fds_free(&fds);
	t[4] = clock_mono_ns();
	struct ho_msg m;
	if (!e)
		e = recv_msg(sock, HO_MOUNTED, &m, NULL, 0, NULL, why, sizeof why);
	else if (why[0])
		send_msg(sock, HO_FAIL, 0, 0, 0, NULL, 0, why);
	if (e) {
		fuse_log(FUSE_LOG_WARNING, "gmsfs: handover failed (%s): serving on\n", why[0] ? why : strerror(-e));
		pthread_mutex_lock(&fs->mu);
		renewals_end(renewed, nrenewed, true); /* the writers' sessions go on with their memory */
		pthread_mutex_unlock(&fs->mu);
		unfreeze(fs);
		return;
	}
	/* The successor serves the mount point now: what still waits here opens again there. */
	t[5] = clock_mono_ns();
	wait_answer_all(fs, -ESTALE);
	fuse_log(FUSE_LOG_INFO, "gmsfs: handed %zu stores over to the next daemon in %.1f ms (the lock %.1f, moves "
				"under way %.1f, writers' sessions and images %.1f, sending %.1f, its mount %.1f); ending\n",
		 nstores, (double)(t[5] - t[0]) / 1e6, (double)(t[1] - t[0]) / 1e6, (double)(t[2] - t[1]) / 1e6,
		 (double)(t[3] - t[2]) / 1e6, (double)(t[4] - t[3]) / 1e6, (double)(t[5] - t[4]) / 1e6);
	unlink(socket_path);
	send_msg(sock, HO_BYE, 0, 0, 0, NULL, 0, NULL);
	/* Its mount is lifted already; the kernel ends the connection as this process goes.
	 * No cleanup: the memory is the successor's, and nothing else here outlives us. */
	_exit(0);
}

/* ---- the new daemon ---- */

/* The daemon serving mountpoint is the one whose socket p names: what answers on the
 * socket is that daemon's process (SO_PEERCRED), not merely someone who wrote its pid
 * in a file. */
static int same_daemon(const struct handover_peer *p, char *err, size_t errlen)
{
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	snprintf(a.sun_path, sizeof a.sun_path, "%s", p->socket);
	int s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	struct ucred cred = {0};
	socklen_t len = sizeof cred;
	int e = s < 0 || connect(s, (struct sockaddr *)&a, sizeof a) ||
			getsockopt(s, SOL_SOCKET, SO_PEERCRED, &cred, &len) ? -errno : 0;
	if (s >= 0)
		close(s);
	if (e)
		return why_fmt(err, errlen, e, "takeover: the old daemon's socket %s: %s", p->socket, strerror(-e));
	if (cred.pid != p->pid)
		return why_fmt(err, errlen, -ESRCH, "takeover: the socket %s is pid %d's, not the mount's daemon (pid %d)",
			       p->socket, (int)cred.pid, (int)p->pid);
	return 0;
}

/* The device file of the gmsfs mount on dir, read by a child given HO_READ_S: a daemon
 * stopped or stuck would hold a reader in the kernel for good (a child killed ends its
 * request, or, where the daemon read it and holds it, stays behind alone).  0 and its text; -ETIMEDOUT, -EXDEV (not that mount's file), or -errno. */
static int read_device(const char *dir, const char *path, char *text, size_t size)
{
	int fds[2];
	if (pipe2(fds, O_CLOEXEC))
		return -errno;
	pid_t pid = fork();
	if (pid == 0) {
		int null = open("/dev/null", O_RDWR | O_CLOEXEC);
		for (int i = 0; null >= 0 && i <= 2; i++)
			dup2(null, i); /* left in the kernel, it would keep the output of whoever reads ours */
		int fd = open(path, O_RDONLY | O_CLOEXEC), n;
		struct statfs fsb;
		struct stat at, top;
		char buf[4096], status = fd < 0 ? (char)errno : 0;
		if (!status && (fstatfs(fd, &fsb) || fsb.f_type != FUSE_SUPER_MAGIC || fstat(fd, &at) || stat(dir, &top) ||
				at.st_dev != top.st_dev))
			status = EXDEV;
		if (write(fds[1], &status, 1) != 1)
			_exit(1);
		while (!status && (n = (int)read(fd, buf, sizeof buf)) > 0)
			if (write(fds[1], buf, (size_t)n) != n)
				_exit(1);
		_exit(0);
	}
	close(fds[1]);
	if (pid < 0) {
		close(fds[0]);
		return -EAGAIN;
	}
	size_t got = 0;
	int e = 0;
	for (time_t end = time(NULL) + HO_READ_S;;) {
		struct pollfd p = { fds[0], POLLIN, 0 };
		int left = (int)(end - time(NULL));
		if (left <= 0 || poll(&p, 1, left * 1000) <= 0) {
			e = -ETIMEDOUT;
			break;
		}
		ssize_t n = read(fds[0], text + got, size - 1 - got);
		if (n <= 0 || (got += (size_t)n) == size - 1)
			break;
	}
	close(fds[0]);
	if (e) /* its request ends with it, unless the daemon read it and holds it: then the child
		* stays in the kernel until that daemon ends, and is not waited for */
		kill(pid, SIGKILL), waitpid(pid, NULL, WNOHANG);
	else
		waitpid(pid, NULL, 0);
	if (!e && !got)
		e = -EIO;
	if (!e && text[0])
		e = -(int)(unsigned char)text[0];
	if (!e)
		memmove(text, text + 1, got), text[got - 1] = '\0';
	return e;
}

int handover_peer(const char *mountpoint, struct handover_peer *p, char *err, size_t errlen)
{
	memset(p, 0, sizeof *p);
	p->conn = -1;
	char dir[PATH_MAX], path[PATH_MAX + 16];
	if (!realpath(mountpoint, dir))
		return why_fmt(err, errlen, -errno, "takeover: %s: %s", mountpoint, strerror(errno));
	/* What is mounted there, by the kernel's word: a copy of a mount's files (a backup,
	 * cp -r, a tmpfs) is not a daemon to take over. */
	if (!mnt_is_gmsfs(dir, p->fsname, sizeof p->fsname))
		return why_fmt(err, errlen, -ENOTCONN, "takeover: %s is not a gmsfs mount: nothing to take over (is a "
				"gmsfs daemon serving %s?)", dir, mountpoint);
	snprintf(path, sizeof path, "%s/device", dir);
	char text[8192];
	int e = read_device(dir, path, text, sizeof text);
	if (e == -ETIMEDOUT)
		return why_fmt(err, errlen, e, "takeover: the daemon serving %s does not answer within %d s (stopped, or "
				"stuck): nothing was taken over; end it (kill -9) and start gmsfs on %s again (its stores "
				"come back where a service manager keeps them: state=)", dir, HO_READ_S, dir);
	if (e == -EXDEV)
		return why_fmt(err, errlen, -ENOTCONN, "takeover: %s is not the device file of the gmsfs mount on %s", path,
			       dir);
	if (e)
		return why_fmt(err, errlen, e, "takeover: %s: %s (is a gmsfs daemon serving %s?)", path, strerror(-e),
			       mountpoint);
	if (vmm_facts_parse(text, &p->known)) /* its device's facts, for the new daemon's start */
		memset(&p->known, 0, sizeof p->known);
	for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
		char *v = strstr(line, ": ");
		if (!v)
			continue;
		*v = '\0';
		v += 2;
		struct { const char *key; char *to; size_t size; } fields[] = {
			{ "backend", p->backend, sizeof p->backend }, { "uuid", p->uuid, sizeof p->uuid },
			{ "socket", p->socket, sizeof p->socket }, { "options", p->options, sizeof p->options },
		};
		for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++)
			if (!strcmp(line, fields[i].key) && strlen(v) < fields[i].size)
				memcpy(fields[i].to, v, strlen(v) + 1);
		if (!strcmp(line, "pid"))
			p->pid = (pid_t)atoi(v);
	}
	if (!p->backend[0] || !p->uuid[0] || !p->socket[0] || p->pid <= 0)
		return why_fmt(err, errlen, -EPROTO, "takeover: %s names no socket or pid: a gmsfs too old to hand over",
			       path);
	e = same_daemon(p, err, errlen);
	/* Its device's index is as its environment showed the devices. */
	if (e || vmm_facts_env_of(p->pid, p->known.env, sizeof p->known.env))
		memset(&p->known, 0, sizeof p->known);
	return e;
}

static int connect_old(struct handover_peer *p, char *err, size_t errlen)
{
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	snprintf(a.sun_path, sizeof a.sun_path, "%s", p->socket);
	int s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (s < 0 || connect(s, (struct sockaddr *)&a, sizeof a)) {
		int e = -errno;
		if (s >= 0)
			close(s);
		return why_fmt(err, errlen, e, "takeover: the old daemon's socket %s: %s", p->socket, strerror(-e));
	}
	set_timeout(s, HO_TIMEOUT_S);
	struct gmsfs_sock_req r;
	wire_req_init(&r, GMSFS_OP_HANDOVER, NULL, 0, 0);
	if (send(s, &r, sizeof r, MSG_NOSIGNAL) != sizeof r) {
		int e = -errno;
		close(s);
		return why_fmt(err, errlen, e, "takeover: asking %s: %s", p->socket, strerror(-e));
	}
	p->conn = s;
	return 0;
}

/* The images' memfd mapped whole (read-only). */
static int map_images(int fd, uint64_t bytes, const uint8_t **out)
{
	struct stat st;
	if (fstat(fd, &st) || (uint64_t)st.st_size != bytes)
		return -EPROTO;
	if (!bytes) {
		*out = NULL;
		return 0;
	}
	void *p = mmap(NULL, bytes, PROT_READ, MAP_PRIVATE, fd, 0);
	if (p == MAP_FAILED)
		return -errno;
	*out = p;
	return 0;
}

/* The successor gives up: it says why, then waits (10 s at most) for the old daemon to
 * close the connection, which it does once it serves on (unfrozen): whoever ran the
 * refused takeover then finds the mount as it was, mkdir and commits included. */
static void refuse(int conn, const char *why)
{
	send_msg(conn, HO_FAIL, 0, 0, 0, NULL, 0, why);
	struct timeval tv = { .tv_sec = 10 };
	setsockopt(conn, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
	char c;
	while (recv(conn, &c, 1, 0) > 0)
		;
}

int handover_take(struct fs *fs, const char *mountpoint, struct handover_peer *p, char *err, size_t errlen)
{
	uint64_t t[5] = { clock_mono_ns() }; /* start, connected, images, descriptors, restored: the log says */
	int e = connect_old(p, err, errlen);
	if (e)
		return e;
	t[1] = clock_mono_ns();
	struct ho_msg m;
	int memfd = -1;
	size_t got = 0;
	if ((e = recv_msg(p->conn, HO_IMAGES, &m, &memfd, 1, &got, err, errlen)))
		return e;
	if (got != 1 || m.nfds > (1u << 24))
		return why_fmt(err, errlen, -EPROTO, "takeover: a malformed list of stores");
	int *fds = malloc((m.nfds ? m.nfds : 1) * sizeof *fds);
	size_t nfds = 0;
	const uint8_t *buf = NULL;
	uint64_t bytes = m.bytes, nstores = m.count;
	e = fds ? map_images(memfd, bytes, &buf) : -ENOMEM;
	close(memfd);
	t[2] = clock_mono_ns();
	while (!e && nfds < m.nfds) {
		struct ho_msg f;
		size_t k = 0;
		if ((e = recv_msg(p->conn, HO_FDS, &f, fds + nfds, m.nfds - nfds, &k, err, errlen)))
			break;
		nfds += k;
		if (!k || k != f.count)
			e = why_fmt(err, errlen, -EPROTO, "takeover: descriptors went missing");
	}
	size_t off = 0, base = 0, done = 0;
	t[3] = clock_mono_ns();
	pthread_mutex_lock(&fs->mu);
	for (; !e && done < nstores; done++) {
		struct wire_image h;
		char why[400] = "";
		if ((e = image_head(buf, bytes, off, &h, why, sizeof why)))
			break;
		uint64_t need = h.nfds;
		wire_image_free(&h);
		if (need > nfds - base) {
			e = -EPROTO;
			snprintf(why, sizeof why, "more descriptors than came");
			break;
		}
		struct store *st;
		if ((e = image_restore(fs, buf, bytes, &off, fds + base, need, NULL, NULL, &st, why, sizeof why))) {
			why_fmt(err, errlen, e, "takeover: %s", why);
			break;
		}
		base += need;
	}
	pthread_mutex_unlock(&fs->mu);
	if (!e && (done != nstores || off != bytes))
		e = why_fmt(err, errlen, -EPROTO, "takeover: %zu of %llu stores, %zu of %llu bytes", done,
			    (unsigned long long)nstores, off, (unsigned long long)bytes);
	for (size_t i = 0; i < nfds; i++)
		close(fds[i]); /* the backends keep their own dups */
	free(fds);
	if (buf)
		munmap((void *)buf, bytes);
	if (e && p->conn >= 0)
		refuse(p->conn, err);
	t[4] = clock_mono_ns();
	if (!e)
		fuse_log(FUSE_LOG_INFO, "gmsfs: took %llu stores over from pid %d in %.1f ms (the connect %.1f, the images "
					"%.1f, %zu descriptors %.1f, the stores %.1f)\n", (unsigned long long)nstores, (int)p->pid,
			 (double)(t[4] - t[0]) / 1e6, (double)(t[1] - t[0]) / 1e6, (double)(t[2] - t[1]) / 1e6, nfds,
			 (double)(t[3] - t[2]) / 1e6, (double)(t[4] - t[3]) / 1e6);
	return e;
}

int handover_finish(struct fs *fs, struct handover_peer *p, const char *mountpoint, bool ok, char *err, size_t errlen)
{
	int e = 0;
	if (!ok) {
		refuse(p->conn, "the new daemon could not mount");
	} else {
		/* The old mount is the top one: lifted, it uncovers this daemon's. */
		if (!p->mounted_by_libfuse && (e = mnt_lift(mountpoint)))
			fuse_log(FUSE_LOG_WARNING, "gmsfs: takeover: lifting the old mount: %s\n", strerror(-e));
		struct ho_msg m;
		if (!(e = send_msg(p->conn, HO_MOUNTED, 0, 0, 0, NULL, 0, NULL)))
			e = recv_msg(p->conn, HO_BYE, &m, NULL, 0, NULL, err, errlen);
		/* BYE comes just before it ends: its socket closing says it has. */
		char c;
		while (!e && recv(p->conn, &c, 1, 0) > 0)
			;
		/* Its writers' uncommitted allocations: their memory goes now. */
		pthread_mutex_lock(&fs->mu);
		for (size_t i = 0; !e && i < fs->stores->n; i++) {
			vmm_pool_trim(fs->stores->v[i]->pool, false);
			vmm_pool_trim(fs->stores->v[i]->pool, true);
		}
		pthread_mutex_unlock(&fs->mu);
	}
	close(p->conn);
	p->conn = -1;
	return e;
}
