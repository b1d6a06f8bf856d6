/* keep: the service manager's descriptor store and the state directory (keep.h).
 *
 * Which descriptors the manager holds, and why each may not leave it yet, is a table by
 * descriptor number under keep's own mutex: a backend closes a descriptor (the closing
 * hook) from any thread, with or without fs->mu; keep never takes fs->mu under it. */
#include "keep_internal.h"
#include "grow.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

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

void keep_remove_name(struct keep *k, const char *name)
{
	char msg[96];
	snprintf(msg, sizeof msg, "FDSTOREREMOVE=1\nFDNAME=%s", name);
	notify(k, msg, NULL);
}

int keep_mark_service(struct keep *k)
{
	int fd = memfd_create(KEEP_SERVICE_NAME, MFD_CLOEXEC);
	if (fd < 0)
		return -errno;
	pthread_mutex_lock(&k->mu);
	int e = notify(k, "FDSTORE=1\nFDNAME=" KEEP_SERVICE_NAME, &fd);
	pthread_mutex_unlock(&k->mu);
	close(fd); /* the manager keeps its own */
	return e;
}

static void forget(struct keep *k, const char *name)
{
	keep_remove_name(k, name);
	k->nkept--;
}

struct kept_fd *keep_slot(struct keep *k, int fd)
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
	struct kept_fd *s = keep_slot(k, fd);
	if (!s)
		return NULL;
	if (!s->name[0]) {
		if (k->nkept + 1 >= k->max_fds) { /* one is the service's mark */
			keep_broken(k, "the service manager's descriptor store is full (fdstore=%u, the daemon's mark "
				    "included)", k->max_fds);
			return NULL;
		}
		char name[KEEP_NAME], msg[96];
		snprintf(name, sizeof name, "%s.%llu", k->prefix, (unsigned long long)++k->serial);
		snprintf(msg, sizeof msg, "FDSTORE=1\nFDNAME=%s", name);
		int e = notify(k, msg, &fd);
		if (e) {
			keep_broken(k, "the service manager (%s%s) did not take a descriptor: %s", k->addr.sun_path[0] ? "" : "@",
				    k->addr.sun_path + !k->addr.sun_path[0], strerror(-e));
			return NULL;
		}
		memcpy(s->name, name, sizeof name);
		k->nkept++;
	}
	s->stamp = k->stamp;
	return s->name;
}

/* The backends' closing hook: a descriptor that held memory is closed. */
void keep_on_close(void *arg, int fd)
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

void keep_broken(struct keep *k, const char *fmt, ...)
{
	char why[sizeof k->why];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(why, sizeof why, fmt, ap);
	va_end(ap);
	if (k->armed || strcmp(why, k->why))
		fuse_log(FUSE_LOG_ERR, "gmsfs: keep: stores are not kept across a restart: %s\n", why);
	memcpy(k->why, why, sizeof why);
	k->armed = false;
}

/* ---- images on disk ---- */

void keep_path(const struct keep *k, const char *store, const char *suffix, char *out, size_t size)
{
	snprintf(out, size, "%s/%s.image%s", k->dir, store, suffix);
}

/* DIR/NAME.readers (suffix: "" or ".new"). */
static void readers_path(const struct keep *k, const char *store, const char *suffix, char *out, size_t size)
{
	snprintf(out, size, "%s/%s.readers%s", k->dir, store, suffix);
}

/* ---- the hooks the stores call (fs->persist) ---- */

struct kept_store *keep_record(struct store *st)
{
	if (!st->kept)
		st->kept = calloc(1, sizeof(struct kept_store));
	return st->kept;
}

static int by_ref(const void *a, const void *b)
{
	const struct image_ref *x = a, *y = b;
	if (x->fd != y->fd)
		return x->fd < y->fd ? -1 : 1;
	return (x->offset > y->offset) - (x->offset < y->offset);
}

/* The image on disk names refs now (taken over, sorted). */
void keep_set_named(struct kept_store *r, struct image_ref *refs, size_t n)
{
	if (n)
		qsort(refs, n, sizeof *refs, by_ref);
	free(r->named);
	r->named = refs;
	r->nnamed = n;
}

static bool names(const struct store *st, const struct vmm_buf *b)
{
	const struct kept_store *r = st->kept;
	struct image_ref key = { b->fd, b->offset };
	return r && r->nnamed && bsearch(&key, r->named, r->nnamed, sizeof key, by_ref);
}

/* r->named and refs, sorted, each once (refs freed): what an image that may or may not
 * have landed names, beside the one before it. */
static void name_both(struct kept_store *r, struct image_ref *refs, size_t n)
{
	struct image_ref *v = malloc((r->nnamed + n) * sizeof *v + 1);
	if (!v) { /* out of memory: the new image's names, which a stuck write lands last */
		keep_set_named(r, refs, n);
		return;
	}
	if (r->nnamed)
		memcpy(v, r->named, r->nnamed * sizeof *v);
	if (n)
		memcpy(v + r->nnamed, refs, n * sizeof *v);
	size_t all = r->nnamed + n, kept = 0;
	free(refs);
	if (all)
		qsort(v, all, sizeof *v, by_ref);
	for (size_t i = 0; i < all; i++)
		if (!kept || by_ref(&v[kept - 1], &v[i]))
			v[kept++] = v[i];
	free(r->named);
	r->named = v;
	r->nnamed = kept;
}

/* st's image, written whole (by rename) with every descriptor it names in the manager's
 * store; then the memory it no longer names may go (store_changed).  The write itself is
 * keep_disk's, without keep's mutex: a disk that does not answer holds neither. */
static int save(struct store *st)
{
	struct keep *k = st->fs->keep;
	struct kept_store *r = keep_record(st);
	if (st->removed)
		return 0;
	if (!r)
		return -ENOMEM;
	msgpack_sbuffer sb;
	msgpack_sbuffer_init(&sb);
	struct image_fds fds = {0};
	char path[4096], tmp[4096];
	keep_path(k, st->name, "", path, sizeof path);
	keep_path(k, st->name, ".new", tmp, sizeof tmp);
	pthread_mutex_lock(&k->mu);
	k->stamp++;
	/* Host memory on standby only while the manager's store is less than half full: it is
	 * made again after a restart, a store's own memory is not (on cuda each is a
	 * descriptor, as many as the allocations' pieces). */
	bool standby = k->nkept < k->max_fds / 2;
	int e = image_pack(st, &sb, &fds, &(struct image_pack_opts){ .fdname = fdname, .arg = k, .standby = standby });
	for (size_t i = 0; !e && i < fds.n; i++) /* from now on it may be on disk: closed, it stays in the store */
		k->fds[fds.v[i]].owner = st;
	pthread_mutex_unlock(&k->mu);
	if (!e)
		e = keep_disk_write(k->disk, path, tmp, sb.data, sb.size);
	pthread_mutex_lock(&k->mu);
	if (!e) {
		settle(k, st, false); /* saves are one at a time (fs->mu): k->stamp is this image's */
		keep_set_named(r, fds.refs, fds.nrefs);
		fds.refs = NULL;
	} else if (e == -ETIMEDOUT) { /* it may land yet: what both images name stays */
		name_both(r, fds.refs, fds.nrefs);
		fds.refs = NULL;
	}
	if (e) {
		/* The image on disk is the last one written: a restart brings that back, and the
		 * memory it names stays until one that does not is written. */
		char why[300];
		if (e == -ETIMEDOUT)
			keep_disk_stuck(k->disk, why, sizeof why);
		else
			snprintf(why, sizeof why, "%s", e == -ENOSPC && k->why[0] ? k->why : strerror(-e));
		store_error(st, "keep: %s: %s", path, why);
		fuse_log(FUSE_LOG_WARNING, "gmsfs: %s: %s\n", st->name, st->last_error);
	}
	pthread_mutex_unlock(&k->mu);
	image_fds_free(&fds);
	msgpack_sbuffer_destroy(&sb);
	return e;
}

static int drop(struct store *st)
{
	struct keep *k = st->fs->keep;
	char path[4096];
	keep_path(k, st->name, "", path, sizeof path);
	int e = keep_disk_unlink(k->disk, path);
	if (e) {
		char why[300];
		if (e != -ETIMEDOUT || !keep_disk_stuck(k->disk, why, sizeof why))
			snprintf(why, sizeof why, "%s", strerror(-e));
		store_error(st, "keep: %s: %s: the store stays", path, why);
		return e == -ETIMEDOUT ? -EIO : e;
	}
	readers_path(k, st->name, "", path, sizeof path);
	keep_disk_unlink(k->disk, path); /* a readers file without its image names nothing */
	pthread_mutex_lock(&k->mu);
	settle(k, st, true);
	pthread_mutex_unlock(&k->mu);
	struct kept_store *r = st->kept;
	if (r)
		keep_set_named(r, NULL, 0);
	return 0;
}

static int by_pid(const void *a, const void *b)
{
	const struct wire_reader *x = a, *y = b;
	return (x->pid > y->pid) - (x->pid < y->pid);
}

/* DIR/NAME.readers: "PID START COUNT" lines (" writer" after a kept session's leader), the
 * processes that hold read locks on st,
 * written again when they change, so that the next daemon keeps their holds. */
void keep_readers_file(struct store *st, bool again)
{
	struct keep *k = st->fs->keep;
	struct kept_store *r = keep_record(st);
	struct lock_reader *v = NULL;
	size_t n = 0;
	struct wire_reader *now = NULL;
	if (!r || lock_readers(st, &v, &n) || (n && !(now = calloc(n, sizeof *now)))) {
		free(v);
		return; /* out of memory: the file says what it said */
	}
	for (size_t i = 0; i < n; i++)
		now[i] = (struct wire_reader){ (uint32_t)v[i].pid, v[i].handles + v[i].inherited, v[i].start, v[i].writer };
	free(v);
	if (n)
		qsort(now, n, sizeof *now, by_pid); /* now is NULL for none */
	if (!again && n == r->nreaders && (!n || !memcmp(now, r->readers, n * sizeof *now))) {
		free(now);
		return;
	}
	char path[4096], tmp[4096], *text = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&text, &len);
	for (size_t i = 0; f && i < n; i++)
		fprintf(f, "%u %llu %u%s\n", now[i].pid, (unsigned long long)now[i].start, now[i].count,
			now[i].writer ? " writer" : "");
	readers_path(k, st->name, "", path, sizeof path);
	readers_path(k, st->name, ".new", tmp, sizeof tmp);
	int e = !f || fclose(f) ? -ENOMEM : n ? keep_disk_write(k->disk, path, tmp, text, len) : keep_disk_unlink(k->disk, path);
	free(text);
	if (e) {
		fuse_log(FUSE_LOG_WARNING, "gmsfs: %s: keep: %s: %s\n", st->name, path,
			 e == -ETIMEDOUT ? "the state directory does not answer (written again once it does)" : strerror(-e));
		free(now);
		return;
	}
	free(r->readers);
	r->readers = now;
	r->nreaders = n;
}

void keep_readers(struct store *st)
{
	keep_readers_file(st, false);
}

static void forget_store(struct store *st)
{
	struct kept_store *r = st->kept;
	if (!r)
		return;
	free(r->named);
	free(r->readers);
	free(r);
	st->kept = NULL;
}

const struct fs_persist keep_hooks = {
	.save = save, .drop = drop, .names = names, .readers = keep_readers, .forget = forget_store,
};

/* k->mu held: whether the stores are kept now, and if not why (k->why, or the disk's;
 * why may be NULL). */
static bool armed_now(struct keep *k, char *why, size_t whylen)
{
	if (keep_disk_stuck(k->disk, why, whylen))
		return false;
	if (why)
		snprintf(why, whylen, "%s", k->why);
	return k->armed;
}

void keep_status(struct fs *fs, FILE *f)
{
	struct keep *k = fs->keep;
	if (!k)
		return;
	pthread_mutex_lock(&k->mu);
	char why[sizeof k->why + 64];
	bool armed = armed_now(k, why, sizeof why);
	fprintf(f, ",\n \"keep\": {\"armed\": %s, \"error\": \"", armed ? "true" : "false");
	for (const char *c = why; *c; c++)
		fprintf(f, *c == '"' || *c == '\\' ? "\\%c" : (unsigned char)*c < 0x20 ? "\\u%04x" : "%c", *c);
	fprintf(f, "\", \"descriptors\": %u, \"max_descriptors\": %u, \"restored\": %zu, \"failed\": [",
		k->gone ? 0 : k->nkept, k->max_fds, k->restored);
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

int keep_armed(struct fs *fs)
{
	struct keep *k = fs->keep;
	if (!k)
		return -1;
	pthread_mutex_lock(&k->mu);
	int armed = armed_now(k, NULL, 0);
	pthread_mutex_unlock(&k->mu);
	return armed;
}

void keep_free(struct fs *fs)
{
	struct keep *k = fs->keep;
	if (!k)
		return;
	pthread_mutex_lock(&fs->mu);
	fs->persist = NULL; /* what goes now goes with the daemon, not with a store */
	for (size_t i = 0; fs->stores && i < fs->stores->n; i++)
		forget_store(fs->stores->v[i]);
	for (size_t i = 0; fs->stores && i < fs->stores->nremoved; i++)
		forget_store(fs->stores->removed[i]);
	pthread_mutex_unlock(&fs->mu);
	vmm_released(fs->vmm); /* what went before goes from the manager's store too */
	fs->vmm->closing = NULL; /* what is closed now stays in the manager's store */
	fs->vmm->keep_memory = true; /* and its memory with it (writers' sessions: trimmed at the restore) */
	for (size_t i = 0; i < k->nfailed; i++) {
		free(k->failed[i].store);
		free(k->failed[i].why);
	}
	free(k->failed);
	free(k->pending);
	free(k->fds);
	fs->keep = NULL;
	if (!keep_disk_stop(k->disk))
		return; /* a write that never returned still has k (keep_watch_disk_back) */
	close(k->sock);
	pthread_mutex_destroy(&k->mu);
	free(k);
}
