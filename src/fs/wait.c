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
#include "wait.h"
#include "clock.h"
#include "caller.h"
#include "store.h"

#include <assert.h>
#include <errno.h>
#include <stdlib.h>
#include <time.h>

/* The waiter thread's state, under fs->mu. */
struct waitq {
	pthread_t thread;
	pthread_cond_t cv;             /* a reply to send, a new deadline, or the stop */
	struct fs_waiter *replies;     /* finished waiters, to reply to */
	struct timespec next_reap;     /* when to look for killed callers again */
	bool stop;
};

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
		dequeue(&st->lock.waiters, w);
		int ended = fsm_wait_end(&st->lock.fsm, w->as_writer);
		assert(ended == 0); /* a parked waiter is counted as waiting */
		(void)ended;
		store_notify(st);
		if (e && w->as_writer)
			lock_changed(st); /* a writer that stops waiting lets the readers it held back in */
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
	enqueue(&fs->wq->replies, w);
	pthread_cond_broadcast(&fs->wq->cv);
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
	return lock_take(w->st, w->want, w->h->tgid, &w->h->hold);
}

void wait_park(struct fs_waiter *w)
{
	struct fs *fs = w->st->fs;
	fuse_req_interrupt_func(w->req, on_interrupt, w); /* may call on_interrupt at once */
	pthread_mutex_lock(&fs->mu);
	int e = w->interrupted ? -EINTR : take(w);
	if (e == -EAGAIN) {
		w->state = WAIT_PARKED;
		w->as_writer = lock_waits_as_writer(w->st, w->want);
		enqueue(&w->st->lock.waiters, w);
		fsm_wait_begin(&w->st->lock.fsm, w->as_writer);
		w->st->lock.waits++;
		store_notify(w->st);
		if (w->has_deadline)
			pthread_cond_broadcast(&fs->wq->cv); /* the waiter thread keeps the time */
		pthread_mutex_unlock(&fs->mu);
		return;
	}
	finish(w, e);
	pthread_mutex_unlock(&fs->mu);
	fuse_req_interrupt_func(w->req, NULL, NULL);
	reply(w);
}

/* Whatever can be granted is granted (gmsfs(5), "Waiting"): each waiter is tried with
 * the mode it asked for, first come first, and counted again as what it would be now (a
 * RW_OR_RO waiter is a reader once something is committed, and must not hold the others
 * back as a writer).  A grant, or a waiter counted anew, can let others in: walk again
 * until a walk changes nothing.  A grant can also release a lock (an open whose file went
 * meanwhile), which asks for another walk: that one runs after this one, not inside it. */
static void wait_grant(struct store *st)
{
	struct fs *fs = st->fs;
	struct lock *l = &st->lock;
	if (l->granting) {
		l->regrant = true;
		return;
	}
	l->granting = true;
	do {
		l->regrant = false;
		for (struct fs_waiter *w = l->waiters, *next; w; w = next) {
			next = w->next;
			/* Its own count is not in the way of its own try. */
			fsm_wait_end(&l->fsm, w->as_writer);
			int e = take(w);
			if (e == -EAGAIN) {
				bool as_writer = lock_waits_as_writer(st, w->want);
				l->regrant |= as_writer != w->as_writer;
				w->as_writer = as_writer;
				fsm_wait_begin(&l->fsm, as_writer);
				continue;
			}
			fsm_wait_begin(&l->fsm, w->as_writer); /* finish counts it out */
			finish(w, e);
			hand_over(fs, w);
			l->regrant = true;
		}
	} while (l->regrant);
	l->granting = false;
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
		for (size_t i = 0; i < fs->stores->n && !any; i++)
			for (struct fs_waiter *w = fs->stores->v[i]->lock.waiters; w && !any; w = w->next)
				if (w->has_deadline && due(&now, &w->deadline)) {
					/* A store whose move in failed says so (last_error: why). */
					finish(w, w->st->lock.blocked ? w->st->lock.blocked : -ETIMEDOUT);
					hand_over(fs, w);
					any = true;
				}
	} while (any);
	for (size_t i = 0; i < fs->stores->n; i++)
		for (struct fs_waiter *w = fs->stores->v[i]->lock.waiters; w; w = w->next)
			if (w->has_deadline && (!any || !due(&w->deadline, next))) {
				*next = w->deadline;
				any = true;
			}
	return any;
}

/* A parked request whose caller was killed: its interrupt ends the wait (on_interrupt).
 * Should none come (seen about once in a few thousand kills, under valgrind), the
 * process would stay in the kernel for good, waiting for its answer: so each second the
 * waiter thread answers those of killed callers. */
static void reap_killed(struct fs *fs)
{
	for (size_t i = 0; i < fs->stores->n; i++)
		for (struct fs_waiter *w = fs->stores->v[i]->lock.waiters, *next; w; w = next) {
			next = w->next;
			if (!caller_killed(w->req))
				continue;
			fuse_log(FUSE_LOG_WARNING, "gmsfs: %s: pid %d was killed while waiting and no interrupt came: "
						   "answered\n", w->st->name, (int)fuse_req_ctx(w->req)->pid);
			finish(w, -EINTR);
			hand_over(fs, w);
			next = fs->stores->v[i]->lock.waiters; /* a grant may have changed the queue: again */
		}
}

/* Readers from before a restart hold their stores until they let go or end: those that
 * ended give them back (removed stores too, whose memory goes with them). */
static void reap_inherited(struct fs *fs)
{
	struct store_table *t = fs->stores;
	for (size_t i = 0; i < t->n; i++)
		if (t->v[i]->lock.inherited)
			lock_reap(t->v[i]);
	for (size_t i = 0; i < t->nremoved;) {
		struct store *st = t->removed[i];
		size_t had = t->nremoved;
		if (st->lock.inherited)
			lock_reap(st); /* may free st and take it off the list */
		i += t->nremoved == had;
	}
}

static void *wait_main(void *arg)
{
	struct fs *fs = arg;
	struct waitq *q = fs->wq;
	pthread_mutex_lock(&fs->mu);
	while (!q->stop || q->replies) {
		while (q->replies) {
			struct fs_waiter *w = q->replies;
			q->replies = w->next;
			pthread_mutex_unlock(&fs->mu);
			fuse_req_interrupt_func(w->req, NULL, NULL); /* waits out a callback in flight */
			reply(w);
			pthread_mutex_lock(&fs->mu);
		}
		struct timespec next, now;
		if (q->stop)
			break;
		bool timed = expire(fs, &next);
		clock_gettime(CLOCK_MONOTONIC, &now);
		if (due(&now, &q->next_reap)) {
			reap_killed(fs);
			reap_inherited(fs);
			q->next_reap = (struct timespec){ now.tv_sec + 1, now.tv_nsec };
		}
		if (q->replies)
			continue; /* what expire just timed out is replied to now, not at the next deadline */
		if (!timed || due(&next, &q->next_reap))
			next = q->next_reap; /* at least once a second */
		pthread_cond_timedwait(&q->cv, &fs->mu, &next);
	}
	pthread_mutex_unlock(&fs->mu);
	return NULL;
}

int wait_start(struct fs *fs)
{
	struct waitq *q = calloc(1, sizeof *q);
	if (!q)
		return -ENOMEM;
	pthread_condattr_t a;
	pthread_condattr_init(&a);
	pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
	pthread_cond_init(&q->cv, &a);
	pthread_condattr_destroy(&a);
	fs->wq = q;
	fs->grant_waiters = wait_grant;
	if (pthread_create(&q->thread, NULL, wait_main, fs)) {
		pthread_cond_destroy(&q->cv);
		free(q);
		fs->wq = NULL;
		return -EAGAIN;
	}
	return 0;
}

void wait_stop(struct fs *fs)
{
	struct waitq *q = fs->wq;
	if (!q)
		return;
	pthread_mutex_lock(&fs->mu);
	for (size_t i = 0; i < fs->stores->n; i++)
		while (fs->stores->v[i]->lock.waiters) {
			struct fs_waiter *w = fs->stores->v[i]->lock.waiters;
			finish(w, -EINTR);
			hand_over(fs, w);
		}
	q->stop = true;
	fs->grant_waiters = NULL; /* nobody waits any more */
	pthread_cond_broadcast(&q->cv);
	pthread_mutex_unlock(&fs->mu);
	pthread_join(q->thread, NULL);
	pthread_cond_destroy(&q->cv);
	free(q);
	fs->wq = NULL;
}

void wait_answer_all(struct fs *fs, int e)
{
	pthread_mutex_lock(&fs->mu);
	for (size_t i = 0; i < fs->stores->n; i++)
		while (fs->stores->v[i]->lock.waiters) {
			struct fs_waiter *w = fs->stores->v[i]->lock.waiters;
			finish(w, e);
			hand_over(fs, w);
		}
	/* The waiter thread sends them: a second at most, as its other replies. */
	for (int i = 0; i < 1000 && fs->wq->replies; i++) {
		pthread_mutex_unlock(&fs->mu);
		nanosleep(&(struct timespec){ 0, 1000000 }, NULL);
		pthread_mutex_lock(&fs->mu);
	}
	pthread_mutex_unlock(&fs->mu);
}

void wait_deadline(struct fs_waiter *w, int timeout_ms)
{
	w->has_deadline = timeout_ms > 0;
	if (!w->has_deadline)
		return;
	w->deadline = clock_after_ms(CLOCK_MONOTONIC, timeout_ms);
}

void wait_block(struct store *st, int e)
{
	st->lock.blocked = e;
}

void wait_unblock(struct store *st)
{
	st->lock.blocked = 0;
}
