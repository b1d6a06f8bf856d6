/* let_go: the read locks that a restarted daemon keeps for this process (gmsfs(5),
 * RESTART), given back.  A handle whose daemon is gone lets go at its release; where no
 * daemon serves the mount yet (the second between a crash and the restart), what it let
 * go of waits here and is said to the daemon at this process's next lock of that store,
 * on the directory the lock opened (a daemon that does not answer holds it no longer than
 * it holds the lock): else its successor would keep those holds for as long as the
 * process lives, and the process could never write the store again (a lock it asks for
 * would wait for itself).  A store removed meanwhile is held until the process ends. */
#include "internal.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

#define LG_MAX 64 /* pending entries kept: a process that loses more lets go when it ends */

struct lg_pending {
	char *dir;
	unsigned holds;
};

static pthread_mutex_t lg_mu = PTHREAD_MUTEX_INITIALIZER;
static struct lg_pending lg_list[LG_MAX];
static size_t lg_n;

/* holds LET_GOs on fd; those not taken because no daemon serves there (ENOTTY: a plain
 * directory, the mount not made again yet; ENOTCONN: a dead mount), to try again; 0 when
 * done (given, or none kept: ENOLCK). */
static unsigned let_go_on(int fd, const struct gmsfs_ioc *io, unsigned holds)
{
	for (; holds; holds--)
		if (ioctl(fd, GMSFS_IOC_LET_GO, io))
			break;
	int e = holds ? errno : 0;
	return e == ENOTTY || gm_gone(e) ? holds : 0;
}

/* The same through dir, opened here; a store removed since has no directory: the
 * mount's root names it by its layout hash. */
static unsigned give_back(const char *dir, const uint8_t *hash, bool has_hash, unsigned holds)
{
	struct gmsfs_ioc io = { .size = sizeof io };
	int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0 && errno == ENOENT && has_hash) {
		char root[4096];
		snprintf(root, sizeof root, "%s", dir);
		char *slash = strrchr(root, '/');
		if (slash && slash != root)
			*slash = '\0';
		fd = slash && slash != root ? open(root, O_RDONLY | O_DIRECTORY | O_CLOEXEC) : -1;
		memcpy(io.layout_hash, hash, sizeof io.layout_hash);
	}
	/* ENOENT: the mount not made again yet (or the store gone: then it waits in vain) */
	if (fd < 0)
		return gm_gone(errno) || errno == ENOENT ? holds : 0;
	holds = let_go_on(fd, &io, holds);
	close(fd);
	return holds;
}

/* Kept to try again (dir is the list's now); past LG_MAX, forgotten. */
static void keep(char *dir, unsigned holds)
{
	pthread_mutex_lock(&lg_mu);
	if (dir && lg_n < LG_MAX) {
		lg_list[lg_n++] = (struct lg_pending){ .dir = dir, .holds = holds };
		dir = NULL;
	}
	pthread_mutex_unlock(&lg_mu);
	free(dir);
}

void lg_let_go(const char *dir, const struct gmsfs_ioc *info, unsigned holds)
{
	unsigned left = holds ? give_back(dir, info->layout_hash, info->has_hash, holds) : 0;
	if (left)
		keep(strdup(dir), left);
}

void lg_retry(int fd, const char *dir)
{
	struct gmsfs_ioc io = { .size = sizeof io };
	for (;;) {
		struct lg_pending p = { 0 };
		pthread_mutex_lock(&lg_mu);
		for (size_t i = 0; i < lg_n && !p.dir; i++)
			if (!strcmp(lg_list[i].dir, dir)) {
				p = lg_list[i];
				lg_list[i] = lg_list[--lg_n];
			}
		pthread_mutex_unlock(&lg_mu);
		if (!p.dir)
			return;
		/* Out of the list while its ioctls go: a daemon that does not answer holds
		 * this thread, not the others' locks. */
		if ((p.holds = let_go_on(fd, &io, p.holds))) {
			keep(p.dir, p.holds);
			return;
		}
		free(p.dir);
	}
}
