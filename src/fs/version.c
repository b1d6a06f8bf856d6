/* version: a store's next version beside its readers, and the version before (version.h). */
#include "version.h"
#include "clock.h"
#include "grow.h"
#include "why.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static struct version_pair *find(struct version_pair *v, size_t n, const struct meta_node *node)
{
	for (size_t i = 0; i < n; i++)
		if (v[i].node == node)
			return &v[i];
	return NULL;
}

struct vmm_buf *version_buf(const struct store *st, const struct fs_handle *h, const struct meta_node *n)
{
	const struct store_versions *v = &st->versions;
	struct version_pair *p = NULL;
	if (h && h->hold == HOLD_SESSION && v->nnext)
		p = find(v->next, v->nnext, n);
	else if (h && h->on_prev && v->nprev)
		p = find(v->prev, v->nprev, n);
	return p ? p->buf : n->buf;
}

bool version_needs_copy(const struct store *st, const struct fs_handle *h, const struct meta_node *n)
{
	return version_beside(st) && h->hold == HOLD_SESSION && n->kind == META_ALLOC && n->buf && meta_committed(n) &&
	       !find(st->versions.next, st->versions.nnext, n);
}

/* The version before's memory is released this long after its last reader flipped or
 * left: that reader unmaps it next, and would otherwise drop the last reference and wait
 * while the driver frees it (10-15 ms for 16 GB on an H200, its flip's whole time). */
#define VERSION_RELEASE_AFTER_NS (20 * 1000000ull)

/* b's memory is no longer st's: each piece on its own, since an image names pieces;
 * released no sooner than after (CLOCK_MONOTONIC ns, 0: at once). */
static void give_back(struct store *st, struct vmm_buf *b, uint64_t after)
{
	for (size_t i = 0; i < vmm_npieces(b); i++)
		vmm_piece(b, i)->release_after = after;
	for (size_t i = 0; b->npieces && i < b->npieces; i++) {
		vmm_buf_get(b->pieces[i]);
		store_give_back(st, b->pieces[i]);
	}
	if (b->npieces)
		vmm_buf_put(b);
	else
		store_give_back(st, b);
}

static void pairs_release(struct store *st, struct version_pair *v, size_t n, uint64_t after)
{
	for (size_t i = 0; i < n; i++) {
		give_back(st, v[i].buf, after);
		meta_drop(v[i].node);
	}
	free(v);
}

/* The version before's memory goes: the same allocations' next version made ahead, as
 * spares of the store's pool once that memory is released (-o next_ahead; vmm.h,
 * vmm_spare_make_like_later), so that the next refit's copies are memory made already.
 * What others need is given up for them (spares are anyone's room). */
static void release_and_ahead(struct store *st, struct version_pair *v, size_t n, uint64_t after)
{
	struct vmm_buf **like = st->fs->next_ahead && !st->removed ? calloc(n + 1, sizeof *like) : NULL;
	size_t k = 0;
	for (size_t i = 0; like && i < n; i++)
		if (v[i].node->linked && v[i].node->buf) {
			like[k] = v[i].node->buf; /* the last commit's: its shape is the next copy's */
			vmm_buf_get(like[k++]);
		}
	pairs_release(st, v, n, after);
	if (k)
		vmm_spare_make_like_later(st->pool, like, k);
	vmm_release_all(like, k);
}

static int copy(struct store *st, const struct fs_handle *h, struct meta_node *const *nodes, size_t n, bool overwrite,
		char *why, size_t whylen);

/* todo's copies: their memory asked of the daemon's one door (room made as for any
 * allocation, the same errno and words for the same shortage), then each filled (but
 * where its writer overwrites it), fs->mu let go meanwhile (an allocation's memory does
 * not change in a data-only session).  fs->mu held on entry and return.  0, or -errno
 * with why, none made. */
static int copies(struct store *st, struct version_pair *todo, size_t k, bool overwrite, char *why, size_t whylen)
{
	struct fs *fs = st->fs;
	struct memory_ask *ask = calloc(k, sizeof *ask);
	char (*paths)[256] = calloc(k, sizeof *paths);
	struct vmm_buf **made = calloc(k, sizeof *made);
	if (!ask || !paths || !made) {
		free(ask), free(paths), free(made);
		return why_fmt(why, whylen, -ENOMEM, "out of memory");
	}
	for (size_t i = 0; i < k; i++) {
		meta_path(todo[i].node, paths[i], sizeof paths[i]);
		const struct vmm_buf *b = todo[i].node->buf;
		ask[i] = (struct memory_ask){ paths[i], b->size, b };
	}
	pthread_mutex_unlock(&fs->mu);
	char msg[600] = "", err[256] = "";
	int e = fs->make_memory(fs, st, ask, k, made, msg, sizeof msg);
	bool made_all = !e; /* all or none */
	size_t i = 0;
	for (; !e && !overwrite && i < k; i += !e)
		e = vmm_copy(todo[i].node->buf, made[i], err, sizeof err);
	pthread_mutex_lock(&fs->mu);
	if (e && made_all)
		why_fmt(why, whylen, e, "a copy of allocs/%s for the next version: %s", paths[i], err[0] ? err : strerror(-e));
	else if (e)
		why_fmt(why, whylen, e, "a copy for the next version: %s", msg);
	for (size_t j = 0; j < k; j++)
		if (e && made[j])
			vmm_buf_put(made[j]);
		else
			todo[j].buf = made[j];
	free(ask), free(paths), free(made);
	return e;
}

int version_copy(struct store *st, const struct fs_handle *h, struct meta_node *const *nodes, size_t n, bool overwrite,
		 char *why, size_t whylen)
{
	char msg[256];
	int e = copy(st, h, nodes, n, overwrite, msg, sizeof msg);
	if (e) {
		store_error(st, "%s", msg);
		snprintf(why ? why : msg, why ? whylen : sizeof msg, "%s", msg);
	}
	return e;
}

static int copy(struct store *st, const struct fs_handle *h, struct meta_node *const *nodes, size_t n, bool overwrite,
		char *why, size_t whylen)
{
	struct fs *fs = st->fs;
	struct store_versions *v = &st->versions;
	/* One copier at a time (the session's threads): the second waits for the first's. */
	while (v->copying) {
		pthread_mutex_unlock(&fs->mu);
		usleep(1000);
		pthread_mutex_lock(&fs->mu);
	}
	struct version_pair *todo = calloc(n ? n : 1, sizeof *todo);
	if (!todo)
		return why_fmt(why, whylen, -ENOMEM, "out of memory");
	size_t k = 0;
	for (size_t i = 0; i < n; i++) {
		bool twice = false;
		for (size_t j = 0; j < k && !twice; j++)
			twice = todo[j].node == nodes[i];
		if (twice || !version_needs_copy(st, h, nodes[i]))
			continue;
		meta_hold(nodes[i]);
		todo[k++].node = nodes[i];
	}
	uint64_t session = v->session;
	int e = 0;
	if (k) {
		v->copying = true;
		store_get(st);
		e = copies(st, todo, k, overwrite, why, whylen);
		v->copying = false;
		if (!e && (st->removed || v->session != session || !version_beside(st))) {
			e = why_fmt(why, whylen, -ENOLCK, "the session ended while its copies were made");
		}
		store_put(st, 1);
	}
	size_t i = 0;
	while (!e && i < k && !GROW(v->next, v->nnext, v->cap_next, 16)) {
		v->next[v->nnext++] = todo[i];
		v->copies++;
		v->overwrites += overwrite;
		v->copied_bytes += overwrite ? 0 : todo[i].buf->size;
		i++;
	}
	if (!e && i < k)
		e = why_fmt(why, whylen, -ENOMEM, "out of memory");
	for (; i < k; i++) { /* not kept: a failure, or no room in the list */
		if (todo[i].buf)
			vmm_buf_put(todo[i].buf);
		meta_drop(todo[i].node);
	}
	free(todo);
	return e;
}

struct nodes {
	struct meta_node **v;
	size_t n, cap;
};

static int add_alloc(struct meta_node *n, void *arg)
{
	struct nodes *l = arg;
	if (n->kind != META_ALLOC || !n->buf)
		return 0;
	int e = GROW(l->v, l->n, l->cap, 64);
	if (!e)
		l->v[l->n++] = n;
	return e;
}

int version_copy_named(struct store *st, const struct fs_handle *h, char *const *names, size_t n, bool overwrite,
		       char *why, size_t whylen)
{
	struct nodes l = {0};
	int e = 0;
	for (size_t i = 0; names && i < n && !e; i++) {
		/* A name that is not an allocation with memory: refused as the export refuses it,
		 * before any copy is made (a copy made unfilled must not outlive its request). */
		struct meta_node *m;
		if ((e = store_alloc_named(st, names[i], &m, why, why ? whylen : 0))) {
			free(l.v);
			return e;
		}
		e = add_alloc(m, &l);
	}
	if (!names)
		e = meta_walk(meta_root(st->meta, META_AREA_ALLOCS), add_alloc, &l);
	e = e ? why_fmt(why, why ? whylen : 0, e, "%s", strerror(-e)) : version_copy(st, h, l.v, l.n, overwrite, why, whylen);
	free(l.v);
	return e;
}

int version_prev(const struct store *st, const struct fs_handle *h, struct meta_node ***out, size_t *n)
{
	struct nodes l = {0};
	int e = 0;
	for (size_t i = 0; h->on_prev && i < st->versions.nprev && !e; i++)
		e = add_alloc(st->versions.prev[i].node, &l);
	*out = e ? (free(l.v), NULL) : l.v;
	*n = e ? 0 : l.n;
	return e;
}

void version_drop_next(struct store *st)
{
	struct store_versions *v = &st->versions;
	for (size_t i = 0; i < v->nnext; i++) {
		vmm_buf_put(v->next[i].buf); /* never in an image: it goes at once */
		meta_drop(v->next[i].node);
	}
	free(v->next);
	v->next = NULL;
	v->nnext = v->cap_next = 0;
	v->session++;
}

unsigned version_commit(struct store *st)
{
	struct store_versions *v = &st->versions;
	if (v->nprev) { /* held by nobody the daemon knows (readers from before a restart): it goes */
		pairs_release(st, v->prev, v->nprev, 0);
		v->prev = NULL;
		v->nprev = v->cap_prev = 0;
	}
	for (size_t i = 0; i < v->nnext; i++) {
		struct vmm_buf *b = v->next[i].node->buf, *c = v->next[i].buf;
		for (size_t p = 0; p < vmm_npieces(b); p++) {
			struct vmm_buf *bp = vmm_piece(b, p), *cp = vmm_piece(c, p);
			vmm_take(&bp, &cp, 1); /* the allocation takes the copy's memory; the copy holds the old */
		}
	}
	unsigned marked = 0;
	for (struct fs_handle *h = st->handles.next; h != &st->handles; h = h->next)
		if (h->hold == HOLD_READ || h->paused) { /* a paused one maps it too */
			h->on_prev = true;
			marked++;
		}
	if (marked) {
		v->prev = v->next, v->nprev = v->nnext, v->cap_prev = v->cap_next;
		v->prev_generation = store_lock(st)->fsm.generation;
	} else { /* (nothing made ahead here: the session's end, just after, drops its spares) */
		pairs_release(st, v->next, v->nnext, 0);
	}
	v->prev_handles = marked;
	v->next = NULL;
	v->nnext = v->cap_next = 0;
	v->session++;
	return marked;
}

bool version_leave(struct store *st, struct fs_handle *h)
{
	struct store_versions *v = &st->versions;
	if (!h->on_prev)
		return false;
	h->on_prev = false;
	if (!v->prev_handles || --v->prev_handles)
		return false;
	release_and_ahead(st, v->prev, v->nprev, clock_mono_ns() + VERSION_RELEASE_AFTER_NS);
	v->prev = NULL;
	v->nprev = v->cap_prev = 0;
	return true;
}
