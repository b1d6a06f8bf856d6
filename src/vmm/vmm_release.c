/* vmm_release: a buffer's memory released off the thread that gave its last reference.
 * That thread may hold fs->mu (a session rolled back, an rmdir, the memory a move or a
 * switch left): a backend release there (cuMemRelease: the driver frees the pages)
 * would stall every request of the mount meanwhile.  The accounting goes down at once,
 * by the caller (room given back is room); the release runs on the releaser thread, and
 * whoever makes memory first runs or waits for those pending (vmm_released), so that the
 * device has the room the accounting shows, where that room is needed
 * (vmm_released_for; v->releasing counts what is on its way).  Never waited for under fs->mu: a release
 * may take the keeper's mutex (vmm->closing), whose holder may wait for fs->mu.  Once the queue
 * has stayed empty SETTLE_MS after a release, the backend may ready its next create (settle). */
#include "vmm_internal.h"
#include "clock.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>

struct job {
	struct job *next;
	void (*fn)(void *arg);
	void *arg;
};

/* The driver's work behind a release is done within 20-50 ms (probe/create_rounds_probe.c,
 * WARM=2): what settle does after it is not undone by it. */
#define SETTLE_MS 100

struct releaser {
	struct vmm *v;
	pthread_mutex_t mu;
	pthread_cond_t work, idle;
	struct job *head, **tail; /* first in, first out */
	size_t pending;           /* queued and running */
	atomic_size_t queued;     /* pending, for a look without mu */
	bool stop, started;
	bool ran;                 /* a job ran since the last settle */
	uint64_t ran_ns;          /* when the last one ended (CLOCK_MONOTONIC) */
	pthread_t thread;
};

/* Under r->mu: the oldest job, off the queue (NULL: none). */
static struct job *pop(struct releaser *r)
{
	struct job *j = r->head;
	if (j && !(r->head = j->next))
		r->tail = &r->head;
	return j;
}

/* Under r->mu, released while the job runs. */
static void run(struct releaser *r, struct job *j)
{
	pthread_mutex_unlock(&r->mu);
	j->fn(j->arg);
	free(j);
	pthread_mutex_lock(&r->mu);
	r->ran = true;
	r->ran_ns = clock_mono_ns();
	atomic_fetch_sub(&r->queued, 1);
	if (!--r->pending)
		pthread_cond_broadcast(&r->idle);
}

/* Under r->mu: once the last job (this thread's or a helper's, vmm_released) ended SETTLE_MS
 * ago with none queued since, the backend's settle (r->mu released meanwhile). */
static void settle_when_still(struct releaser *r)
{
	for (;;) {
		if (r->head || r->stop)
			return; /* more to release first, or the end */
		uint64_t now = clock_mono_ns(), due = r->ran_ns + SETTLE_MS * 1000000ull;
		if (now >= due)
			break;
		struct timespec until = clock_after_ms(CLOCK_REALTIME, (long)((due - now + 999999) / 1000000));
		pthread_cond_timedwait(&r->work, &r->mu, &until);
	}
	r->ran = false;
	pthread_mutex_unlock(&r->mu);
	r->v->ops->settle(r->v);
	pthread_mutex_lock(&r->mu);
}

static void *releaser_main(void *arg)
{
	struct releaser *r = arg;
	pthread_mutex_lock(&r->mu);
	for (;;) {
		struct job *j = pop(r);
		if (j)
			run(r, j);
		else if (r->stop)
			break;
		else if (r->ran && r->v->ops->settle)
			settle_when_still(r);
		else
			pthread_cond_wait(&r->work, &r->mu);
	}
	pthread_mutex_unlock(&r->mu);
	return NULL;
}

int vmm_release_open(struct vmm *v)
{
	struct releaser *r = calloc(1, sizeof *r);
	if (!r)
		return -ENOMEM;
	pthread_mutex_init(&r->mu, NULL);
	pthread_cond_init(&r->work, NULL);
	pthread_cond_init(&r->idle, NULL);
	r->tail = &r->head;
	r->v = v;
	v->releases = r;
	return 0;
}

void vmm_release_later(struct vmm *v, void (*fn)(void *arg), void *arg)
{
	struct releaser *r = v->releases;
	struct job *j = r ? malloc(sizeof *j) : NULL;
	if (!j)
		return fn(arg); /* no queue (or no memory for it): now, as before */
	*j = (struct job){ .fn = fn, .arg = arg };
	pthread_mutex_lock(&r->mu);
	if (!r->started && !r->stop) /* the thread starts with the first release */
		r->started = !pthread_create(&r->thread, NULL, releaser_main, r);
	if (!r->started) {
		pthread_mutex_unlock(&r->mu);
		free(j);
		return fn(arg);
	}
	*r->tail = j;
	r->tail = &j->next;
	r->pending++;
	atomic_fetch_add(&r->queued, 1);
	pthread_cond_signal(&r->work);
	pthread_mutex_unlock(&r->mu);
}

void vmm_released(struct vmm *v)
{
	struct releaser *r = v->releases;
	if (!r || !atomic_load(&r->queued))
		return;
	pthread_mutex_lock(&r->mu);
	for (struct job *j; (j = pop(r));) /* helped with: the caller needs them done */
		run(r, j);
	while (r->pending)
		pthread_cond_wait(&r->idle, &r->mu);
	pthread_mutex_unlock(&r->mu);
}

void vmm_released_for(struct vmm *v, bool host)
{
	uint64_t going = atomic_load(host ? &v->host_releasing : &v->releasing);
	if (!going)
		return;
	uint64_t held = host ? atomic_load(&v->host_used) : atomic_load(&v->used_bytes) + atomic_load(&v->pages_spare);
	uint64_t limit = host ? v->host_bytes : v->max_bytes;
	if (held > limit || going > limit - held)
		vmm_released(v);
}

bool vmm_released_retry(struct vmm *v, bool host, int e)
{
	if (e != -ENOSPC || !atomic_load(host ? &v->host_releasing : &v->releasing))
		return false;
	vmm_released(v);
	return true;
}

void vmm_release_close(struct vmm *v)
{
	struct releaser *r = v->releases;
	if (!r)
		return;
	vmm_released(v);
	pthread_mutex_lock(&r->mu);
	r->stop = true;
	pthread_cond_signal(&r->work);
	pthread_mutex_unlock(&r->mu);
	if (r->started)
		pthread_join(r->thread, NULL);
	vmm_released(v); /* none expected: whatever came meanwhile */
	pthread_cond_destroy(&r->work);
	pthread_cond_destroy(&r->idle);
	pthread_mutex_destroy(&r->mu);
	free(r);
	v->releases = NULL;
}
