/* The host backend: one memfd per store (its pool), each allocation a page-aligned
 * range of it at an offset that is never reused.  Shrinking is sealed, so nobody can
 * cut the file under a mapping; freeing punches a hole, which gives the pages back
 * to the system at once.  Descriptors stay at two per store (the memfd and one
 * read-only reopen for readers, which mmap can only map PROT_READ), whatever the
 * number of allocations. */
#include "vmm.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/falloc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

struct range {
	uint64_t off, len;
	bool host;            /* in the host tier's file */
};

struct host_pool {
	pthread_mutex_t mu;   /* the end of the file; creates run in parallel */
	struct range *adopted; /* what adopted buffers use of each file, until trim (host: tier) */
	size_t nadopted, adopted_cap;
	uint64_t adopted_size[2]; /* each file's size when adopted: what trim looks at */
	int fd;               /* the memfd, mode 0600: other users cannot reopen it writable */
	atomic_int ro_fd;     /* the readers' read-only reopen, made at the first export */
	uint64_t end;         /* bytes handed out so far: the next buffer's offset */
	int tier_fd;          /* the host tier's memfd, made at the first move out (-1: none) */
	uint64_t tier_end;
};

static int host_open(struct vmm *v, const char *device, char *err, size_t errlen)
{
	if (device && strcmp(device, "0") != 0 && strncmp(device, "host-", 5) != 0) {
		snprintf(err, errlen, "device=%s: the host backend has one device, 0 (or host-NAME: host mounts that stay "
				      "apart by that name)", device);
		return -ENODEV;
	}
	long page = sysconf(_SC_PAGESIZE), pages = sysconf(_SC_PHYS_PAGES);
	v->dev.index = v->dev.gpu = 0;
	v->dev.backend = "host";
	v->dev.granularity = page > 0 ? (uint64_t)page : 4096;
	v->dev.total_bytes = (uint64_t)pages * v->dev.granularity;
	char host[64] = "localhost";
	gethostname(host, sizeof host - 1);
	snprintf(v->dev.name, sizeof v->dev.name, "host memory (%s)", host);
	/* A stable id for this machine's memory: the machine-id where there is one. */
	char id[33] = "0";
	FILE *f = fopen("/etc/machine-id", "re");
	if (f) {
		if (fscanf(f, "%32s", id) != 1)
			strcpy(id, "0");
		fclose(f);
	}
	snprintf(v->dev.uuid, sizeof v->dev.uuid, "host-%s", id);
	if (device && !strncmp(device, "host-", 5)) /* named: several host "devices" (tests, CPU nodes) stay apart */
		snprintf(v->dev.uuid, sizeof v->dev.uuid, "%s", device);
	return 0;
}

static int host_pool_open(struct vmm_pool *p)
{
	struct host_pool *h = calloc(1, sizeof *h);
	if (!h)
		return -ENOMEM;
	h->fd = memfd_create("gmsfs", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (h->fd < 0 || fchmod(h->fd, 0600) < 0 || fcntl(h->fd, F_ADD_SEALS, F_SEAL_SHRINK) < 0) {
		int e = -errno;
		if (h->fd >= 0)
			close(h->fd);
		free(h);
		return e;
	}
	pthread_mutex_init(&h->mu, NULL);
	atomic_init(&h->ro_fd, -1);
	h->tier_fd = -1;
	p->priv = h;
	return 0;
}

static void host_pool_close(struct vmm_pool *p)
{
	struct host_pool *h = p->priv;
	int ro = atomic_load(&h->ro_fd);
	if (ro >= 0)
		close(ro);
	vmm_close_fd(p->vmm, h->fd);
	vmm_close_fd(p->vmm, h->tier_fd);
	pthread_mutex_destroy(&h->mu);
	free(h->adopted);
	free(h);
}

/* aligned bytes at the end of fd (the device's memfd, or the host tier's). */
static int range_at_end(struct host_pool *h, int fd, uint64_t *end, uint64_t aligned, struct vmm_buf **out)
{
	struct vmm_buf *b = calloc(1, sizeof *b);
	if (!b)
		return -ENOMEM;
	pthread_mutex_lock(&h->mu);
	uint64_t off = *end;
	int e = 0;
	if (off > (uint64_t)INT64_MAX - aligned)
		e = -ENOSPC;
	else if (ftruncate(fd, (off_t)(off + aligned)) < 0)
		e = errno == EFBIG || errno == EINVAL ? -ENOSPC : -errno;
	else
		*end = off + aligned;
	pthread_mutex_unlock(&h->mu);
	if (e) {
		free(b);
		return e;
	}
	b->fd = fd;
	b->offset = off;
	*out = b;
	return 0;
}

static int host_create(struct vmm_pool *p, uint64_t aligned, struct vmm_buf **out)
{
	struct host_pool *h = p->priv;
	return range_at_end(h, h->fd, &h->end, aligned, out);
}

/* The host tier of the host backend is a second memfd of the store: the same kind of
 * memory, counted apart (host_bytes), so that the tier's rules are the same on both
 * backends. */
static int host_create_host(struct vmm_pool *p, uint64_t aligned, struct vmm_buf **out)
{
	struct host_pool *h = p->priv;
	pthread_mutex_lock(&h->mu);
	if (h->tier_fd < 0)
		h->tier_fd = memfd_create("gmsfs-host-tier", MFD_CLOEXEC);
	int fd = h->tier_fd;
	pthread_mutex_unlock(&h->mu);
	if (fd < 0)
		return -errno;
	return range_at_end(h, fd, &h->tier_end, aligned, out);
}

/* The same memory file as fd?  (Two descriptors of one file, or of two.) */
static bool same_file(int a, int b)
{
	struct stat x, y;
	return a >= 0 && !fstat(a, &x) && !fstat(b, &y) && x.st_dev == y.st_dev && x.st_ino == y.st_ino;
}

/* A handed-over store's memory file (or its host tier's) becomes the pool's: the first
 * buffer adopted replaces the empty file pool_open made; the end moves past every range. */
static int host_adopt(struct vmm_pool *p, int fd, uint64_t offset, uint64_t aligned, bool host, struct vmm_buf **out)
{
	struct host_pool *h = p->priv;
	struct stat st;
	if (fstat(fd, &st) || !S_ISREG(st.st_mode) || offset > (uint64_t)st.st_size ||
	    aligned > (uint64_t)st.st_size - offset)
		return -EINVAL; /* not a memory file, or the range is not in it */
	struct vmm_buf *b = calloc(1, sizeof *b);
	if (!b)
		return -ENOMEM;
	pthread_mutex_lock(&h->mu);
	int *mine = host ? &h->tier_fd : &h->fd, e = 0;
	uint64_t *end = host ? &h->tier_end : &h->end;
	if (!same_file(*mine, fd)) {
		if (*end) {
			e = -EINVAL; /* a pool's buffers share one file */
		} else {
			int d = fcntl(fd, F_DUPFD_CLOEXEC, 3);
			if (d < 0) {
				e = -errno;
			} else {
				if (*mine >= 0)
					close(*mine); /* pool_open's empty file: no memory, never kept */
				*mine = d;
			}
		}
	}
	/* New buffers go past whatever the file held: the old daemon's too. */
	if (!e && (uint64_t)st.st_size > *end)
		*end = h->adopted_size[host] = (uint64_t)st.st_size;
	if (!e) {
		b->fd = *mine;
		b->offset = offset;
		if (h->nadopted == h->adopted_cap) {
			size_t cap = h->adopted_cap ? 2 * h->adopted_cap : 16;
			struct range *r = realloc(h->adopted, cap * sizeof *r);
			if (r)
				h->adopted = r, h->adopted_cap = cap;
		}
		if (h->nadopted < h->adopted_cap) /* else trim keeps everything: nothing is lost */
			h->adopted[h->nadopted++] = (struct range){ offset, aligned, host };
		else
			h->adopted_cap = SIZE_MAX;
	}
	pthread_mutex_unlock(&h->mu);
	if (e) {
		free(b);
		return e;
	}
	*out = b;
	return 0;
}

static int by_offset(const void *a, const void *b)
{
	const struct range *x = a, *y = b;
	return (x->off > y->off) - (x->off < y->off);
}

/* What the adopted file held besides the adopted ranges, up to its size when adopted: a
 * dead daemon's uncommitted allocations.  The file's ranges are forgotten after. */
static void host_trim(struct vmm_pool *p, bool host)
{
	struct host_pool *h = p->priv;
	pthread_mutex_lock(&h->mu);
	int fd = host ? h->tier_fd : h->fd;
	uint64_t end = h->adopted_size[host], at = 0;
	size_t kept = 0;
	if (h->nadopted && h->adopted_cap != SIZE_MAX)
		qsort(h->adopted, h->nadopted, sizeof *h->adopted, by_offset);
	for (size_t i = 0; i < h->nadopted; i++) {
		struct range r = h->adopted[i];
		if (r.host != host) {
			h->adopted[kept++] = r;
			continue;
		}
		if (fd >= 0 && end && h->adopted_cap != SIZE_MAX && r.off > at)
			fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)at, (off_t)(r.off - at));
		if (r.off + r.len > at)
			at = r.off + r.len;
	}
	if (fd >= 0 && end > at && h->adopted_cap != SIZE_MAX)
		fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)at, (off_t)(end - at));
	h->nadopted = kept;
	h->adopted_size[host] = 0;
	pthread_mutex_unlock(&h->mu);
}

/* GMSFS_SLOW_RELEASE_MS: for tests, each release takes that long (a driver's would). */
static useconds_t slow_release_us(void)
{
	static atomic_long us = -1;
	long v = atomic_load(&us);
	if (v < 0) {
		const char *s = getenv("GMSFS_SLOW_RELEASE_MS");
		long ms = s ? strtol(s, NULL, 10) : 0;
		v = ms > 0 && ms <= 10000 ? ms * 1000 : 0;
		atomic_store(&us, v);
	}
	return (useconds_t)v;
}

static void host_release(struct vmm_buf *b)
{
	if (slow_release_us())
		usleep(slow_release_us());
	/* The pages go back now; a mapping someone still holds sees zeros from here on.  At
	 * the end under a service manager, they stay: the next daemon adopts them. */
	if (!b->vmm->keep_memory)
		fallocate(b->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)b->offset, (off_t)b->size);
	free(b);
}

static int copy_range(const struct vmm_buf *s, const struct vmm_buf *d)
{
	loff_t in = (loff_t)s->offset, out = (loff_t)d->offset;
	uint64_t left = s->size;
	while (left) {
		ssize_t n = copy_file_range(s->fd, &in, d->fd, &out, left, 0);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		left -= (uint64_t)n;
	}
	/* Where the kernel cannot (EXDEV, ENOSYS), through a buffer. */
	char buf[1 << 16];
	while (left) {
		size_t k = left < sizeof buf ? left : sizeof buf;
		ssize_t n = pread(s->fd, buf, k, in);
		if (n <= 0 || pwrite(d->fd, buf, (size_t)n, out) != n)
			return n == 0 ? -EIO : -errno;
		in += n, out += n, left -= (uint64_t)n;
	}
	return 0;
}

static int host_copy(struct vmm *v, struct vmm_buf *const *src, struct vmm_buf *const *dst, size_t n, char *err,
		     size_t errlen)
{
	for (size_t i = 0; i < n; i++) {
		int e = copy_range(src[i], dst[i]);
		if (e) {
			snprintf(err, errlen, "copying to the %s tier: %s", dst[i]->host ? "host" : "device", strerror(-e));
			return e;
		}
	}
	return 0;
}

static void host_swap(struct vmm_buf *a, struct vmm_buf *b)
{
	int fd = a->fd;
	uint64_t off = a->offset;
	a->fd = b->fd, a->offset = b->offset;
	b->fd = fd, b->offset = off;
}

/* Writers get the memfd itself.  Readers share the pool's read-only reopen, made once
 * and kept: it cannot be mapped PROT_WRITE, and every later export costs no open. */
static int host_export(struct vmm_buf *b, bool read_only)
{
	struct host_pool *h = b->pool->priv;
	if (!read_only)
		return h->fd;
	int fd = atomic_load(&h->ro_fd);
	if (fd >= 0)
		return fd;
	char path[64];
	snprintf(path, sizeof path, "/proc/self/fd/%d", h->fd);
	if ((fd = open(path, O_RDONLY | O_CLOEXEC)) < 0)
		return -errno;
	int none = -1;
	if (!atomic_compare_exchange_strong(&h->ro_fd, &none, fd)) {
		close(fd); /* another export made it first */
		fd = none;
	}
	return fd;
}

static ssize_t host_pread(struct vmm_buf *b, void *dst, size_t len, uint64_t off)
{
	ssize_t n = pread(b->fd, dst, len, (off_t)(b->offset + off));
	return n < 0 ? -errno : n;
}

static ssize_t host_pwrite(struct vmm_buf *b, const void *src, size_t len, uint64_t off)
{
	ssize_t n = pwrite(b->fd, src, len, (off_t)(b->offset + off));
	return n < 0 ? -errno : n;
}

const struct vmm_ops vmm_host_ops = {
	.name = "host",
	.open = host_open,
	.pool_open = host_pool_open,
	.pool_close = host_pool_close,
	.create = host_create,
	.release = host_release,
	.export_fd = host_export,
	.pread = host_pread,
	.pwrite = host_pwrite,
	.create_host = host_create_host,
	.copy = host_copy,
	.swap = host_swap,
	.adopt = host_adopt,
	.trim = host_trim,
};
