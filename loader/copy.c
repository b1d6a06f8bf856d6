/* copy: see copy.h. */
#include "copy.h"
#include "store_files.h"

#include <gmsfs/abi.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#define XXH_INLINE_ALL /* header only: the loader links nothing more */
#include <xxhash.h>

#ifdef GMSFS_HAVE_CUDA
#include "cuda_api.h"
#endif

/* Per pinned buffer.  From the page cache on the H100 host, 14 threads: 2 MiB 40-42 GB/s,
 * 1 MiB 34-37, 4 MiB 20-43, 8 MiB 24-26 (page-cache memcpy and the DMA share memory
 * bandwidth; smaller chunks stay in the caches). */
#define CP_CHUNK CP_PIECE /* a chunk is a hashed piece (copy.h) */
#define CP_PAGE 4096ull
#define CP_BUF (CP_CHUNK + 2 * CP_PAGE) /* a chunk widened to whole pages, for O_DIRECT */

struct cp_file {
	int fd;          /* through the page cache */
	int dfd;         /* O_DIRECT; -1 on the host backend or where the file system has none */
	char *map;       /* the file, mapped for mincore only (never touched); NULL with dfd -1 */
	uint64_t size;
};

struct cp_chunk {
	size_t file;
	uint64_t off, len;
	char *dst;
	uint64_t *digest; /* where its bytes' xxh3 goes, as they pass through host memory (NULL: none) */
};

struct cp {
	bool cuda;
	struct cp_file *files;  /* what cp_file opened */
	size_t nfiles, fcap;
	struct cp_chunk *q;     /* what cp_add queued */
	size_t n, cap;
	/* while cp_run runs */
	atomic_size_t next;
	atomic_uint_fast64_t done, direct;
	pthread_mutex_t mu;
	int err;
	char why[512];
#ifdef GMSFS_HAVE_CUDA
	struct cu_api cu;
	CUcontext ctx;
	char *pinned;           /* CP_THREADS x 2 x CP_BUF: allocated once, with the context */
#endif
};

#ifdef GMSFS_HAVE_CUDA
static int cu_fail(struct cp *c, char *err, size_t errlen, const char *what, CUresult r)
{
	snprintf(err, errlen, "%s: %s", what, cu_name(&c->cu, r));
	return -EIO;
}

/* The GPU whose uuid the daemon serves, its primary context current, the pinned buffers. */
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
		if ((r = c->cu.cuMemHostAlloc((void **)&c->pinned, CP_THREADS * 2 * CP_BUF, 0)))
			return cu_fail(c, err, errlen, "pinned buffers", r);
		return 0;
	}
	snprintf(err, errlen, "the store's GPU %s is not among this process's %d CUDA devices", uuid, n);
	return -ENODEV;
}
#endif

/* GMSFS_COPY_THREADS as a count of 1 to CP_THREADS, 0 when unset, -1 when it is not one. */
static int threads_asked(void)
{
	const char *s = getenv("GMSFS_COPY_THREADS");
	if (!s || !*s)
		return 0;
	char *end;
	errno = 0;
	long n = strtol(s, &end, 10);
	return errno || *end || n < 1 || n > CP_THREADS ? -1 : (int)n;
}

size_t cp_threads(void)
{
	int asked = threads_asked();
	if (asked > 0)
		return (size_t)asked;
	long cores = sysconf(_SC_NPROCESSORS_ONLN);
	return cores < 1 ? 1 : cores > CP_THREADS ? CP_THREADS : (size_t)cores;
}

int cp_open(const char *store, struct cp **out, char *err, size_t errlen)
{
	if (threads_asked() < 0) {
		snprintf(err, errlen, "GMSFS_COPY_THREADS=%s: not a count of threads from 1 to %d", getenv("GMSFS_COPY_THREADS"),
			 CP_THREADS);
		return -EINVAL;
	}
	char backend[64], uuid[128];
	struct cp *c = calloc(1, sizeof *c);
	if (!c)
		return -ENOMEM;
	int e = sf_field(store, "../device", "backend", backend, sizeof backend);
	if (!e)
		e = sf_field(store, "../device", "uuid", uuid, sizeof uuid);
	if (e) {
		if (e == -ETIMEDOUT)
			snprintf(err, errlen, "%s: its daemon does not answer within %d s (stopped, or stuck)", store,
				 SF_READ_MS / 1000);
		else
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
		if (c->pinned)
			c->cu.cuMemFreeHost(c->pinned);
		cu_unload(&c->cu);
	}
#endif
	for (size_t i = 0; i < c->nfiles; i++) {
		close(c->files[i].fd);
		if (c->files[i].dfd >= 0)
			close(c->files[i].dfd);
		if (c->files[i].map)
			munmap(c->files[i].map, c->files[i].size);
	}
	free(c->files);
	free(c->q);
	free(c);
}

int cp_file(struct cp *c, const char *path, char *err, size_t errlen)
{
	if (c->nfiles == c->fcap) {
		size_t cap = c->fcap ? 2 * c->fcap : 8;
		struct cp_file *f = realloc(c->files, cap * sizeof *f);
		if (!f) {
			snprintf(err, errlen, "out of memory");
			return -ENOMEM;
		}
		c->files = f;
		c->fcap = cap;
	}
	struct cp_file *f = &c->files[c->nfiles];
	if ((f->fd = open(path, O_RDONLY | O_CLOEXEC)) < 0) {
		int e = errno;
		snprintf(err, errlen, "%s: %s", path, strerror(e));
		return -e;
	}
	/* What the page cache lacks is read past it: a cold load does not leave a second copy
	 * of the model in host memory. */
	struct stat st;
	f->dfd = -1;
	f->map = NULL;
	f->size = 0;
	if (c->cuda && !fstat(f->fd, &st) && st.st_size > 0) {
		void *m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, f->fd, 0);
		if (m != MAP_FAILED) {
			f->map = m;
			f->size = (uint64_t)st.st_size;
			f->dfd = open(path, O_RDONLY | O_CLOEXEC | O_DIRECT);
		}
	}
	return (int)c->nfiles++;
}

uint64_t cp_direct_bytes(const struct cp *c)
{
	return atomic_load(&c->direct);
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
	struct cp_put p = { fd, off, src, len, NULL };
	return cp_save(c, &p, 1, NULL, NULL, err, errlen);
}

int cp_add(struct cp *c, int file, uint64_t off, void *dst, uint64_t len, uint64_t *digests)
{
	if (file < 0 || (size_t)file >= c->nfiles)
		return -EBADF;
	for (uint64_t at = 0; at < len; at += CP_CHUNK) {
		if (c->n == c->cap) {
			size_t cap = c->cap ? 2 * c->cap : 256;
			struct cp_chunk *q = realloc(c->q, cap * sizeof *q);
			if (!q)
				return -ENOMEM;
			c->q = q;
			c->cap = cap;
		}
		c->q[c->n++] = (struct cp_chunk){ (size_t)file, off + at, len - at < CP_CHUNK ? len - at : CP_CHUNK,
						  (char *)dst + at, digests ? &digests[at / CP_CHUNK] : NULL };
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
/* O_DIRECT from page-aligned a up to at least need, into p (page-aligned); 0 or -errno. */
static int direct_read(int dfd, char *p, uint64_t a, uint64_t need, uint64_t b)
{
	for (uint64_t done = 0; a + done < need;) {
		ssize_t r = pread(dfd, p + done, b - a - done, (off_t)(a + done));
		if (r < 0)
			return -errno;
		if (r == 0)
			return -ENODATA;
		done += (uint64_t)r;
	}
	return 0;
}

/* Whether the page cache holds every page of [off, off + len): mincore on the file's
 * mapping looks without reading (a buffered read, even with RWF_NOWAIT, starts one). */
static bool cached(const struct cp_file *f, uint64_t off, uint64_t len)
{
	unsigned char vec[CP_BUF / CP_PAGE];
	uint64_t first = off / CP_PAGE, pages = (off + len + CP_PAGE - 1) / CP_PAGE - first;
	if (!f->map || pages > sizeof vec || mincore(f->map + first * CP_PAGE, pages * CP_PAGE, vec))
		return true;
	for (uint64_t i = 0; i < pages; i++)
		if (!(vec[i] & 1))
			return false;
	return true;
}

/* A chunk into buf (CP_BUF bytes, page-aligned); *src: where its first byte landed.  From
 * the page cache when it holds the chunk; else with O_DIRECT, widened to whole pages. */
static int read_chunk(struct cp *c, const struct cp_chunk *k, char *buf, char **src, char *why, size_t whylen)
{
	const struct cp_file *f = &c->files[k->file];
	uint64_t base = k->off & ~(CP_PAGE - 1), end = k->off + k->len;
	*src = buf + (k->off - base);
	if (f->dfd >= 0 && !cached(f, k->off, k->len)) {
		int e = direct_read(f->dfd, buf, base, end, (end + CP_PAGE - 1) & ~(CP_PAGE - 1));
		if (!e) {
			atomic_fetch_add(&c->direct, k->len);
			return 0;
		}
		if (e == -ENODATA) {
			snprintf(why, whylen, "read: the file is shorter than its header says");
			return -EIO;
		}
		/* e.g. EINVAL: this file system's blocks are not page-aligned; read it as usual */
	}
	return full_pread(f->fd, *src, k->len, k->off, why, whylen);
}

/* One worker on cuda: read a chunk into one of its two pinned buffers while the other
 * buffer's copy runs on its own stream. */
static void cuda_worker(struct cp *c, size_t me)
{
	char *buf[2] = { c->pinned + (2 * me) * CP_BUF, c->pinned + (2 * me + 1) * CP_BUF };
	CUstream st[2] = { 0 };
	CUresult r = c->cu.cuCtxSetCurrent(c->ctx);
	for (int k = 0; !r && k < 2; k++)
		r = c->cu.cuStreamCreate(&st[k], CU_STREAM_NON_BLOCKING);
	if (r)
		set_error(c, -EIO, "streams: %s", cu_name(&c->cu, r));
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
		pending[b] = 0;
		char why[256], *src;
		if (read_chunk(c, k, buf[b], &src, why, sizeof why)) {
			set_error(c, -EIO, "%s", why);
			break;
		}
		if (k->digest)
			*k->digest = XXH3_64bits(src, k->len);
		if ((r = c->cu.cuMemcpyHtoDAsync((CUdeviceptr)(uintptr_t)k->dst, src, k->len, st[b]))) {
			set_error(c, -EIO, "copy to the GPU: %s", cu_name(&c->cu, r));
			break;
		}
		pending[b] = k->len;
	}
	for (int k = 0; k < 2; k++) {
		if (!st[k])
			continue;
		CUresult s2 = c->cu.cuStreamSynchronize(st[k]);
		if (s2)
			set_error(c, -EIO, "copy to the GPU: %s", cu_name(&c->cu, s2));
		else
			atomic_fetch_add(&c->done, pending[k]);
		c->cu.cuStreamDestroy(st[k]);
	}
}
#endif

struct cp_worker {
	struct cp *c;
	size_t me;
};

static void *worker(void *arg)
{
	struct cp *c = ((struct cp_worker *)arg)->c;
#ifdef GMSFS_HAVE_CUDA
	if (c->cuda) {
		cuda_worker(c, ((struct cp_worker *)arg)->me);
		return NULL;
	}
#endif
	for (;;) {
		size_t i = atomic_fetch_add(&c->next, 1);
		if (i >= c->n)
			break;
		char why[256];
		if (full_pread(c->files[c->q[i].file].fd, c->q[i].dst, c->q[i].len, c->q[i].off, why, sizeof why)) {
			set_error(c, -EIO, "%s", why);
			break;
		}
		if (c->q[i].digest)
			*c->q[i].digest = XXH3_64bits(c->q[i].dst, c->q[i].len);
		atomic_fetch_add(&c->done, c->q[i].len);
	}
	return NULL;
}

int cp_run(struct cp *c, void (*progress)(void *arg, uint64_t done), void *arg, char *err, size_t errlen)
{
	pthread_t t[CP_THREADS];
	struct cp_worker w[CP_THREADS];
	size_t nt = 0;
	atomic_store(&c->next, 0);
	atomic_store(&c->done, 0);
	pthread_mutex_init(&c->mu, NULL);
	c->err = 0;
	for (size_t most = cp_threads(); nt < most && nt < c->n; nt++)
		if (w[nt] = (struct cp_worker){ c, nt }, pthread_create(&t[nt], NULL, worker, &w[nt]))
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

/* ---- out of the store, into files: cp_save ---- */

struct cp_saver {
	struct cp *c;
	struct cp_put *v;
	size_t n;
	atomic_size_t next_file;  /* the next run of puts to one file a thread takes */
	size_t *runs, nruns;      /* where each file's run of v starts; runs[nruns] = n */
	atomic_uint_fast64_t done;
};

/* One put: its pieces out of the store (on cuda into two pinned buffers, the next piece's
 * copy running while this one is hashed and written), each hashed and written in order. */
static int put_one(struct cp_saver *s, size_t me, const struct cp_put *p, char *why, size_t whylen)
{
	struct cp *c = s->c;
	uint64_t npieces = (p->len + CP_PIECE - 1) / CP_PIECE;
	if (!c->cuda) {
		for (uint64_t k = 0; k < npieces; k++) {
			uint64_t at = k * CP_PIECE, len = p->len - at < CP_PIECE ? p->len - at : CP_PIECE;
			if (p->digests)
				p->digests[k] = XXH3_64bits((const char *)p->src + at, len);
			int e = full_pwrite(p->fd, (const char *)p->src + at, len, p->off + at, why, whylen);
			if (e)
				return e;
			atomic_fetch_add(&s->done, len);
		}
		return 0;
	}
#ifdef GMSFS_HAVE_CUDA
	char *buf[2] = { c->pinned + (2 * me) * CP_BUF, c->pinned + (2 * me + 1) * CP_BUF };
	CUstream st[2] = { 0 };
	CUresult r = c->cu.cuCtxSetCurrent(c->ctx);
	for (int b = 0; !r && b < 2; b++)
		r = c->cu.cuStreamCreate(&st[b], CU_STREAM_NON_BLOCKING);
	int e = r ? cu_fail(c, why, whylen, "streams", r) : 0;
	for (uint64_t k = 0; !e && k <= npieces; k++) {
		if (k < npieces) { /* piece k's copy starts */
			uint64_t at = k * CP_PIECE, len = p->len - at < CP_PIECE ? p->len - at : CP_PIECE;
			if ((r = c->cu.cuMemcpyDtoHAsync(buf[k & 1], (CUdeviceptr)(uintptr_t)p->src + at, len, st[k & 1])))
				e = cu_fail(c, why, whylen, "copy from the GPU", r);
		}
		if (!e && k) { /* piece k - 1, copied: hashed and written */
			uint64_t j = k - 1, at = j * CP_PIECE, len = p->len - at < CP_PIECE ? p->len - at : CP_PIECE;
			if ((r = c->cu.cuStreamSynchronize(st[j & 1])))
				e = cu_fail(c, why, whylen, "copy from the GPU", r);
			if (!e) {
				if (p->digests)
					p->digests[j] = XXH3_64bits(buf[j & 1], len);
				e = full_pwrite(p->fd, buf[j & 1], len, p->off + at, why, whylen);
				atomic_fetch_add(&s->done, len);
			}
		}
	}
	for (int b = 0; b < 2; b++)
		if (st[b]) {
			c->cu.cuStreamSynchronize(st[b]);
			c->cu.cuStreamDestroy(st[b]);
		}
	return e;
#else
	(void)me;
	return -ENOTSUP;
#endif
}

struct cp_save_worker {
	struct cp_saver *s;
	size_t me;
};

static void *save_worker(void *arg)
{
	struct cp_saver *s = ((struct cp_save_worker *)arg)->s;
	size_t me = ((struct cp_save_worker *)arg)->me;
	for (;;) {
		size_t f = atomic_fetch_add(&s->next_file, 1);
		if (f >= s->nruns)
			break;
		for (size_t i = s->runs[f]; i < s->runs[f + 1]; i++) {
			char why[512];
			int e = put_one(s, me, &s->v[i], why, sizeof why);
			if (e) {
				set_error(s->c, e, "%s", why);
				atomic_store(&s->next_file, s->nruns);
				return NULL;
			}
			if (s->c->err)
				return NULL;
		}
	}
	return NULL;
}

int cp_save(struct cp *c, struct cp_put *v, size_t n, void (*progress)(void *arg, uint64_t done), void *arg,
	    char *err, size_t errlen)
{
	struct cp_saver s = { .c = c, .v = v, .n = n };
	s.runs = calloc(n + 1, sizeof *s.runs);
	if (!s.runs)
		return snprintf(err, errlen, "out of memory"), -ENOMEM;
	for (size_t i = 0; i < n; i++)
		if (!i || v[i].fd != v[i - 1].fd)
			s.runs[s.nruns++] = i;
	s.runs[s.nruns] = n;
	pthread_mutex_init(&c->mu, NULL);
	c->err = 0;
	c->n = 0; /* set_error's stop: nothing queued for cp_run */
	pthread_t t[CP_THREADS];
	struct cp_save_worker w[CP_THREADS];
	size_t nt = 0;
	for (size_t most = cp_threads(); nt < most && nt < s.nruns; nt++)
		if (w[nt] = (struct cp_save_worker){ &s, nt }, pthread_create(&t[nt], NULL, save_worker, &w[nt]))
			break;
	if (s.nruns && !nt)
		set_error(c, -EAGAIN, "%s", "no thread to copy with");
	for (size_t i = 0; progress && i < nt;) {
		struct timespec ts = { 0, 100 * 1000 * 1000 };
		if (pthread_tryjoin_np(t[i], NULL) == 0) {
			i++;
			continue;
		}
		progress(arg, atomic_load(&s.done));
		nanosleep(&ts, NULL);
	}
	for (size_t i = progress ? nt : 0; i < nt; i++)
		pthread_join(t[i], NULL);
	if (progress)
		progress(arg, atomic_load(&s.done));
	pthread_mutex_destroy(&c->mu);
	free(s.runs);
	if (c->err)
		snprintf(err, errlen, "%s", c->why);
	return c->err;
}

#ifdef GMSFS_HAVE_CUDA
int cp_cuda(struct cp *c, struct cu_api **cu, CUcontext *ctx, char **pinned, size_t *pinned_bytes)
{
	if (!c->cuda)
		return -ENODEV;
	*cu = &c->cu, *ctx = c->ctx, *pinned = c->pinned, *pinned_bytes = CP_THREADS * 2 * CP_BUF;
	return 0;
}
#endif

int cp_enter(struct cp *c)
{
#ifdef GMSFS_HAVE_CUDA
	if (c->cuda && c->cu.cuCtxSetCurrent(c->ctx))
		return -EIO;
#endif
	return 0;
}

void cp_stage_enter(void *stage)
{
#ifdef GMSFS_HAVE_CUDA
	struct cp_stage *s = stage;
	if (s->pinned)
		s->cu->cuCtxSetCurrent(s->ctx);
#else
	(void)stage;
#endif
}

int cp_stage(struct cp *c, int backend, struct cp_stage *s, char *err, size_t errlen)
{
	*s = (struct cp_stage){ 0 };
	if (backend == GMSFS_BACKEND_HOST)
		return 0;
#ifdef GMSFS_HAVE_CUDA
	if (!cp_cuda(c, &s->cu, &s->ctx, &s->pinned, &s->room))
		return 0;
	snprintf(err, errlen, "no pinned buffer for the GPU's bytes");
	return -EIO;
#else
	snprintf(err, errlen, "a store on a GPU, and this build has no CUDA support");
	return -ENOTSUP;
#endif
}
