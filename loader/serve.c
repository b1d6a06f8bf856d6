/* serve: gmsfs-peer serve, committed stores of a mount sent read-only to peers that show
 * the token (serve.h).  One peer at a time, each wait bounded: a peer that stops
 * reading loses its connection after the timeout and the next one is served. */
#include "serve.h"
#include "copy.h"
#include "net.h"
#include "net_wire.h"
#include "store_files.h"

#include <gmsfs/gmsfs.h>

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

int sv_read_token(const char *path, uint8_t *token, size_t *len, char *err, size_t errlen)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
	struct stat st;
	if (fd < 0 || fstat(fd, &st)) {
		int e = errno;
		snprintf(err, errlen, "%s: %s", path, strerror(e));
		if (fd >= 0)
			close(fd);
		return -e;
	}
	int e = 0;
	if (!S_ISREG(st.st_mode) || (st.st_mode & 077))
		e = -EPERM, snprintf(err, errlen, "%s: a token file is a regular file its owner alone reads (chmod 600)",
				     path);
	ssize_t n = e ? 0 : read(fd, token, NW_TOKEN_MAX + 1);
	close(fd);
	if (!e && n < 0)
		e = -errno, snprintf(err, errlen, "%s: %s", path, strerror(errno));
	while (!e && n > 0 && (token[n - 1] == '\n' || token[n - 1] == '\r'))
		n--;
	if (!e && (n < 16 || n > NW_TOKEN_MAX))
		e = -EINVAL, snprintf(err, errlen, "%s: a token of 16 to %d bytes", path, NW_TOKEN_MAX);
	if (!e)
		*len = (size_t)n;
	return e;
}

/* Equal, in a time that does not depend on where they differ. */
static int same_token(const uint8_t *a, size_t alen, const uint8_t *b, size_t blen)
{
	uint8_t d = alen != blen;
	for (size_t i = 0; i < blen; i++)
		d |= (uint8_t)(b[i] ^ (i < alen ? a[i] : 0));
	return !d;
}

static int allowed(const struct sv_options *o, const char *name)
{
	for (size_t i = 0; i < o->nallow; i++)
		if (!strcmp(o->allow[i], "*") || !strcmp(o->allow[i], name))
			return 1;
	return 0;
}

static void logf_(const char *peer, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	fprintf(stderr, "gmsfs-peer: %s: ", peer);
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	va_end(ap);
}

static int send_frame(struct nt_conn *c, void *frame, size_t len, int timeout_ms, char *err, size_t errlen)
{
	int e = nt_send(c, frame, len, timeout_ms, err, errlen);
	free(frame);
	return e;
}

static int refuse(struct nt_conn *c, const char *peer, int timeout_ms, int error, const char *fmt, ...)
{
	struct nw_layout l = { .error = error };
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(l.why, sizeof l.why, fmt, ap);
	va_end(ap);
	logf_(peer, "refused: %s", l.why);
	void *f;
	size_t n;
	char err[256];
	if (!nw_pack_layout(&l, &f, &n))
		send_frame(c, f, n, timeout_ms, err, sizeof err);
	return -error;
}

/* The store's layout, as LAYOUT says it; its entries' strings are the handle's. */
static int layout_of(gmsfs *g, char **keys, struct gmsfs_meta *m, size_t ne, struct nw_layout *l)
{
	const struct gmsfs_mapping *v;
	l->nallocs = gmsfs_mappings(g, &v);
	l->allocs = calloc(l->nallocs + 1, sizeof *l->allocs);
	l->entries = calloc(ne + 1, sizeof *l->entries);
	if (!l->allocs || !l->entries)
		return -ENOMEM;
	for (size_t i = 0; i < l->nallocs; i++)
		l->allocs[i] = (struct nw_alloc){ .name = (char *)v[i].name, .tag = (char *)v[i].tag, .size = v[i].size };
	for (size_t i = 0; i < ne; i++)
		l->entries[i] = (struct nw_entry){ .key = keys[i], .alloc = (char *)(m[i].alloc ? m[i].alloc : ""),
						   .offset = m[i].offset, .size = m[i].size, .flags = m[i].flags,
						   .value = (char *)m[i].value, .value_len = m[i].value_len };
	l->nentries = ne;
	return gmsfs_layout_hash(g, l->hash);
}

/* A run of sends, two at a time: each piece hashed (and on a GPU copied out) while the
 * piece before it is on its way. */
struct sv_pipe {
	struct nt_conn *c;
	void *op[2];
	int k;
	int timeout_ms;
};

/* The slot k is free again: its send has gone. */
static int slot_free(struct sv_pipe *p, char *err, size_t errlen)
{
	void *op = p->op[p->k];
	p->op[p->k] = NULL;
	return op ? nt_finish(p->c, op, "sending", p->timeout_ms, err, errlen) : 0;
}

static int slot_send(struct sv_pipe *p, const void *buf, uint64_t len, char *err, size_t errlen)
{
	int e = nt_send_start(p->c, buf, len, &p->op[p->k], err, errlen);
	p->k ^= 1;
	return e;
}

/* Every send finished (after an error too: each started one is waited for). */
static int pipe_drain(struct sv_pipe *p, int e, char *err, size_t errlen)
{
	for (int n = 0; n < 2; n++, p->k ^= 1) {
		char why[256];
		int e2 = slot_free(p, why, sizeof why);
		if (e2 && !e) {
			e = e2;
			snprintf(err, errlen, "%s", why);
		}
	}
	return e;
}

#define SV_PIECE (32ull << 20) /* host memory: bytes hashed and sent a piece */

/* Every allocation's bytes, in order, and their digests: straight from host memory, or
 * out of the GPU through the pinned buffer of the store's context, in two halves. */
static int send_bytes(struct nt_conn *c, struct cp *cp, gmsfs *g, uint64_t *digests, int timeout_ms, char *err,
		      size_t errlen)
{
	const struct gmsfs_mapping *v;
	size_t n = gmsfs_mappings(g, &v);
	struct cp_stage st;
	int e = cp_stage(cp, gmsfs_backend(g), &st, err, errlen);
	if (e)
		return e;
	char *pinned = st.pinned;
	struct sv_pipe p = { .c = c, .timeout_ms = timeout_ms };
	uint64_t piece = pinned ? st.room / 2 : SV_PIECE;
	XXH3_state_t *x = XXH3_createState();
	if (!x)
		return -ENOMEM;
	for (size_t i = 0; !e && i < n; i++) {
		XXH3_64bits_reset(x);
		for (uint64_t at = 0; !e && at < v[i].size; at += piece) {
			uint64_t len = v[i].size - at < piece ? v[i].size - at : piece;
			const char *src = (const char *)v[i].ptr + at;
			if ((e = slot_free(&p, err, errlen)))
				break;
#ifdef GMSFS_HAVE_CUDA
			if (pinned) {
				char *half = pinned + (size_t)p.k * piece;
				CUresult r = st.cu->cuMemcpyDtoH(half, (CUdeviceptr)(uintptr_t)src, len);
				if (r) {
					snprintf(err, errlen, "%s: out of the GPU: %s", v[i].name, cu_name(st.cu, r));
					e = -EIO;
					break;
				}
				src = half;
			}
#endif
			XXH3_64bits_update(x, src, len);
			e = slot_send(&p, src, len, err, errlen);
		}
		digests[i] = XXH3_64bits_digest(x);
	}
	XXH3_freeState(x);
	return pipe_drain(&p, e, err, errlen);
}

static int serve_one(const struct sv_options *o, struct nt_conn *c, const char *peer)
{
	char err[512] = "", path[4096];
	void *body;
	size_t len;
	int e = nt_recv_frame(c, NW_HELLO_MAX, &body, &len, o->timeout_ms, err, sizeof err);
	if (e) {
		logf_(peer, "refused: hello: %s", err);
		return e;
	}
	struct nw_hello *h = malloc(sizeof *h);
	if (!h) {
		free(body);
		return -ENOMEM;
	}
	e = nw_parse_hello(body, len, h, err, sizeof err);
	free(body);
	if (e)
		e = refuse(c, peer, o->timeout_ms, EPROTO, "%s", err);
	else if (!same_token(h->token, h->token_len, o->token, o->token_len))
		e = refuse(c, peer, o->timeout_ms, EACCES, "the token is not this server's");
	else if (!allowed(o, h->store))
		e = refuse(c, peer, o->timeout_ms, EACCES, "%s is not served here", h->store);
	char state[32] = "";
	if (!e) {
		snprintf(path, sizeof path, "%s/%s", o->mount, h->store);
		if (sf_field(path, "state", "state", state, sizeof state))
			e = refuse(c, peer, o->timeout_ms, ENOENT, "%s: no such store", h->store);
		else if (strcmp(state, "COMMITTED") && strcmp(state, "RO"))
			e = refuse(c, peer, o->timeout_ms, EAGAIN, "%s is %s, not committed", h->store, state);
	}
	struct cp *cp = NULL;
	gmsfs *g = NULL;
	char **keys = NULL;
	struct gmsfs_meta *m = NULL;
	size_t ne = 0;
	if (!e && (e = cp_open(path, &cp, err, sizeof err)))
		e = refuse(c, peer, o->timeout_ms, -e, "%s: %s", h->store, err);
	if (!e && (e = gmsfs_connect(&g, path, GMSFS_RO, o->timeout_ms)))
		e = refuse(c, peer, o->timeout_ms, -e, "%s: %s", h->store, g ? gmsfs_errmsg(g) : gmsfs_strerror(e));
	if (!e && ((e = gmsfs_import_all(g)) || (e = gmsfs_meta_get_all(g, "", &keys, &m, &ne))))
		e = refuse(c, peer, o->timeout_ms, -e, "%s: %s", h->store, gmsfs_errmsg(g));
	struct nw_layout l = { 0 };
	uint64_t *digests = NULL;
	if (!e && (e = layout_of(g, keys, m, ne, &l)))
		e = refuse(c, peer, o->timeout_ms, -e, "%s: %s", h->store, gmsfs_errmsg(g));
	void *f;
	bool answered = !e; /* the layout goes: what fails from here on is said here, not to the peer */
	if (!e && !(e = nw_pack_layout(&l, &f, &len)))
		e = send_frame(c, f, len, o->timeout_ms, err, sizeof err);
	if (!e && !(digests = calloc(l.nallocs + 1, sizeof *digests)))
		e = -ENOMEM;
	uint64_t bytes = 0;
	for (size_t i = 0; i < l.nallocs; i++)
		bytes += l.allocs[i].size;
	if (!e)
		e = send_bytes(c, cp, g, digests, o->timeout_ms, err, sizeof err);
	if (!e && !(e = nw_pack_trailer(digests, l.nallocs, &f, &len)))
		e = send_frame(c, f, len, o->timeout_ms, err, sizeof err);
	if (!e)
		logf_(peer, "sent %s (%zu allocations, %llu bytes, layout %s)", h->store, l.nallocs,
		      (unsigned long long)bytes, l.hash);
	else if (answered)
		logf_(peer, "%s: %s", h->store, err[0] ? err : strerror(-e));
	free(digests);
	free(l.allocs);
	free(l.entries);
	if (keys)
		gmsfs_meta_free_all(keys, m, ne);
	gmsfs_disconnect(g); /* the read lock goes with the connection */
	cp_close(cp);
	free(h);
	return e;
}

int sv_serve(const struct sv_options *o)
{
	struct nt_listener *l;
	char err[512];
	int e = nt_listen(o->addr, o->port, &l, err, sizeof err);
	if (e) {
		fprintf(stderr, "gmsfs-peer: %s\n", err);
		return e;
	}
	fprintf(stderr, "gmsfs-peer: serving %s on %s:%u\n", o->mount, o->addr[0] ? o->addr : "*", o->port);
	for (;;) {
		struct nt_conn *c;
		char peer[64];
		if ((e = nt_accept(l, -1, &c, peer, sizeof peer, err, sizeof err))) {
			fprintf(stderr, "gmsfs-peer: %s\n", err);
			continue;
		}
		serve_one(o, c, peer);
		nt_await_close(c, o->timeout_ms); /* the peer has read the refusal or the trailer */
		nt_close(c);
	}
}
