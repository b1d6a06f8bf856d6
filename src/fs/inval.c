/* inval: the kernel caches the layout's names and attributes (LAYOUT_TIMEOUT); what changes
 * them behind its back (the socket's calls, an abort, a writer that leaves without commit)
 * tells it here.  The meta layer reports each change to a node the kernel knows (lookups);
 * the change is queued under fs->mu and sent by a thread of its own, never from a FUSE
 * handler that may hold a lock the kernel needs for it (libfuse's rule for notify_inval).
 * inval_flush waits until what was queued has been sent: a socket call returns only once
 * the kernel has dropped what it made stale. */
#include "fs.h"
#include "grow.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

struct inval_item {
	fuse_ino_t parent, ino;
	char *name; /* NULL: the attributes only; else the name in parent is gone too */
};

/* meta's watcher, fs->mu held: n changed; gone: its name no longer leads to it. */
static void changed(struct meta_node *n, bool gone, void *ctx)
{
	struct store *st = ctx;
	struct fs *fs = st->fs;
	if (fs->inval_stop)
		return; /* the daemon is ending: stores are freed after the mount is gone */
	fuse_ino_t ino = node_ino(fs, n);
	if (!gone && fs->inval_n && fs->inval_q[fs->inval_n - 1].ino == ino && !fs->inval_q[fs->inval_n - 1].name)
		return; /* a bulk call touches one directory many times: once is enough */
	if (GROW(fs->inval_q, fs->inval_n, fs->inval_cap, 64))
		return; /* out of memory: the timeout still bounds how long it stays stale */
	struct inval_item *it = &fs->inval_q[fs->inval_n];
	*it = (struct inval_item){ .ino = ino };
	if (gone && n->parent && !(it->name = strdup(n->name)))
		return;
	if (gone && n->parent)
		it->parent = node_ino(fs, n->parent);
	fs->inval_n++;
	fs->inval_queued++;
	pthread_cond_signal(&fs->inval_cv);
}

void inval_watch(struct store *st)
{
	meta_set_watch(st->meta, changed);
}

static void *inval_main(void *arg)
{
	struct fs *fs = arg;
	pthread_mutex_lock(&fs->mu);
	while (!fs->inval_stop) {
		if (!fs->inval_n) {
			pthread_cond_wait(&fs->inval_cv, &fs->mu);
			continue;
		}
		struct inval_item *q = fs->inval_q;
		size_t n = fs->inval_n;
		uint64_t upto = fs->inval_queued;
		fs->inval_q = NULL;
		fs->inval_n = fs->inval_cap = 0;
		pthread_mutex_unlock(&fs->mu);
		/* Errors are expected and harmless: the kernel may have forgotten the node. */
		for (size_t i = 0; i < n; i++) {
			if (q[i].name) {
				fuse_lowlevel_notify_inval_entry(fs->se, q[i].parent, q[i].name, strlen(q[i].name));
				free(q[i].name);
			}
			fuse_lowlevel_notify_inval_inode(fs->se, q[i].ino, 0, 0);
		}
		free(q);
		pthread_mutex_lock(&fs->mu);
		fs->inval_done = upto;
		pthread_cond_broadcast(&fs->inval_done_cv);
	}
	fs->inval_done = fs->inval_queued; /* nobody waits past the end */
	pthread_cond_broadcast(&fs->inval_done_cv);
	pthread_mutex_unlock(&fs->mu);
	return NULL;
}

int inval_start(struct fs *fs)
{
	pthread_cond_init(&fs->inval_cv, NULL);
	pthread_cond_init(&fs->inval_done_cv, NULL);
	return pthread_create(&fs->inval_thread, NULL, inval_main, fs) ? -EAGAIN : 0;
}

void inval_flush(struct fs *fs)
{
	pthread_mutex_lock(&fs->mu);
	uint64_t want = fs->inval_queued;
	while (fs->inval_done < want && !fs->inval_stop)
		pthread_cond_wait(&fs->inval_done_cv, &fs->mu);
	pthread_mutex_unlock(&fs->mu);
}

void inval_stop(struct fs *fs)
{
	pthread_mutex_lock(&fs->mu);
	fs->inval_stop = true;
	pthread_cond_broadcast(&fs->inval_cv);
	pthread_cond_broadcast(&fs->inval_done_cv);
	pthread_mutex_unlock(&fs->mu);
	pthread_join(fs->inval_thread, NULL);
	for (size_t i = 0; i < fs->inval_n; i++)
		free(fs->inval_q[i].name);
	free(fs->inval_q);
	fs->inval_q = NULL;
	fs->inval_n = fs->inval_cap = 0;
	pthread_cond_destroy(&fs->inval_cv);
	pthread_cond_destroy(&fs->inval_done_cv);
}
