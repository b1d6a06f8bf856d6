/* keep_start: the start of a daemon under a service manager (keep.h): the stores whose
 * memory the manager passed back are rebuilt from their images, with their readers; then
 * the stores keep what a restart needs through keep.c's hooks, and keep_watch.c watches
 * the manager; and the stop. */
#include "keep_internal.h"
#include "fdpass.h"
#include "grow.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

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
	struct kept_fd *s = keep_slot(a->k, fd);
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

/* The memory a restored store's image names: its allocations' (the layout is the
 * image's) and what they have on standby. */
static int add_ref(struct meta_node *n, void *arg)
{
	struct image_fds *f = arg;
	if (n->kind != META_ALLOC || !n->buf)
		return 0;
	for (size_t i = 0; i < vmm_npieces(n->buf); i++) {
		const struct vmm_buf *b = vmm_piece(n->buf, i);
		if (GROW(f->refs, f->nrefs, f->refs_cap, 64))
			return -ENOMEM;
		f->refs[f->nrefs++] = (struct image_ref){ b->fd, b->offset };
		if (b->standby) { /* the host memory made ahead, named too */
			if (GROW(f->refs, f->nrefs, f->refs_cap, 64))
				return -ENOMEM;
			f->refs[f->nrefs++] = (struct image_ref){ b->standby->fd, b->standby->offset };
		}
	}
	return 0;
}

/* NAME.readers, if there: the processes that held read locks when the daemon before
 * this one last said, kept for those still running (lock_inherit). */
static void inherit_readers(struct keep *k, int dirfd, const char *name, struct store *st)
{
	char file[300];
	uint8_t *buf = NULL;
	size_t len = 0;
	snprintf(file, sizeof file, "%s.readers", name);
	if (read_file(dirfd, file, &buf, &len))
		return;
	buf[len] = '\0';
	size_t n = 0, bad = 0;
	struct lock_reader *v = calloc(len / 6 + 1, sizeof *v); /* "1 1 1\n" is the shortest line */
	for (char *line = (char *)buf, *next; v && line && *line; line = next) {
		next = strchr(line, '\n');
		if (next)
			*next++ = '\0';
		unsigned pid, count;
		unsigned long long start;
		char end, word[8] = "";
		int got = sscanf(line, "%u %llu %u %7s%c", &pid, &start, &count, word, &end);
		if ((got != 3 && (got != 4 || strcmp(word, "writer"))) || !pid || pid > INT32_MAX || !count)
			bad++;
		else
			v[n++] = (struct lock_reader){ .pid = (pid_t)pid, .start = start, .handles = count, .writer = got == 4 };
	}
	if (bad)
		fuse_log(FUSE_LOG_WARNING, "gmsfs: keep: %s: %zu malformed lines ignored\n", file, bad);
	lock_inherit(st, v, n);
	free(v);
	free(buf);
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
		struct kept_store *r = keep_record(st);
		struct image_fds named = {0};
		if (r && st->meta && !meta_walk(meta_root(st->meta, META_AREA_ALLOCS), add_ref, &named)) {
			keep_set_named(r, named.refs, named.nrefs);
			named.refs = NULL;
		}
		image_fds_free(&named);
		char name[256];
		snprintf(name, sizeof name, "%.*s", (int)(strlen(file) - 6), file);
		inherit_readers(k, dirfd, name, st);
		fuse_log(FUSE_LOG_INFO, "gmsfs: keep: store %s restored (generation %llu)\n", st->name,
			 (unsigned long long)store_lock(st)->fsm.generation);
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
		keep_path(k, name, "", was, sizeof was);
		keep_path(k, name, ".failed", to, sizeof to);
		rename(was, to); /* kept for a look, not tried again */
		/* Its readers (a reader still listed when the daemon before died) read no store now. */
		snprintf(was, sizeof was, "%s.readers", name);
		unlinkat(dirfd, was, 0);
	}
	free(fds);
	wire_image_free(&h);
	free(buf);
}

/* *marked: the service's mark came back (it was not stopped). */
static int restore_all(struct fs *fs, struct keep *k, bool *marked)
{
	struct passed p;
	int e = listen_fds(&p);
	int mark = e ? -1 : passed_fd(&p, KEEP_SERVICE_NAME);
	if ((*marked = mark >= 0))
		p.used[mark - LISTEN_FDS_START] = true;
	DIR *d = e ? NULL : opendir(k->dir);
	if (!e && !d)
		e = -errno;
	size_t stale = 0;
	pthread_mutex_lock(&fs->mu);
	for (struct dirent *de; d && (de = readdir(d));) {
		size_t n = strlen(de->d_name);
		if (n <= 6 || strcmp(de->d_name + n - 6, ".image"))
			continue;
		if (!p.n) { /* nothing passed back, not even the mark: the service was stopped */
			char readers[300];
			snprintf(readers, sizeof readers, "%.*s.readers", (int)(n - 6), de->d_name);
			unlinkat(dirfd(d), readers, 0);
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
			keep_remove_name(k, p.names[i]);
		close(LISTEN_FDS_START + i); /* the backends hold their own dups */
		free(p.names[i]);
	}
	free(p.names);
	free(p.used);
	return e;
}

/* The service's mark among $LISTEN_FDNAMES, passed to this process. */
static bool mark_passed(void)
{
	const char *pid = getenv("LISTEN_PID"), *names = getenv("LISTEN_FDNAMES");
	if (!pid || !names || atol(pid) != (long)getpid())
		return false;
	size_t n = strlen(KEEP_SERVICE_NAME);
	for (const char *c = names; *c; c += strcspn(c, ":"), c += *c == ':')
		if (!strncmp(c, KEEP_SERVICE_NAME, n) && (c[n] == ':' || !c[n]))
			return true;
	return false;
}

int keep_device_facts(const char *dir, struct vmm_known *k)
{
	char path[4096];
	if (!mark_passed() || snprintf(path, sizeof path, "%s/device", dir) >= (int)sizeof path)
		return -ENOENT;
	int e = vmm_facts_read(path, k);
	if (e && e != -ENOENT)
		fuse_log(FUSE_LOG_WARNING, "gmsfs: keep: %s: %s: the device is opened before the daemon serves\n", path,
			 e == -EINVAL ? "not a cuda device's facts, or one fails its check" : strerror(-e));
	return e;
}

void keep_device_remember(const char *dir, const struct vmm *v)
{
	char path[4096];
	if (snprintf(path, sizeof path, "%s/device", dir) >= (int)sizeof path)
		return;
	int e = strcmp(v->dev.backend, "cuda") ? (unlink(path) && errno != ENOENT ? -errno : 0)
					       : vmm_facts_write(path, v);
	if (e)
		fuse_log(FUSE_LOG_WARNING, "gmsfs: keep: %s: %s (the next start opens the device before it serves)\n",
			 path, strerror(-e));
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

void keep_stop(struct fs *fs)
{
	keep_watch_stop(fs);
	keep_free(fs);
}

int keep_start(struct fs *fs, const char *dir, unsigned max_fds, char *err, size_t errlen)
{
	struct keep *k = calloc(1, sizeof *k);
	if (!k)
		return -ENOMEM;
	if (!(k->alen = fdpass_notify_addr(&k->addr))) {
		free(k);
		snprintf(err, errlen, "state=%s: no service manager to keep descriptors (NOTIFY_SOCKET; systemd with "
				      "FileDescriptorStoreMax=)", dir);
		return -ENOTSUP;
	}
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
	struct timeval send_max = { 2, 0 }; /* a manager that stopped reading holds no commit up for good */
	setsockopt(k->sock, SOL_SOCKET, SO_SNDTIMEO, &send_max, sizeof send_max);
	k->armed = true;
	fs->keep = k;
	bool marked = false;
	int e = restore_all(fs, k, &marked);
	if (e)
		snprintf(err, errlen, "state=%s: %s", dir, strerror(-e));
	int me = marked ? 0 : keep_mark_service(k);
	if (me)
		fuse_log(FUSE_LOG_WARNING, "gmsfs: keep: the service's mark was not taken (%s): a crash while no store "
					   "holds memory will read as a stop, and the empty stores go\n", strerror(-me));
	/* From now on a memory descriptor that closes may leave the manager's store, and
	 * the stores write what a restart needs. */
	if (!(k->disk = keep_disk_start(keep_watch_disk_back, k))) {
		snprintf(err, errlen, "state=%s: no thread to write it", dir);
		return -ENOMEM;
	}
	fs->vmm->closing_arg = k;
	fs->vmm->closing = keep_on_close;
	pthread_mutex_lock(&fs->mu);
	fs->persist = &keep_hooks;
	for (size_t i = 0; i < fs->stores->n; i++)
		keep_readers(fs->stores->v[i]); /* the readers files say who still reads */
	pthread_mutex_unlock(&fs->mu);
	fuse_log(FUSE_LOG_INFO, "gmsfs: keep: %zu stores restored, %zu failed; images in %s\n", k->restored,
		 k->nfailed, dir);
	if (!e && (e = keep_watch_start(fs)))
		snprintf(err, errlen, "state=%s: no thread to watch the service manager: %s", dir, strerror(-e));
	return e;
}

