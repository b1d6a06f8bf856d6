/* keep: the service manager's descriptor store and the state directory (keep.h).
 *
 * Which descriptors the manager holds, and why each may not leave it yet, is a table by
 * descriptor number under keep's own mutex: a backend closes a descriptor (the closing
 * hook) from any thread, with or without fs->mu; keep never takes fs->mu under it. */
#include "keep.h"
#include "image.h"
#include "store.h"
#include "grow.h"
#include "wire.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define KEEP_NAME 40
#define LISTEN_FDS_START 3

struct kept_fd {                /* by descriptor number */
	char name[KEEP_NAME];       /* "": not in the manager's store */
	const void *owner;          /* the store whose image on disk names it, or NULL */
	uint64_t stamp;             /* the last image write that named it */
};

struct pending {                /* closed, but an image on disk still names it */
	char name[KEEP_NAME];
	const void *owner;
};

struct failed {
	char *store, *why;
};

struct keep {
	pthread_mutex_t mu;         /* everything below */
	char dir[3584];
	unsigned max_fds, nkept;
	struct kept_fd *fds;
	size_t nfds;
	struct pending *pending;
	size_t npending, pending_cap;
	struct failed *failed;
	size_t nfailed, failed_cap;
	size_t restored;
	uint64_t serial, stamp;
	char prefix[24];            /* this daemon's names: unique across restarts */
	int sock;                   /* a datagram socket for NOTIFY_SOCKET */
	struct sockaddr_un addr;
	socklen_t alen;
};

/* ---- the manager ---- */

static int notify(struct keep *k, const char *msg, const int *fd)
{
	struct iovec iov = { (void *)msg, strlen(msg) };
	union {
		char buf[CMSG_SPACE(sizeof(int))];
		struct cmsghdr align;
	} u;
	struct msghdr m = { .msg_name = &k->addr, .msg_namelen = k->alen, .msg_iov = &iov, .msg_iovlen = 1 };
	if (fd) {
		memset(u.buf, 0, sizeof u.buf);
		m.msg_control = u.buf;
		m.msg_controllen = sizeof u.buf;
		struct cmsghdr *c = CMSG_FIRSTHDR(&m);
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(sizeof(int));
		memcpy(CMSG_DATA(c), fd, sizeof(int));
	}
	return sendmsg(k->sock, &m, MSG_NOSIGNAL) < 0 ? -errno : 0;
}

static void remove_name(struct keep *k, const char *name)
{
	char msg[96];
	snprintf(msg, sizeof msg, "FDSTOREREMOVE=1\nFDNAME=%s", name);
	notify(k, msg, NULL);
}

static void forget(struct keep *k, const char *name)
{
	remove_name(k, name);
	k->nkept--;
}

static struct kept_fd *slot(struct keep *k, int fd)
{
	if (fd < 0)
		return NULL;
	if ((size_t)fd >= k->nfds) {
		size_t n = (size_t)fd + 1 > 2 * k->nfds ? (size_t)fd + 1 : 2 * k->nfds;
		struct kept_fd *v = realloc(k->fds, n * sizeof *v);
		if (!v)
			return NULL;
		memset(v + k->nfds, 0, (n - k->nfds) * sizeof *v);
		k->fds = v, k->nfds = n;
	}
	return &k->fds[fd];
}

/* image_pack's question, k->mu held: fd's name in the manager's store, handed over now
 * if it is not there yet; NULL when the store is full. */
static const char *fdname(void *arg, int fd)
{
	struct keep *k = arg;
	struct kept_fd *s = slot(k, fd);
	if (!s)
		return NULL;
	if (!s->name[0]) {
		if (k->nkept >= k->max_fds)
			return NULL;
		char name[KEEP_NAME], msg[96];
		snprintf(name, sizeof name, "%s.%llu", k->prefix, (unsigned long long)++k->serial);
		snprintf(msg, sizeof msg, "FDSTORE=1\nFDNAME=%s", name);
		if (notify(k, msg, &fd))
			return NULL;
		memcpy(s->name, name, sizeof name);
		k->nkept++;
	}
	s->stamp = k->stamp;
	return s->name;
}

/* The backends' closing hook: a descriptor that held memory is closed. */
static void on_close(void *arg, int fd)
{
	struct keep *k = arg;
	pthread_mutex_lock(&k->mu);
	struct kept_fd *s = (size_t)fd < k->nfds ? &k->fds[fd] : NULL;
	if (s && s->name[0]) {
		if (s->owner && !GROW(k->pending, k->npending, k->pending_cap, 16)) {
			struct pending *p = &k->pending[k->npending++];
			memcpy(p->name, s->name, sizeof p->name);
			p->owner = s->owner; /* goes when that store's image no longer names it */
		} else {
			forget(k, s->name);
		}
		memset(s, 0, sizeof *s); /* the number is free for the next open */
	}
	pthread_mutex_unlock(&k->mu);
}

/* k->mu held: what owner's old image named and its new one (stamped now) does not. */
static void settle(struct keep *k, const void *owner, bool gone)
{
	for (size_t i = 0; i < k->nfds; i++)
		if (k->fds[i].owner == owner && (gone || k->fds[i].stamp != k->stamp))
			k->fds[i].owner = NULL;
	for (size_t i = 0; i < k->npending;)
		if (k->pending[i].owner == owner) {
			forget(k, k->pending[i].name);
			k->pending[i] = k->pending[--k->npending];
		} else {
			i++;
		}
}

/* ---- images on disk ---- */

static void path_of(const struct keep *k, const char *store, const char *suffix, char *out, size_t size)
{
	snprintf(out, size, "%s/%s.image%s", k->dir, store, suffix);
}

static int write_file(const char *path, const char *tmp, const void *data, size_t len)
{
	int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (fd < 0)
		return -errno;
	const char *p = data;
	while (len) {
		ssize_t n = write(fd, p, len);
		if (n <= 0) {
			int e = n ? -errno : -EIO;
			close(fd);
			unlink(tmp);
			return e;
		}
		p += n, len -= (size_t)n;
	}
	if (close(fd) || rename(tmp, path)) /* whole or not at all */
		return -errno;
	return 0;
}

void keep_store(struct store *st)
{
	struct keep *k = st->fs->keep;
	if (!k || st->removed)
		return;
	msgpack_sbuffer sb;
	msgpack_sbuffer_init(&sb);
	struct image_fds fds = {0};
	char path[4096], tmp[4096];
	path_of(k, st->name, "", path, sizeof path);
	path_of(k, st->name, ".new", tmp, sizeof tmp);
	pthread_mutex_lock(&k->mu);
	k->stamp++;
	int e = image_pack(st, &sb, &fds, fdname, k);
	if (!e)
		e = write_file(path, tmp, sb.data, sb.size);
	if (!e) {
		for (size_t i = 0; i < fds.n; i++)
			k->fds[fds.v[i]].owner = st;
		settle(k, st, false);
	}
	pthread_mutex_unlock(&k->mu);
	if (e) {
		/* The image on disk is the last one written: a restart brings that back. */
		store_error(st, "keep: %s: %s", path,
			    e == -ENOSPC ? "the service manager's descriptor store is full (fdstore=)" : strerror(-e));
		fuse_log(FUSE_LOG_WARNING, "gmsfs: %s: %s\n", st->name, st->last_error);
	}
	image_fds_free(&fds);
	msgpack_sbuffer_destroy(&sb);
}

void keep_drop(struct store *st)
{
	struct keep *k = st->fs->keep;
	if (!k)
		return;
	char path[4096];
	path_of(k, st->name, "", path, sizeof path);
	unlink(path);
	pthread_mutex_lock(&k->mu);
	settle(k, st, true);
	pthread_mutex_unlock(&k->mu);
}

void keep_status(struct fs *fs, FILE *f)
{
	struct keep *k = fs->keep;
	if (!k)
		return;
	pthread_mutex_lock(&k->mu);
	fprintf(f, ",\n \"keep\": {\"descriptors\": %u, \"max_descriptors\": %u, \"restored\": %zu, \"failed\": [",
		k->nkept, k->max_fds, k->restored);
	for (size_t i = 0; i < k->nfailed; i++) {
		fputs(i ? ", {\"store\": \"" : "{\"store\": \"", f);
		for (const char *c = k->failed[i].store; *c; c++)
			fprintf(f, *c == '"' || *c == '\\' ? "\\%c" : (unsigned char)*c < 0x20 ? "\\u%04x" : "%c", *c);
		fputs("\", \"error\": \"", f);
		for (const char *c = k->failed[i].why; *c; c++)
			fprintf(f, *c == '"' || *c == '\\' ? "\\%c" : (unsigned char)*c < 0x20 ? "\\u%04x" : "%c", *c);
		fputs("\"}", f);
	}
	fputs("]}", f);
	pthread_mutex_unlock(&k->mu);
}

/* ---- the start: what the manager passed back ---- */

struct passed {
	char **names;
	int n;
	bool *used;
};

static int passed_fd(const struct passed *p, const char *name)
{
	for (int i = 0; i < p->n; i++)
		if (p->names[i] && !strcmp(p->names[i], name))
			return LISTEN_FDS_START + i;
	return -1;
}

/* $LISTEN_FDS descriptors from 3 on, named by $LISTEN_FDNAMES, if they are this process's. */
static int listen_fds(struct passed *p)
{
	const char *pid = getenv("LISTEN_PID"), *n = getenv("LISTEN_FDS"), *names = getenv("LISTEN_FDNAMES");
	memset(p, 0, sizeof *p);
	if (!pid || !n || atol(pid) != (long)getpid() || atoi(n) <= 0)
		return 0;
	p->n = atoi(n);
	p->names = calloc((size_t)p->n, sizeof *p->names);
	p->used = calloc((size_t)p->n, sizeof *p->used);
	if (!p->names || !p->used)
		return -ENOMEM;
	const char *c = names ? names : "";
	for (int i = 0; i < p->n; i++) {
		size_t len = strcspn(c, ":");
		p->names[i] = strndup(c, len);
		c += len + (c[len] == ':');
		fcntl(LISTEN_FDS_START + i, F_SETFD, FD_CLOEXEC); /* the mover is not to inherit them */
	}
	return 0;
}

struct adopt_ctx {
	struct keep *k;
	const struct wire_image *h;
	const struct store *st;     /* the store being made: its names go if it fails */
};

/* image_restore's: the daemon's dup of descriptor index has the name the image gave it. */
static void adopted(void *arg, const struct store *st, uint64_t index, int fd)
{
	struct adopt_ctx *a = arg;
	struct kept_fd *s = slot(a->k, fd);
	if (!s || s->name[0])
		return; /* a pool's descriptor, named already */
	snprintf(s->name, sizeof s->name, "%s", a->h->fdnames[index]);
	s->owner = st;
	a->st = st;
	a->k->nkept++;
}

static void failed(struct keep *k, const char *store, const char *why)
{
	fuse_log(FUSE_LOG_ERR, "gmsfs: keep: store %s not restored: %s\n", store, why);
	if (GROW(k->failed, k->nfailed, k->failed_cap, 4))
		return;
	k->failed[k->nfailed++] = (struct failed){ strdup(store), strdup(why) };
}

static int read_file(int dirfd, const char *name, uint8_t **out, size_t *len)
{
	int fd = openat(dirfd, name, O_RDONLY | O_CLOEXEC);
	struct stat s;
	if (fd < 0 || fstat(fd, &s) || !S_ISREG(s.st_mode)) {
		int e = fd < 0 ? -errno : -EINVAL;
		if (fd >= 0)
			close(fd);
		return e;
	}
	uint8_t *b = malloc((size_t)s.st_size + 1);
	ssize_t n = b ? read(fd, b, (size_t)s.st_size) : -1;
	close(fd);
	if (n != s.st_size) {
		free(b);
		return -EIO;
	}
	*out = b;
	*len = (size_t)n;
	return 0;
}

/* One image file: its store back from the passed descriptors, or a failure named. */
static void restore_one(struct fs *fs, struct keep *k, int dirfd, const char *file, struct passed *p)
{
	uint8_t *buf = NULL;
	size_t len = 0, off = 0;
	char why[600] = "";
	struct wire_image h = {0};
	int e = read_file(dirfd, file, &buf, &len);
	if (e)
		snprintf(why, sizeof why, "%s: %s", file, strerror(-e));
	else if (!(e = image_head(buf, len, 0, &h, why, sizeof why)) && !h.fdnames)
		e = -EINVAL, snprintf(why, sizeof why, "%s: an image without descriptor names", file);
	int *fds = e ? NULL : calloc(h.nfds ? h.nfds : 1, sizeof *fds);
	for (uint64_t i = 0; !e && i < h.nfds; i++)
		if ((fds[i] = passed_fd(p, h.fdnames[i])) < 0)
			e = -EBADF, snprintf(why, sizeof why, "its memory is gone: descriptor %s was not passed back",
					     h.fdnames[i]);
	struct store *st;
	struct adopt_ctx a = { k, &h, NULL };
	if (!e && !(e = image_restore(fs, buf, len, &off, fds, h.nfds, adopted, &a, &st, why, sizeof why))) {
		for (uint64_t i = 0; i < h.nfds; i++)
			p->used[fds[i] - LISTEN_FDS_START] = true;
		k->restored++;
		vmm_pool_trim(st->pool, false); /* what a dead writer made and never committed */
		vmm_pool_trim(st->pool, true);
		fuse_log(FUSE_LOG_INFO, "gmsfs: keep: store %s restored (generation %llu)\n", st->name,
			 (unsigned long long)st->lock.fsm.generation);
	} else {
		/* Its descriptors are closed already (the store went): their names are not ours. */
		for (size_t i = 0; a.st && i < k->nfds; i++)
			if (k->fds[i].owner == a.st) {
				memset(&k->fds[i], 0, sizeof k->fds[i]);
				k->nkept--;
			}
		char name[256];
		snprintf(name, sizeof name, "%.*s", (int)(strlen(file) - 6), file);
		failed(k, h.store ? h.store : name, why);
		char was[4096], to[4096];
		path_of(k, name, "", was, sizeof was);
		path_of(k, name, ".failed", to, sizeof to);
		rename(was, to); /* kept for a look, not tried again */
	}
	free(fds);
	wire_image_free(&h);
	free(buf);
}

static int restore_all(struct fs *fs, struct keep *k)
{
	struct passed p;
	int e = listen_fds(&p);
	DIR *d = e ? NULL : opendir(k->dir);
	if (!e && !d)
		e = -errno;
	size_t stale = 0;
	pthread_mutex_lock(&fs->mu);
	for (struct dirent *de; d && (de = readdir(d));) {
		size_t n = strlen(de->d_name);
		if (n <= 6 || strcmp(de->d_name + n - 6, ".image"))
			continue;
		if (!p.n) { /* nothing passed back: the service was stopped, its memory freed */
			unlinkat(dirfd(d), de->d_name, 0);
			stale++;
			continue;
		}
		restore_one(fs, k, dirfd(d), de->d_name, &p);
	}
	pthread_mutex_unlock(&fs->mu);
	if (d)
		closedir(d);
	if (stale)
		fuse_log(FUSE_LOG_INFO, "gmsfs: keep: %zu images without descriptors (the service was stopped): "
					"removed\n", stale);
	for (int i = 0; i < p.n; i++) {
		if (!p.used[i] && p.names[i]) /* named by no image: its memory goes */
			remove_name(k, p.names[i]);
		close(LISTEN_FDS_START + i); /* the backends hold their own dups */
		free(p.names[i]);
	}
	free(p.names);
	free(p.used);
	return e;
}

/* dir and its parents (mkdir -p), mode 0700: the images are the daemon's. */
static int make_dir(char *dir)
{
	for (char *s = dir + 1;; s++) {
		if (*s && *s != '/')
			continue;
		char c = *s;
		*s = '\0';
		int e = mkdir(dir, 0700) && errno != EEXIST ? -1 : 0;
		*s = c;
		if (e || !c)
			return e;
	}
}

int keep_start(struct fs *fs, const char *dir, unsigned max_fds, char *err, size_t errlen)
{
	const char *ns = getenv("NOTIFY_SOCKET");
	size_t n = ns ? strlen(ns) : 0;
	struct keep *k = calloc(1, sizeof *k);
	if (!k)
		return -ENOMEM;
	k->addr.sun_family = AF_UNIX;
	if (!n || n >= sizeof k->addr.sun_path || (ns[0] != '/' && ns[0] != '@')) {
		free(k);
		snprintf(err, errlen, "state=%s: no service manager to keep descriptors (NOTIFY_SOCKET; systemd with "
				      "FileDescriptorStoreMax=)", dir);
		return -ENOTSUP;
	}
	memcpy(k->addr.sun_path, ns, n);
	if (ns[0] == '@')
		k->addr.sun_path[0] = '\0';
	k->alen = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n);
	snprintf(k->dir, sizeof k->dir, "%s", dir);
	k->max_fds = max_fds;
	struct timespec t;
	clock_gettime(CLOCK_REALTIME, &t);
	snprintf(k->prefix, sizeof k->prefix, "gmsfs-%llx", (unsigned long long)t.tv_sec * 1000000ull + t.tv_nsec / 1000);
	pthread_mutex_init(&k->mu, NULL);
	if ((k->sock = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0)) < 0 || make_dir(k->dir)) {
		int e = -errno;
		snprintf(err, errlen, "state=%s: %s", dir, strerror(-e));
		if (k->sock >= 0)
			close(k->sock);
		free(k);
		return e;
	}
	fs->keep = k;
	int e = restore_all(fs, k);
	if (e)
		snprintf(err, errlen, "state=%s: %s", dir, strerror(-e));
	/* From now on a memory descriptor that closes may leave the manager's store. */
	fs->vmm->closing_arg = k;
	fs->vmm->closing = on_close;
	fuse_log(FUSE_LOG_INFO, "gmsfs: keep: %zu stores restored, %zu failed; images in %s\n", k->restored,
		 k->nfailed, dir);
	return e;
}

void keep_stop(struct fs *fs)
{
	struct keep *k = fs->keep;
	if (!k)
		return;
	fs->vmm->closing = NULL; /* what is closed now stays in the manager's store */
	fs->vmm->keep_memory = true; /* and its memory with it (writers' sessions: trimmed at the restore) */
	for (size_t i = 0; i < k->nfailed; i++) {
		free(k->failed[i].store);
		free(k->failed[i].why);
	}
	free(k->failed);
	free(k->pending);
	free(k->fds);
	close(k->sock);
	pthread_mutex_destroy(&k->mu);
	free(k);
	fs->keep = NULL;
}
