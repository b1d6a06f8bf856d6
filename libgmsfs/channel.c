/* channel: requests on the daemon's socket and their replies (abi.h, gmsfs(5)).
 * The transport keeps its own error text: callers pass a buffer. */
#include "internal.h"
#include "fdpass.h"
#include "why.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

static void close_fds(const int *fds, size_t n)
{
	for (size_t i = 0; i < n; i++)
		close(fds[i]);
}

void ch_manifest_free(struct ch_manifest *m)
{
	for (size_t i = 0; i < m->nallocs; i++)
		wire_alloc_free(&m->allocs[i]);
	entry_recs_clear(m->entries, m->nentries);
	close_fds(m->fds, m->nfds);
	free(m->allocs);
	free(m->fd);
	free(m->entries);
	free(m->fds);
	memset(m, 0, sizeof *m);
}

static int dial(const char *path, char *err, size_t errlen)
{
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	snprintf(a.sun_path, sizeof a.sun_path, "%s", path);
	int s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (s < 0)
		return why_fmt(err, errlen, -errno, "socket: %s", strerror(errno));
	if (connect(s, (struct sockaddr *)&a, sizeof a) < 0) {
		int e = -errno;
		close(s);
		return why_fmt(err, errlen, e, "socket %s: %s", a.sun_path, strerror(-e));
	}
	return s;
}

/* The request: a header per message, the body split at GMSFS_MSG_MAX. */
static int send_request(int s, enum gmsfs_op op, const uint8_t *ticket, const uint8_t *body, size_t len)
{
	size_t off = 0;
	do {
		size_t n = len - off < GMSFS_MSG_MAX ? len - off : GMSFS_MSG_MAX;
		struct gmsfs_sock_req hd;
		wire_req_init(&hd, op, ticket, off + n < len ? GMSFS_REQ_MORE : 0, (uint32_t)n);
		struct iovec iov[2] = { { &hd, sizeof hd }, { (void *)(body + off), n } };
		struct msghdr msg = { .msg_iov = iov, .msg_iovlen = n ? 2 : 1 };
		ssize_t r = sendmsg(s, &msg, MSG_NOSIGNAL);
		if (r != (ssize_t)(sizeof hd + n))
			return r < 0 ? -errno : -EIO;
		off += n;
	} while (off < len);
	return 0;
}

/* Entries arrive in chunks: the first of each (voff 0) has every field, the next ones
 * continue it.  entries[i].value_len counts the bytes so far, want[i] the whole. */
static int add_chunks(struct ch_manifest *m, struct wire_reply *r, uint64_t nentries, uint64_t *want, char *err,
		      size_t errlen)
{
	for (size_t i = 0; i < r->nchunks; i++) {
		struct wire_chunk *c = &r->chunks[i];
		size_t k = m->nentries;
		struct entry_rec *e;
		if (c->voff == 0) {
			if (k && m->entries[k - 1].value_len != want[k - 1])
				return why_fmt(err, errlen, -EPROTO, "socket: meta/%s arrived incomplete", m->entries[k - 1].key);
			if (k == nentries)
				return why_fmt(err, errlen, -EPROTO, "socket: more entries than announced");
			e = &m->entries[k];
			*e = (struct entry_rec){ .key = c->key, .alloc = c->alloc, .offset = c->offset, .size = c->size,
						.flags = c->flags };
			c->key = c->alloc = NULL;
			want[m->nentries++] = c->value_len;
			if (c->nbytes == c->value_len && c->bytes) { /* the whole value: take it as it is */
				e->value = c->bytes;
				e->value_len = c->nbytes;
				c->bytes = NULL;
				continue;
			}
			if (!(e->value = malloc(c->value_len ? c->value_len : 1)))
				return why_fmt(err, errlen, -ENOMEM, "out of memory");
		} else {
			e = k ? &m->entries[k - 1] : NULL;
			if (!e || strcmp(e->key, c->key) || c->voff != e->value_len)
				return why_fmt(err, errlen, -EPROTO, "socket: a value chunk out of order");
		}
		if (c->nbytes > want[m->nentries - 1] - e->value_len)
			return why_fmt(err, errlen, -EPROTO, "socket: meta/%s: a chunk past the value's length", e->key);
		memcpy(e->value + e->value_len, c->bytes, c->nbytes);
		e->value_len += c->nbytes;
	}
	return 0;
}

/* One message and the descriptors that came with it: its length, or -errno (-ENOTCONN:
 * the daemon closed the connection). */
/* How long a call watches for its reply before it sleeps (fdpass_spin_readable): 200 us
 * where the process has cores to spare (8 or more), else none; GMSFS_SPIN_US says
 * otherwise (0: never).  Asked at connect, before anything is timed by the caller. */
long ch_spin_ns(void)
{
	static long ns = -1;
	if (ns < 0) {
		bool asked;
		int cores;
		long spin = fdpass_spin_config(&asked, &cores);
		ns = asked || cores >= 8 ? spin : 0;
	}
	return ns;
}

static ssize_t recv_msg(int s, uint8_t *buf, size_t size, int *fds, size_t *nfds, char *err, size_t errlen)
{
	struct fdpass_info info;
	fdpass_spin_readable(s, ch_spin_ns());
	ssize_t r = fdpass_recv(s, buf, size, fds, GMSFS_FDS_PER_MSG, &info);
	if (r == -ECONNRESET) /* the daemon closed with our request unread: said once, */
		r = fdpass_recv(s, buf, size, fds, GMSFS_FDS_PER_MSG, &info); /* before what it sent (a refusal's reason) */
	*nfds = info.nfds;
	if (r <= 0) {
		close_fds(fds, *nfds);
		*nfds = 0;
		int e = r == 0 || r == -ECONNRESET ? -ENOTCONN : (int)r;
		return why_fmt(err, errlen, e, "socket: %s", r == 0 ? "the daemon closed the connection" : strerror((int)-r));
	}
	if (info.truncated) {
		close_fds(fds, *nfds);
		return why_fmt(err, errlen, -EPROTO, "socket: reply longer than %d bytes", GMSFS_MSG_MAX);
	}
	return r;
}

/* What a manifest announced in its first message, and how far it got. */
struct progress {
	uint64_t total, nentries;
	uint64_t *want;        /* each entry's value length */
};

/* The first message sizes the manifest: counts are bounded before anything is made for them. */
static int start(struct ch_manifest *m, struct progress *p, const struct wire_reply *rep, char *err, size_t errlen)
{
	p->total = rep->total;
	p->nentries = rep->nentries;
	if (p->total > (1ull << 32) || p->nentries > (1ull << 32) ||
	    (p->total && !(m->allocs = calloc(p->total, sizeof *m->allocs))) ||
	    (p->total && !(m->fd = calloc(p->total, sizeof *m->fd))) ||
	    (p->nentries && !(m->entries = calloc(p->nentries, sizeof *m->entries))) ||
	    (p->nentries && !(p->want = calloc(p->nentries, sizeof *p->want))))
		return why_fmt(err, errlen, -ENOMEM, "out of memory for %llu allocations and %llu entries",
			    (unsigned long long)p->total, (unsigned long long)p->nentries);
	return 0;
}

/* Add one message of a manifest to m; its descriptors become m's. */
static int take(struct ch_manifest *m, struct progress *p, struct wire_reply *rep, const int *fds, size_t nfds,
		bool first, char *err, size_t errlen)
{
	if (!rep->manifest || (first && rep->first) ||
	    (!first && (rep->total != p->total || rep->nentries != p->nentries)) || rep->first != m->nallocs) {
		close_fds(fds, nfds);
		return why_fmt(err, errlen, -EPROTO, "socket: a manifest out of order");
	}
	int e = first ? start(m, p, rep, err, errlen) : 0;
	if (!e && nfds) {
		int *grown = realloc(m->fds, (m->nfds + nfds) * sizeof *m->fds);
		if (!grown)
			e = why_fmt(err, errlen, -ENOMEM, "out of memory");
		else
			m->fds = grown;
	}
	if (e) {
		close_fds(fds, nfds);
		return e;
	}
	if (nfds)
		memcpy(m->fds + m->nfds, fds, nfds * sizeof *fds);
	m->nfds += nfds;
	for (size_t i = 0; i < rep->nallocs; i++) {
		/* A message without descriptors lists allocations only (an export without fds). */
		if (nfds && rep->allocs[i].fd >= nfds)
			return why_fmt(err, errlen, -EPROTO, "socket: %s names descriptor %u of %zu", rep->allocs[i].path,
				    (unsigned)rep->allocs[i].fd, nfds);
		struct wire_alloc *a = &rep->allocs[i];
		for (uint32_t k = 0; k < a->npieces; k++) { /* in pieces: each piece's own descriptor */
			if (nfds && a->pieces[k].fd >= nfds)
				return why_fmt(err, errlen, -EPROTO, "socket: %s names descriptor %u of %zu", a->path,
					    (unsigned)a->pieces[k].fd, nfds);
			a->pieces[k].fd = nfds ? (uint32_t)fds[a->pieces[k].fd] : UINT32_MAX;
		}
		m->fd[m->nallocs] = nfds ? fds[a->fd] : -1;
		m->allocs[m->nallocs++] = *a;
		a->path = a->tag = NULL;
		a->pieces = NULL; /* m's now */
		a->npieces = 0;
	}
	if (m->consume && nfds) {
		int e = m->consume(m->ctx, m, m->nallocs - rep->nallocs, m->nallocs);
		for (size_t i = m->nallocs - rep->nallocs; i < m->nallocs; i++)
			m->fd[i] = -1;
		m->nfds -= nfds;
		close_fds(fds, nfds);
		if (e)
			return e; /* consume wrote its reason */
	}
	return add_chunks(m, rep, p->nentries, p->want, err, errlen);
}

/* Receive the reply to one request.  m NULL: a plain reply is expected.  *whole: its
 * last message was read (else the connection is out of step and must be closed). */
static int receive(int s, struct ch_manifest *m, bool *whole, char *err, size_t errlen)
{
	uint8_t *buf = malloc(GMSFS_MSG_MAX + 1);
	struct progress p = {0};
	int e = buf ? 0 : why_fmt(err, errlen, -ENOMEM, "out of memory");
	bool last = false;
	for (bool first = true; !e && !last; first = false) {
		int fds[GMSFS_FDS_PER_MSG];
		size_t nfds;
		ssize_t r = recv_msg(s, buf, GMSFS_MSG_MAX + 1, fds, &nfds, err, errlen);
		struct wire_reply rep;
		char why[160];
		if (r < 0) {
			e = (int)r;
			break;
		}
		if ((e = wire_parse_reply(buf, (size_t)r, &rep, why, sizeof why))) {
			close_fds(fds, nfds);
			why_fmt(err, errlen, e, "socket: malformed reply: %s", why);
			break;
		}
		if (rep.err || !m) {
			close_fds(fds, nfds);
			if (rep.err)
				e = why_fmt(err, errlen, -rep.err, "%s", rep.msg[0] ? rep.msg : strerror(rep.err));
			else if (rep.manifest)
				e = why_fmt(err, errlen, -EPROTO, "socket: a manifest where none was asked for");
			last = true;
		} else {
			e = take(m, &p, &rep, fds, nfds, first, err, errlen);
			last = rep.last;
			if (rep.has_gen)
				m->has_gen = true, m->gen = rep.gen;
		}
		wire_reply_free(&rep);
	}
	if (!e && m && (m->nallocs != p.total || m->nentries != p.nentries))
		e = why_fmt(err, errlen, -EPROTO, "socket: the manifest ended early");
	for (size_t i = 0; !e && m && i < m->nentries; i++)
		if (m->entries[i].value_len != p.want[i])
			e = why_fmt(err, errlen, -EPROTO, "socket: meta/%s arrived incomplete", m->entries[i].key);
	free(p.want);
	free(buf);
	if (e && m)
		ch_manifest_free(m);
	*whole = last;
	return e;
}

/* A send that failed because the daemon had closed the connection: a refusal sent before
 * it closed (too many connections of the uid) waits in the queue and says why; else
 * -ENOTCONN (the connection may be made and the request sent again). */
static int closed_why(int s, char *err, size_t errlen)
{
	bool whole;
	int why = receive(s, NULL, &whole, err, errlen);
	return why && why != -ENOTCONN ? why : why_fmt(err, errlen, -ENOTCONN, "socket: %s", strerror(ENOTCONN));
}

/* Send a request, read its reply.  bind_first: a BIND sent ahead (ch_bind_start) is
 * answered first; if it was refused, the request's reply is not read (*whole false). */
static int call_on(int s, enum gmsfs_op op, const uint8_t *ticket, const void *body, size_t len, bool bind_first,
		   struct ch_manifest *m, bool *whole, char *err, size_t errlen)
{
	*whole = false;
	if (m)
		*m = (struct ch_manifest){ .consume = m->consume, .ctx = m->ctx };
	int e = send_request(s, op, ticket, body, len);
	if (e == -EPIPE || e == -ECONNRESET || e == -ENOTCONN)
		return closed_why(s, err, errlen);
	if (e)
		return why_fmt(err, errlen, e, "socket: %s", strerror(-e));
	if (bind_first && (e = receive(s, NULL, whole, err, errlen))) {
		*whole = false;
		return e;
	}
	return receive(s, m, whole, err, errlen);
}

int ch_bind(struct ch *c, const char *path, const uint8_t ticket[GMSFS_TICKET_LEN], char *err, size_t errlen)
{
	ch_close(c);
	int s = dial(path, err, errlen);
	if (s < 0)
		return s;
	bool whole;
	int e = call_on(s, GMSFS_OP_BIND, ticket, NULL, 0, false, NULL, &whole, err, errlen);
	if (e) {
		close(s);
		return e;
	}
	c->sock = s;
	return 0;
}

int ch_bind_start(struct ch *c, const char *path, const uint8_t ticket[GMSFS_TICKET_LEN], char *err, size_t errlen)
{
	ch_spin_ns(); /* asked now, not in the first call's time */
	ch_close(c);
	int s = dial(path, err, errlen);
	if (s < 0)
		return s;
	int e = send_request(s, GMSFS_OP_BIND, ticket, NULL, 0);
	if (e) {
		close(s);
		return why_fmt(err, errlen, e, "socket: %s", strerror(-e));
	}
	c->sock = s;
	c->bind_pending = true;
	return 0;
}

int ch_call(struct ch *c, enum gmsfs_op op, const void *body, size_t len, struct ch_manifest *m, char *err,
	    size_t errlen)
{
	if (c->sock < 0)
		return why_fmt(err, errlen, -ENOTCONN, "socket: not connected");
	bool whole;
	bool bind_first = c->bind_pending;
	c->bind_pending = false;
	int e = call_on(c->sock, op, NULL, body, len, bind_first, m, &whole, err, errlen);
	if (e == -ENOTCONN || !whole)
		ch_close(c); /* the rest of a reply (or all of it, after a refused bind) must not be
			      * read as the next one's: bind again */
	return e;
}

int ch_send(struct ch *c, enum gmsfs_op op)
{
	if (c->sock < 0 || c->bind_pending)
		return -ENOTCONN;
	return send_request(c->sock, op, NULL, NULL, 0);
}

int ch_reply(struct ch *c, char *err, size_t errlen)
{
	bool whole;
	int e = c->sock < 0 ? why_fmt(err, errlen, -ENOTCONN, "socket: not connected")
			    : receive(c->sock, NULL, &whole, err, errlen);
	if (e == -ENOTCONN || (!e && !whole))
		ch_close(c);
	return e;
}

void ch_soon(struct ch *c)
{
	if (c->sock >= 0)
		send_request(c->sock, GMSFS_OP_SOON, NULL, NULL, 0);
}

void ch_close(struct ch *c)
{
	if (c->sock >= 0)
		close(c->sock);
	c->sock = -1;
	c->bind_pending = false;
}
