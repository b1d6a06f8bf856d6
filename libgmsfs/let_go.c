/* let_go: the read locks that a restarted daemon keeps for this process (gmsfs(5),
 * RESTART), given back.  A handle whose daemon is gone lets go at its release; where no
 * daemon serves the mount yet (the second between a crash and the restart), what it let
 * go of waits here and is said to the daemon at this process's next lock of any store:
 * else its successor would keep those holds for as long as the process lives, and the
 * process could never write the store again (a lock it asks for would wait for itself). */
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
	uint8_t hash[GMSFS_HASH_LEN];
	bool has_hash;
	unsigned holds;
};

static pthread_mutex_t lg_mu = PTHREAD_MUTEX_INITIALIZER;
static struct lg_pending lg_list[LG_MAX];
static size_t lg_n;

/* Holds given back to the daemon serving dir now; the number it did not take because no
 * daemon serves there (to try again), 0 when done (given, or none kept: ENOLCK). */
static unsigned give_back(const char *dir, const uint8_t *hash, bool has_hash, unsigned holds)
{
	struct gmsfs_ioc io = { .size = sizeof io };
	int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0 && errno == ENOENT && has_hash) {
		/* A store removed since has no directory: the mount's root names it by its hash. */
		char root[4096];
		snprintf(root, sizeof root, "%s", dir);
		char *slash = strrchr(root, '/');
		if (slash && slash != root)
			*slash = '\0';
		fd = slash && slash != root ? open(root, O_RDONLY | O_DIRECTORY | O_CLOEXEC) : -1;
		memcpy(io.layout_hash, hash, sizeof io.layout_hash);
	}
	if (fd < 0)
		return errno == ENOTCONN || errno == ECONNABORTED ? holds : 0;
	for (; holds; holds--)
		if (ioctl(fd, GMSFS_IOC_LET_GO, &io))
			break;
	/* ENOTTY: a plain directory (the mount not made again yet); ENOTCONN: a dead mount. */
	int e = holds ? errno : 0;
	close(fd);
	return e == ENOTTY || e == ENOTCONN || e == ECONNABORTED ? holds : 0;
}

void lg_let_go(const char *dir, const struct gmsfs_ioc *info, unsigned holds)
{
	bool has_hash = info->has_hash;
	unsigned left = holds ? give_back(dir, info->layout_hash, has_hash, holds) : 0;
	if (!left)
		return;
	pthread_mutex_lock(&lg_mu);
	char *copy = lg_n < LG_MAX ? strdup(dir) : NULL;
	if (copy) {
		struct lg_pending *p = &lg_list[lg_n++];
		*p = (struct lg_pending){ .dir = copy, .has_hash = has_hash, .holds = left };
		memcpy(p->hash, info->layout_hash, sizeof p->hash);
	}
	pthread_mutex_unlock(&lg_mu);
}

void lg_retry(void)
{
	pthread_mutex_lock(&lg_mu);
	for (size_t i = 0; i < lg_n;) {
		struct lg_pending *p = &lg_list[i];
		if ((p->holds = give_back(p->dir, p->hash, p->has_hash, p->holds))) {
			i++;
			continue;
		}
		free(p->dir);
		*p = lg_list[--lg_n];
	}
	pthread_mutex_unlock(&lg_mu);
}
