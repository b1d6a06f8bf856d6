/* rpc: what a socket request does.  A ticket (REDEEM) buys one export; BIND ties the
 * connection to the ticket's handle, and later requests act through that handle: with
 * its lock, its view of the layout (the committed one for a reader, the session's for
 * the writer), and, to change anything, only if it holds the writer session and was
 * opened for writing.  Manifests go out in messages of at most RPC_FDS_PER_MSG
 * descriptors and GMSFS_MSG_MAX bytes; readers only ever get read-only descriptors. */
#include "export_internal.h"
#include "rpc_reply.h"
#include "../handover.h"
#include "../inval.h"
#include "../lock.h"
#include "../memory.h"
#include "../named.h"
#include "../log.h"
#include "../store.h"
#include "../version.h"
#include "clock.h"
#include "grow.h"
#include "why.h"
#include "wire.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int add_alloc(struct meta_node *n, void *arg)
{
	struct xset *s = arg;
	if (n->kind != META_ALLOC || !n->buf)
		return 0; /* directories, and allocations not sized yet: no memory to send */
	char path[GMSFS_PATH_MAX + 1];
	int e = meta_path(n, path, sizeof path);
	if (e || (e = GROW(s->a, s->na, s->cap_a, 64)))
		return e;
	struct xalloc *x = &s->a[s->na];
	*x = (struct xalloc){ .path = strdup(path), .tag = strdup(n->tag ? n->tag : "default"), .size = n->size,
			      .aligned = n->aligned, .buf = s->h ? version_buf(s->h->store, s->h, n) : n->buf };
	if (!x->path || !x->tag) {
		free(x->path);
		free(x->tag);
		return -ENOMEM;
	}
	vmm_buf_get(x->buf);
	s->na++;
	bool theirs = !s->read_only && meta_committed(n); /* the last commit's bytes, to a writer */
	x->ro = theirs && s->guard && !s->ask_in_place;
	/* Only memory handed out writable can be written: a writer's look at the metadata (no
	 * descriptors), or its read-only import, leaves the committed bytes as they are.  An
	 * ask without descriptors (CUDA's: the mapping it has can be made writable) counts. */
	s->in_place |= theirs && !x->ro && (s->fds || s->ask_in_place);
	return 0;
}

static int add_entry(struct meta_node *n, void *arg)
{
	struct xset *s = arg;
	if (n->kind != META_ENTRY)
		return 0;
	char key[GMSFS_PATH_MAX + 1];
	int e = meta_path(n, key, sizeof key);
	if (e || (e = GROW(s->e, s->ne, s->cap_e, 64)))
		return e;
	struct entry_rec *x = &s->e[s->ne];
	*x = (struct entry_rec){ .key = strdup(key), .alloc = strdup(n->alloc ? n->alloc : ""), .offset = n->offset,
				 .size = n->extent, .flags = n->flags, .value = malloc(n->value_len ? n->value_len : 1),
				 .value_len = n->value_len };
	if (!x->key || !x->alloc || !x->value) {
		free(x->key);
		free(x->alloc);
		free(x->value);
		return -ENOMEM;
	}
	if (n->value_len)
		memcpy(x->value, n->value, n->value_len);
	s->ne++;
	return 0;
}


/* ---- requests ---- */

/* Whether h's exports of the last commit's allocations go read-only: a plain writer's
 * session.  A data-only one asked to write in place by its mode; a kept one writes its
 * own layout (its engine's pages). */
static bool export_guarded(const struct fs_handle *h)
{
	const struct fsm *f = &store_lock(h->store)->fsm;
	return lock_writes(h) && !f->data && !f->kept && !f->beside;
}

/* The export of a handle's view: everything, or the named allocations; fs->mu held. */
static int collect(struct fs_handle *h, const struct wire_body *body, struct xset *s, char *why, size_t whylen)
{
	struct meta_store *ms = h->store->meta;
	s->read_only = !lock_writes(h);
	s->fds = body ? body->fds : true;
	s->h = h;
	s->guard = export_guarded(h);
	s->ask_in_place = body && body->in_place;
	int e = 0;
	if (body && body->has_names) {
		for (size_t i = 0; i < body->nnames && !e; i++) {
			struct meta_node *n;
			if ((e = store_alloc_named(h->store, body->names[i], &n, why, whylen)))
				return e;
			e = add_alloc(n, s);
		}
	} else {
		e = meta_walk(meta_root(ms, META_AREA_ALLOCS), add_alloc, s);
	}
	if (!e && (!body || body->meta) && !(body && body->has_names))
		e = meta_walk(meta_root(ms, META_AREA_META), add_entry, s);
	if (!e && s->in_place)
		e = lock_in_place(h->store);
	if (e)
		snprintf(why, whylen, "%s", e == -EIO ? h->store->last_error : strerror(-e));
	return e;
}

/* The handle r's ticket stands for, counted as a socket request, if the ticket is of the
 * kind the op takes (channel: BIND's; else REDEEM's); NULL with *e and why otherwise. */
static struct fs_handle *redeemed(struct fs *fs, const struct rpc_req *r, bool channel, enum ticket_kind *kind, int *e,
				  char *why, size_t whylen)
{
	struct fs_handle *h = ticket_redeem(fs, r->ticket, r->pid, r->uid, kind, e, why, whylen);
	if (!h)
		return NULL;
	h->store->socket_requests++;
	if ((*kind == TICKET_CHANNEL) != channel) {
		snprintf(why, whylen, "%s", channel ? "an export ticket is for REDEEM" : "a channel ticket is for BIND");
		*e = -EINVAL;
		return NULL;
	}
	return h;
}

/* REDEEM: what an EXPORT or EXPORT_ALL ticket stands for. */
static int do_redeem(struct fs *fs, const struct rpc_req *r, struct xset *s, char *why, size_t whylen)
{
	enum ticket_kind kind;
	int e = 0;
	struct fs_handle *h = redeemed(fs, r, false, &kind, &e, why, whylen);
	if (!h)
		return e;
	if (kind == TICKET_EXPORT_ALL)
		return collect(h, NULL, s, why, whylen);
	s->read_only = !lock_writes(h);
	s->fds = true;
	s->h = h;
	s->guard = export_guarded(h);
	if (!h->node->linked) {
		snprintf(why, whylen, "the allocation was removed");
		return -ESTALE;
	}
	e = add_alloc(h->node, s);
	if (!e && s->in_place && (e = lock_in_place(h->store)))
		snprintf(why, whylen, "%s", h->store->last_error);
	return e;
}

/* BIND: a channel ticket binds the connection to its handle. */
static int do_bind(struct fs *fs, const struct rpc_req *r, char *why, size_t whylen)
{
	enum ticket_kind kind;
	int e = 0;
	struct fs_handle *h = redeemed(fs, r, true, &kind, &e, why, whylen);
	return h ? sock_bind(fs, r->conn, h, r->pid, r->uid) : e;
}

/* The bound handle, if it may do op; fs->mu held.  count: this is the request's one
 * check (state's socket_requests counts each request once). */
static struct fs_handle *bound(struct fs *fs, const struct rpc_req *r, bool write, bool count, int *err, char *why,
			       size_t whylen)
{
	struct fs_handle *h = sock_handle(r->conn, r->pid, r->uid, err);
	if (!h) {
		snprintf(why, whylen, "%s", *err == -EPERM ? "this connection was bound by another process or user"
							   : "no handle: BIND a ticket first (or the handle was closed)");
		return NULL;
	}
	*err = -ENOLCK;
	if (h->store->removed || h->hold == HOLD_NONE) {
		snprintf(why, whylen, "the store or the lock is gone");
		return NULL;
	}
	if (count)
		h->store->socket_requests++;
	if (write && !lock_writes(h)) {
		snprintf(why, whylen, "the handle does not hold the writer session for writing (lock: %s)",
			 lock_mode_of(h) == GMSFS_RO ? "RO" : "none");
		*err = -EPERM;
		return NULL;
	}
	if (write && r->op != GMSFS_OP_COMMIT && r->op != GMSFS_OP_COMMIT_NAMED && r->op != GMSFS_OP_COMMIT_LEAVE &&
	    r->op != GMSFS_OP_KEEP && r->op != GMSFS_OP_SOON &&
	    (*err = lock_layout_change(h->store))) {
		snprintf(why, whylen, "%s", h->store->last_error); /* CREATE, FREE, META_PUT, META_DELETE */
		return NULL;
	}
	*err = 0;
	return h;
}

/* A create's memory_check: the request's handle still holds the writer session. */
static int still_bound(struct fs *fs, void *r, char *why, size_t whylen)
{
	int e;
	bound(fs, r, true, false, &e, why, whylen);
	return e;
}

/* CREATE: memory first (the backend's calls run without fs->mu), then the nodes. */
static int do_create(struct fs *fs, const struct rpc_req *r, const struct wire_body *b, struct xset *s, char *why,
		     size_t whylen)
{
	struct meta_new_alloc *v = calloc(b->nallocs ? b->nallocs : 1, sizeof *v);
	if (!v)
		return -ENOMEM;
	for (size_t i = 0; i < b->nallocs; i++)
		v[i] = (struct meta_new_alloc){ .path = b->allocs[i].path, .tag = b->allocs[i].tag };
	/* Check first: no memory is made for a caller who may not keep it, or for names the
	 * layout refuses (one that exists, a parent that is a file). */
	int e = 0;
	pthread_mutex_lock(&fs->mu);
	struct fs_handle *h = bound(fs, r, true, true, &e, why, whylen);
	if (h)
		e = meta_check_allocs(h->store->meta, v, b->nallocs, why, whylen);
	struct store *st = h && !e ? h->store : NULL;
	if (st)
		store_get(st); /* memory is made without fs->mu */
	pthread_mutex_unlock(&fs->mu);
	if (!st) {
		free(v);
		return e;
	}
	/* The memory, through the one door (memory.h), while the caller may still keep it. */
	struct memory_ask *ask = calloc(b->nallocs ? b->nallocs : 1, sizeof *ask);
	struct vmm_buf **bufs = calloc(b->nallocs ? b->nallocs : 1, sizeof *bufs);
	e = ask && bufs ? 0 : -ENOMEM;
	for (size_t i = 0; !e && i < b->nallocs; i++)
		ask[i] = (struct memory_ask){ b->allocs[i].path, b->allocs[i].size, NULL };
	if (!e)
		e = memory_make(fs, st, ask, b->nallocs, bufs, &(struct memory_check){ still_bound, (void *)r }, why, whylen);
	for (size_t i = 0; !e && i < b->nallocs; i++) {
		v[i].size = b->allocs[i].size;
		v[i].aligned = bufs[i]->size;
		v[i].buf = bufs[i];
	}
	free(ask);
	free(bufs);
	pthread_mutex_lock(&fs->mu);
	/* After a failure to make memory the handle is looked up only to say why in state. */
	int gone;
	char scratch[160];
	h = e ? bound(fs, r, true, false, &gone, scratch, sizeof scratch) : bound(fs, r, true, false, &e, why, whylen);
	if (h && !e && !(e = meta_create_allocs(h->store->meta, v, b->nallocs, why, whylen))) {
		for (size_t i = 0; i < b->nallocs && !e; i++)
			e = add_alloc(v[i].node, s);
		s->read_only = false;
		s->fds = true;
		store_notify(h->store);
	} else if (h && (e == -ENOSPC || e == -EMFILE || e == -ENFILE)) {
		store_error(h->store, "%s", why);
	}
	store_put(st, 1);
	pthread_mutex_unlock(&fs->mu);
	if (!h || e)
		for (size_t i = 0; i < b->nallocs; i++)
			if (v[i].buf && !v[i].node)
				vmm_buf_put(v[i].buf);
	free(v);
	return e;
}

/* EXPORT, under fs->mu.  A writer beside the readers gets copies of what it asks for,
 * made first (fs->mu let go meanwhile: its handle is looked up again). */
static int do_export(struct fs *fs, const struct rpc_req *r, const struct wire_body *body, struct xset *s, char *why,
		     size_t whylen)
{
	int e = 0;
	struct fs_handle *h = bound(fs, r, false, true, &e, why, whylen);
	if (h && body->in_place && !lock_writes(h))
		return why_fmt(why, whylen, -EPERM, "inplace: only the writer's session writes the last commit in place");
	if (h && body->overwrite && !lock_writes(h))
		return why_fmt(why, whylen, -EPERM, "overwrite: only the writer's session writes");
	if (h && lock_writes(h) && version_beside(h->store) && body->fds &&
	    !(e = version_copy_named(h->store, h, body->has_names ? body->names : NULL, body->nnames, body->overwrite, why,
				     whylen)))
		h = bound(fs, r, false, false, &e, why, whylen);
	if (h && !e)
		e = collect(h, body, s, why, whylen);
	if (h && !e)
		h->store->exports++;
	return e;
}

/* FLIP: the bound read handle leaves the version before; the reply names the allocations
 * whose memory differs from it (none when it was on the last commit already). */
static int do_flip(struct fs *fs, const struct rpc_req *r, struct xset *s, char *why, size_t whylen)
{
	int e = 0;
	struct fs_handle *h = bound(fs, r, false, true, &e, why, whylen);
	if (!h)
		return e;
	if (h->hold != HOLD_READ)
		return why_fmt(why, whylen, -EINVAL, "flip is a reader's: this handle holds the writer session");
	struct meta_node **changed;
	size_t n;
	if ((e = version_prev(h->store, h, &changed, &n)))
		return why_fmt(why, whylen, e, "out of memory");
	lock_flip(h); /* its exports are of the last commit from now on */
	*s = (struct xset){ .read_only = true, .fds = true, .h = h, .has_gen = true,
			    .gen = store_lock(h->store)->fsm.generation };
	for (size_t i = 0; i < n && !e; i++)
		e = add_alloc(changed[i], s);
	free(changed);
	return e ? why_fmt(why, whylen, e, "%s", strerror(-e)) : 0;
}

/* COMMIT_LEAVE's end: the holds h's process has from the session it committed go, as its
 * UNLOCKs would (the bound handle's, and those of the STORE/lock files it joined by), so
 * that the writer disconnects with no round trip but its lock file's close.  Chosen
 * before the commit (members is filled then), when they are still told apart from other
 * read handles of the same process. */
static size_t session_files_of(struct store *st, const struct fs_handle *h, struct fs_handle **members, size_t most)
{
	size_t n = 0;
	for (struct fs_handle *x = st->handles.next; x != &st->handles && n < most; x = x->next)
		if (x != h && x->tgid == h->tgid && x->hold == HOLD_SESSION && x->fnode && x->fnode->kind == FS_LOCK)
			members[n++] = x;
	return n;
}

static void leave(struct fs *fs, struct fs_handle *h, struct fs_handle **members, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (members[i]->hold == HOLD_READ) {
			export_revoke(fs, members[i]); /* tickets a lock file was given go with its hold */
			lock_release(members[i]);
		}
	export_revoke(fs, h); /* this connection is unbound: the reply below is its last */
	if (h->hold == HOLD_READ)
		lock_release(h);
}

/* FREE, META_PUT, META_DELETE, COMMIT, COMMIT_NAMED, COMMIT_LEAVE, KEEP: under fs->mu
 * through the bound writer handle. */
static int do_change(struct fs *fs, const struct rpc_req *r, const struct wire_body *b, char *why, size_t whylen)
{
	int e = 0;
	pthread_mutex_lock(&fs->mu);
	struct fs_handle *h = bound(fs, r, true, true, &e, why, whylen);
	if (h) {
		struct store *st = h->store;
		const char *const *names = (const char *const *)b->names;
		switch (r->op) {
		case GMSFS_OP_FREE:
			/* Memory given back (an elastic store's pages, maybe asked for): a move in
			 * that waits for room is tried again. */
			if (!(e = meta_free_allocs(st->meta, names, b->nnames, why, whylen)))
				store_room_changed(fs);
			break;
		case GMSFS_OP_META_PUT:
			e = meta_put_entries(st->meta, b->entries, b->nentries, why, whylen);
			break;
		case GMSFS_OP_META_DELETE:
			e = meta_delete_entries(st->meta, names, b->nnames, why, whylen);
			break;
		case GMSFS_OP_COMMIT_NAMED: /* the name and the commit in one round trip */
		case GMSFS_OP_COMMIT_LEAVE: {
			struct fs_handle *members[8];
			size_t n = r->op == GMSFS_OP_COMMIT_LEAVE ? session_files_of(st, h, members, 8) : 0;
			if ((b->version && (e = named_set_pending(st, b->version, strlen(b->version)))) ||
			    (e = lock_commit(st))) {
				snprintf(why, whylen, "%s", st->last_error);
				if (b->version)
					named_drop_pending(st); /* nothing committed: no name kept */
			} else if (r->op == GMSFS_OP_COMMIT_LEAVE) {
				leave(fs, h, members, n);
			}
			break;
		}
		default: /* COMMIT, KEEP (the session staying): the image is written before it returns */
			if ((e = r->op == GMSFS_OP_KEEP ? lock_keep(st) : lock_commit(st)))
				snprintf(why, whylen, "%s", st->last_error);
			break;
		}
		if (!e)
			store_notify(st);
	}
	pthread_mutex_unlock(&fs->mu);
	return e;
}

/* UNLOCK: a reader's lock given back through its connection (abi.h), as the ioctl's. */
static int do_unlock(struct fs *fs, const struct rpc_req *r, char *why, size_t whylen)
{
	int e;
	struct fs_handle *h = bound(fs, r, false, true, &e, why, whylen);
	if (!h)
		return e;
	if (!h->fnode || h->fnode->kind != FS_STORE || h->hold != HOLD_READ) {
		snprintf(why, whylen, "UNLOCK: only a store directory's read lock (a writer's session ends by its "
				      "GMSFS_IOC_UNLOCK, or its commit)");
		return -EPERM;
	}
	export_revoke(fs, h); /* this connection is unbound: the reply below is its last */
	lock_release(h);
	return 0;
}

/* SOON: no reply (its sender reads none); a wrong one is answered, then hung up on. */
static int serve_soon(struct fs *fs, const struct rpc_req *r)
{
	char why[256] = "";
	int e;
	pthread_mutex_lock(&fs->mu);
	bound(fs, r, true, false, &e, why, sizeof why);
	pthread_mutex_unlock(&fs->mu);
	if (e) {
		reply_error(r->sock, e, "SOON: %s", why);
		return 0;
	}
	sock_soon(r->conn);
	return 1;
}

static int rpc_serve(struct fs *fs, const struct rpc_req *r)
{
	if (r->op == GMSFS_OP_SOON)
		return serve_soon(fs, r);
	char why[512] = "";
	struct wire_body body = {0};
	struct xset s = {0};
	uint64_t t[3] = {0};
	fs_busy(fs);
	int e = wire_parse_body(r->op, r->body, r->body_len, &body, why, sizeof why);
	if (e) {
		reply_error(r->sock, e, "%s", why);
		return 0; /* malformed: drop the connection */
	}
	size_t items = body.nallocs + body.nentries + body.nnames;
	bool manifest = false;
	switch (r->op) {
	case GMSFS_OP_REDEEM:
	case GMSFS_OP_FLIP: /* a flip that failed sends no manifest */
		pthread_mutex_lock(&fs->mu);
		e = r->op == GMSFS_OP_REDEEM ? do_redeem(fs, r, &s, why, sizeof why) : do_flip(fs, r, &s, why, sizeof why);
		pthread_mutex_unlock(&fs->mu);
		manifest = r->op == GMSFS_OP_REDEEM || !e;
		break;
	case GMSFS_OP_BIND:
	case GMSFS_OP_UNLOCK:
		pthread_mutex_lock(&fs->mu);
		e = r->op == GMSFS_OP_BIND ? do_bind(fs, r, why, sizeof why) : do_unlock(fs, r, why, sizeof why);
		pthread_mutex_unlock(&fs->mu);
		break;
	case GMSFS_OP_EXPORT: {
		t[0] = log_trace_rpc() ? clock_mono_ns() : 0;
		pthread_mutex_lock(&fs->mu);
		t[1] = t[0] ? clock_mono_ns() : 0;
		e = do_export(fs, r, &body, &s, why, sizeof why);
		pthread_mutex_unlock(&fs->mu);
		t[2] = t[0] ? clock_mono_ns() : 0;
		manifest = true;
		break;
	}
	case GMSFS_OP_CREATE:
		e = do_create(fs, r, &body, &s, why, sizeof why);
		manifest = true;
		break;
	case GMSFS_OP_HANDOVER: /* the rest of the exchange is handover.c's; on success it ends the daemon */
		handover_give(fs, r->sock, r->uid, export_socket(fs));
		return 0;
	default:
		e = do_change(fs, r, &body, why, sizeof why);
		break;
	}
	wire_body_free(&body);
	inval_flush(fs); /* the kernel has dropped what this call made stale before the caller hears */
	int se;
	if (e) {
		fuse_log(FUSE_LOG_DEBUG, "gmsfs: socket: pid %d op %d: %s\n", (int)r->pid, (int)r->op, why);
		se = reply_error(r->sock, e, "%s", why[0] ? why : strerror(-e));
	} else if (manifest) {
		se = reply_set(r->sock, &s);
		if (t[0]) /* GMSFS_TRACE_RPC: an export's wait for fs->mu, collection, send */
			fuse_log(FUSE_LOG_INFO, "gmsfs: socket: an export waited %.0f us for the daemon's mutex, collected in "
				 "%.0f us, sent in %.0f us\n", (t[1] - t[0]) / 1e3, (t[2] - t[1]) / 1e3, (clock_mono_ns() - t[2]) / 1e3);
	} else {
		struct wire_head h = {0};
		se = reply_plain(r->sock, &h);
	}
	if (se) /* a client gone before its reply (it exited) is no fault of the daemon's */
		fuse_log(se == -EPIPE || se == -ECONNRESET ? FUSE_LOG_DEBUG : FUSE_LOG_WARNING,
			 "gmsfs: socket: pid %d: sending the reply: %s\n", (int)r->pid, strerror(-se));
	items += s.na + s.ne;
	reply_free(&s);
	/* A call of many items (a big export, a bulk put) leaves large free blocks in
	 * malloc's arenas: give them back, or the daemon keeps them for good. */
	if (items >= FS_TRIM_ITEMS)
		store_want_trim(fs);
	store_trim(fs); /* this call's, or a commit's or removal's under it */
	return se ? 0 : 1;
}

int export_start(struct fs *fs, const char *path, char *err, size_t errlen)
{
	return sock_start(fs, path, rpc_serve, err, errlen);
}
