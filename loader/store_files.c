/* store_files: see store_files.h. */
#include "store_files.h"

#include <gmsfs/abi.h>

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

/* A text file of the mount read by a thread of its own, given SF_READ_MS: a daemon that
 * is stopped or stuck holds that thread in the kernel, not the tool (it is left behind, and
 * frees what it holds once the daemon answers). */
struct sf_read {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	char path[4096], text[16384];
	int e;
	bool done, abandoned;
};

static void *sf_reader(void *arg)
{
	struct sf_read *r = arg;
	int fd = open(r->path, O_RDONLY | O_CLOEXEC), e = fd < 0 ? -errno : 0;
	size_t got = 0;
	for (ssize_t n = 1; !e && n > 0 && got < sizeof r->text - 1; got += n > 0 ? (size_t)n : 0)
		if ((n = read(fd, r->text + got, sizeof r->text - 1 - got)) < 0)
			e = -errno;
	if (fd >= 0)
		close(fd);
	pthread_mutex_lock(&r->mu);
	r->text[got] = '\0';
	r->e = e;
	r->done = true;
	bool late = r->abandoned;
	pthread_cond_signal(&r->cv);
	pthread_mutex_unlock(&r->mu);
	if (late)
		free(r);
	return NULL;
}

/* path's text into a new sf_read (the caller frees it), or -errno; -ETIMEDOUT when the
 * daemon did not answer within ms. */
static int sf_read_within(const char *path, struct sf_read **out, int ms)
{
	struct sf_read *r = calloc(1, sizeof *r);
	pthread_t t;
	pthread_attr_t attr;
	if (!r || pthread_attr_init(&attr)) {
		free(r);
		return -ENOMEM;
	}
	snprintf(r->path, sizeof r->path, "%s", path);
	pthread_mutex_init(&r->mu, NULL);
	pthread_cond_init(&r->cv, NULL);
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	int started = !pthread_create(&t, &attr, sf_reader, r);
	pthread_attr_destroy(&attr);
	if (!started) {
		sf_reader(r); /* no thread to spare: read here, unbounded */
	} else {
		struct timespec end;
		clock_gettime(CLOCK_REALTIME, &end);
		end.tv_sec += ms / 1000;
		end.tv_nsec += (long)(ms % 1000) * 1000000;
		if (end.tv_nsec >= 1000000000)
			end.tv_sec++, end.tv_nsec -= 1000000000;
		pthread_mutex_lock(&r->mu);
		while (!r->done && pthread_cond_timedwait(&r->cv, &r->mu, &end) != ETIMEDOUT)
			;
		bool done = r->done;
		r->abandoned = !done;
		pthread_mutex_unlock(&r->mu);
		if (!done)
			return -ETIMEDOUT; /* the reader frees it */
	}
	int e = r->e;
	if (e)
		free(r);
	else
		*out = r;
	return e;
}

int sf_field(const char *store, const char *name, const char *key, char *out, size_t len)
{
	return sf_field_within(store, name, key, out, len, SF_READ_MS);
}

int sf_field_within(const char *store, const char *name, const char *key, char *out, size_t len, int ms)
{
	char path[4096];
	snprintf(path, sizeof path, "%s/%s", store, name);
	struct sf_read *r = NULL;
	int e = sf_read_within(path, &r, ms);
	if (e)
		return e;
	size_t klen = strlen(key);
	e = -ENOENT;
	for (char *line = r->text; line && *line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL)
		if (!strncmp(line, key, klen) && line[klen] == ':' && line[klen + 1] == ' ') {
			snprintf(out, len, "%.*s", (int)strcspn(line + klen + 2, "\n"), line + klen + 2);
			e = 0;
			break;
		}
	free(r);
	return e;
}

long sf_allocations(const char *store)
{
	char v[32], *end;
	if (sf_field(store, "state", "allocations", v, sizeof v))
		return -1;
	long n = strtol(v, &end, 10);
	return *end || end == v ? -1 : n;
}

int sf_mkdir(const char *dir)
{
	return mkdir(dir, 0700) && errno != EEXIST ? -errno : 0;
}

static int made(const char *path, int trunc)
{
	char dir[4096];
	const char *slash = strrchr(path, '/');
	snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash - path) : 1, slash ? path : ".");
	struct stat d, f;
	if (stat(dir[0] ? dir : "/", &d))
		return -errno;
	mode_t mode = d.st_mode & 0666;
	int fd = open(path, O_WRONLY | O_CREAT | trunc | O_CLOEXEC, mode);
	if (fd < 0)
		return -errno;
	if (!fstat(fd, &f) && (f.st_mode & 0777 & ~mode) && fchmod(fd, f.st_mode & mode)) {
		int e = -errno;
		close(fd);
		return e;
	}
	return fd;
}

int sf_create(const char *path)
{
	return made(path, O_TRUNC);
}

int sf_overwrite(const char *path)
{
	return made(path, 0);
}

FILE *sf_fcreate(const char *path)
{
	int fd = sf_create(path);
	FILE *f = fd < 0 ? NULL : fdopen(fd, "w");
	if (fd < 0)
		errno = -fd;
	else if (!f)
		close(fd);
	return f;
}

int sf_set_content_hash(const char *store, unsigned long long gen, const char *hex)
{
	char value[64];
	snprintf(value, sizeof value, "%llu %s", gen, hex);
	return setxattr(store, GMSFS_XATTR_CONTENT, value, strlen(value), 0) ? -errno : 0;
}
