/* vmm: backend choice, buffers and their moves between the tiers (the accounting of
 * device memory: vmm_account.c). */
#include "vmm.h"
#include "vmm_internal.h"
#include "clock.h"

#include <dlfcn.h>
#include <pthread.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

static int open_with(struct vmm **out, const struct vmm_ops *ops, const char *device, uint64_t max_bytes,
		     char *err, size_t errlen)
{
	struct vmm *v = calloc(1, sizeof *v);
	if (!v)
		return -ENOMEM;
	v->ops = ops;
	int e = ops->open(v, device, err, errlen);
	if (e) {
		free(v);
		return e;
	}
	v->max_bytes = max_bytes && max_bytes < v->dev.total_bytes ? max_bytes : v->dev.total_bytes;
	if (vmm_mins_open(v) || vmm_kept_open(v)) {
		vmm_mins_close(v);
		ops->close(v);
		free(v);
		return -ENOMEM;
	}
	*out = v;
	return 0;
}

int vmm_open(struct vmm **out, const char *backend, const char *device, uint64_t max_bytes, char *err, size_t errlen)
{
	if (backend && strcmp(backend, "host") != 0 && strcmp(backend, "cuda") != 0) {
		snprintf(err, errlen, "backend=%s: unknown backend (cuda or host)", backend);
		return -EINVAL;
	}
	if (!backend || !strcmp(backend, "cuda")) {
#ifdef GMSFS_HAVE_CUDA
		int e = open_with(out, &vmm_cuda_ops, device, max_bytes, err, errlen);
		if (!e || backend || e != -ENODEV)
			return e;
		/* The default: cuda where a VMM-capable GPU is found, else host. */
		fprintf(stderr, "gmsfs: %s: using the host backend\n", err);
		err[0] = '\0';
#else
		if (backend) {
			snprintf(err, errlen, "backend=cuda: this gmsfs was built without cuda.h (use backend=host)");
			return -ENOTSUP;
		}
#endif
	}
	return open_with(out, &vmm_host_ops, device, max_bytes, err, errlen);
}

void vmm_leave(struct vmm *v)
{
	if (v && v->ops->leave)
		v->ops->leave(v);
}

void vmm_close(struct vmm *v)
{
	if (v && v->ops->close)
		v->ops->close(v);
	if (v)
		vmm_mins_close(v);
	if (v)
		vmm_kept_close(v);
	free(v);
}

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
	if (!p || atomic_fetch_sub(&p->refs, 1) != 1)
		return;
	if (atomic_load(&p->min))
		vmm_pool_set_min(p, 0);
	vmm_kept_pool_end(p); /* its kept pages are ranges of its memory (host): they go first */
	if (p->vmm->ops->pool_close)
		p->vmm->ops->pool_close(p);
	free(p);
}

/* New memory for pool: pages kept for other growth are given up where the room is theirs. */
static bool device_reserve(struct vmm *v, struct vmm_pool *pool, uint64_t n)
{
	while (!vmm_device_take(v, pool, n, atomic_load(&v->pages_kept)))
		if (!vmm_give_up_kept(v, n))
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
	if (!device_reserve(v, pool, aligned)) {
		atomic_fetch_sub(&pool->used, aligned);
		return -ENOSPC;
	}
	int e = v->ops->create(pool, aligned, out);
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

void vmm_buf_put(struct vmm_buf *b)
{
	if (!b || atomic_fetch_sub(&b->refs, 1) != 1)
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
	bool host = b->host, spare = b->spare;
	if (b->page && vmm_keep_page(b))
		return;
	vmm_buf_put(vmm_take_kept(b));
	v->ops->release(b);
	uint64_t was = atomic_fetch_sub(host ? &v->host_used : &v->used_bytes, size);
	if (host && was == size && v->ops->copies_unneeded)
		v->ops->copies_unneeded(v);
	if (!spare)
		atomic_fetch_sub(&pool->used, size);
	vmm_pool_put(pool);
}

/* A buffer on the other tier for b: the same size, counted against that tier's limit;
 * in b's pool's use too, but for a spare (host memory made ahead: not a copy the store
 * holds, so never in its used, even while it is being made). */
static int alloc_twin(struct vmm_buf *b, bool to_host, bool spare, struct vmm_buf **out)
{
	struct vmm *v = b->vmm;
	if (to_host ? !vmm_reserve(&v->host_used, v->host_bytes, b->size) : !device_reserve(v, b->pool, b->size))
		return -ENOSPC;
	int e = to_host ? v->ops->create_host(b->pool, b->size, out) : v->ops->create(b->pool, b->size, out);
	if (e) {
		atomic_fetch_sub(to_host ? &v->host_used : &v->used_bytes, b->size);
		return e;
	}
	if (!spare)
		atomic_fetch_add(&b->pool->used, b->size); /* the twin's put takes it off again */
	vmm_pool_get(b->pool);
	(*out)->vmm = v;
	(*out)->pool = b->pool;
	(*out)->size = b->size;
	(*out)->host = to_host;
	(*out)->spare = spare;
	atomic_init(&(*out)->ro_fd, -1);
	atomic_init(&(*out)->refs, 1);
	return 0;
}

int vmm_twin(struct vmm_buf *b, bool to_host, struct vmm_buf **out)
{
	/* The host memory kept from the last move in, if any: no new pinned memory. */
	struct vmm_buf *k = to_host && !b->host ? vmm_take_kept(b) : NULL;
	if (!k)
		return alloc_twin(b, to_host, false, out);
	k->spare = false; /* in the pool's use again, as a twin is */
	atomic_fetch_add(&k->pool->used, k->size);
	*out = k;
	return 0;
}

void vmm_take(struct vmm_buf *const *bufs, struct vmm_buf **twins, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		bool was = bufs[i]->host;
		bufs[i]->vmm->ops->swap(bufs[i], twins[i]);
		bufs[i]->host = twins[i]->host;
		twins[i]->host = was;
	}
}

void vmm_twin_why(const struct vmm_buf *b, bool to_host, int e, char *err, size_t errlen)
{
	const struct vmm *v = b->vmm;
	if (e == -ENOSPC)
		snprintf(err, errlen, "%s: %llu bytes more would pass %s=%llu (used %llu)",
			 to_host ? "the host tier" : "the device", (unsigned long long)b->size,
			 to_host ? "host_bytes" : "max_bytes", (unsigned long long)(to_host ? v->host_bytes : v->max_bytes),
			 (unsigned long long)atomic_load(to_host ? &v->host_used : &v->used_bytes));
	else
		snprintf(err, errlen, "%s memory: %s", to_host ? "host" : "device", strerror(-e));
}

/* vmm_move, or (renew) vmm_renew: each buffer's bytes copied into new memory on the
 * other tier, or on its own, which it takes; the old comes back in *old. */
static int copy_away(struct vmm_buf *const *bufs, size_t n, bool renew, bool to_host, struct vmm_buf ***old,
		     uint64_t ns[2], char *err, size_t errlen)
{
	*old = NULL;
	uint64_t t0 = clock_mono_ns(), t1;
	if (!n)
		return 0;
	struct vmm *v = bufs[0]->vmm;
	if (!v->ops->create_host || !v->ops->copy || !v->ops->swap) {
		snprintf(err, errlen, "the %s backend %s", v->dev.backend, renew ? "cannot copy" : "has no host tier");
		return -EOPNOTSUPP;
	}
	struct vmm_buf **twins = calloc(n, sizeof *twins);
	if (!twins)
		return -ENOMEM;
	size_t made = 0;
	int e = 0;
	while (made < n && !e) {
		struct vmm_buf *b = bufs[made];
		e = renew ? alloc_twin(b, b->host, false, &twins[made]) : vmm_twin(b, to_host, &twins[made]);
		made += !e;
	}
	if (e)
		vmm_twin_why(bufs[made], renew ? bufs[made]->host : to_host, e, err, errlen);
	t1 = clock_mono_ns();
	if (!e)
		e = v->ops->copy(v, bufs, twins, n, err, errlen);
	if (ns)
		ns[0] = t1 - t0, ns[1] = clock_mono_ns() - t1;
	if (e) {
		vmm_release_all(twins, n);
		return e;
	}
	/* Each buffer takes its twin's memory; the twin, holding the old, goes to the caller. */
	vmm_take(bufs, twins, n);
	*old = twins;
	return 0;
}

int vmm_move(struct vmm_buf *const *bufs, size_t n, bool to_host, struct vmm_buf ***old, uint64_t ns[2], char *err,
	     size_t errlen)
{
	/* Those already there stay (a switch that stopped mid-way left some): old[i] NULL. */
	struct vmm_buf **some = calloc(n + 1, sizeof *some), **moved = NULL;
	size_t *at = calloc(n + 1, sizeof *at), k = 0;
	*old = calloc(n + 1, sizeof **old);
	int e = some && at && *old ? 0 : -ENOMEM;
	for (size_t i = 0; !e && i < n; i++)
		if (bufs[i]->host != to_host)
			at[k] = i, some[k++] = bufs[i];
	if (!e && ns)
		ns[0] = ns[1] = 0;
	if (!e && k)
		e = copy_away(some, k, false, to_host, &moved, ns, err, errlen);
	for (size_t i = 0; !e && i < k; i++)
		(*old)[at[i]] = moved[i];
	free(moved);
	free(some);
	free(at);
	if (e) {
		free(*old);
		*old = NULL;
	}
	return e;
}

int vmm_renew(struct vmm_buf *const *bufs, size_t n, struct vmm_buf ***old, char *err, size_t errlen)
{
	return copy_away(bufs, n, true, false, old, NULL, err, errlen);
}

void vmm_unrenew(struct vmm_buf *const *bufs, struct vmm_buf **old, size_t n)
{
	for (size_t i = 0; old && i < n; i++)
		bufs[i]->vmm->ops->swap(bufs[i], old[i]);
	vmm_release_all(old, n);
}

void vmm_release_all(struct vmm_buf **bufs, size_t n)
{
	for (size_t i = 0; bufs && i < n; i++)
		vmm_buf_put(bufs[i]);
	free(bufs);
}

int vmm_bufs_push(struct vmm_bufs *l, struct vmm_buf *b)
{
	if (l->n == l->cap) {
		size_t cap = l->cap ? 2 * l->cap : 16;
		struct vmm_buf **v = realloc(l->v, cap * sizeof *v);
		if (!v)
			return -ENOMEM;
		l->v = v, l->cap = cap;
	}
	l->v[l->n++] = b;
	return 0;
}

void vmm_bufs_release(struct vmm_bufs *l)
{
	vmm_release_all(l->v, l->n);
	*l = (struct vmm_bufs){0};
}

void vmm_copies_ready(struct vmm *v)
{
	if (v->ops->copies_ready)
		v->ops->copies_ready(v);
}

int vmm_touch_host(struct vmm_buf *const *bufs, size_t n, char *err, size_t errlen)
{
	size_t k = 0;
	struct vmm_buf **some = calloc(n + 1, sizeof *some);
	if (!some)
		return -ENOMEM;
	for (size_t i = 0; i < n; i++)
		if (bufs[i])
			some[k++] = bufs[i];
	int e = k && some[0]->vmm->ops->touch ? some[0]->vmm->ops->touch(some[0]->vmm, some, k, err, errlen) : 0;
	free(some);
	return e;
}

int vmm_make_host(struct vmm_buf *b, struct vmm_buf **out)
{
	*out = NULL;
	if (b->host)
		return -EINVAL;
	if (!b->vmm->ops->create_host)
		return -EOPNOTSUPP;
	return alloc_twin(b, true, true, out);
}

void vmm_keep(struct vmm_buf *const *bufs, struct vmm_buf **old, size_t n)
{
	for (size_t i = 0; old && i < n; i++) {
		struct vmm_buf *k = old[i];
		if (!k)
			continue; /* vmm_make_host's caller: this one kept some already */
		vmm_buf_put(vmm_take_kept(bufs[i])); /* none expected: a move out takes it */
		if (!k->spare) /* a move's old buffer leaves its pool's use (vmm_make_host's never entered it) */
			atomic_fetch_sub(&k->pool->used, k->size);
		k->spare = true;
		atomic_fetch_add(&k->vmm->host_kept, k->size);
		bufs[i]->kept = k;
	}
	free(old);
}

struct vmm_buf *vmm_take_kept(struct vmm_buf *b)
{
	struct vmm_buf *k = b->kept;
	if (k) {
		b->kept = NULL;
		atomic_fetch_sub(&k->vmm->host_kept, k->size);
	}
	return k;
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
