/* copy_save: out of a store, into files (cp_save, copy.h): each file's run of puts on a
 * thread of its own, each piece hashed as it passes through host memory. */
#include "copy.h"
#include "piece_hash.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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
				p->digests[k] = piece_hash((const char *)p->src + at, len);
			int e = cp_full_pwrite(p->fd, (const char *)p->src + at, len, p->off + at, why, whylen);
			if (e)
				return e;
			atomic_fetch_add(&s->done, len);
		}
		return 0;
	}
#ifdef GMSFS_HAVE_CUDA
	char *buf[2] = { NULL, NULL };
	CUstream st[2] = { 0 };
	CUresult r = c->cu.cuCtxSetCurrent(c->ctx);
	if (!r && !(buf[0] = cp_thread_buffers(c, me, why, whylen)))
		return -EIO;
	if (buf[0])
		buf[1] = buf[0] + CP_BUF;
	for (int b = 0; !r && b < 2; b++)
		r = c->cu.cuStreamCreate(&st[b], CU_STREAM_NON_BLOCKING);
	int e = r ? cp_cu_fail(c, why, whylen, "streams", r) : 0;
	for (uint64_t k = 0; !e && k <= npieces; k++) {
		if (k < npieces) { /* piece k's copy starts */
			uint64_t at = k * CP_PIECE, len = p->len - at < CP_PIECE ? p->len - at : CP_PIECE;
			if ((r = c->cu.cuMemcpyDtoHAsync(buf[k & 1], (CUdeviceptr)(uintptr_t)p->src + at, len, st[k & 1])))
				e = cp_cu_fail(c, why, whylen, "copy from the GPU", r);
		}
		if (!e && k) { /* piece k - 1, copied: hashed and written */
			uint64_t j = k - 1, at = j * CP_PIECE, len = p->len - at < CP_PIECE ? p->len - at : CP_PIECE;
			if ((r = c->cu.cuStreamSynchronize(st[j & 1])))
				e = cp_cu_fail(c, why, whylen, "copy from the GPU", r);
			if (!e) {
				if (p->digests)
					p->digests[j] = piece_hash(buf[j & 1], len);
				e = cp_full_pwrite(p->fd, buf[j & 1], len, p->off + at, why, whylen);
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
				cp_set_error(s->c, e, "%s", why);
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
		cp_set_error(c, -EAGAIN, "%s", "no thread to copy with");
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

int cp_store_to_file(struct cp *c, const void *src, uint64_t len, int fd, uint64_t off, char *err, size_t errlen)
{
	struct cp_put p = { fd, off, src, len, NULL };
	return cp_save(c, &p, 1, NULL, NULL, err, errlen);
}
