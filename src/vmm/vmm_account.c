/* vmm_account: the daemon's own accounting of device memory, below the rest of vmm:
 * limits reserved before memory is made, the pools' minimums, their peaks. */
#include "vmm.h"
#include "vmm_internal.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>

/* The pools with a minimum: few (elastic stores), looked at by every reservation while
 * there is one. */
struct mins {
	struct vmm_pool_set *set;
	atomic_size_t count; /* set->n, read without its mutex: 0 keeps reservations lock-free */
};

int vmm_mins_open(struct vmm *v)
{
	struct mins *m = calloc(1, sizeof *m);
	if (!m || !(m->set = vmm_pool_set_new())) {
		free(m);
		return -ENOMEM;
	}
	v->mins = m;
	return 0;
}

void vmm_mins_close(struct vmm *v)
{
	struct mins *m = v->mins;
	if (!m)
		return;
	vmm_pool_set_free(m->set);
	free(m);
	v->mins = NULL;
}

/* Reserve n bytes of a limit first, so that concurrent creates cannot overshoot together. */
bool vmm_reserve(atomic_uint_fast64_t *used, uint64_t limit, uint64_t n)
{
	uint64_t was = atomic_fetch_add(used, n);
	if (limit && (n > limit || was > limit - n)) {
		atomic_fetch_sub(used, n);
		return false;
	}
	return true;
}

static uint64_t short_of(struct mins *m, const struct vmm_pool *pool)
{
	uint64_t lack = 0;
	for (size_t i = 0; i < m->set->n; i++) {
		uint64_t min = atomic_load(&m->set->v[i]->min), used = atomic_load(&m->set->v[i]->used);
		if (m->set->v[i] != pool && used < min)
			lack += min - used;
	}
	return lack;
}

uint64_t vmm_mins_short(struct vmm *v, const struct vmm_pool *pool)
{
	struct mins *m = v->mins;
	if (!atomic_load(&m->count)) /* no minimum anywhere: every create asks, none waits on mu */
		return 0;
	pthread_mutex_lock(&m->set->mu);
	uint64_t lack = short_of(m, pool);
	pthread_mutex_unlock(&m->set->mu);
	return lack;
}

uint64_t vmm_room_for(struct vmm *v, const struct vmm_pool *pool)
{
	uint64_t used = atomic_load(&v->used_bytes), lack = vmm_mins_short(v, pool);
	return used + lack < v->max_bytes ? v->max_bytes - used - lack : 0;
}

int vmm_pool_set_min(struct vmm_pool *pool, uint64_t min)
{
	struct vmm *v = pool->vmm;
	struct mins *m = v->mins;
	struct vmm_pool_set *set = m->set;
	pthread_mutex_lock(&set->mu);
	uint64_t others = 0;
	for (size_t i = 0; i < set->n; i++)
		if (set->v[i] != pool)
			others += atomic_load(&set->v[i]->min);
	int e = 0;
	if (min && (min > v->max_bytes || others > v->max_bytes - min))
		e = -EINVAL;
	else if (min)
		e = vmm_pool_set_add(set, pool);
	else
		vmm_pool_set_remove(set, pool);
	if (!e)
		atomic_store(&pool->min, min);
	atomic_store(&m->count, set->n);
	pthread_mutex_unlock(&set->mu);
	return e;
}

/* n bytes of the device for pool: within max_bytes less held (bytes held outside
 * used_bytes), less what the other pools' minimums still lack (under mins' lock while
 * there are minimums, so that two reservations do not both count the same free bytes). */
bool vmm_device_take(struct vmm *v, struct vmm_pool *pool, uint64_t n, uint64_t held)
{
	struct mins *m = v->mins;
	if (!atomic_load(&m->count))
		return held < v->max_bytes && vmm_reserve(&v->used_bytes, v->max_bytes - held, n);
	pthread_mutex_lock(&m->set->mu);
	uint64_t lack = short_of(m, pool);
	bool ok = lack < v->max_bytes - held && held < v->max_bytes &&
		  vmm_reserve(&v->used_bytes, v->max_bytes - held - lack, n);
	pthread_mutex_unlock(&m->set->mu);
	return ok;
}

void vmm_note_peak(struct vmm_pool *pool)
{
	uint64_t used = atomic_load(&pool->used), peak = atomic_load(&pool->peak);
	while (used > peak && !atomic_compare_exchange_weak(&pool->peak, &peak, used))
		;
}
