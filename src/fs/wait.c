/* wait: opens (and lock ioctls) that must wait for a store's lock are parked, not
 * blocked: the request is kept, the worker thread goes back to the loop, and the
 * reply comes when the lock is granted, the wait times out, or a signal interrupts
 * it.  So any number may wait while status files still answer.
 *
 * libfuse calls an interrupt callback with the request's own lock held, and a
 * reply may race it.  Who finishes a waiter is decided under fs->mu (its state);
 * the reply of a waiter finished outside the callback is sent by the waiter thread,
 * after fuse_req_interrupt_func(req, NULL, NULL) has waited out any callback in
 * flight, so a request is never replied twice or touched after its reply. */
#include "fs.h"

#include <errno.h>
#include <stdlib.h>
#include <time.h>

static void enqueue(struct fs_waiter **head, struct fs_waiter *w)
{
	w->next = NULL;
	while (*head)
		head = &(*head)->next;
	*head = w;
}

static void dequeue(struct fs_waiter **head, struct fs_waiter *w)
{
	for (; *head; head = &(*head)->next)
		if (*head == w) {
			*head = w->next;
			w->next = NULL;
			return;
		}
}

/* Leave the store's queue with result e, under fs->mu; the reply is the caller's. */
static void finish(struct fs_waiter *w, int e)
{
	struct store *st = w->st;
	if (w->state == WAIT_PARKED) {
		dequeue(&st->waiters, w);
		fsm_wait_end(&st->fsm, w->as_writer);
		store_notify(st);
		if (e && w->as_writer)
			store_changed(st); /* a writer that stops waiting lets the readers it held back in */
	}
	w->state = WAIT_DONE;
	w->result = w->ops->grant(w, e);
}

static void reply(struct fs_waiter *w)
{
	w->ops->reply(w, w->result);
	w->ops->free(w);
}

/* A finished waiter's reply goes to the waiter thread (fs->mu held). */
static void hand_over(struct fs *fs, struct fs_waiter *w)
{
	enqueue(&fs->replies, w);
	pthread_cond_broadcast(&fs->wait_cv);
}

static void on_interrupt(fuse_req_t req, void *data)
{
	struct fs_waiter *w = data;
	struct fs *fs = w->st->fs;
	pthread_mutex_lock(&fs->mu);
	if (w->state == WAIT_NEW) {
		w->interrupted = true; /* wait_park sees it */
		pthread_mutex_unlock(&fs->mu);
		return;
	}
	bool mine = w->state == WAIT_PARKED;
	if (mine)
		finish(w, -EINTR);
	pthread_mutex_unlock(&fs->mu);
	if (mine)
		reply(w); /* libfuse holds the request's lock: replying here is safe, unregistering is not */
}

/* fs->mu held: 0 (taken), -EAGAIN, or an error. */
static int take(struct fs_waiter *w)
{
	return store_take(w->st, w->want, w->h->tgid, &w->h->hold);
}

void wait_park(struct fs_waiter *w)
{
	struct fs *fs = w->st->fs;
	fuse_req_interrupt_func(w->req, on_interrupt, w); /* may call on_interrupt at once */
	pthread_mutex_lock(&fs->mu);
	int e = w->interrupted ? -EINTR : take(w);
	if (e == -EAGAIN) {
		w->state = WAIT_PARKED;
		w->as_writer = store_wants_write(w->st, w->want);
		enqueue(&w->st->waiters, w);
		fsm_wait_begin(&w->st->fsm, w->as_writer);
		w->st->lock_waits++;
		store_notify(w->st);
		if (w->has_deadline)
			pthread_cond_broadcast(&fs->wait_cv); /* the waiter thread keeps the time */
		pthread_mutex_unlock(&fs->mu);
		return;
	}
	finish(w, e);
	pthread_mutex_unlock(&fs->mu);
	fuse_req_interrupt_func(w->req, NULL, NULL);
	reply(w);
}

/* A grant can release a lock (an open whose file went meanwhile), which asks for
 * another walk: that one runs after this one, not inside it. */
void wait_grant(struct store *st)
{
	struct fs *fs = st->fs;
	if (st->granting) {
		st->regrant = true;
		return;
	}
	st->granting = true;
	do {
		st->regrant = false;
		for (struct fs_waiter *w = st->waiters, *next; w; w = next) {
			next = w->next;
			/* Its own count is not in the way of its own try. */
			fsm_wait_end(&st->fsm, w->as_writer);
			int e = take(w);
			fsm_wait_begin(&st->fsm, w->as_writer);
			if (e == -EAGAIN)
				continue;
			finish(w, e);
			hand_over(fs, w);
		}
	} while (st->regrant);
	st->granting = false;
}

static bool due(const struct timespec *now, const struct timespec *t)
{
	return now->tv_sec > t->tv_sec || (now->tv_sec == t->tv_sec && now->tv_nsec >= t->tv_nsec);
}

/* Time out what is due; the earliest deadline left, or none.  fs->mu held.  A timeout
 * changes queues (a writer that gives up lets readers in): scan again after each. */
static bool expire(struct fs *fs, struct timespec *next)
{
	struct timespec now;
	clock_gettime(CLOCK_MONOTONIC, &now);
	bool any;
	do {
		any = false;
		for (size_t i = 0; i < fs->nstores && !any; i++)
			for (struct fs_waiter *w = fs->stores[i]->waiters; w && !any; w = w->next)
				if (w->has_deadline && due(&now, &w->deadline)) {
					finish(w, -ETIMEDOUT);
					hand_over(fs, w);
					any = true;
				}
	} while (any);
	for (size_t i = 0; i < fs->nstores; i++)
		for (struct fs_waiter *w = fs->stores[i]->waiters; w; w = w->next)
			if (w->has_deadline && (!any || !due(&w->deadline, next))) {
				*next = w->deadline;
				any = true;
			}
	return any;
}

static void *wait_main(void *arg)
{
	struct fs *fs = arg;
	pthread_mutex_lock(&fs->mu);
	while (!fs->wait_stop || fs->replies) {
		while (fs->replies) {
			struct fs_waiter *w = fs->replies;
			fs->replies = w->next;
			pthread_mutex_unlock(&fs->mu);
			fuse_req_interrupt_func(w->req, NULL, NULL); /* waits out a callback in flight */
			reply(w);
			pthread_mutex_lock(&fs->mu);
		}
		struct timespec next;
		if (fs->wait_stop)
			break;
		if (expire(fs, &next))
			pthread_cond_timedwait(&fs->wait_cv, &fs->mu, &next);
		else if (!fs->replies)
			pthread_cond_wait(&fs->wait_cv, &fs->mu);
	}
	pthread_mutex_unlock(&fs->mu);
	return NULL;
}

int wait_start(struct fs *fs)
{
	pthread_condattr_t a;
	pthread_condattr_init(&a);
	pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
	pthread_cond_init(&fs->wait_cv, &a);
	pthread_condattr_destroy(&a);
	return pthread_create(&fs->wait_thread, NULL, wait_main, fs) ? -EAGAIN : 0;
}

void wait_stop(struct fs *fs)
{
	pthread_mutex_lock(&fs->mu);
	for (size_t i = 0; i < fs->nstores; i++)
		while (fs->stores[i]->waiters) {
			struct fs_waiter *w = fs->stores[i]->waiters;
			finish(w, -EINTR);
			hand_over(fs, w);
		}
	fs->wait_stop = true;
	pthread_cond_broadcast(&fs->wait_cv);
	pthread_mutex_unlock(&fs->mu);
	pthread_join(fs->wait_thread, NULL);
	pthread_cond_destroy(&fs->wait_cv);
}

void wait_deadline(struct fs_waiter *w, int timeout_ms)
{
	w->has_deadline = timeout_ms > 0;
	if (!w->has_deadline)
		return;
	clock_gettime(CLOCK_MONOTONIC, &w->deadline);
	w->deadline.tv_sec += timeout_ms / 1000;
	w->deadline.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
	if (w->deadline.tv_nsec >= 1000000000L) {
		w->deadline.tv_sec++;
		w->deadline.tv_nsec -= 1000000000L;
	}
}
