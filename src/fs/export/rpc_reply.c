/* rpc_reply: a request's reply sent (rpc_reply.h). */
#include "rpc_reply.h"
#include "export_internal.h"
#include "why.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void reply_free(struct xset *s)
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


/* ---- sending a manifest ---- */

int reply_plain(int sock, const struct wire_head *h)
{
	msgpack_sbuffer sb;
	msgpack_sbuffer_init(&sb);
	int e = wire_pack_reply(&sb, h, NULL, 0, NULL, 0);
	if (!e)
		e = sock_send(sock, sb.data, sb.size, NULL, 0);
	msgpack_sbuffer_destroy(&sb);
	return e;
}

int reply_error(int sock, int err, const char *fmt, ...)
{
	char why[512];
	va_list ap;
	va_start(ap, fmt);
	why_vfmt(why, sizeof why, 0, fmt, ap);
	va_end(ap);
	struct wire_head h = { .err = err < 0 ? -err : err, .msg = why };
	return reply_plain(sock, &h);
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
		int fd = vmm_export(vmm_piece(x->buf, k), s->read_only || x->ro);
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
						     .npieces = (uint32_t)n, .ro = x->ro };
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

int reply_set(int sock, const struct xset *s)
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

