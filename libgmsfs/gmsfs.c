/* libgmsfs: connections, mappings, commit, sleep and wake.  See libgmsfs(3). */
#include "internal.h"
#include "../src/grow.h"
#include "../src/meta/meta_path.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#define XATTR_TAG "user.gms.tag"
#define XATTR_ALLOC "user.gms.alloc"
#define XATTR_OFFSET "user.gms.offset"

int gm_error(gmsfs *g, int e, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(g->err, sizeof g->err, fmt, ap);
	va_end(ap);
	return e;
}

const char *gmsfs_errmsg(const gmsfs *g)
{
	return g ? g->err : "no handle";
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
	case -EPROTO: return "protocol error talking to the daemon";
	default: return strerror(err < 0 ? -err : err);
	}
}

static bool path_ok(const char *p)
{
	return p && meta_path_valid(p, strlen(p));
}

/* "allocs/" or "meta/" + rel, checked. */
static int rel_path(gmsfs *g, const char *area, const char *rel, char *out, size_t size)
{
	if (!path_ok(rel))
		return gm_error(g, -EINVAL, "%s: not a valid name (components of 1..255 bytes, no . or ..)",
				rel ? rel : "(null)");
	snprintf(out, size, "%s/%s", area, rel);
	return 0;
}

/* mkdir -p of the parents of path (relative to the store). */
static int make_parents(gmsfs *g, const char *path)
{
	char tmp[4200];
	snprintf(tmp, sizeof tmp, "%s", path);
	char *slash = strchr(tmp, '/'); /* skip allocs/ or meta/ */
	while (slash && (slash = strchr(slash + 1, '/'))) {
		*slash = '\0';
		if (mkdirat(g->dirfd, tmp, 0755) < 0 && errno != EEXIST)
			return gm_error(g, -errno, "mkdir %s: %s", tmp, strerror(errno));
		*slash = '/';
	}
	return 0;
}

static int need_lock(gmsfs *g, int want)
{
	if (!g->lock)
		return gm_error(g, -ENOLCK, "no lock: the handle is unmapped (remap_all first)");
	if (want == GMSFS_RW && g->lock != GMSFS_RW)
		return gm_error(g, -EPERM, "this handle holds a read lock: only a writer may change the store");
	return 0;
}

/* ---- connecting ---- */

static int take_lock(gmsfs *g, int mode, int timeout_ms)
{
	int fd = open(g->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		return gm_error(g, -errno, "%s: %s", g->dir, strerror(errno));
	struct gmsfs_ioc io = { .size = sizeof io, .mode = (uint32_t)mode, .timeout_ms = timeout_ms };
	if (ioctl(fd, GMSFS_IOC_LOCK, &io) < 0) {
		int e = errno;
		close(fd);
		if (e == ETIMEDOUT)
			return gm_error(g, -e, "%s: lock not granted within %d ms", g->dir, timeout_ms);
		if (e == EAGAIN)
			return gm_error(g, -e, "%s: the lock is taken", g->dir);
		if (e == ENOTTY)
			return gm_error(g, -e, "%s: not a store of a gmsfs mount", g->dir);
		return gm_error(g, -e, "%s: lock: %s", g->dir, strerror(e));
	}
	const struct gm_backend *be = io.backend == GMSFS_BACKEND_HOST ? &gm_host_backend : NULL;
#ifdef GMSFS_HAVE_CUDA
	if (io.backend == GMSFS_BACKEND_CUDA)
		be = &gm_cuda_backend;
#endif
	if (!be) {
		close(fd);
		return gm_error(g, -ENOTSUP, "%s: backend %u is not supported by this libgmsfs", g->dir, io.backend);
	}
	char why[300] = "";
	int e = be->attach(g, why, sizeof why);
	if (e) {
		close(fd);
		return gm_error(g, e, "%s: %s", g->dir, why);
	}
	g->be = be;
	g->dirfd = fd;
	g->info = io;
	g->lock = (int)io.lock;
	return 0;
}

int gmsfs_connect(gmsfs **out, const char *store_dir, int mode, int timeout_ms)
{
	*out = NULL;
	if (!store_dir || mode < GMSFS_RO || mode > GMSFS_RW_OR_RO || timeout_ms < -1)
		return -EINVAL;
	gmsfs *g = calloc(1, sizeof *g);
	if (!g || !(g->dir = strdup(store_dir))) {
		free(g);
		return -ENOMEM;
	}
	g->dirfd = -1;
	g->mode = mode;
	int e = take_lock(g, mode, timeout_ms);
	if (e) {
		/* The handle is returned anyway when it can say why: the caller disconnects it. */
		*out = g;
		return e;
	}
	*out = g;
	return 0;
}

/* ---- the name index: imports check every name, so it must not be a scan ---- */

static size_t name_hash(const char *s)
{
	uint64_t h = 1469598103934665603ull; /* FNV-1a */
	while (*s)
		h = (h ^ (unsigned char)*s++) * 1099511628211ull;
	return (size_t)h;
}

static void index_put(gmsfs *g, size_t i)
{
	size_t mask = g->index_cap - 1, k = name_hash(g->maps[i].name) & mask;
	while (g->index[k])
		k = (k + 1) & mask;
	g->index[k] = i + 1;
}

static int index_rebuild(gmsfs *g, size_t want)
{
	size_t cap = 64;
	while (cap < 2 * want)
		cap *= 2;
	size_t *v = calloc(cap, sizeof *v);
	if (!v) {
		if (g->index_cap < 2 * want)
			return -ENOMEM;
		/* Shrinking: the old table is big enough, refill it in place. */
		v = g->index;
		cap = g->index_cap;
		memset(v, 0, cap * sizeof *v);
	} else {
		free(g->index);
	}
	g->index = v;
	g->index_cap = cap;
	for (size_t i = 0; i < g->nmaps; i++)
		index_put(g, i);
	return 0;
}

static struct gmsfs_mapping *find_name(const gmsfs *g, const char *name)
{
	if (!g->index_cap)
		return NULL;
	size_t mask = g->index_cap - 1;
	for (size_t k = name_hash(name) & mask; g->index[k]; k = (k + 1) & mask)
		if (!strcmp(g->maps[g->index[k] - 1].name, name))
			return &g->maps[g->index[k] - 1];
	return NULL;
}

/* Unmap, give the range back, forget the names. */
static void release_map(gmsfs *g, size_t i)
{
	struct gmsfs_mapping *m = &g->maps[i];
	g->be->unreserve(g, m->ptr, m->aligned, g->mapped[i]);
	free((char *)m->name);
	free((char *)m->tag);
}

static void drop_map(gmsfs *g, size_t i)
{
	release_map(g, i);
	g->nmaps--;
	g->maps[i] = g->maps[g->nmaps];
	g->mapped[i] = g->mapped[g->nmaps];
	index_rebuild(g, g->nmaps); /* cannot fail: it shrinks */
}

void gmsfs_disconnect(gmsfs *g)
{
	if (!g)
		return;
	for (size_t i = 0; i < g->nmaps; i++)
		release_map(g, i);
	if (g->dirfd >= 0)
		close(g->dirfd);
#ifdef GMSFS_HAVE_CUDA
	cu_unload(&g->cu);
#endif
	free(g->maps);
	free(g->mapped);
	free(g->index);
	free(g->dir);
	free(g);
}

int gmsfs_lock_mode(const gmsfs *g)
{
	return g->lock;
}

uint64_t gmsfs_total_bytes(const gmsfs *g)
{
	uint64_t t = 0;
	for (size_t i = 0; i < g->nmaps; i++)
		t += g->maps[i].aligned;
	return t;
}

static int refresh_info(gmsfs *g)
{
	struct gmsfs_ioc io = { .size = sizeof io };
	if (g->dirfd < 0)
		return gm_error(g, -ENOLCK, "no lock: the handle is unmapped");
	if (ioctl(g->dirfd, GMSFS_IOC_INFO, &io) < 0)
		return gm_error(g, -errno, "info: %s", strerror(errno));
	g->info = io;
	g->lock = (int)io.lock;
	return 0;
}

static void hash_hex(const uint8_t h[16], char hex[33])
{
	for (int i = 0; i < 16; i++)
		snprintf(hex + 2 * i, 3, "%02x", h[i]);
}

int gmsfs_layout_hash(gmsfs *g, char hex[33])
{
	int e = refresh_info(g);
	if (e)
		return e;
	hex[0] = '\0';
	if (g->info.has_hash)
		hash_hex(g->info.layout_hash, hex);
	return 0;
}

/* ---- mappings ---- */

size_t gmsfs_mappings(const gmsfs *g, const struct gmsfs_mapping **list)
{
	*list = g->maps;
	return g->nmaps;
}

int gmsfs_find(const gmsfs *g, const char *name, struct gmsfs_mapping *out)
{
	struct gmsfs_mapping *m = find_name(g, name);
	if (!m)
		return -ENOENT;
	*out = *m;
	return 0;
}

/* Reserve and map one exported allocation; on success it joins the table. */
static int add_map(gmsfs *g, struct xp_entry *x, bool writable, void **ptr)
{
	size_t cap = g->cap;
	if (GROW(g->maps, g->nmaps, g->cap, 64))
		return gm_error(g, -ENOMEM, "out of memory");
	if (cap != g->cap) { /* mapped[] follows maps[] */
		bool *v = realloc(g->mapped, g->cap * sizeof *v);
		if (!v) {
			g->cap = cap; /* maps[] grew; the next call tries mapped[] again */
			return gm_error(g, -ENOMEM, "out of memory");
		}
		g->mapped = v;
	}
	if (2 * (g->nmaps + 1) > g->index_cap && index_rebuild(g, g->nmaps + 1))
		return gm_error(g, -ENOMEM, "out of memory");
	void *va;
	int e = g->be->reserve(g, x->aligned, &va);
	if (e)
		return gm_error(g, e, "%s: reserving %llu bytes: %s", x->path, (unsigned long long)x->aligned, strerror(-e));
	char why[256] = "";
	if ((e = g->be->map(g, va, x->aligned, x->fd, writable, why, sizeof why))) {
		g->be->unreserve(g, va, x->aligned, false);
		return gm_error(g, e, "%s: %s", x->path, why[0] ? why : strerror(-e));
	}
	g->mapped[g->nmaps] = true;
	g->maps[g->nmaps++] = (struct gmsfs_mapping){ .name = x->path, .tag = x->tag, .ptr = va, .size = x->size,
						      .aligned = x->aligned, .writable = writable };
	x->path = x->tag = NULL; /* the table owns them now */
	index_put(g, g->nmaps - 1);
	if (ptr)
		*ptr = va;
	return 0;
}

int gmsfs_create(gmsfs *g, const char *name, uint64_t size, const char *tag, void **ptr)
{
	char rel[4200];
	int e = need_lock(g, GMSFS_RW);
	if (e || (e = rel_path(g, "allocs", name, rel, sizeof rel)))
		return e;
	if (!size)
		return gm_error(g, -EINVAL, "%s: size 0", name);
	if (tag && (!*tag || strlen(tag) > 255))
		return gm_error(g, -EINVAL, "%s: a tag has 1..255 bytes", name);
	if ((e = make_parents(g, rel)))
		return e;
	int fd = openat(g->dirfd, rel, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
	if (fd < 0)
		return gm_error(g, -errno, "create %s: %s", rel, strerror(errno));
	if (ftruncate(fd, (off_t)size) < 0)
		e = gm_error(g, -errno, "%s: %llu bytes: %s", rel, (unsigned long long)size, strerror(errno));
	else if (tag && fsetxattr(fd, XATTR_TAG, tag, strlen(tag), 0) < 0)
		e = gm_error(g, -errno, "%s: tag: %s", rel, strerror(errno));
	struct xp_entry *x = NULL;
	size_t n = 0;
	if (!e)
		e = xp_fetch(g, fd, GMSFS_IOC_EXPORT, &x, &n);
	if (!e && n != 1)
		e = gm_error(g, -EPROTO, "%s: export sent %zu descriptors", rel, n);
	if (!e)
		e = add_map(g, &x[0], true, ptr);
	xp_free(x, n);
	close(fd);
	if (e)
		unlinkat(g->dirfd, rel, 0); /* nothing half made is left behind */
	return e;
}

static int import_entries(gmsfs *g, struct xp_entry *x, size_t n)
{
	bool writable = g->lock == GMSFS_RW;
	for (size_t i = 0; i < n; i++) {
		if (find_name(g, x[i].path))
			continue; /* mapped already */
		int e = add_map(g, &x[i], writable, NULL);
		if (e)
			return e;
	}
	return 0;
}

int gmsfs_import_all(gmsfs *g)
{
	int e = need_lock(g, GMSFS_RO);
	if (e)
		return e;
	struct xp_entry *x = NULL;
	size_t n = 0;
	if (!(e = xp_fetch(g, g->dirfd, GMSFS_IOC_EXPORT_ALL, &x, &n)))
		e = import_entries(g, x, n);
	xp_free(x, n);
	return e;
}

int gmsfs_import(gmsfs *g, const char *name, void **ptr)
{
	char rel[4200];
	int e = need_lock(g, GMSFS_RO);
	if (e || (e = rel_path(g, "allocs", name, rel, sizeof rel)))
		return e;
	struct gmsfs_mapping *m = find_name(g, name);
	if (m) {
		*ptr = m->ptr;
		return 0;
	}
	int fd = openat(g->dirfd, rel, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return gm_error(g, -errno, "%s: %s", rel, strerror(errno));
	struct xp_entry *x = NULL;
	size_t n = 0;
	e = xp_fetch(g, fd, GMSFS_IOC_EXPORT, &x, &n);
	if (!e && n != 1)
		e = gm_error(g, -EPROTO, "%s: export sent %zu descriptors", rel, n);
	if (!e)
		e = add_map(g, &x[0], g->lock == GMSFS_RW, ptr);
	xp_free(x, n);
	close(fd);
	return e;
}

/* ---- metadata, through the files of meta/ ---- */

static int read_all(int fd, void **out, size_t *len)
{
	size_t cap = 256, n = 0;
	char *buf = malloc(cap);
	for (;;) {
		if (!buf)
			return -ENOMEM;
		ssize_t r = read(fd, buf + n, cap - n);
		if (r < 0) {
			free(buf);
			return -errno;
		}
		if (r == 0)
			break;
		n += (size_t)r;
		if (n == cap) {
			char *b = realloc(buf, cap *= 2);
			if (!b)
				free(buf);
			buf = b;
		}
	}
	*out = buf;
	*len = n;
	return 0;
}

/* Size of allocation alloc: from the table, else from the store. */
static int alloc_size(gmsfs *g, const char *alloc, uint64_t *size)
{
	struct gmsfs_mapping *m = find_name(g, alloc);
	if (m) {
		*size = m->size;
		return 0;
	}
	char rel[4200];
	struct stat s;
	if (!path_ok(alloc))
		return -EINVAL;
	snprintf(rel, sizeof rel, "allocs/%s", alloc);
	if (fstatat(g->dirfd, rel, &s, 0) < 0)
		return -errno;
	if (!S_ISREG(s.st_mode))
		return -EISDIR;
	*size = (uint64_t)s.st_size;
	return 0;
}

int gmsfs_meta_put(gmsfs *g, const char *key, const char *alloc, uint64_t offset, const void *value, size_t len)
{
	char rel[4200];
	int e = need_lock(g, GMSFS_RW);
	if (e || (e = rel_path(g, "meta", key, rel, sizeof rel)))
		return e;
	uint64_t size = 0;
	if (!alloc || alloc_size(g, alloc, &size))
		return gm_error(g, -EINVAL, "meta %s: allocation %s does not exist", key, alloc ? alloc : "(null)");
	if (offset >= size)
		return gm_error(g, -EINVAL, "meta %s: offset %llu is outside %s (%llu bytes)", key,
				(unsigned long long)offset, alloc, (unsigned long long)size);
	if (len && !value)
		return gm_error(g, -EINVAL, "meta %s: no value", key);
	if ((e = make_parents(g, rel)))
		return e;
	int fd = openat(g->dirfd, rel, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0)
		return gm_error(g, -errno, "%s: %s", rel, strerror(errno));
	char off[24];
	snprintf(off, sizeof off, "%llu", (unsigned long long)offset);
	if (len && write(fd, value, len) != (ssize_t)len)
		e = gm_error(g, -errno, "%s: write: %s", rel, strerror(errno));
	else if (fsetxattr(fd, XATTR_ALLOC, alloc, strlen(alloc), 0) < 0 ||
		 fsetxattr(fd, XATTR_OFFSET, off, strlen(off), 0) < 0)
		e = gm_error(g, -errno, "%s: xattr: %s", rel, strerror(errno));
	close(fd);
	return e;
}

int gmsfs_meta_delete(gmsfs *g, const char *key)
{
	char rel[4200];
	int e = need_lock(g, GMSFS_RW);
	if (e || (e = rel_path(g, "meta", key, rel, sizeof rel)))
		return e;
	if (unlinkat(g->dirfd, rel, 0) < 0)
		return gm_error(g, -errno, "%s: %s", rel, strerror(errno));
	return 0;
}

int gmsfs_meta_get(gmsfs *g, const char *key, struct gmsfs_meta *out)
{
	char rel[4200], buf[4200];
	*out = (struct gmsfs_meta){0};
	int e = need_lock(g, GMSFS_RO);
	if (e || (e = rel_path(g, "meta", key, rel, sizeof rel)))
		return e;
	int fd = openat(g->dirfd, rel, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return gm_error(g, -errno, "%s: %s", rel, strerror(errno));
	if ((e = read_all(fd, &out->value, &out->value_len)))
		gm_error(g, e, "%s: read: %s", rel, strerror(-e));
	ssize_t n = e ? 0 : fgetxattr(fd, XATTR_ALLOC, buf, sizeof buf - 1);
	if (n > 0) {
		buf[n] = '\0';
		out->alloc = strdup(buf);
	}
	n = e ? 0 : fgetxattr(fd, XATTR_OFFSET, buf, sizeof buf - 1);
	if (n > 0) {
		buf[n] = '\0';
		out->offset = strtoull(buf, NULL, 10);
	}
	close(fd);
	if (e)
		gmsfs_meta_free(out);
	return e;
}

void gmsfs_meta_free(struct gmsfs_meta *m)
{
	free(m->alloc);
	free(m->value);
	*m = (struct gmsfs_meta){0};
}

struct keys {
	char **v;
	size_t n, cap;
};

static int keys_add(struct keys *k, const char *s)
{
	if (GROW(k->v, k->n, k->cap, 64))
		return -ENOMEM;
	if (!(k->v[k->n] = strdup(s)))
		return -ENOMEM;
	k->n++;
	return 0;
}

/* Walk meta/ below rel (relative to the store), collecting keys. */
static int walk_meta(gmsfs *g, const char *rel, size_t skip, const char *prefix, struct keys *k)
{
	int fd = openat(g->dirfd, rel, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	DIR *d = fdopendir(fd);
	if (!d) {
		close(fd);
		return -errno;
	}
	int e = 0;
	struct dirent *de;
	while (!e && (de = readdir(d))) {
		if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
			continue;
		char path[4200];
		snprintf(path, sizeof path, "%s/%s", rel, de->d_name);
		if (de->d_type == DT_DIR)
			e = walk_meta(g, path, skip, prefix, k);
		else if (!strncmp(path + skip, prefix, strlen(prefix)))
			e = keys_add(k, path + skip);
	}
	closedir(d);
	return e;
}

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

int gmsfs_meta_list(gmsfs *g, const char *prefix, char ***keys, size_t *count)
{
	*keys = NULL;
	*count = 0;
	int e = need_lock(g, GMSFS_RO);
	if (e)
		return e;
	struct keys k = {0};
	if ((e = walk_meta(g, "meta", strlen("meta/"), prefix ? prefix : "", &k))) {
		gmsfs_list_free(k.v, k.n);
		return gm_error(g, e, "listing meta/: %s", strerror(-e));
	}
	qsort(k.v, k.n, sizeof *k.v, cmp_str);
	*keys = k.v;
	*count = k.n;
	return 0;
}

void gmsfs_list_free(char **keys, size_t count)
{
	for (size_t i = 0; i < count; i++)
		free(keys[i]);
	free(keys);
}

/* ---- free and commit ---- */

int gmsfs_free(gmsfs *g, void *ptr)
{
	int e = need_lock(g, GMSFS_RW);
	if (e)
		return e;
	size_t i = 0;
	while (i < g->nmaps && g->maps[i].ptr != ptr)
		i++;
	if (i == g->nmaps)
		return gm_error(g, -ENOENT, "%p: not a mapping of this handle", ptr);
	const char *name = g->maps[i].name;
	/* Entries that point at it go first: a commit would refuse them. */
	char **keys;
	size_t n;
	if ((e = gmsfs_meta_list(g, "", &keys, &n)))
		return e;
	for (size_t k = 0; k < n && !e; k++) {
		/* The entry's allocation by path: no open, no read of the value. */
		char path[8400], alloc[4200];
		snprintf(path, sizeof path, "%s/meta/%s", g->dir, keys[k]);
		ssize_t len = getxattr(path, XATTR_ALLOC, alloc, sizeof alloc - 1);
		if (len > 0 && (size_t)len == strlen(name) && !memcmp(alloc, name, (size_t)len))
			e = gmsfs_meta_delete(g, keys[k]);
	}
	gmsfs_list_free(keys, n);
	if (e)
		return e;
	char rel[4200];
	snprintf(rel, sizeof rel, "allocs/%s", name);
	if (unlinkat(g->dirfd, rel, 0) < 0 && errno != ENOENT)
		return gm_error(g, -errno, "%s: %s", rel, strerror(errno));
	drop_map(g, i);
	return 0;
}

/* last_error of the store's state file, for the message of a failed commit. */
static void last_error(gmsfs *g, char *out, size_t size)
{
	out[0] = '\0';
	int fd = openat(g->dirfd, "state", O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return;
	char buf[2048];
	ssize_t n = read(fd, buf, sizeof buf - 1);
	close(fd);
	if (n <= 0)
		return;
	buf[n] = '\0';
	char *p = strstr(buf, "last_error: ");
	if (p) {
		p += strlen("last_error: ");
		snprintf(out, size, "%.*s", (int)strcspn(p, "\n"), p);
	}
}

int gmsfs_commit(gmsfs *g)
{
	int e = need_lock(g, GMSFS_RW);
	if (e)
		return e;
	int fd = openat(g->dirfd, "commit", O_WRONLY | O_TRUNC | O_CLOEXEC);
	if (fd < 0)
		return gm_error(g, -errno, "commit: %s", strerror(errno));
	if (write(fd, "1\n", 2) != 2) {
		e = -errno;
		char why[400];
		last_error(g, why, sizeof why);
		gm_error(g, e, "%s", why[0] ? why : strerror(-e));
	}
	close(fd);
	if (e)
		return e;
	/* The daemon downgraded the lock; the mappings follow. */
	for (size_t i = 0; i < g->nmaps; i++) {
		if (g->mapped[i] && g->maps[i].writable) {
			g->be->protect_ro(g, g->maps[i].ptr, g->maps[i].aligned);
			g->maps[i].writable = 0;
		}
	}
	return refresh_info(g);
}

/* ---- sleep and wake ---- */

int gmsfs_unmap_all(gmsfs *g)
{
	int e = refresh_info(g);
	if (e)
		return e;
	for (size_t i = 0; i < g->nmaps; i++) {
		struct gmsfs_mapping *m = &g->maps[i];
		if (g->mapped[i] && (e = g->be->unmap(g, m->ptr, m->aligned)))
			return gm_error(g, e, "%s: unmap: %s", m->name, strerror(-e));
		g->mapped[i] = false;
	}
	g->saved_has_hash = g->info.has_hash;
	memcpy(g->saved_hash, g->info.layout_hash, sizeof g->saved_hash);
	g->unmapped_lock = g->lock;
	close(g->dirfd); /* releases the lock (a writer that did not commit rolls back) */
	g->dirfd = -1;
	g->lock = 0;
	return 0;
}

static void unmap_mapped(gmsfs *g)
{
	for (size_t i = 0; i < g->nmaps; i++)
		if (g->mapped[i]) {
			g->be->unmap(g, g->maps[i].ptr, g->maps[i].aligned);
			g->mapped[i] = false;
		}
}

static void release_lock(gmsfs *g)
{
	close(g->dirfd);
	g->dirfd = -1;
	g->lock = 0;
}

int gmsfs_remap_all(gmsfs *g, int timeout_ms)
{
	if (g->lock)
		return gm_error(g, -EINVAL, "remap_all: the handle is mapped (unmap_all first)");
	int e = take_lock(g, g->unmapped_lock ? g->unmapped_lock : g->mode, timeout_ms);
	if (e)
		return e;
	if (g->info.has_hash != g->saved_has_hash || memcmp(g->info.layout_hash, g->saved_hash, 16)) {
		char a[33] = "", b[33] = "";
		if (g->saved_has_hash)
			hash_hex(g->saved_hash, a);
		if (g->info.has_hash)
			hash_hex(g->info.layout_hash, b);
		release_lock(g);
		return gm_error(g, -ESTALE, "remap_all: layout hash was %s, is %s now", a[0] ? a : "(none)",
				b[0] ? b : "(none)");
	}
	struct xp_entry *x = NULL;
	size_t n = 0;
	if ((e = xp_fetch(g, g->dirfd, GMSFS_IOC_EXPORT_ALL, &x, &n))) {
		release_lock(g);
		return e;
	}
	bool writable = g->lock == GMSFS_RW;
	for (size_t i = 0; i < n && !e; i++) {
		struct gmsfs_mapping *m = find_name(g, x[i].path);
		char why[256] = "";
		if (!m || m->aligned != x[i].aligned || g->mapped[m - g->maps])
			e = gm_error(g, -ESTALE, "remap_all: %s is not what was unmapped", x[i].path);
		else if ((e = g->be->map(g, m->ptr, m->aligned, x[i].fd, writable, why, sizeof why)))
			gm_error(g, e, "%s: %s", x[i].path, why[0] ? why : strerror(-e));
		else {
			g->mapped[m - g->maps] = true;
			m->writable = writable;
		}
	}
	xp_free(x, n);
	for (size_t i = 0; i < g->nmaps && !e; i++)
		if (!g->mapped[i])
			e = gm_error(g, -ESTALE, "remap_all: %s is gone", g->maps[i].name);
	if (e) {
		unmap_mapped(g);
		release_lock(g);
	}
	return e;
}

int gmsfs_reallocate_all(gmsfs *g, int timeout_ms)
{
	if (g->lock)
		return gm_error(g, -EINVAL, "reallocate_all: the handle is mapped (unmap_all first)");
	int e = take_lock(g, GMSFS_RW, timeout_ms);
	if (e)
		return e;
	for (size_t i = 0; i < g->nmaps && !e; i++) {
		struct gmsfs_mapping *m = &g->maps[i];
		char rel[4200];
		snprintf(rel, sizeof rel, "allocs/%s", m->name);
		if (unlinkat(g->dirfd, rel, 0) < 0 && errno != ENOENT) {
			e = gm_error(g, -errno, "%s: %s", rel, strerror(errno));
			break;
		}
		if ((e = make_parents(g, rel)))
			break;
		int fd = openat(g->dirfd, rel, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
		if (fd < 0) {
			e = gm_error(g, -errno, "create %s: %s", rel, strerror(errno));
			break;
		}
		struct xp_entry *x = NULL;
		size_t n = 0;
		char why[256] = "";
		if (ftruncate(fd, (off_t)m->size) < 0)
			e = gm_error(g, -errno, "%s: %s", rel, strerror(errno));
		else if (fsetxattr(fd, XATTR_TAG, m->tag, strlen(m->tag), 0) < 0)
			e = gm_error(g, -errno, "%s: tag: %s", rel, strerror(errno));
		else if (!(e = xp_fetch(g, fd, GMSFS_IOC_EXPORT, &x, &n)) && n == 1 && x[0].aligned == m->aligned) {
			if ((e = g->be->map(g, m->ptr, m->aligned, x[0].fd, true, why, sizeof why)))
				gm_error(g, e, "%s: %s", rel, why[0] ? why : strerror(-e));
			else
				g->mapped[i] = true, m->writable = 1;
		} else if (!e)
			e = gm_error(g, -EPROTO, "%s: the new allocation does not fit the old address range", rel);
		xp_free(x, n);
		close(fd);
	}
	if (e) {
		unmap_mapped(g);
		release_lock(g); /* the session rolls back */
	}
	return e;
}
