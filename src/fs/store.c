/* store: the table of stores, and a store's life (store.h).  Its lock is lock.c's.
 * Everything here runs with fs->mu held and never sleeps. */
#include "store.h"
#include "fault.h"
#include "inval.h"
#include "grow.h"
#include "why.h"

#include <assert.h>
#include <stdarg.h>

#include <errno.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* meta's hook: an allocation's memory is no longer in the layout or its undo log. */
static void release_buf(void *buf, void *ctx)
{
	store_give_back(ctx, buf);
}

int store_table_new(struct fs *fs)
{
	return (fs->stores = calloc(1, sizeof *fs->stores)) ? 0 : -ENOMEM;
}

/* At the end: handles whose release never came (a client closed just before the unmount,
 * or still held them) go with their store; nothing is given back to anyone.  The
 * export's record of a handle is its own (the export's list went with the export). */
static void forget_handles(struct store *st)
{
	while (st->handles.next != &st->handles) {
		struct fs_handle *h = st->handles.next;
		store_untrack(h);
		if (h->ph)
			fuse_pollhandle_destroy(h->ph);
		if (h->node)
			meta_drop(h->node);
		free(h->listing); /* its lookups go with the graveyard */
		free(h->x);
		free(h->text);
		free(h);
	}
}

/* A store's versions (version.c's lists) go with its layout. */
static void versions_release(struct store_versions *v)
{
	for (size_t i = 0; i < v->nnext; i++)
		vmm_buf_put(v->next[i].buf), meta_drop(v->next[i].node);
	for (size_t i = 0; i < v->nprev; i++)
		vmm_buf_put(v->prev[i].buf), meta_drop(v->prev[i].node);
	free(v->next);
	free(v->prev);
	v->next = v->prev = NULL;
	v->nnext = v->cap_next = v->nprev = v->cap_prev = 0;
	v->prev_handles = 0;
}

static void store_free(struct store *st)
{
	versions_release(&st->versions);
	meta_store_free(st->meta);
	/* Its image went at rmdir, or the daemon ends (keep hands nothing back then). */
	vmm_bufs_release(&st->limbo);
	if (st->fs->persist)
		st->fs->persist->forget(st);
	store_lock_end(st);
	vmm_pool_put(st->pool);
	free(st->name);
	free(st);
}

void store_table_free(struct fs *fs)
{
	struct store_table *t = fs->stores;
	if (!t)
		return;
	pthread_mutex_lock(&fs->mu);
	while (t->n) {
		struct store *st = t->v[--t->n];
		/* The session is gone: no kernel reference or handle is left to honour. */
		meta_root(st->meta, META_AREA_ALLOCS)->lookups = 0;
		meta_root(st->meta, META_AREA_META)->lookups = 0;
		forget_handles(st);
		store_free(st);
	}
	while (t->nremoved) { /* no forget comes after the unmount */
		forget_handles(t->removed[t->nremoved - 1]);
		store_free(t->removed[--t->nremoved]);
	}
	free(t->v);
	free(t->removed);
	free(t);
	fs->stores = NULL;
	meta_graveyard_free(&fs->grave);
	pthread_mutex_unlock(&fs->mu);
}

int store_create(struct fs *fs, const char *name, struct store **out)
{
	struct store_table *t = fs->stores;
	if (strlen(name) > 255)
		return -ENAMETOOLONG;
	if (!meta_name_valid(name))
		return -EINVAL;
	for (const unsigned char *c = (const unsigned char *)name; *c; c++)
		if (*c < 0x20 || *c == 0x7f)
			return -EINVAL; /* a newline would split gmsfsctl list's and state's lines */
	if (store_find(fs, name))
		return -EEXIST;
	if (fs->handing_over)
		return -EAGAIN; /* the successor would not have it */
	if (GROW(t->v, t->n, t->cap, 8))
		return -ENOMEM;
	struct store *st = calloc(1, sizeof *st);
	int e = -ENOMEM;
	if (!st || !(st->name = strdup(name)) || !(st->meta = meta_store_new(release_buf, st)) ||
	    (e = vmm_pool_new(fs->vmm, &st->pool))) {
		if (st) {
			meta_store_free(st->meta);
			free(st->name);
		}
		free(st);
		return e;
	}
	st->fs = fs;
	st->refs = 1;
	st->versions.allowed = 1;
	store_tier_used(&st->tier);
	meta_set_graveyard(st->meta, &fs->grave);
	inval_watch(fs, st->meta);
	st->dir = (struct fs_node){ FS_NODE_MAGIC, FS_STORE, st };
	for (int i = 0; i < FS_STORE_FILES; i++)
		st->files[i] = (struct fs_node){ FS_NODE_MAGIC, FS_LOCK + i, st };
	st->handles.next = st->handles.prev = &st->handles;
	t->v[t->n++] = st;
	*out = st;
	return 0;
}

struct store *store_find(struct fs *fs, const char *name)
{
	struct store_table *t = fs->stores;
	for (size_t i = 0; i < t->n; i++)
		if (!strcmp(t->v[i]->name, name))
			return t->v[i];
	return NULL;
}

int store_remove(struct fs *fs, const char *name)
{
	struct store_table *t = fs->stores;
	if (fs->handing_over)
		return -EAGAIN; /* the successor has it */
	for (size_t i = 0; i < t->n; i++) {
		struct store *st = t->v[i];
		if (strcmp(st->name, name))
			continue;
		/* A writer session or a move keeps it; readers and waiters do not (Triton's
		 * unregister): the name goes now, the memory with the last reader. */
		int e = fsm_can_remove(&store_lock(st)->fsm);
		if (e || st->tier.at == TIER_TO_HOST || st->tier.at == TIER_TO_DEVICE)
			return e ? e : -EBUSY;
		if (GROW(t->removed, t->nremoved, t->removed_cap, 8))
			return -ENOMEM;
		/* Its image goes first: a crash from here on must not bring it back half freed. */
		const struct fs_persist *p = fs->persist;
		fault_point("rmdir", "image");
		if (p && (e = p->drop(st)))
			return e;
		fault_point("rmdir", "give");
		t->v[i] = t->v[--t->n];
		st->removed = true;
		t->removed[t->nremoved++] = st; /* until the kernel forgets it, or the daemon exits */
		if (store_lock(st)->fsm.readers || store_lock(st)->fsm.paused)
			fuse_log(FUSE_LOG_INFO, "gmsfs: %s removed; its memory goes when its %u readers leave\n", st->name,
				 store_readers(st));
		else
			store_free_layout(st);
		store_room_changed(fs);
		store_put(st, 1); /* the caller holds one: its waiters learn it is gone (lock_changed) */
		return 0;
	}
	return -ENOENT;
}

void store_free_layout(struct store *st)
{
	versions_release(&st->versions);
	meta_store_free(st->meta); /* frees the memory now; lookups may outlive it */
	st->meta = NULL;
	vmm_bufs_release(&st->limbo); /* its image is gone already (store_remove) */
	store_room_changed(st->fs);
	store_want_trim(st->fs); /* a big store's metadata goes back to the system, not to malloc's arenas */
	store_notify(st);
}

void store_get(struct store *st)
{
	st->refs++;
}

void store_put(struct store *st, unsigned n)
{
	assert(n <= st->refs); /* no more given back than taken (a forget's nlookup included) */
	st->refs -= n;
	if (st->refs)
		return;
	struct fs *fs = st->fs;
	struct store_table *t = fs->stores;
	for (size_t i = 0; st->removed && i < t->nremoved; i++)
		if (t->removed[i] == st) {
			t->removed[i] = t->removed[--t->nremoved];
			break;
		}
	store_free(st);
	store_want_trim(fs);
}

void store_want_trim(struct fs *fs)
{
	atomic_store(&fs->trim_wanted, true);
}

/* glibc's heap given back.  Not under AddressSanitizer: its allocator replaces glibc's,
 * whose arenas malloc_trim would walk for nothing, and doing so while another thread made
 * its arena crashed the daemon (SEGV in mtrim, the sanitizers' run of 25-waiting). */
static void trim_heap(void)
{
#if defined(__SANITIZE_ADDRESS__)
	return;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
	return;
#else
	malloc_trim(0);
#endif
#else
	malloc_trim(0);
#endif
}

void store_trim(struct fs *fs)
{
	/* A plain load first: every release and forget passes here, and is not worth a
	 * locked exchange. */
	if (atomic_load_explicit(&fs->trim_wanted, memory_order_relaxed) && atomic_exchange(&fs->trim_wanted, false))
		trim_heap();
}

void store_notify(struct store *st)
{
	st->events++;
	for (struct fs_handle *h = st->handles.next; st->pollers && h != &st->handles; h = h->next) {
		if (!h->ph)
			continue;
		fuse_lowlevel_notify_poll(h->ph);
		fuse_pollhandle_destroy(h->ph);
		h->ph = NULL;
		st->pollers--;
	}
}

void store_error(struct store *st, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	why_vfmt(st->last_error, sizeof st->last_error, 0, fmt, ap);
	va_end(ap);
	store_notify(st);
}

int store_cannot_tell(struct store *st, int e)
{
	if (e == -EMFILE || e == -ENFILE) {
		vmm_why(st->fs->vmm, e, st->last_error, sizeof st->last_error);
		fuse_log(FUSE_LOG_WARNING, "gmsfs: %s: %s\n", st->name, st->last_error);
		store_notify(st);
	}
	return e;
}

unsigned store_readers(const struct store *st)
{
	/* Out of memory the table may lack one: then at least the FSM says whether any. */
	size_t n = store_lock(st)->nreaders;
	return n ? (unsigned)n : store_lock(st)->fsm.readers ? 1 : 0;
}

void store_track(struct store *st, struct fs_handle *h)
{
	h->next = st->handles.next;
	h->prev = &st->handles;
	st->handles.next->prev = h;
	st->handles.next = h;
}

void store_untrack(struct fs_handle *h)
{
	if (!h->next)
		return;
	h->prev->next = h->next;
	h->next->prev = h->prev;
	h->next = h->prev = NULL;
}

int store_alloc_named(const struct store *st, const char *name, struct meta_node **out, char *why, size_t whylen)
{
	struct meta_node *n = meta_resolve(st->meta, META_AREA_ALLOCS, name);
	*out = n;
	if (!n || n->kind != META_ALLOC)
		return why_fmt(why, whylen, n ? -EISDIR : -ENOENT, "allocs/%s %s", name,
			       n ? "is a directory" : "does not exist");
	if (!n->buf)
		return why_fmt(why, whylen, -ENODATA, "allocs/%s was never sized", name);
	return 0;
}

/* ---- write-ahead, then give back ---- */

void store_give_back(struct store *st, struct vmm_buf *b)
{
	const struct fs_persist *p = st->fs->persist;
	if (!b)
		return;
	if (p && p->names(st, b)) {
		if (vmm_bufs_push(&st->limbo, b))
			fuse_log(FUSE_LOG_ERR, "gmsfs: %s: out of memory: %llu bytes an image names are kept until the "
					       "daemon ends\n", st->name, (unsigned long long)b->size);
		return;
	}
	vmm_buf_put(b);
}

int store_changed(struct store *st, const char *what)
{
	const struct fs_persist *p = st->fs->persist;
	fault_point(what, "image");
	int e = p ? p->save(st) : 0;
	if (e)
		return e;
	fault_point(what, "give");
	struct vmm_bufs waited = st->limbo;
	st->limbo = (struct vmm_bufs){0};
	for (size_t i = 0; i < waited.n; i++)
		store_give_back(st, waited.v[i]);
	free(waited.v);
	return 0;
}

void store_readers_changed(struct store *st)
{
	const struct fs_persist *p = st->fs->persist;
	if (p && !st->removed)
		p->readers(st);
}

void store_room_changed(struct fs *fs)
{
	fs->room_gen++;
	pthread_cond_signal(&fs->tier_wake);
}
