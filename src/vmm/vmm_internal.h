/* vmm_internal: what the files of src/vmm share beyond vmm.h (their layers: src/vmm/layers). */
#ifndef GMSFS_VMM_INTERNAL_H
#define GMSFS_VMM_INTERNAL_H

#include "vmm.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* A set of pools under its mutex, made at the device's open and freed at its end: the
 * pools with a minimum (vmm_account.c), those with spare pages (vmm_spare.c).  add and
 * remove with mu held. */
struct vmm_pool_set {
	pthread_mutex_t mu;
	struct vmm_pool **v;
	size_t n, cap;
};

static inline struct vmm_pool_set *vmm_pool_set_new(void)
{
	struct vmm_pool_set *s = calloc(1, sizeof *s);
	if (s)
		pthread_mutex_init(&s->mu, NULL);
	return s;
}

static inline void vmm_pool_set_free(struct vmm_pool_set *s)
{
	if (!s)
		return;
	free(s->v);
	pthread_mutex_destroy(&s->mu);
	free(s);
}

/* p in s (there already: nothing).  0 or -ENOMEM, s as it was. */
static inline int vmm_pool_set_add(struct vmm_pool_set *s, struct vmm_pool *p)
{
	for (size_t i = 0; i < s->n; i++)
		if (s->v[i] == p)
			return 0;
	if (s->n == s->cap) {
		size_t cap = s->cap ? 2 * s->cap : 8;
		struct vmm_pool **v = (struct vmm_pool **)realloc(s->v, cap * sizeof *v);
		if (!v)
			return -ENOMEM;
		s->v = v, s->cap = cap;
	}
	s->v[s->n++] = p;
	return 0;
}

/* p out of s (not in it: nothing). */
static inline void vmm_pool_set_remove(struct vmm_pool_set *s, const struct vmm_pool *p)
{
	for (size_t i = 0; i < s->n; i++)
		if (s->v[i] == p) {
			s->v[i] = s->v[--s->n];
			return;
		}
}

/* vmm_release.c: fn(arg) run on the releaser thread (now, where there is none). */
int vmm_release_open(struct vmm *v);
void vmm_release_close(struct vmm *v);
void vmm_release_later(struct vmm *v, void (*fn)(void *arg), void *arg);
/* Before new memory of a tier (its bytes reserved in the accounting already): the
 * releases pending waited for where their room is needed (the memory in use, spare and
 * still being released passes the tier's limit), not where it is not (a release of
 * gigabytes holds the driver for milliseconds, and a delayed one sleeps: a create of
 * 2 MiB beside a free device waited for both). */
void vmm_released_for(struct vmm *v, bool host);
/* A create refused for want of room (-ENOSPC) while releases were pending: worth one
 * more try once they are done (the device is shared with others the accounting does
 * not see).  True: they were waited for, try again. */
bool vmm_released_retry(struct vmm *v, bool host, int e);

/* vmm_account.c */
int vmm_mins_open(struct vmm *v);
void vmm_mins_close(struct vmm *v);
/* n bytes more of used, within limit (0: none); false changes nothing. */
bool vmm_reserve(atomic_uint_fast64_t *used, uint64_t limit, uint64_t n);
/* n bytes of the device for pool: within max_bytes less held (bytes held outside
 * used_bytes), less what the other pools' minimums still lack. */
bool vmm_device_take(struct vmm *v, struct vmm_pool *pool, uint64_t n, uint64_t held);
void vmm_note_peak(struct vmm_pool *pool);

/* vmm_spare.c: the device's list of pools with spare pages, and a pool's end. */
int vmm_spare_open(struct vmm *v);
void vmm_spare_close(struct vmm *v);
void vmm_spare_pool_end(struct vmm_pool *p);
/* Spare pages given up until n bytes have gone; false when there were none. */
bool vmm_give_up_spares(struct vmm *v, uint64_t n);
/* b's last reference went: a spare of its pool (true), or to be released as any buffer. */
bool vmm_spare_page(struct vmm_buf *b);
/* A spare page of aligned bytes of pool, off its list (NULL: none); vmm_spare_return puts
 * one taken and not used back (still counted in pages_spare meanwhile). */
struct vmm_buf *vmm_spare_take(struct vmm_pool *pool, uint64_t aligned);
void vmm_spare_return(struct vmm_buf *b);
/* Every spare page of p off its list and out of the counters, into *out: the caller
 * releases each (ops->release) while it holds p, then frees out->v. */
void vmm_spares_detach(struct vmm_pool *p, struct vmm_bufs *out);

/* vmm_buf.c: n bytes of the device for pool, spare pages given up where the room is theirs. */
bool vmm_device_reserve(struct vmm *v, struct vmm_pool *pool, uint64_t n);

#endif
