/* vmm_spare: spare pages, those an elastic store's engine gave back, kept made and exported for
 * the store's next growth (vmm_alloc_page in vmm_pages.c takes them).  Making and
 * exporting a page is what a new one costs beyond the client's import, map and access
 * (an H100: 86 against 49 us a page in batches), and a KV cache grows again and again.
 * A spare page is in neither its pool's use nor used_bytes but in pages_spare; a
 * reservation anywhere that lacks room gives spare pages up first (vmm_give_up_spares), and
 * a session's end drops its store's. */
#include "vmm.h"
#include "vmm_internal.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>

/* A pool's spare pages. */
struct pool_spares {
	pthread_mutex_t mu;
	struct vmm_bufs l;
	bool listed; /* in the device's spare_pools */
};

/* The pools with spare pages (v->spare_pools, vmm_alloc_page): a vmm_pool_set.  Lock
 * order: its mutex, then a pool's. */
int vmm_spare_open(struct vmm *v)
{
	return (v->spare_pools = vmm_pool_set_new()) ? 0 : -ENOMEM;
}

void vmm_spare_close(struct vmm *v)
{
	vmm_pool_set_free(v->spare_pools);
	v->spare_pools = NULL;
}

/* A spare page out of the counters (it is in neither its pool's use nor used_bytes). */
static void uncount_spare(const struct vmm_buf *b)
{
	atomic_fetch_sub(&b->pool->pages_spare, b->size);
	atomic_fetch_sub(&b->vmm->pages_spare, b->size);
}

/* A spare page's memory goes. */
static void release_spare(struct vmm_buf *b)
{
	uncount_spare(b);
	b->vmm->ops->release(b);
}

/* Every spare page of p off its list into *l; unlist: p ends, it leaves the list too. */
static void take_spares(struct vmm_pool *p, bool unlist, struct vmm_bufs *l)
{
	struct vmm_pool_set *reg = p->vmm->spare_pools;
	struct pool_spares *k = p->spare_list;
	*l = (struct vmm_bufs){ 0 };
	if (!k)
		return;
	pthread_mutex_lock(&reg->mu);
	pthread_mutex_lock(&k->mu);
	*l = k->l;
	k->l = (struct vmm_bufs){ 0 };
	if (unlist && k->listed) {
		vmm_pool_set_remove(reg, p);
		k->listed = false;
	}
	pthread_mutex_unlock(&k->mu);
	pthread_mutex_unlock(&reg->mu);
}

/* Every spare page of p goes; unlist: p ends, it leaves the list too. */
static void drop_spares(struct vmm_pool *p, bool unlist)
{
	struct vmm_bufs l;
	take_spares(p, unlist, &l);
	for (size_t i = 0; i < l.n; i++)
		release_spare(l.v[i]);
	free(l.v);
}

void vmm_pool_drop_spares(struct vmm_pool *p)
{
	if (p && atomic_load(&p->pages_spare))
		drop_spares(p, false);
}

void vmm_spares_detach(struct vmm_pool *p, struct vmm_bufs *out)
{
	*out = (struct vmm_bufs){ 0 };
	if (!p || !atomic_load(&p->pages_spare))
		return;
	take_spares(p, false, out);
	for (size_t i = 0; i < out->n; i++)
		uncount_spare(out->v[i]);
}

/* Spare pages given up until n bytes have gone (a reservation lacks room); false when
 * there were none.  Under the list's lock: no pool ends meanwhile. */
bool vmm_give_up_spares(struct vmm *v, uint64_t n)
{
	struct vmm_pool_set *reg = v->spare_pools;
	if (!atomic_load(&v->pages_spare))
		return false;
	uint64_t gone = 0;
	pthread_mutex_lock(&reg->mu);
	for (size_t i = 0; i < reg->n && gone < n; i++) {
		struct pool_spares *k = reg->v[i]->spare_list;
		for (;;) {
			pthread_mutex_lock(&k->mu);
			struct vmm_buf *b = k->l.n ? k->l.v[--k->l.n] : NULL;
			pthread_mutex_unlock(&k->mu);
			if (!b)
				break;
			gone += b->size;
			release_spare(b);
			if (gone >= n)
				break;
		}
	}
	pthread_mutex_unlock(&reg->mu);
	return gone > 0;
}

/* b's last reference went: a spare of its pool, unless the pool is ending or the daemon
 * hands its memory on (the caller then puts b's reference on the pool: a spare page holds
 * none, the pool's end drops it).  false: b is released as any buffer. */
bool vmm_spare_page(struct vmm_buf *b)
{
	struct vmm *v = b->vmm;
	struct vmm_pool *pool = b->pool;
	struct vmm_pool_set *reg = v->spare_pools;
	if (b->host || b->standby || atomic_load(&v->frozen) || v->keep_memory || atomic_load(&pool->refs) < 2)
		return false;
	pthread_mutex_lock(&reg->mu);
	struct pool_spares *k = pool->spare_list;
	if (!k && (k = calloc(1, sizeof *k))) {
		pthread_mutex_init(&k->mu, NULL);
		pool->spare_list = k;
	}
	bool ok = k != NULL;
	if (ok && !k->listed && (ok = !vmm_pool_set_add(reg, pool)))
		k->listed = true;
	if (ok) {
		pthread_mutex_lock(&k->mu);
		if ((ok = !vmm_bufs_push(&k->l, b))) {
			atomic_fetch_add(&v->pages_spare, b->size);
			atomic_fetch_add(&pool->pages_spare, b->size);
			atomic_fetch_sub(&v->used_bytes, b->size);
			atomic_fetch_sub(&pool->used, b->size);
		}
		pthread_mutex_unlock(&k->mu);
	}
	pthread_mutex_unlock(&reg->mu);
	return ok;
}

void vmm_spare_pool_end(struct vmm_pool *p)
{
	struct pool_spares *k = p->spare_list;
	if (!k)
		return;
	drop_spares(p, true);
	pthread_mutex_destroy(&k->mu);
	free(k->l.v);
	free(k);
	p->spare_list = NULL;
}

struct vmm_buf *vmm_spare_take(struct vmm_pool *pool, uint64_t aligned)
{
	struct pool_spares *k = atomic_load(&pool->pages_spare) ? pool->spare_list : NULL;
	struct vmm_buf *b = NULL;
	if (!k || !aligned || atomic_load(&pool->vmm->frozen))
		return NULL;
	pthread_mutex_lock(&k->mu);
	for (size_t i = k->l.n; i-- > 0;)
		if (k->l.v[i]->size == aligned) {
			b = k->l.v[i];
			k->l.v[i] = k->l.v[--k->l.n];
			break;
		}
	pthread_mutex_unlock(&k->mu);
	return b;
}

void vmm_spare_return(struct vmm_buf *b)
{
	struct pool_spares *k = b->pool->spare_list;
	pthread_mutex_lock(&k->mu);
	if (vmm_bufs_push(&k->l, b)) {
		pthread_mutex_unlock(&k->mu);
		release_spare(b);
	} else {
		pthread_mutex_unlock(&k->mu);
	}
}
