/* lane: see lane.h. */
#include "lane.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

struct ln {
	pthread_t t;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	ln_job job;         /* given and not yet taken; NULL: none */
	void *arg;
	bool quit;
	atomic_bool busy;   /* given and not yet done: the giver polls it while it moves bytes */
	int result;
	char why[512];
	void (*enter)(void *arg);
	void *enter_arg;
};

static void *lane(void *p)
{
	struct ln *l = p;
	if (l->enter)
		l->enter(l->enter_arg);
	pthread_mutex_lock(&l->mu);
	for (;;) {
		while (!l->job && !l->quit)
			pthread_cond_wait(&l->cv, &l->mu);
		if (!l->job)
			break;
		ln_job job = l->job;
		void *arg = l->arg;
		l->job = NULL;
		pthread_mutex_unlock(&l->mu);
		l->why[0] = '\0';
		l->result = job(arg, l->why, sizeof l->why);
		atomic_store_explicit(&l->busy, false, memory_order_release); /* result and why before it */
		pthread_mutex_lock(&l->mu);
	}
	pthread_mutex_unlock(&l->mu);
	return NULL;
}

int ln_start(struct ln **out, void (*enter)(void *arg), void *arg)
{
	struct ln *l = calloc(1, sizeof *l);
	if (!l)
		return -ENOMEM;
	pthread_mutex_init(&l->mu, NULL);
	pthread_cond_init(&l->cv, NULL);
	l->enter = enter, l->enter_arg = arg;
	int e = pthread_create(&l->t, NULL, lane, l);
	if (e) {
		pthread_cond_destroy(&l->cv);
		pthread_mutex_destroy(&l->mu);
		free(l);
		return -e;
	}
	*out = l;
	return 0;
}

void ln_give(struct ln *l, ln_job job, void *arg)
{
	atomic_store(&l->busy, true);
	pthread_mutex_lock(&l->mu);
	l->job = job, l->arg = arg;
	pthread_cond_signal(&l->cv);
	pthread_mutex_unlock(&l->mu);
}

int ln_wait(struct ln *l, struct nt_conn *c, char *err, size_t errlen)
{
	while (atomic_load_explicit(&l->busy, memory_order_acquire))
		if (c)
			nt_progress(c);
		else
			sched_yield();
	if (l->result && err)
		snprintf(err, errlen, "%s", l->why);
	int e = l->result;
	l->result = 0;
	return e;
}

void ln_stop(struct ln *l)
{
	if (!l)
		return;
	ln_wait(l, NULL, NULL, 0);
	pthread_mutex_lock(&l->mu);
	l->quit = true;
	pthread_cond_signal(&l->cv);
	pthread_mutex_unlock(&l->mu);
	pthread_join(l->t, NULL);
	pthread_cond_destroy(&l->cv);
	pthread_mutex_destroy(&l->mu);
	free(l);
}
