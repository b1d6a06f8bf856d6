/* vmm_buf: pools and buffers: made (one piece of memory), adopted, exported, read and
 * written, given back; a pool's spare pages (vmm_spare.c) and the accounting (vmm_account.c)
 * below. */
#include "vmm.h"
#include "vmm_internal.h"
#include "clock.h"

#include <assert.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

uint64_t vmm_align(const struct vmm *v, uint64_t size)
{
	uint64_t g = v->dev.granularity;
	if (size > UINT64_MAX - (g - 1))
		return 0;
	return (size + g - 1) / g * g;
}

int vmm_pool_new(struct vmm *v, struct vmm_pool **out)
{
	struct vmm_pool *p = calloc(1, sizeof *p);
	if (!p)
		return -ENOMEM;
	p->vmm = v;
	atomic_init(&p->refs, 1);
	int e = v->ops->pool_open ? v->ops->pool_open(p) : 0;
	if (e) {
		free(p);
		return e;
	}
	*out = p;
	return 0;
}

void vmm_pool_get(struct vmm_pool *p)
{
	atomic_fetch_add(&p->refs, 1);
}

void vmm_pool_put(struct vmm_pool *p)
{
	unsigned refs = p ? atomic_fetch_sub(&p->refs, 1) : 0;
	assert(!p || refs > 0); /* no more puts than gets */
	if (!p || refs != 1)
		return;
	if (atomic_load(&p->min))
		vmm_pool_set_min(p, 0);
	vmm_spare_pool_end(p); /* its spare pages are ranges of its memory (host): they go first */
	if (p->vmm->ops->pool_close)
		p->vmm->ops->pool_close(p);
	free(p);
}

/* New memory for pool: spare pages of other stores are given up where the room is theirs. */
bool vmm_device_reserve(struct vmm *v, struct vmm_pool *pool, uint64_t n)
{
	while (!vmm_device_take(v, pool, n, atomic_load(&v->pages_spare)))
		if (!vmm_give_up_spares(v, n))
			return false;
	return true;
}

int vmm_alloc_one(struct vmm_pool *pool, uint64_t size, struct vmm_buf **out)
{
	struct vmm *v = pool->vmm;
	uint64_t aligned = vmm_align(v, size);
	if (!size || !aligned)
		return size ? -ENOSPC : -EINVAL;
	if (atomic_load(&v->frozen))
		return -EAGAIN;
	if (!vmm_reserve(&pool->used, atomic_load(&pool->quota), aligned))
		return -EDQUOT;
	if (!vmm_device_reserve(v, pool, aligned)) {
		atomic_fetch_sub(&pool->used, aligned);
		return -ENOSPC;
	}
	vmm_released_for(v, false); /* the room the accounting showed, on the device too */
	int e = v->ops->create(pool, aligned, out);
	if (vmm_released_retry(v, false, e))
		e = v->ops->create(pool, aligned, out);
	if (e) {
		atomic_fetch_sub(&v->used_bytes, aligned);
		atomic_fetch_sub(&pool->used, aligned);
		return e;
	}
	vmm_pool_get(pool);
	vmm_note_peak(pool);
	(*out)->vmm = v;
	(*out)->pool = pool;
	(*out)->size = aligned;
	atomic_init(&(*out)->ro_fd, -1);
	atomic_init(&(*out)->refs, 1);
	return 0;
}

int vmm_adopt(struct vmm_pool *pool, int fd, uint64_t offset, uint64_t aligned, bool host, struct vmm_buf **out)
{
	struct vmm *v = pool->vmm;
	if (!aligned || aligned != vmm_align(v, aligned) || fd < 0)
		return -EINVAL;
	int e = v->ops->adopt(pool, fd, offset, aligned, host, out);
	if (e)
		return e;
	atomic_fetch_add(host ? &v->host_used : &v->used_bytes, aligned);
	atomic_fetch_add(&pool->used, aligned);
	vmm_pool_get(pool);
	(*out)->vmm = v;
	(*out)->pool = pool;
	(*out)->size = aligned;
	(*out)->host = host;
	atomic_init(&(*out)->ro_fd, -1);
	atomic_init(&(*out)->refs, 1);
	return 0;
}

/* On the releaser thread: spare pages detached at a session's end, then the pool. */
struct spares_going {
	struct vmm_pool *pool;
	struct vmm_bufs l;
};

static void release_spares(void *arg)
{
	struct spares_going *g = arg;
	struct vmm *v = g->pool->vmm;
	for (size_t i = 0; i < g->l.n; i++) {
		uint64_t size = g->l.v[i]->size;
		v->ops->release(g->l.v[i]);
		atomic_fetch_sub(&v->releasing, size);
	}
	free(g->l.v);
	vmm_pool_put(g->pool);
	free(g);
}

void vmm_pool_drop_spares_later(struct vmm_pool *p)
{
	struct spares_going *g = p && atomic_load(&p->pages_spare) ? malloc(sizeof *g) : NULL;
	if (!g)
		return vmm_pool_drop_spares(p); /* none; or no memory for the job: now */
	g->pool = p;
	vmm_spares_detach(p, &g->l);
	for (size_t i = 0; i < g->l.n; i++)
		atomic_fetch_add(&p->vmm->releasing, g->l.v[i]->size);
	vmm_pool_get(p);
	vmm_release_later(p->vmm, release_spares, g);
}

void vmm_pool_trim(struct vmm_pool *p, bool host)
{
	if (p->vmm->ops->trim)
		p->vmm->ops->trim(p, host);
}

void vmm_close_fd(struct vmm *v, int fd)
{
	if (fd >= 0 && v->closing)
		v->closing(v->closing_arg, fd);
	if (fd >= 0)
		close(fd);
}

void vmm_buf_get(struct vmm_buf *b)
{
	atomic_fetch_add(&b->refs, 1);
}

/* On the releaser thread: b's memory goes, then its pool's reference. */
static void release_buf(void *arg)
{
	struct vmm_buf *b = arg;
	struct vmm *v = b->vmm;
	struct vmm_pool *pool = b->pool;
	bool last_host = b->last_host;
	uint64_t now = clock_mono_ns();
	if (b->release_after > now) { /* on the releaser thread: no request waits for it */
		uint64_t d = b->release_after - now;
		nanosleep(&(struct timespec){ (time_t)(d / 1000000000u), (long)(d % 1000000000u) }, NULL);
	}
	uint64_t size = b->size;
	bool host = b->host;
	if (v->before_release)
		v->before_release();
	v->ops->release(b);
	atomic_fetch_sub(host ? &v->host_releasing : &v->releasing, size);
	if (last_host && v->ops->copies_unneeded)
		v->ops->copies_unneeded(v);
	vmm_pool_put(pool);
}

void vmm_buf_put(struct vmm_buf *b)
{
	unsigned refs = b ? atomic_fetch_sub(&b->refs, 1) : 0;
	assert(!b || refs > 0); /* no more puts than gets */
	if (!b || refs != 1)
		return;
	if (b->npieces) { /* an allocation of pieces: its memory is theirs */
		atomic_fetch_sub(&b->pool->pieces, b->npieces);
		for (uint32_t i = 0; i < b->npieces; i++)
			vmm_buf_put(b->pieces[i]);
		free(b->pieces);
		free(b);
		return;
	}
	struct vmm *v = b->vmm;
	struct vmm_pool *pool = b->pool;
	uint64_t size = b->size;
	bool host = b->host, on_standby = b->on_standby;
	if (b->page && vmm_spare_page(b)) {
		vmm_pool_put(pool); /* a spare page holds no reference on its pool */
		return;
	}
	vmm_buf_put(vmm_take_standby(b));
	uint64_t was = atomic_fetch_sub(host ? &v->host_used : &v->used_bytes, size);
	if (!on_standby)
		atomic_fetch_sub(&pool->used, size);
	b->last_host = host && was == size;
	atomic_fetch_add(host ? &v->host_releasing : &v->releasing, size);
	vmm_release_later(v, release_buf, b); /* the room is the taker's now, the memory soon */
}

struct vmm_buf *vmm_take_standby(struct vmm_buf *b)
{
	struct vmm_buf *k = b->standby;
	if (k) {
		b->standby = NULL;
		atomic_fetch_sub(&k->vmm->host_standby, k->size);
	}
	return k;
}

void vmm_release_all(struct vmm_buf **bufs, size_t n)
{
	for (size_t i = 0; bufs && i < n; i++)
		vmm_buf_put(bufs[i]);
	free(bufs);
}

void vmm_bufs_release(struct vmm_bufs *l)
{
	vmm_release_all(l->v, l->n);
	*l = (struct vmm_bufs){0};
}

int vmm_export(struct vmm_buf *b, bool read_only)
{
	if (b->npieces)
		return -EINVAL; /* each piece is exported */
	return b->vmm->ops->export_fd(b, read_only);
}

/* An allocation of pieces: [off, off + len) of its bytes, piece after piece. */
static ssize_t piece_io(struct vmm_buf *b, char *p, size_t len, uint64_t off, bool write)
{
	uint64_t piece = b->pieces[0]->size;
	size_t done = 0;
	while (done < len && (off + done) / piece < b->npieces) {
		struct vmm_buf *k = b->pieces[(off + done) / piece];
		uint64_t in = (off + done) % piece;
		size_t n = len - done < k->size - in ? len - done : (size_t)(k->size - in);
		ssize_t r = write ? vmm_pwrite(k, p + done, n, in) : vmm_pread(k, p + done, n, in);
		if (r < 0)
			return done ? (ssize_t)done : r;
		done += (size_t)r;
		if ((size_t)r < n)
			break;
	}
	return (ssize_t)done;
}

ssize_t vmm_pread(struct vmm_buf *b, void *dst, size_t len, uint64_t off)
{
	if (b->npieces)
		return piece_io(b, dst, len, off, false);
	return b->vmm->ops->pread ? b->vmm->ops->pread(b, dst, len, off) : -EOPNOTSUPP;
}

ssize_t vmm_pwrite(struct vmm_buf *b, const void *src, size_t len, uint64_t off)
{
	if (b->npieces)
		return piece_io(b, (char *)src, len, off, true);
	return b->vmm->ops->pwrite ? b->vmm->ops->pwrite(b, src, len, off) : -EOPNOTSUPP;
}

void vmm_pool_why(const struct vmm_pool *p, int e, uint64_t size, char *buf, size_t len)
{
	if (e != -EDQUOT)
		return vmm_why(p->vmm, e, buf, len);
	snprintf(buf, len, "%s: the store's quota is %llu bytes, %llu used, %llu more asked", strerror(ENOSPC),
		 (unsigned long long)atomic_load(&p->quota), (unsigned long long)atomic_load(&p->used),
		 (unsigned long long)vmm_align(p->vmm, size));
}

void vmm_why(const struct vmm *v, int e, char *buf, size_t len)
{
	if (e == -ENOSPC) {
		snprintf(buf, len, "%s (used %llu of %llu bytes)", strerror(-e),
			 (unsigned long long)atomic_load(&v->used_bytes), (unsigned long long)v->max_bytes);
		return;
	}
	if (e == -EMFILE || e == -ENFILE) {
		struct rlimit r = {0};
		getrlimit(RLIMIT_NOFILE, &r);
		snprintf(buf, len, "%s: the daemon is out of descriptors (limit %llu; the %s backend keeps %s): "
				   "raise its LimitNOFILE",
			 strerror(-e), (unsigned long long)r.rlim_cur, v->dev.backend,
			 strcmp(v->dev.backend, "cuda") ? "two per store" : "one per allocation");
		return;
	}
	snprintf(buf, len, "%s", strerror(-e));
}
