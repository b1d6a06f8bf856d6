/* keep_disk: the state directory's writes, on a thread of their own (keep_disk.h).
 * One job at a time: the caller fills it under d->mu and waits on d->done for the
 * bound; the thread does it without the lock. */
#include "keep_disk.h"
#include "clock.h"

#include <errno.h>
#include <fcntl.h>
#include <fuse_log.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define KEEP_DISK_MS 1000
#define KEEP_DISK_MAX_MS 600000

enum disk_state { DISK_IDLE, DISK_ASKED, DISK_BUSY, DISK_DONE };

struct keep_disk {
	pthread_mutex_t mu;         /* everything below */
	pthread_cond_t asked, done;
	pthread_t thread;
	long bound_ms;
	bool stopping;
	void (*back)(void *arg);
	void *arg;
	/* The one job: */
	enum disk_state state;
	bool given_up;              /* its caller stopped waiting: the disk is stuck */
	bool unlink;                /* else a write */
	char path[4096], tmp[4096];
	void *data;
	size_t len;
	int result;
	uint64_t asked_ns;
};

static int write_whole(const char *path, const char *tmp, const void *data, size_t len)
{
	int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (fd < 0)
		return -errno;
	const char *p = data;
	while (len) {
		ssize_t n = write(fd, p, len);
		if (n <= 0) {
			int e = n ? -errno : -EIO;
			close(fd);
			unlink(tmp);
			return e;
		}
		p += n, len -= (size_t)n;
	}
	if (close(fd) || rename(tmp, path)) /* whole or not at all */
		return -errno;
	return 0;
}

static void *run(void *arg)
{
	struct keep_disk *d = arg;
	pthread_mutex_lock(&d->mu);
	for (;;) {
		while (d->state != DISK_ASKED && !d->stopping)
			pthread_cond_wait(&d->asked, &d->mu);
		if (d->state != DISK_ASKED)
			break;
		d->state = DISK_BUSY;
		pthread_mutex_unlock(&d->mu);
		int e = d->unlink ? (unlink(d->path) && errno != ENOENT ? -errno : 0)
				  : write_whole(d->path, d->tmp, d->data, d->len);
		pthread_mutex_lock(&d->mu);
		free(d->data);
		d->data = NULL;
		d->result = e;
		if (d->given_up) { /* nobody waits for it: the disk answers again */
			fuse_log(FUSE_LOG_WARNING, "gmsfs: keep: %s returned after %.1f s (%s)\n", d->path,
				 (double)(clock_mono_ns() - d->asked_ns) / 1e9, e ? strerror(-e) : "written");
			d->given_up = false;
			d->state = DISK_IDLE;
			pthread_mutex_unlock(&d->mu);
			d->back(d->arg);
			pthread_mutex_lock(&d->mu);
		} else {
			d->state = DISK_DONE;
			pthread_cond_broadcast(&d->done);
		}
	}
	pthread_mutex_unlock(&d->mu);
	return NULL;
}

struct keep_disk *keep_disk_start(void (*back)(void *arg), void *arg)
{
	struct keep_disk *d = calloc(1, sizeof *d);
	if (!d)
		return NULL;
	const char *env = getenv("GMSFS_KEEP_DISK_MS");
	char *end = NULL;
	long ms = env && *env ? strtol(env, &end, 10) : KEEP_DISK_MS;
	if (env && *env && (*end || ms < 1 || ms > KEEP_DISK_MAX_MS)) {
		fuse_log(FUSE_LOG_WARNING, "gmsfs: GMSFS_KEEP_DISK_MS=%s: not a number of milliseconds from 1 to %d: "
					   "%d it is\n", env, KEEP_DISK_MAX_MS, KEEP_DISK_MS);
		ms = KEEP_DISK_MS;
	}
	d->bound_ms = ms;
	d->back = back, d->arg = arg;
	pthread_mutex_init(&d->mu, NULL);
	pthread_condattr_t ca;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&d->done, &ca);
	pthread_condattr_destroy(&ca);
	pthread_cond_init(&d->asked, NULL);
	if (pthread_create(&d->thread, NULL, run, d)) {
		free(d);
		return NULL;
	}
	return d;
}

bool keep_disk_stop(struct keep_disk *d)
{
	if (!d)
		return true;
	pthread_mutex_lock(&d->mu);
	d->stopping = true;
	pthread_cond_signal(&d->asked);
	bool stuck = d->given_up;
	pthread_mutex_unlock(&d->mu);
	if (stuck) { /* in the kernel on a disk that does not answer: nothing would end it */
		fuse_log(FUSE_LOG_WARNING, "gmsfs: keep: a write to the state directory has not returned: left behind\n");
		pthread_detach(d->thread);
		return false;
	}
	pthread_join(d->thread, NULL);
	pthread_cond_destroy(&d->asked);
	pthread_cond_destroy(&d->done);
	pthread_mutex_destroy(&d->mu);
	free(d);
	return true;
}

/* The job asked, waited for the bound.  d->mu held by neither side on entry. */
static int ask(struct keep_disk *d, bool unlink, const char *path, const char *tmp, const void *data, size_t len)
{
	void *copy = NULL;
	if (len && !(copy = malloc(len)))
		return -ENOMEM;
	if (len)
		memcpy(copy, data, len);
	pthread_mutex_lock(&d->mu);
	if (d->given_up || d->state != DISK_IDLE) { /* stuck: nothing queues behind it */
		pthread_mutex_unlock(&d->mu);
		free(copy);
		return -ETIMEDOUT;
	}
	d->unlink = unlink;
	snprintf(d->path, sizeof d->path, "%s", path);
	snprintf(d->tmp, sizeof d->tmp, "%s", tmp ? tmp : "");
	d->data = copy;
	d->len = len;
	d->asked_ns = clock_mono_ns();
	d->state = DISK_ASKED;
	pthread_cond_signal(&d->asked);
	struct timespec until = clock_after_ms(CLOCK_MONOTONIC, d->bound_ms);
	while (d->state != DISK_DONE)
		if (pthread_cond_timedwait(&d->done, &d->mu, &until) == ETIMEDOUT && d->state != DISK_DONE)
			break;
	int e;
	if (d->state == DISK_DONE) {
		e = d->result;
		d->state = DISK_IDLE;
	} else {
		d->given_up = true;
		e = -ETIMEDOUT;
		fuse_log(FUSE_LOG_ERR, "gmsfs: keep: %s has not been written within %ld ms: the state directory does not "
				       "answer; the stores are served, and not kept across a restart until it does\n", path,
			 d->bound_ms);
	}
	pthread_mutex_unlock(&d->mu);
	return e;
}

int keep_disk_write(struct keep_disk *d, const char *path, const char *tmp, const void *data, size_t len)
{
	return ask(d, false, path, tmp, data, len);
}

int keep_disk_unlink(struct keep_disk *d, const char *path)
{
	return ask(d, true, path, NULL, NULL, 0);
}

bool keep_disk_stuck(struct keep_disk *d, char *why, size_t whylen)
{
	if (!d)
		return false;
	pthread_mutex_lock(&d->mu);
	bool stuck = d->given_up;
	if (stuck && why)
		snprintf(why, whylen, "the state directory does not answer: %s %s has not returned for %.0f s (a frozen or "
				      "hung file system)", d->unlink ? "removing" : "writing", d->path,
			 (double)(clock_mono_ns() - d->asked_ns) / 1e9);
	pthread_mutex_unlock(&d->mu);
	return stuck;
}
