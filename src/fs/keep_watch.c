/* keep_watch: persistence that cannot be off without saying so.  The service manager that
 * keeps the stores' descriptors (systemd, or gmsfs-keeper in a container) can go: a keeper
 * is killed and restarted by the kubelet, and what it held went with it, while this daemon
 * serves on.  Every KEEP_WATCH_MS this thread looks at the manager's socket: nobody bound
 * to it (a connect, no message), the stores are not kept (said in the log, status.json
 * and gmsfs_keep_armed); another file there (a new keeper binds it again at its start: told
 * by its inode and the time it was made, for a keeper back within a second may be given the
 * inode number of the one before),
 * or a manager back after a message that failed, and every store's image is written again
 * with every descriptor handed to it anew.  An abstract socket ("@name") has no file: a
 * manager back there is taken as a new one. */
#include "keep_internal.h"
#include "clock.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define KEEP_WATCH_MS 1000
#define KEEP_RETRY_MAX_S 30

/* fs->mu held: every store's image written again, each descriptor handed to the manager
 * anew (the old names forgotten first, where the old manager still listens).  0, or the
 * number of stores that failed. */
static size_t hand_all(struct fs *fs, struct keep *k)
{
	pthread_mutex_lock(&k->mu);
	for (size_t i = 0; i < k->nfds; i++) {
		if (k->fds[i].name[0])
			keep_remove_name(k, k->fds[i].name);
		k->fds[i] = (struct kept_fd){0};
	}
	for (size_t i = 0; i < k->npending; i++)
		keep_remove_name(k, k->pending[i].name);
	k->nkept = 0;
	k->npending = 0;
	k->armed = true; /* until a message fails below */
	k->gone = false;
	k->why[0] = '\0';
	pthread_mutex_unlock(&k->mu);
	size_t failed = keep_mark_service(k) != 0; /* the new manager's store is marked too */
	for (size_t i = 0; i < fs->stores->n; i++) {
		struct store *st = fs->stores->v[i];
		if (st->kept)
			keep_set_named(st->kept, NULL, 0);
		failed += keep_hooks.save(st) != 0;
	}
	return failed;
}

/* The state directory answers again: every store's image and readers written again
 * (what was asked while it did not answer was not written, or may have been). */
static void rewrite_all(struct fs *fs, struct keep *k)
{
	pthread_mutex_lock(&fs->mu);
	size_t failed = 0, n = fs->stores->n;
	for (size_t i = 0; i < n; i++) {
		struct store *st = fs->stores->v[i];
		if (keep_hooks.save(st))
			failed++;
		else
			keep_readers_file(st, true);
	}
	pthread_mutex_unlock(&fs->mu);
	if (failed)
		fuse_log(FUSE_LOG_WARNING, "gmsfs: keep: %s: %zu of %zu stores' images could not be written again\n", k->dir,
			 failed, n);
	else
		fuse_log(FUSE_LOG_WARNING, "gmsfs: keep: %s answers again: every store's image written again (%zu stores): "
					   "stores are kept across a restart again\n", k->dir, n);
}

void keep_watch_disk_back(void *arg)
{
	struct keep *k = arg;
	pthread_mutex_lock(&k->mu);
	k->disk_back = true;
	pthread_cond_signal(&k->wake);
	pthread_mutex_unlock(&k->mu);
}

/* k->mu held: the manager's socket file now; false where it is gone (or abstract). */
static bool same_file(const struct keep *k, const struct stat *s)
{
	return s->st_ino == k->sock_ino && s->st_dev == k->sock_dev && s->st_ctim.tv_sec == k->sock_ctime.tv_sec &&
	       s->st_ctim.tv_nsec == k->sock_ctime.tv_nsec;
}

static void remember(struct keep *k, const struct stat *s)
{
	k->sock_dev = s->st_dev, k->sock_ino = s->st_ino, k->sock_ctime = s->st_ctim;
}

static bool sock_file(struct keep *k, struct stat *s)
{
	return k->addr.sun_path[0] && !stat(k->addr.sun_path, s) && S_ISSOCK(s->st_mode);
}

/* Whether somebody is bound to the manager's socket: a connect, no message (a keeper
 * killed leaves its file: ECONNREFUSED).  0 or -errno. */
static int sock_alive(const struct keep *k)
{
	int c = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	int e = c < 0 || connect(c, (const struct sockaddr *)&k->addr, k->alen) ? -errno : 0;
	if (c >= 0)
		close(c);
	return e;
}

static void *watch(void *arg)
{
	struct fs *fs = arg;
	struct keep *k = fs->keep;
	pthread_mutex_lock(&k->mu);
	while (!k->stopping) {
		struct timespec t = clock_after_ms(CLOCK_REALTIME, KEEP_WATCH_MS);
		pthread_cond_timedwait(&k->wake, &k->mu, &t);
		struct stat s;
		bool there = sock_file(k, &s), other = there && !same_file(k, &s);
		int dead = sock_alive(k);
		if (k->stopping)
			break;
		if (k->disk_back) {
			k->disk_back = false;
			k->retry_in_s = 0; /* a manager to hand everything to anew was waiting for the disk */
			if (k->armed) {
				pthread_mutex_unlock(&k->mu); /* keep never takes fs->mu under its own */
				rewrite_all(fs, k);
				pthread_mutex_lock(&k->mu);
				continue;
			}
		}
		if (keep_disk_stuck(k->disk, NULL, 0))
			continue; /* names handed anew need images that say them */
		if (dead) {
			k->gone = true;
			if (k->armed)
				keep_broken(k, "the service manager's socket %s%s does not answer: %s", k->addr.sun_path[0] ? "" : "@",
					    k->addr.sun_path + !k->addr.sun_path[0], strerror(-dead));
			continue;
		}
		if (!other && (k->armed || (k->retry_in_s && --k->retry_in_s)))
			continue;
		pthread_mutex_unlock(&k->mu); /* keep never takes fs->mu under its own */
		pthread_mutex_lock(&fs->mu);
		size_t failed = hand_all(fs, k);
		size_t n = fs->stores->n;
		pthread_mutex_unlock(&fs->mu);
		pthread_mutex_lock(&k->mu);
		if (other) {
			remember(k, &s);
			k->retry_s = 0;
		}
		if (failed || !k->armed) {
			k->retry_s = k->retry_s ? (2 * k->retry_s > KEEP_RETRY_MAX_S ? KEEP_RETRY_MAX_S : 2 * k->retry_s) : 1;
			k->retry_in_s = k->retry_s;
			if (k->armed)
				keep_broken(k, "%zu of %zu stores could not be handed to the service manager", failed, n);
		} else {
			k->retry_s = k->retry_in_s = 0;
			fuse_log(FUSE_LOG_WARNING, "gmsfs: keep: %s: every store handed to the service manager again (%zu "
						   "stores, %u descriptors): stores are kept across a restart again\n",
				 other ? "a new service manager" : "after a failure", n, k->nkept);
		}
	}
	pthread_mutex_unlock(&k->mu);
	return NULL;
}

int keep_watch_start(struct fs *fs)
{
	struct keep *k = fs->keep;
	struct stat s;
	pthread_cond_init(&k->wake, NULL);
	if (sock_file(k, &s))
		remember(k, &s);
	int e = pthread_create(&k->watch, NULL, watch, fs);
	k->watching = !e;
	return -e;
}

void keep_watch_stop(struct fs *fs)
{
	struct keep *k = fs->keep;
	if (!k || !k->watching)
		return;
	pthread_mutex_lock(&k->mu);
	k->stopping = true;
	pthread_cond_signal(&k->wake);
	pthread_mutex_unlock(&k->mu);
	pthread_join(k->watch, NULL);
	k->watching = false;
}
