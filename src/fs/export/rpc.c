/* rpc: what a socket request does.  A ticket (REDEEM) buys one export; BIND ties the
 * connection to the ticket's handle, and later requests act through that handle: with
 * its lock, its view of the layout (the committed one for a reader, the session's for
 * the writer), and, to change anything, only if it holds the writer session and was
 * opened for writing.  Manifests go out in messages of at most RPC_FDS_PER_MSG
 * descriptors and GMSFS_MSG_MAX bytes; readers only ever get read-only descriptors. */
#include "export_internal.h"
#include "../handover.h"
#include "../inval.h"
#include "../lock.h"
#include "../memory.h"
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

/* Descriptors per message: few, so a client that maps and closes each message's
 * descriptors before the next keeps its descriptor table small.  Growing that table
 * in a process with threads (every CUDA process) waits for an RCU grace period, and
 * 128 descriptors in one message cost a fresh CUDA process (which holds ~38 already)
 * 15-30 ms on an H100 machine, 16 at a time under 2 ms in all (bench-gpu). */
#define RPC_FDS_PER_MSG 16

/* ---- what a reply carries, copied under fs->mu and sent after ---- */

struct xalloc {
	char *path, *tag;
	uint64_t size, aligned;
	struct vmm_buf *buf; /* a reference, put when sent */
};

struct xset {
	struct xalloc *a;
	size_t na, cap_a;
	struct entry_rec *e;
	size_t ne, cap_e;
	bool read_only, fds;
	bool in_place; /* a committed allocation's memory, writable: the session may write it in place */
	const struct fs_handle *h; /* whose view: which version's memory (version_buf) */
	bool has_gen;  /* a flip's reply says the generation it shows */
	uint64_t gen;
};

static void xset_free(struct xset *s)
{
	for (size_t i = 0; i < s->na; i++) {
		free(s->a[i].path);
		free(s->a[i].tag);
		vmm_buf_put(s->a[i].buf);
	}
	entry_recs_clear(s->e, s->ne);
	free(s->a);
	free(s->e);
	memset(s, 0, sizeof *s);
}

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
	/* Only memory handed out can be written: a writer's look at the metadata (no
	 * descriptors) leaves the committed bytes as they are. */
	s->in_place |= s->fds && !s->read_only && meta_committed(n);
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

/* ---- sending a manifest ---- */

static int send_reply(int sock, const struct wire_head *h)
{
	msgpack_sbuffer sb;
	msgpack_sbuffer_init(&sb);
	int e = wire_pack_reply(&sb, h, NULL, 0, NULL, 0);
	if (!e)
		e = sock_send(sock, sb.data, sb.size, NULL, 0);
	msgpack_sbuffer_destroy(&sb);
	return e;
}

static int send_error(int sock, int err, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int send_error(int sock, int err, const char *fmt, ...)
{
	char why[512];
	va_list ap;
	va_start(ap, fmt);
	why_vfmt(why, sizeof why, 0, fmt, ap);
	va_end(ap);
	struct wire_head h = { .err = err < 0 ? -err : err, .msg = why };
	return send_reply(sock, &h);
}

/* One message's worth: allocations from *ai (distinct descriptors at most
 * RPC_FDS_PER_MSG, or the pieces of one allocation), then entry chunks from (*ei, *voff),
 * within GMSFS_MSG_MAX. */
#define RPC_PIECES_PER_MSG 512
struct batch {
	struct wire_alloc a[GMSFS_FDS_PER_MSG];
	size_t na;
	struct wire_chunk c[512];
	size_t nc;
	int fds[GMSFS_PIECES_MAX > RPC_FDS_PER_MSG ? GMSFS_PIECES_MAX : RPC_FDS_PER_MSG];
	size_t nfds;
	struct wire_piece p[RPC_PIECES_PER_MSG]; /* the allocations' pieces, theirs in order */
	size_t np;
	size_t bytes;
};

/* The slot of each piece of x's memory among the message's descriptors, added where new:
 * false when they do not fit (the message is full; nothing of x was added). */
static int batch_fds(struct batch *b, const struct xset *s, const struct xalloc *x, uint32_t *slot, bool *fit)
{
	size_t had = b->nfds, room = b->na ? RPC_FDS_PER_MSG : sizeof b->fds / sizeof b->fds[0];
	*fit = false;
	for (size_t k = 0; k < vmm_npieces(x->buf); k++) {
		int fd = vmm_export(vmm_piece(x->buf, k), s->read_only);
		if (fd < 0)
			return fd;
		for (slot[k] = 0; slot[k] < b->nfds && b->fds[slot[k]] != fd; slot[k]++)
			;
		if (slot[k] == b->nfds) {
			if (b->nfds == room) {
				b->nfds = had;
				return 0;
			}
			b->fds[b->nfds++] = fd;
		}
	}
	*fit = true;
	return 0;
}

static int batch_allocs(struct batch *b, const struct xset *s, size_t *ai)
{
	for (; *ai < s->na && b->na < GMSFS_FDS_PER_MSG; ++*ai) {
		const struct xalloc *x = &s->a[*ai];
		size_t n = x->buf->npieces, cost = wire_alloc_cost(x->path, x->tag) + n * 24;
		if (b->na && (b->bytes + cost > GMSFS_MSG_MAX || b->np + n > RPC_PIECES_PER_MSG))
			break;
		uint32_t slot[GMSFS_PIECES_MAX] = {0};
		bool fit = true;
		int e = s->fds ? batch_fds(b, s, x, slot, &fit) : 0;
		if (e || !fit)
			return e ? e : b->na ? 0 : -E2BIG; /* the next message; none holds more pieces */
		for (size_t k = 0; k < n; k++) /* in pieces: each its descriptor and offset */
			b->p[b->np + k] = (struct wire_piece){ .fd = slot[k], .fd_offset = x->buf->pieces[k]->offset };
		struct vmm_buf *first = vmm_piece(x->buf, 0);
		b->a[b->na++] = (struct wire_alloc){ .path = x->path, .tag = x->tag, .size = x->size, .aligned = x->aligned,
						     .fd = slot[0], .fd_offset = first->offset,
						     .piece = n ? first->size : 0, .pieces = n ? &b->p[b->np] : NULL,
						     .npieces = (uint32_t)n };
		b->np += n;
		b->bytes += cost;
	}
	return 0;
}

static void batch_entries(struct batch *b, const struct xset *s, size_t *ei, size_t *voff)
{
	while (*ei < s->ne && b->nc < sizeof b->c / sizeof b->c[0]) {
		const struct entry_rec *x = &s->e[*ei];
		size_t fixed = wire_chunk_cost(x->key, x->alloc, 0);
		if (b->bytes + fixed + (x->value_len - *voff ? 1 : 0) > GMSFS_MSG_MAX)
			break;
		size_t room = GMSFS_MSG_MAX - b->bytes - fixed, n = x->value_len - *voff < room ? x->value_len - *voff : room;
		b->c[b->nc++] = (struct wire_chunk){ .key = x->key, .alloc = x->alloc, .offset = x->offset,
						     .size = x->size, .flags = x->flags, .value_len = x->value_len,
						     .voff = *voff, .bytes = (uint8_t *)x->value + *voff, .nbytes = n };
		b->bytes += fixed + n;
		*voff += n;
		if (*voff == x->value_len) {
			++*ei;
			*voff = 0;
		}
	}
}

static int send_set(int sock, const struct xset *s)
{
	struct batch *b = malloc(sizeof *b);
	/* One buffer for every message, reserved once: a big manifest is thousands of them. */
	msgpack_sbuffer sb = { .data = malloc(GMSFS_MSG_MAX + 4096), .alloc = GMSFS_MSG_MAX + 4096 };
	int e = b && sb.data ? 0 : -ENOMEM;
	size_t ai = 0, ei = 0, voff = 0;
	while (!e) {
		b->na = b->nc = b->nfds = b->np = 0;
		b->bytes = WIRE_HEAD_COST;
		size_t first = ai;
		if ((e = batch_allocs(b, s, &ai)))
			break;
		if (ai == s->na)
			batch_entries(b, s, &ei, &voff);
		struct wire_head h = { .manifest = true, .total = s->na, .nentries = s->ne, .first = first,
				       .last = ai == s->na && ei == s->ne, .has_gen = s->has_gen, .gen = s->gen };
		msgpack_sbuffer_clear(&sb);
		if (!(e = wire_pack_reply(&sb, &h, b->a, b->na, b->c, b->nc)))
			e = sock_send(sock, sb.data, sb.size, b->fds, b->nfds);
		if (h.last)
			break;
	}
	msgpack_sbuffer_destroy(&sb);
	free(b);
	return e;
}

/* ---- requests ---- */

/* The export of a handle's view: everything, or the named allocations; fs->mu held. */
static int collect(struct fs_handle *h, const struct wire_body *body, struct xset *s, char *why, size_t whylen)
{
	struct meta_store *ms = h->store->meta;
	s->read_only = !lock_writes(h);
	s->fds = body ? body->fds : true;
	s->h = h;
	int e = 0;
	if (body && body->has_names) {
		for (size_t i = 0; i < body->nnames && !e; i++) {
			struct meta_node *n = meta_resolve(ms, META_AREA_ALLOCS, body->names[i]);
			if (!n || n->kind != META_ALLOC) {
				snprintf(why, whylen, "allocs/%s %s", body->names[i], n ? "is a directory" : "does not exist");
				return n ? -EISDIR : -ENOENT;
			}
			if (!n->buf) {
				snprintf(why, whylen, "allocs/%s was never sized", body->names[i]);
				return -ENODATA;
			}
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
	if (write && r->op != GMSFS_OP_COMMIT && r->op != GMSFS_OP_KEEP && (*err = lock_layout_change(h->store))) {
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
		ask[i] = (struct memory_ask){ b->allocs[i].path, b->allocs[i].size };
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
	if (h && lock_writes(h) && version_beside(h->store) && body->fds &&
	    !(e = version_copy_named(h->store, h, body->has_names ? body->names : NULL, body->nnames, why, whylen)))
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

/* FREE, META_PUT, META_DELETE, COMMIT, KEEP: under fs->mu through the bound writer handle. */
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

static int rpc_serve(struct fs *fs, const struct rpc_req *r)
{
	char why[512] = "";
	struct wire_body body = {0};
	struct xset s = {0};
	uint64_t t[3] = {0};
	fs_busy(fs);
	int e = wire_parse_body(r->op, r->body, r->body_len, &body, why, sizeof why);
	if (e) {
		send_error(r->sock, e, "%s", why);
		return 0; /* malformed: drop the connection */
	}
	size_t items = body.nallocs + body.nentries + body.nnames;
	bool manifest = false;
	switch (r->op) {
	case GMSFS_OP_REDEEM:
		pthread_mutex_lock(&fs->mu);
		e = do_redeem(fs, r, &s, why, sizeof why);
		pthread_mutex_unlock(&fs->mu);
		manifest = true;
		break;
	case GMSFS_OP_BIND:
		pthread_mutex_lock(&fs->mu);
		e = do_bind(fs, r, why, sizeof why);
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
	case GMSFS_OP_FLIP:
		pthread_mutex_lock(&fs->mu);
		e = do_flip(fs, r, &s, why, sizeof why);
		pthread_mutex_unlock(&fs->mu);
		manifest = !e;
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
		se = send_error(r->sock, e, "%s", why[0] ? why : strerror(-e));
	} else if (manifest) {
		se = send_set(r->sock, &s);
		if (t[0]) /* GMSFS_TRACE_RPC: an export's wait for fs->mu, collection, send */
			fuse_log(FUSE_LOG_INFO, "gmsfs: socket: an export waited %.0f us for the daemon's mutex, collected in "
				 "%.0f us, sent in %.0f us\n", (t[1] - t[0]) / 1e3, (t[2] - t[1]) / 1e3, (clock_mono_ns() - t[2]) / 1e3);
	} else {
		struct wire_head h = {0};
		se = send_reply(r->sock, &h);
	}
	if (se) /* a client gone before its reply (it exited) is no fault of the daemon's */
		fuse_log(se == -EPIPE || se == -ECONNRESET ? FUSE_LOG_DEBUG : FUSE_LOG_WARNING,
			 "gmsfs: socket: pid %d: sending the reply: %s\n", (int)r->pid, strerror(-se));
	items += s.na + s.ne;
	xset_free(&s);
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
