/* vmm: backend choice and the daemon's own accounting of device memory. */
#include "vmm.h"

#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

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

void vmm_close(struct vmm *v)
{
	if (v && v->ops->close)
		v->ops->close(v);
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
	if (p->vmm->ops->pool_close)
		p->vmm->ops->pool_close(p);
	free(p);
}

int vmm_alloc(struct vmm_pool *pool, uint64_t size, struct vmm_buf **out)
{
	struct vmm *v = pool->vmm;
	uint64_t aligned = vmm_align(v, size);
	if (!size || !aligned)
		return size ? -ENOSPC : -EINVAL;
	/* Reserve first, so that concurrent creates cannot overshoot together. */
	uint64_t used = atomic_fetch_add(&v->used_bytes, aligned);
	if (aligned > v->max_bytes || used > v->max_bytes - aligned) {
		atomic_fetch_sub(&v->used_bytes, aligned);
		return -ENOSPC;
	}
	int e = v->ops->create(pool, aligned, out);
	if (e) {
		atomic_fetch_sub(&v->used_bytes, aligned);
		return e;
	}
	vmm_pool_get(pool);
	(*out)->vmm = v;
	(*out)->pool = pool;
	(*out)->size = aligned;
	atomic_init(&(*out)->ro_fd, -1);
	atomic_init(&(*out)->refs, 1);
	return 0;
}

void vmm_buf_get(struct vmm_buf *b)
{
	atomic_fetch_add(&b->refs, 1);
}

void vmm_buf_put(struct vmm_buf *b)
{
	if (!b || atomic_fetch_sub(&b->refs, 1) != 1)
		return;
	struct vmm *v = b->vmm;
	struct vmm_pool *pool = b->pool;
	uint64_t size = b->size;
	v->ops->release(b);
	atomic_fetch_sub(&v->used_bytes, size);
	vmm_pool_put(pool);
}

int vmm_export(struct vmm_buf *b, bool read_only)
{
	return b->vmm->ops->export_fd(b, read_only);
}

ssize_t vmm_pread(struct vmm_buf *b, void *dst, size_t len, uint64_t off)
{
	return b->vmm->ops->pread ? b->vmm->ops->pread(b, dst, len, off) : -EOPNOTSUPP;
}

ssize_t vmm_pwrite(struct vmm_buf *b, const void *src, size_t len, uint64_t off)
{
	return b->vmm->ops->pwrite ? b->vmm->ops->pwrite(b, src, len, off) : -EOPNOTSUPP;
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
