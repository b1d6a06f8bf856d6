/* copy: see copy.h. */
#include "copy.h"
#include "store_files.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifdef GMSFS_HAVE_CUDA
#include "cuda_api.h"
#endif

#define CP_CHUNK (4ull << 20) /* per pinned buffer: pinning costs by the byte; 4 MiB still fills a copy engine */
#define CP_THREADS 14

struct cp_chunk {
	int fd;
	uint64_t off, len;
	char *dst;
};

struct cp {
	bool cuda;
	struct cp_chunk *q;     /* what cp_add queued */
	size_t n, cap;
	/* while cp_run runs */
	atomic_size_t next;
	atomic_uint_fast64_t done;
	pthread_mutex_t mu;
	int err;
	char why[512];
#ifdef GMSFS_HAVE_CUDA
	struct cu_api cu;
	CUcontext ctx;
	void *buf[2];           /* cp_store_to_file's */
	CUstream stream[2];
#endif
};

#ifdef GMSFS_HAVE_CUDA
static int cu_fail(struct cp *c, char *err, size_t errlen, const char *what, CUresult r)
{
	snprintf(err, errlen, "%s: %s", what, cu_name(&c->cu, r));
	return -EIO;
}

/* The GPU whose uuid the daemon serves, its primary context current, two pinned buffers. */
static int cuda_open(struct cp *c, const char *uuid, char *err, size_t errlen)
{
	if (cu_load(&c->cu, err, errlen))
		return -ENOTSUP;
	CUresult r = c->cu.cuInit(0);
	int n = 0;
	if (r || (r = c->cu.cuDeviceGetCount(&n)))
		return cu_fail(c, err, errlen, "cuInit", r);
	for (int i = 0; i < n; i++) {
		CUdevice d;
		CUuuid u;
		char s[48];
		if (c->cu.cuDeviceGet(&d, i) || c->cu.cuDeviceGetUuid(&u, d))
			continue;
		const unsigned char *b = (const unsigned char *)u.bytes;
		snprintf(s, sizeof s, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1],
			 b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
		if (strcmp(s, uuid))
			continue;
		if ((r = c->cu.cuDevicePrimaryCtxRetain(&c->ctx, d)) || (r = c->cu.cuCtxSetCurrent(c->ctx)))
			return cu_fail(c, err, errlen, "the GPU's context", r);
		return 0;
	}
	snprintf(err, errlen, "the store's GPU %s is not among this process's %d CUDA devices", uuid, n);
	return -ENODEV;
}
#endif

int cp_open(const char *store, struct cp **out, char *err, size_t errlen)
{
	char backend[64], uuid[128];
	struct cp *c = calloc(1, sizeof *c);
	if (!c)
		return -ENOMEM;
	int e = sf_field(store, "../device", "backend", backend, sizeof backend);
	if (!e)
		e = sf_field(store, "../device", "uuid", uuid, sizeof uuid);
	if (e) {
		snprintf(err, errlen, "%s: not a store of a gmsfs mount (no ../device)", store);
		free(c);
		return e;
	}
	c->cuda = !strcmp(backend, "cuda");
	if (c->cuda) {
#ifdef GMSFS_HAVE_CUDA
		e = cuda_open(c, uuid, err, errlen);
#else
		snprintf(err, errlen, "%s is in GPU memory and this build has no CUDA support", store);
		e = -ENOTSUP;
#endif
	}
	if (e) {
		cp_close(c);
		return e;
	}
	*out = c;
	return 0;
}

void cp_close(struct cp *c)
{
	if (!c)
		return;
#ifdef GMSFS_HAVE_CUDA
	if (c->cu.lib) {
		for (int k = 0; k < 2; k++) {
			if (c->stream[k])
				c->cu.cuStreamDestroy(c->stream[k]);
			if (c->buf[k])
				c->cu.cuMemFreeHost(c->buf[k]);
		}
		cu_unload(&c->cu);
	}
#endif
	free(c->q);
	free(c);
}

static int full_pread(int fd, void *p, uint64_t len, uint64_t off, char *err, size_t errlen)
{
	for (uint64_t done = 0; done < len;) {
		ssize_t r = pread(fd, (char *)p + done, len - done, (off_t)(off + done));
		if (r <= 0) {
			snprintf(err, errlen, "read: %s", r ? strerror(errno) : "the file is shorter than its header says");
			return r ? -errno : -EIO;
		}
		done += (uint64_t)r;
	}
	return 0;
}

static int full_pwrite(int fd, const void *p, uint64_t len, uint64_t off, char *err, size_t errlen)
{
	for (uint64_t done = 0; done < len;) {
		ssize_t r = pwrite(fd, (const char *)p + done, len - done, (off_t)(off + done));
		if (r < 0) {
			snprintf(err, errlen, "write: %s", strerror(errno));
			return -errno;
		}
		done += (uint64_t)r;
	}
	return 0;
}

int cp_store_to_file(struct cp *c, const void *src, uint64_t len, int fd, uint64_t off, char *err, size_t errlen)
{
	if (!c->cuda)
		return full_pwrite(fd, src, len, off, err, errlen);
#ifdef GMSFS_HAVE_CUDA
	CUresult r0 = CUDA_SUCCESS;
	if (!c->buf[0] && ((r0 = c->cu.cuMemHostAlloc(&c->buf[0], CP_CHUNK, 0)) ||
			   (r0 = c->cu.cuStreamCreate(&c->stream[0], CU_STREAM_NON_BLOCKING))))
		return cu_fail(c, err, errlen, "a pinned buffer", r0);
	for (uint64_t done = 0; done < len;) {
		uint64_t n = len - done < CP_CHUNK ? len - done : CP_CHUNK;
		CUresult r = c->cu.cuMemcpyDtoHAsync(c->buf[0], (CUdeviceptr)(uintptr_t)src + done, n, c->stream[0]);
		if (r || (r = c->cu.cuStreamSynchronize(c->stream[0])))
			return cu_fail(c, err, errlen, "copy from the GPU", r);
		int e = full_pwrite(fd, c->buf[0], n, off + done, err, errlen);
		if (e)
			return e;
		done += n;
	}
#endif
	return 0;
}

int cp_add(struct cp *c, int fd, uint64_t off, void *dst, uint64_t len)
{
	for (uint64_t at = 0; at < len; at += CP_CHUNK) {
		if (c->n == c->cap) {
			size_t cap = c->cap ? 2 * c->cap : 256;
			struct cp_chunk *q = realloc(c->q, cap * sizeof *q);
			if (!q)
				return -ENOMEM;
			c->q = q;
			c->cap = cap;
		}
		c->q[c->n++] = (struct cp_chunk){ fd, off + at, len - at < CP_CHUNK ? len - at : CP_CHUNK, (char *)dst + at };
	}
	return 0;
}

static void set_error(struct cp *c, int e, const char *fmt, const char *what)
{
	pthread_mutex_lock(&c->mu);
	if (!c->err) {
		c->err = e;
		snprintf(c->why, sizeof c->why, fmt, what);
	}
	pthread_mutex_unlock(&c->mu);
	atomic_store(&c->next, c->n); /* the others stop at their next chunk */
}

#ifdef GMSFS_HAVE_CUDA
/* One worker on cuda: read a chunk into a pinned buffer while the other buffer's copy runs. */
static void cuda_worker(struct cp *c)
{
	void *buf[2] = { 0 };
	CUstream st[2] = { 0 };
	CUresult r = c->cu.cuCtxSetCurrent(c->ctx);
	for (int k = 0; !r && k < 2; k++)
		if (!(r = c->cu.cuMemHostAlloc(&buf[k], CP_CHUNK, 0)))
			r = c->cu.cuStreamCreate(&st[k], CU_STREAM_NON_BLOCKING);
	if (r)
		set_error(c, -EIO, "pinned buffers: %s", cu_name(&c->cu, r));
	uint64_t pending[2] = { 0 };
	for (int b = 0;; b ^= 1) {
		size_t i = atomic_fetch_add(&c->next, 1);
		if (r || i >= c->n)
			break;
		const struct cp_chunk *k = &c->q[i];
		if ((r = c->cu.cuStreamSynchronize(st[b]))) { /* this buffer's last copy is done */
			set_error(c, -EIO, "copy to the GPU: %s", cu_name(&c->cu, r));
			break;
		}
		atomic_fetch_add(&c->done, pending[b]);
		char why[256];
		if (full_pread(k->fd, buf[b], k->len, k->off, why, sizeof why)) {
			set_error(c, -EIO, "%s", why);
			break;
		}
		if ((r = c->cu.cuMemcpyHtoDAsync((CUdeviceptr)(uintptr_t)k->dst, buf[b], k->len, st[b]))) {
			set_error(c, -EIO, "copy to the GPU: %s", cu_name(&c->cu, r));
			break;
		}
		pending[b] = k->len;
	}
	for (int k = 0; k < 2; k++) {
		if (st[k]) {
			CUresult s2 = c->cu.cuStreamSynchronize(st[k]);
			if (s2)
				set_error(c, -EIO, "copy to the GPU: %s", cu_name(&c->cu, s2));
			else
				atomic_fetch_add(&c->done, pending[k]);
			c->cu.cuStreamDestroy(st[k]);
		}
		if (buf[k])
			c->cu.cuMemFreeHost(buf[k]);
	}
}
#endif

static void *worker(void *arg)
{
	struct cp *c = arg;
#ifdef GMSFS_HAVE_CUDA
	if (c->cuda) {
		cuda_worker(c);
		return NULL;
	}
#endif
	for (;;) {
		size_t i = atomic_fetch_add(&c->next, 1);
		if (i >= c->n)
			break;
		char why[256];
		if (full_pread(c->q[i].fd, c->q[i].dst, c->q[i].len, c->q[i].off, why, sizeof why)) {
			set_error(c, -EIO, "%s", why);
			break;
		}
		atomic_fetch_add(&c->done, c->q[i].len);
	}
	return NULL;
}

int cp_run(struct cp *c, void (*progress)(void *arg, uint64_t done), void *arg, char *err, size_t errlen)
{
	pthread_t t[CP_THREADS];
	size_t nt = 0;
	atomic_store(&c->next, 0);
	atomic_store(&c->done, 0);
	pthread_mutex_init(&c->mu, NULL);
	c->err = 0;
	for (; nt < CP_THREADS && nt < c->n; nt++)
		if (pthread_create(&t[nt], NULL, worker, c))
			break;
	if (c->n && !nt)
		set_error(c, -EAGAIN, "%s", "no thread to copy with");
	for (size_t i = 0; progress && i < nt;) { /* progress while they work */
		struct timespec ts = { 0, 100 * 1000 * 1000 };
		if (pthread_tryjoin_np(t[i], NULL) == 0) {
			i++;
			continue;
		}
		progress(arg, atomic_load(&c->done));
		nanosleep(&ts, NULL);
	}
	for (size_t i = progress ? nt : 0; i < nt; i++)
		pthread_join(t[i], NULL);
	if (progress)
		progress(arg, atomic_load(&c->done));
	pthread_mutex_destroy(&c->mu);
	c->n = 0;
	if (c->err)
		snprintf(err, errlen, "%s", c->why);
	return c->err;
}
