/* test_release: the releaser thread (src/vmm/vmm_release.c) and a backend's settle: called
 * once the queue has stayed empty SETTLE_MS (100 ms) after a release, never while releases
 * keep coming, once a burst, not after the end, not for a backend without one; a release
 * queued meanwhile runs at once. */
#include "vmm_internal.h"
#include "clock.h"
#include "tap.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <time.h>
#include <unistd.h>

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static int settles, ran;
static uint64_t settled_at, ran_at;

static void settle(struct vmm *v)
{
	(void)v;
	pthread_mutex_lock(&mu);
	settles++;
	settled_at = clock_mono_ns();
	pthread_cond_broadcast(&cv);
	pthread_mutex_unlock(&mu);
}

static void job(void *arg)
{
	(void)arg;
	pthread_mutex_lock(&mu);
	ran++;
	ran_at = clock_mono_ns();
	pthread_cond_broadcast(&cv);
	pthread_mutex_unlock(&mu);
}

/* Waits until *count reaches want, at most ms: whether it did. */
static int wait_for(int *count, int want, long ms)
{
	struct timespec until = clock_after_ms(CLOCK_REALTIME, ms);
	pthread_mutex_lock(&mu);
	while (*count < want && pthread_cond_timedwait(&cv, &mu, &until) == 0)
		;
	int got = *count >= want;
	pthread_mutex_unlock(&mu);
	return got;
}

static int count(int *c)
{
	pthread_mutex_lock(&mu);
	int n = *c;
	pthread_mutex_unlock(&mu);
	return n;
}

static void reset(void)
{
	pthread_mutex_lock(&mu);
	settles = ran = 0;
	pthread_mutex_unlock(&mu);
}

int main(void)
{
	static const struct vmm_ops with = { .name = "test", .settle = settle }, without = { .name = "test" };
	struct vmm v = { .ops = &with };
	ok(!vmm_release_open(&v), "the releaser opens");

	uint64_t t0 = clock_mono_ns();
	vmm_release_later(&v, job, NULL);
	ok(wait_for(&settles, 1, 5000), "a release, then a quiet queue: the backend settles");
	ok(settled_at - ran_at >= 100000000ull, "no sooner than 100 ms after the release (%.1f ms)",
	   (settled_at - ran_at) / 1e6);
	ok(count(&settles) && settled_at - t0 < 2000000000ull, "and not much later (%.1f ms after it was queued)",
	   count(&settles) ? (settled_at - t0) / 1e6 : -1.0);
	ok(!wait_for(&settles, 2, 300), "once: nothing released since, no second settle");

	reset();
	t0 = clock_mono_ns();
	for (int i = 0; i < 8; i++) { /* a release every 40 ms: never 100 ms of quiet */
		vmm_release_later(&v, job, NULL);
		wait_for(&ran, i + 1, 5000);
		usleep(40000);
	}
	int during = count(&settles);
	uint64_t last = ran_at;
	is_int(during, 0, "releases 40 ms apart: no settle while they come");
	ok(wait_for(&settles, 1, 5000), "then one, after the last");
	ok(settled_at - last >= 100000000ull, "100 ms or more after the last release (%.1f ms)", (settled_at - last) / 1e6);
	ok(!wait_for(&settles, 2, 300), "one for the whole burst");

	reset();
	vmm_release_later(&v, job, NULL);
	wait_for(&ran, 1, 5000);
	usleep(50000); /* the releaser waits for quiet now */
	t0 = clock_mono_ns();
	vmm_release_later(&v, job, NULL);
	ok(wait_for(&ran, 2, 5000) && ran_at - t0 < 50000000ull,
	   "a release queued while the releaser waits to settle runs at once (%.1f ms)", (ran_at - t0) / 1e6);
	ok(wait_for(&settles, 1, 5000) && settled_at - ran_at >= 100000000ull, "and the settle waits for quiet again");

	reset();
	vmm_release_later(&v, job, NULL);
	wait_for(&ran, 1, 5000);
	t0 = clock_mono_ns();
	vmm_release_close(&v);
	ok(clock_mono_ns() - t0 < 1000000000ull, "the end during the wait for quiet: joined at once (%.1f ms)",
	   (clock_mono_ns() - t0) / 1e6);
	is_int(count(&settles), 0, "and no settle at the end");

	struct vmm w = { .ops = &without };
	ok(!vmm_release_open(&w), "a backend without settle: the releaser opens");
	reset();
	vmm_release_later(&w, job, NULL);
	ok(wait_for(&ran, 1, 5000), "its release runs");
	vmm_release_close(&w);
	is_int(count(&settles), 0, "nothing settles");

	struct vmm h = { .ops = &with };
	ok(!vmm_release_open(&h), "again with settle");
	reset();
	vmm_release_later(&h, job, NULL);
	wait_for(&ran, 1, 5000);
	usleep(60000); /* the releaser waits for quiet now */
	vmm_release_later(&h, job, NULL);
	vmm_released(&h); /* run here (as a create helps), or by the thread: either counts */
	is_int(count(&ran), 2, "vmm_released: the release done before it returns");
	ok(wait_for(&settles, 1, 5000), "a release run by the one that waited for it is settled after too");
	ok(settled_at - ran_at >= 100000000ull, "100 ms or more after that release, not after the one before (%.1f ms)",
	   (settled_at - ran_at) / 1e6);
	vmm_release_close(&h);
	return tap_done();
}
