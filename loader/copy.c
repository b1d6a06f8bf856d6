/* copy: see copy.h. */
#include "copy.h"
#include "piece_hash.h"
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

#ifdef GMSFS_HAVE_CUDA
#include "copy_cuda.h"

int cp_cu_fail(struct cp *c, char *err, size_t errlen, const char *what, CUresult r)
{
	snprintf(err, errlen, "%s: %s", what, cu_name(&c->cu, r));
	return -EIO;
}

/* Each worker's own, made by it as it starts (copy_cuda.h says why). */
char *cp_thread_buffers(struct cp *c, size_t me, char *err, size_t errlen)
{
	if (!c->tbuf[me])
		c->tbuf[me] = cpc_pinned(&c->cu, 2 * CP_BUF, err, errlen);
	return c->tbuf[me];
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
		e = cpc_open(&c->cu, uuid, &c->ctx, err, errlen);
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
		for (size_t i = 0; i < CP_THREADS; i++)
			if (c->tbuf[i])
				cpc_unpin(&c->cu, c->ctx, c->tbuf[i], 2 * CP_BUF);
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
	free(c->parts);
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

int cp_full_pwrite(int fd, const void *p, uint64_t len, uint64_t off, char *err, size_t errlen)
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

/* Room for one more chunk in the queue: 0 or -ENOMEM. */
static int queue_room(struct cp *c)
{
	if (c->n < c->cap)
		return 0;
	size_t cap = c->cap ? 2 * c->cap : 256;
	struct cp_chunk *q = realloc(c->q, cap * sizeof *q);
	if (!q)
		return -ENOMEM;
	c->q = q;
	c->cap = cap;
	return 0;
}

int cp_add(struct cp *c, int file, uint64_t off, void *dst, uint64_t len, uint64_t *digests)
{
	if (file < 0 || (size_t)file >= c->nfiles)
		return -EBADF;
	for (uint64_t at = 0; at < len; at += CP_CHUNK) {
		if (queue_room(c))
			return -ENOMEM;
		c->q[c->n++] = (struct cp_chunk){ .file = (size_t)file, .off = off + at,
						  .len = len - at < CP_CHUNK ? len - at : CP_CHUNK, .dst = (char *)dst + at,
						  .digest = digests ? &digests[at / CP_CHUNK] : NULL };
	}
	return 0;
}

int cp_add_piece(struct cp *c, void *dst, uint64_t len, const struct cp_part *parts, size_t n, uint64_t *digest)
{
	if (!len || len > CP_PIECE)
		return -EINVAL;
	for (size_t i = 0; i < n; i++)
		if (parts[i].file < 0 || (size_t)parts[i].file >= c->nfiles)
			return -EBADF;
		else if (!parts[i].len || parts[i].at + parts[i].len > len ||
			 (i && parts[i].at < parts[i - 1].at + parts[i - 1].len))
			return -EINVAL;
	if (queue_room(c))
		return -ENOMEM;
	if (c->np + n > c->pcap) {
		size_t cap = c->pcap ? 2 * c->pcap : 256;
		while (cap < c->np + n)
			cap *= 2;
		struct cp_part *v = realloc(c->parts, cap * sizeof *v);
		if (!v)
			return -ENOMEM;
		c->parts = v;
		c->pcap = cap;
	}
	memcpy(c->parts + c->np, parts, n * sizeof *parts);
	c->q[c->n++] = (struct cp_chunk){ .len = len, .dst = dst, .digest = digest, .piece = true, .part = c->np,
					  .nparts = n };
	c->np += n;
	return 0;
}

/* The file's bytes a chunk carries (a piece's parts, not its zeros): what progress counts. */
static uint64_t chunk_bytes(const struct cp *c, const struct cp_chunk *k)
{
	uint64_t n = k->piece ? 0 : k->len;
	for (size_t i = 0; k->piece && i < k->nparts; i++)
		n += c->parts[k->part + i].len;
	return n;
}

/* A piece's bytes at p (k->len of them): every part but part skip (read already by the
 * caller; k->nparts: none) read in place, the bytes between and after them zeros. */
static int fill_piece(struct cp *c, const struct cp_chunk *k, char *p, size_t skip, char *why, size_t whylen)
{
	const struct cp_part *v = &c->parts[k->part];
	uint64_t end = 0;
	for (size_t i = 0; i < k->nparts; i++) {
		memset(p + end, 0, v[i].at - end);
		end = v[i].at + v[i].len;
		if (i != skip && full_pread(c->files[v[i].file].fd, p + v[i].at, v[i].len, v[i].off, why, whylen))
			return -EIO;
	}
	memset(p + end, 0, k->len - end);
	return 0;
}

void cp_set_error(struct cp *c, int e, const char *fmt, const char *what)
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

/* Whether the page cache holds every byte k reads. */
static bool all_cached(const struct cp *c, const struct cp_chunk *k)
{
	if (!k->piece)
		return cached(&c->files[k->file], k->off, k->len);
	for (size_t i = 0; i < k->nparts; i++)
		if (!cached(&c->files[c->parts[k->part + i].file], c->parts[k->part + i].off, c->parts[k->part + i].len))
			return false;
	return true;
}
#endif

/* Slices of a read that are hashed as they land: a slice is still in the core's cache,
 * where a whole 2 MiB hashed after its read came from memory again.  A 16 GiB load on the
 * H200's host (probe/load_hash_probe.py): 1.02-1.03x the load without a hash, sliced;
 * 1.07x hashed whole after the read; 1.25x hashed beside its copy to the GPU. */
#define CP_SLICE (256u << 10)

static int pread_hashed(int fd, char *p, uint64_t len, uint64_t off, struct piece_hash_state *h, char *why,
			size_t whylen)
{
	for (uint64_t at = 0; at < len; at += CP_SLICE) {
		uint64_t n = len - at < CP_SLICE ? len - at : CP_SLICE;
		if (full_pread(fd, p + at, n, off + at, why, whylen))
			return -EIO;
		piece_hash_update(h, p + at, n);
	}
	return 0;
}

/* k's bytes into p through the page cache (a piece's parts in order, the bytes between and
 * after them zeros), *k->digest their hash, taken as they land. */
static int read_hashed(struct cp *c, const struct cp_chunk *k, char *p, char *why, size_t whylen)
{
	struct piece_hash_state h;
	piece_hash_begin(&h);
	int e = 0;
	if (!k->piece) {
		e = pread_hashed(c->files[k->file].fd, p, k->len, k->off, &h, why, whylen);
	} else {
		const struct cp_part *v = &c->parts[k->part];
		uint64_t end = 0;
		for (size_t i = 0; !e && i < k->nparts; end = v[i].at + v[i].len, i++) {
			memset(p + end, 0, v[i].at - end);
			piece_hash_update(&h, p + end, v[i].at - end);
			e = pread_hashed(c->files[v[i].file].fd, p + v[i].at, v[i].len, v[i].off, &h, why, whylen);
		}
		memset(p + end, 0, k->len - end);
		piece_hash_update(&h, p + end, k->len - end);
	}
	*k->digest = piece_hash_end(&h);
	return e;
}

#ifdef GMSFS_HAVE_CUDA
/* A piece into buf (CP_BUF bytes, page-aligned); *piece: where its first byte landed.
 * The piece is placed so that its largest part's O_DIRECT read lands where it goes (its
 * file offset and its place in the piece alike within a page); the other parts are read
 * in place after it. */
static int read_piece(struct cp *c, const struct cp_chunk *k, char *buf, char **piece, char *why, size_t whylen)
{
	const struct cp_part *v = &c->parts[k->part];
	size_t big = 0;
	for (size_t i = 1; i < k->nparts; i++)
		if (v[i].len > v[big].len)
			big = i;
	if (!k->nparts) {
		*piece = buf;
		return fill_piece(c, k, buf, 0, why, whylen);
	}
	uint64_t delta = v[big].off & (CP_PAGE - 1);
	char *p = buf + cp_piece_shift(v[big].off, v[big].at), *src;
	struct cp_chunk one = { .file = (size_t)v[big].file, .off = v[big].off, .len = v[big].len };
	*piece = p;
	int e = read_chunk(c, &one, p + v[big].at - delta, &src, why, whylen);
	return e ? e : fill_piece(c, k, p, big, why, whylen);
}

/* One worker on cuda: read a chunk into one of its two pinned buffers while the other
 * buffer's copy runs on its own stream. */
static void cuda_worker(struct cp *c, size_t me)
{
	CUstream st[2] = { 0 };
	char why0[256] = "", *buf[2] = { NULL, NULL };
	CUresult r = c->cu.cuCtxSetCurrent(c->ctx);
	if (!r && (buf[0] = cp_thread_buffers(c, me, why0, sizeof why0)))
		buf[1] = buf[0] + CP_BUF;
	for (int k = 0; !r && buf[0] && k < 2; k++)
		r = c->cu.cuStreamCreate(&st[k], CU_STREAM_NON_BLOCKING);
	if (r)
		cp_set_error(c, -EIO, "streams: %s", cu_name(&c->cu, r));
	else if (!buf[0]) {
		cp_set_error(c, -EIO, "%s", why0);
		r = CUDA_ERROR_OUT_OF_MEMORY; /* no chunk taken */
	}
	uint64_t pending[2] = { 0 };
	for (int b = 0;; b ^= 1) {
		size_t i = atomic_fetch_add(&c->next, 1);
		if (r || i >= c->n)
			break;
		const struct cp_chunk *k = &c->q[i];
		if ((r = c->cu.cuStreamSynchronize(st[b]))) { /* this buffer's last copy is done */
			cp_set_error(c, -EIO, "copy to the GPU: %s", cu_name(&c->cu, r));
			break;
		}
		atomic_fetch_add(&c->done, pending[b]);
		pending[b] = 0;
		char why[256], *src = buf[b];
		bool hashed = k->digest && all_cached(c, k); /* else O_DIRECT, hashed after */
		if (hashed ? read_hashed(c, k, src, why, sizeof why)
			   : k->piece ? read_piece(c, k, buf[b], &src, why, sizeof why)
				      : read_chunk(c, k, buf[b], &src, why, sizeof why)) {
			cp_set_error(c, -EIO, "%s", why);
			break;
		}
		if (k->digest && !hashed) /* before the copy: beside it, both reads of the bytes were slower */
			*k->digest = piece_hash(src, k->len);
		if ((r = c->cu.cuMemcpyHtoDAsync((CUdeviceptr)(uintptr_t)k->dst, src, k->len, st[b]))) {
			cp_set_error(c, -EIO, "copy to the GPU: %s", cu_name(&c->cu, r));
			break;
		}
		pending[b] = chunk_bytes(c, k);
	}
	for (int k = 0; k < 2; k++) {
		if (!st[k])
			continue;
		CUresult s2 = c->cu.cuStreamSynchronize(st[k]);
		if (s2)
			cp_set_error(c, -EIO, "copy to the GPU: %s", cu_name(&c->cu, s2));
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
		const struct cp_chunk *k = &c->q[i];
		char why[256];
		if (k->digest ? read_hashed(c, k, k->dst, why, sizeof why)
			      : k->piece ? fill_piece(c, k, k->dst, k->nparts, why, sizeof why)
					 : full_pread(c->files[k->file].fd, k->dst, k->len, k->off, why, sizeof why)) {
			cp_set_error(c, -EIO, "%s", why);
			break;
		}
		atomic_fetch_add(&c->done, chunk_bytes(c, k));
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
		cp_set_error(c, -EAGAIN, "%s", "no thread to copy with");
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
	c->n = c->np = 0;
	if (c->err)
		snprintf(err, errlen, "%s", c->why);
	return c->err;
}

#ifdef GMSFS_HAVE_CUDA
int cp_cuda(struct cp *c, struct cu_api **cu, CUcontext *ctx, char **pinned, size_t *pinned_bytes)
{
	if (!c->cuda)
		return -ENODEV;
	if (!c->pinned && c->cu.cuMemHostAlloc((void **)&c->pinned, CP_THREADS * 2 * CP_BUF, 0)) {
		c->pinned = NULL;
		return -ENOMEM;
	}
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
