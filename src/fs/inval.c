/* inval: the kernel caches the layout's names and attributes (LAYOUT_TIMEOUT); what changes
 * them behind its back (the socket's calls, an abort, a writer that leaves without commit)
 * tells it here.  The meta layer reports each change to a node the kernel knows (lookups);
 * the change is queued under fs->mu and sent by a thread of its own, never from a FUSE
 * handler that may hold a lock the kernel needs for it (libfuse's rule for notify_inval).
 * inval_flush waits until what was queued has been sent: a socket call returns only once
 * the kernel has dropped what it made stale. */
#include "inval.h"
#include "grow.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

struct inval_item {
	fuse_ino_t parent, ino;
	char *name; /* NULL: the attributes only; else the name in parent is gone too */
};

/* The notifier's state, under fs->mu. */
struct inval {
	pthread_t thread;
	pthread_cond_t cv, done_cv;        /* something queued; something sent */
	struct inval_item *q;
	size_t n, cap;
	uint64_t queued, done;             /* how many were queued, and sent */
	bool stop;
};

/* meta's watcher, fs->mu held: n changed; gone: its name no longer leads to it. */
static void changed(struct meta_node *n, bool gone, void *ctx)
{
	struct fs *fs = ctx;
	struct inval *v = fs->inval;
	if (!v || v->stop)
		return; /* the daemon is ending: stores are freed after the mount is gone */
	fuse_ino_t ino = node_ino(fs, n);
	if (!gone && v->n && v->q[v->n - 1].ino == ino && !v->q[v->n - 1].name)
		return; /* a bulk call touches one directory many times: once is enough */
	if (GROW(v->q, v->n, v->cap, 64))
		return; /* out of memory: the timeout still bounds how long it stays stale */
	struct inval_item *it = &v->q[v->n];
	*it = (struct inval_item){ .ino = ino };
	if (gone && n->parent && !(it->name = strdup(n->name)))
		return;
	if (gone && n->parent)
		it->parent = node_ino(fs, n->parent);
	v->n++;
	v->queued++;
	pthread_cond_signal(&v->cv);
}

void inval_watch(struct fs *fs, struct meta_store *m)
{
	meta_set_watch(m, changed, fs);
}

static void *inval_main(void *arg)
{
	struct fs *fs = arg;
	struct inval *v = fs->inval;
	pthread_mutex_lock(&fs->mu);
	while (!v->stop) {
		if (!v->n) {
			pthread_cond_wait(&v->cv, &fs->mu);
			continue;
		}
		struct inval_item *q = v->q;
		size_t n = v->n;
		uint64_t upto = v->queued;
		v->q = NULL;
		v->n = v->cap = 0;
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
		v->done = upto;
		pthread_cond_broadcast(&v->done_cv);
	}
	v->done = v->queued; /* nobody waits past the end */
	pthread_cond_broadcast(&v->done_cv);
	pthread_mutex_unlock(&fs->mu);
	return NULL;
}

int inval_start(struct fs *fs)
{
	struct inval *v = calloc(1, sizeof *v);
	if (!v)
		return -ENOMEM;
	pthread_cond_init(&v->cv, NULL);
	pthread_cond_init(&v->done_cv, NULL);
	fs->inval = v;
	if (pthread_create(&v->thread, NULL, inval_main, fs)) {
		fs->inval = NULL;
		pthread_cond_destroy(&v->cv);
		pthread_cond_destroy(&v->done_cv);
		free(v);
		return -EAGAIN;
	}
	return 0;
}

void inval_flush(struct fs *fs)
{
	struct inval *v = fs->inval;
	pthread_mutex_lock(&fs->mu);
	uint64_t want = v->queued;
	while (v->done < want && !v->stop)
		pthread_cond_wait(&v->done_cv, &fs->mu);
	pthread_mutex_unlock(&fs->mu);
}

void inval_stop(struct fs *fs)
{
	struct inval *v = fs->inval;
	if (!v)
		return;
	pthread_mutex_lock(&fs->mu);
	v->stop = true;
	pthread_cond_broadcast(&v->cv);
	pthread_cond_broadcast(&v->done_cv);
	pthread_mutex_unlock(&fs->mu);
	pthread_join(v->thread, NULL);
	pthread_mutex_lock(&fs->mu);
	for (size_t i = 0; i < v->n; i++)
		free(v->q[i].name);
	free(v->q);
	v->q = NULL;
	v->n = v->cap = 0;
	pthread_mutex_unlock(&fs->mu);
}

void inval_free(struct fs *fs)
{
	struct inval *v = fs->inval;
	if (!v)
		return;
	fs->inval = NULL;
	pthread_cond_destroy(&v->cv);
	pthread_cond_destroy(&v->done_cv);
	free(v);
}
