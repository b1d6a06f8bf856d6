/* vmm_move: a buffer's memory moved to the other tier (or renewed on its own): a twin
 * made there, the bytes copied by the backend, the memory exchanged; the host memory a
 * store holds on standby for its next move out. */
#include "vmm.h"
#include "vmm_internal.h"
#include "clock.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A buffer on the other tier for b: the same size, counted against that tier's limit;
 * in b's pool's use too, but for one on standby (host memory made ahead: not a copy the store
 * holds, so never in its used, even while it is being made). */
static int alloc_twin(struct vmm_buf *b, bool to_host, bool on_standby, struct vmm_buf **out)
{
	struct vmm *v = b->vmm;
	if (to_host ? !vmm_reserve(&v->host_used, v->host_bytes, b->size) : !vmm_device_reserve(v, b->pool, b->size))
		return -ENOSPC;
	vmm_released_for(v, to_host); /* the room the accounting showed, in memory too */
	int e = to_host ? v->ops->create_host(b->pool, b->size, out) : v->ops->create(b->pool, b->size, out);
	if (vmm_released_retry(v, to_host, e))
		e = to_host ? v->ops->create_host(b->pool, b->size, out) : v->ops->create(b->pool, b->size, out);
	if (e) {
		atomic_fetch_sub(to_host ? &v->host_used : &v->used_bytes, b->size);
		return e;
	}
	if (!on_standby)
		atomic_fetch_add(&b->pool->used, b->size); /* the twin's put takes it off again */
	vmm_pool_get(b->pool);
	(*out)->vmm = v;
	(*out)->pool = b->pool;
	(*out)->size = b->size;
	(*out)->host = to_host;
	(*out)->on_standby = on_standby;
	atomic_init(&(*out)->ro_fd, -1);
	atomic_init(&(*out)->refs, 1);
	return 0;
}

int vmm_twin(struct vmm_buf *b, bool to_host, struct vmm_buf **out)
{
	/* The host memory on standby from the last move in, if any: no new pinned memory. */
	struct vmm_buf *k = to_host && !b->host ? vmm_take_standby(b) : NULL;
	if (!k)
		return alloc_twin(b, to_host, false, out);
	k->on_standby = false; /* in the pool's use again, as a twin is */
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

void vmm_copies_ready(struct vmm *v)
{
	if (v->ops->copies_ready)
		v->ops->copies_ready(v);
}

bool vmm_touches(const struct vmm *v)
{
	return v->ops->touch != NULL;
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

int vmm_adopt_standby(struct vmm_buf *b, int fd, uint64_t offset)
{
	if (b->standby || b->host || b->npieces)
		return -EINVAL;
	struct vmm_buf *k;
	int e = vmm_adopt(b->pool, fd, offset, b->size, true, &k);
	if (e)
		return e;
	/* Not checked against host_bytes: a takeover adopts before it knows its own (the host
	 * tier's memory too); standby is given up as moves need the room. */
	struct vmm *v = b->vmm;
	atomic_fetch_sub(&k->pool->used, k->size); /* on standby: in host_used, not in the pool's use */
	k->on_standby = true;
	atomic_fetch_add(&v->host_standby, k->size);
	b->standby = k;
	return 0;
}

void vmm_set_standby(struct vmm_buf *const *bufs, struct vmm_buf **old, size_t n)
{
	for (size_t i = 0; old && i < n; i++) {
		struct vmm_buf *k = old[i];
		if (!k)
			continue; /* vmm_make_host's caller: this one has some on standby already */
		vmm_buf_put(vmm_take_standby(bufs[i])); /* none expected: a move out takes it */
		if (!k->on_standby) /* a move's old buffer leaves its pool's use (vmm_make_host's never entered it) */
			atomic_fetch_sub(&k->pool->used, k->size);
		k->on_standby = true;
		atomic_fetch_add(&k->vmm->host_standby, k->size);
		bufs[i]->standby = k;
	}
	free(old);
}
