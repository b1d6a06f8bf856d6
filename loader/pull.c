/* pull: gmsfs-peer pull (pull.h). */
#include "pull.h"
#include "copy.h"
#include "net.h"
#include "net_wire.h"
#include "store_files.h"

#include <gmsfs/gmsfs.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <xxhash.h>

int pl_parse_url(const char *url, char *host, size_t hostlen, uint16_t *port, char *name, size_t namelen)
{
	const char *p = url;
	if (strncmp(p, "gmsfs://", 8))
		return -EINVAL;
	p += 8;
	const char *h = p, *he;
	if (*p == '[') { /* [IPv6]:PORT */
		h = ++p;
		if (!(he = strchr(p, ']')) || he[1] != ':')
			return -EINVAL;
		p = he + 2;
	} else {
		if (!(he = strchr(p, ':')))
			return -EINVAL;
		p = he + 1;
	}
	if (he == h || (size_t)(he - h) >= hostlen)
		return -EINVAL;
	char *end;
	unsigned long v = strtoul(p, &end, 10);
	if (end == p || *end != '/' || !v || v > 65535)
		return -EINVAL;
	if (strlen(end + 1) >= namelen || !nw_store_name_ok(end + 1))
		return -EINVAL;
	memcpy(host, h, (size_t)(he - h));
	host[he - h] = '\0';
	*port = (uint16_t)v;
	strcpy(name, end + 1);
	return 0;
}

static double seconds_since(const struct timespec *t0)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)(t.tv_sec - t0->tv_sec) + (double)(t.tv_nsec - t0->tv_nsec) / 1e9;
}

static void show(bool progress, uint64_t done, uint64_t total, const struct timespec *t0)
{
	if (!progress)
		return;
	double s = seconds_since(t0);
	fprintf(stderr, "\rgmsfs-peer: %llu of %llu MB, %.0f MB/s   ", (unsigned long long)(done >> 20),
		(unsigned long long)(total >> 20), s > 0 ? (double)done / 1e6 / s : 0.0);
}

/* One piece of the bytes: allocation i's len bytes at at. */
struct pl_piece {
	size_t i;
	uint64_t at, len;
};

/* The pieces of n allocations of size, in order: piece bytes each (the last of each
 * allocation less); *count of them, the caller frees. */
static struct pl_piece *pieces(const struct gmsfs_new *nv, size_t n, uint64_t piece, size_t *count)
{
	size_t k = 0, cap = 0;
	for (size_t i = 0; i < n; i++)
		cap += (size_t)((nv[i].size + piece - 1) / piece);
	struct pl_piece *v = calloc(cap + 1, sizeof *v);
	for (size_t i = 0; v && i < n; i++)
		for (uint64_t at = 0; at < nv[i].size; at += piece)
			v[k++] = (struct pl_piece){ i, at, nv[i].size - at < piece ? nv[i].size - at : piece };
	*count = k;
	return v;
}

#define PL_PIECE (32ull << 20) /* host memory: bytes received a piece */

/* Every allocation's bytes into the store's memory, each one's digest as it passes: the
 * next piece asked for before this one is hashed (and on a GPU copied in, from one half
 * of the pinned buffer while the other half fills). */
static int recv_bytes(struct nt_conn *c, struct cp *cp, gmsfs *g, struct gmsfs_new *nv, size_t n,
		      uint64_t *digests, uint64_t total, bool progress, int timeout_ms, char *err, size_t errlen)
{
	struct cp_stage st;
	int e = cp_stage(cp, gmsfs_backend(g), &st, err, errlen);
	if (e)
		return e;
	char *pinned = st.pinned;
#ifdef GMSFS_HAVE_CUDA
	struct cu_api *cu = st.cu;
	CUstream s[2] = { NULL, NULL };
	if (pinned &&
	    (cu->cuStreamCreate(&s[0], CU_STREAM_NON_BLOCKING) || cu->cuStreamCreate(&s[1], CU_STREAM_NON_BLOCKING))) {
		if (s[0])
			cu->cuStreamDestroy(s[0]);
		snprintf(err, errlen, "no stream for the GPU's bytes");
		return -EIO;
	}
#endif
	uint64_t piece = pinned ? st.room / 2 : PL_PIECE;
	size_t count = 0;
	struct pl_piece *v = pieces(nv, n, piece, &count);
	XXH3_state_t *x = XXH3_createState();
	e = v && x ? 0 : -ENOMEM;
	struct timespec t0;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	uint64_t done = 0;
	void *op = NULL;
	/* Where piece j lands: its place in the store's memory, or the half j % 2 of the pinned buffer. */
#define PL_AT(j) (pinned ? pinned + (size_t)((j) % 2) * piece : (char *)nv[v[j].i].ptr + v[j].at)
	if (!e && count)
		e = nt_recv_start(c, PL_AT(0), v[0].len, &op, err, errlen);
	for (size_t j = 0; !e && j < count; j++) {
		if ((e = nt_finish(c, op, "receiving", timeout_ms, err, errlen)))
			break;
		op = NULL;
#ifdef GMSFS_HAVE_CUDA
		CUresult r = 0;
		if (pinned && j + 1 < count && (r = cu->cuStreamSynchronize(s[(j + 1) % 2]))) { /* its half is free */
			snprintf(err, errlen, "into the GPU: %s", cu_name(cu, r));
			e = -EIO;
			break;
		}
#endif
		if (j + 1 < count && (e = nt_recv_start(c, PL_AT(j + 1), v[j + 1].len, &op, err, errlen)))
			break;
		if (!v[j].at)
			XXH3_64bits_reset(x);
		XXH3_64bits_update(x, PL_AT(j), v[j].len);
		if (v[j].at + v[j].len == nv[v[j].i].size)
			digests[v[j].i] = XXH3_64bits_digest(x);
#ifdef GMSFS_HAVE_CUDA
		if (pinned && (r = cu->cuMemcpyHtoDAsync((CUdeviceptr)(uintptr_t)nv[v[j].i].ptr + v[j].at, PL_AT(j),
							 v[j].len, s[j % 2]))) {
			snprintf(err, errlen, "%s: into the GPU: %s", nv[v[j].i].name, cu_name(cu, r));
			e = -EIO;
		}
#endif
		show(progress, done += v[j].len, total, &t0);
	}
#undef PL_AT
	if (op) { /* started, not finished: waited for (the error stands) */
		char why[128];
		nt_finish(c, op, "receiving", timeout_ms, why, sizeof why);
	}
#ifdef GMSFS_HAVE_CUDA
	for (int k = 0; k < 2; k++)
		if (s[k]) {
			CUresult r = cu->cuStreamSynchronize(s[k]);
			if (r && !e) {
				snprintf(err, errlen, "into the GPU: %s", cu_name(cu, r));
				e = -EIO;
			}
			cu->cuStreamDestroy(s[k]);
		}
#endif
	if (progress)
		fputc('\n', stderr);
	/* Allocations of no bytes have no piece: their digest is the empty one's. */
	for (size_t i = 0; !e && i < n; i++)
		if (!nv[i].size)
			digests[i] = XXH3_64bits(NULL, 0);
	XXH3_freeState(x);
	free(v);
	return e;
}

/* The peer's answer to HELLO: its layout, or its refusal as -errno with its words. */
static int ask(struct nt_conn *c, const char *url, const char *name, const uint8_t *token, size_t token_len,
	       struct nw_layout *l, int timeout_ms, char *err, size_t errlen)
{
	struct nw_hello *h = calloc(1, sizeof *h);
	if (!h)
		return -ENOMEM;
	h->version = NW_VERSION;
	memcpy(h->token, token, token_len);
	h->token_len = token_len;
	snprintf(h->store, sizeof h->store, "%s", name);
	void *f, *body;
	size_t len;
	int e = nw_pack_hello(h, &f, &len);
	free(h);
	if (!e) {
		e = nt_send(c, f, len, timeout_ms, err, errlen);
		free(f);
	}
	if (!e)
		e = nt_recv_frame(c, NW_LAYOUT_MAX, &body, &len, timeout_ms, err, errlen);
	if (e)
		return e;
	char why[256];
	e = nw_parse_layout(body, len, l, why, sizeof why);
	free(body);
	if (e)
		snprintf(err, errlen, "%s: %s", url, why);
	else if (l->error)
		e = -l->error, snprintf(err, errlen, "%s refused: %s", url, l->why);
	return e;
}

int pl_pull(const char *url, const char *store, const uint8_t *token, size_t token_len, int timeout_ms,
	    bool progress, char *how, size_t howlen, char *err, size_t errlen)
{
	char host[256], name[NW_NAME_MAX + 1], got[33];
	uint16_t port;
	how[0] = err[0] = '\0';
	if (pl_parse_url(url, host, sizeof host, &port, name, sizeof name)) {
		snprintf(err, errlen, "%s: not gmsfs://HOST:PORT/STORE", url);
		return -EINVAL;
	}
	struct nt_conn *c = NULL;
	struct cp *cp = NULL;
	gmsfs *g = NULL;
	struct nw_layout l = { 0 };
	struct gmsfs_new *nv = NULL;
	struct gmsfs_entry *ev = NULL;
	uint64_t *digests = NULL, *theirs = NULL, total = 0;
	struct timespec t0;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	/* The target first: a store that cannot take it costs the peer nothing. */
	int e = cp_open(store, &cp, err, errlen);
	if (!e && (e = gmsfs_connect(&g, store, GMSFS_RW, timeout_ms)))
		snprintf(err, errlen, "%s: %s", store, g ? gmsfs_errmsg(g) : gmsfs_strerror(e));
	if (!e && sf_allocations(store) != 0)
		e = -EEXIST, snprintf(err, errlen, "%s holds allocations already: pull into an empty store", store);
	if (!e)
		e = nt_connect(host, port, timeout_ms, &c, err, errlen);
	if (!e)
		e = ask(c, url, name, token, token_len, &l, timeout_ms, err, errlen);
	if (!e && (!(nv = calloc(l.nallocs + 1, sizeof *nv)) || !(ev = calloc(l.nentries + 1, sizeof *ev)) ||
		   !(digests = calloc(l.nallocs + 1, sizeof *digests)) || !(theirs = calloc(l.nallocs + 1, sizeof *theirs))))
		e = -ENOMEM, snprintf(err, errlen, "out of memory");
	for (size_t i = 0; !e && i < l.nallocs; i++) {
		nv[i] = (struct gmsfs_new){ .name = l.allocs[i].name, .tag = l.allocs[i].tag, .size = l.allocs[i].size };
		total += l.allocs[i].size;
	}
	if (!e && l.nallocs && (e = gmsfs_create_many(g, nv, l.nallocs)))
		snprintf(err, errlen, "%s: %s", store, gmsfs_errmsg(g));
	if (!e)
		e = recv_bytes(c, cp, g, nv, l.nallocs, digests, total, progress, timeout_ms, err, errlen);
	void *body = NULL;
	size_t len;
	char why[256];
	if (!e && !(e = nt_recv_frame(c, 64 + 9 * (size_t)l.nallocs, &body, &len, timeout_ms, err, errlen)) &&
	    (e = nw_parse_trailer(body, len, theirs, l.nallocs, why, sizeof why)))
		snprintf(err, errlen, "%s: %s", url, why);
	free(body);
	nt_close(c); /* all it says is here: the peer is free for the next while this one commits */
	c = NULL;
	for (size_t i = 0; !e && i < l.nallocs; i++)
		if (digests[i] != theirs[i])
			e = -EIO, snprintf(err, errlen, "%s: the bytes of %s that came differ from the peer's (xxh3)", url,
					   l.allocs[i].name);
	for (size_t i = 0; !e && i < l.nentries; i++)
		ev[i] = (struct gmsfs_entry){ .key = l.entries[i].key, .alloc = l.entries[i].alloc,
					      .offset = l.entries[i].offset, .size = l.entries[i].size,
					      .flags = l.entries[i].flags, .value = l.entries[i].value,
					      .value_len = l.entries[i].value_len };
	if (!e && l.nentries && (e = gmsfs_meta_put_many(g, ev, l.nentries)))
		snprintf(err, errlen, "%s: %s", store, gmsfs_errmsg(g));
	if (!e && (e = gmsfs_commit(g)))
		snprintf(err, errlen, "%s: commit: %s", store, gmsfs_errmsg(g));
	if (!e && (e = gmsfs_layout_hash(g, got)))
		snprintf(err, errlen, "%s: %s", store, gmsfs_errmsg(g));
	if (!e && strcmp(got, l.hash))
		e = -EIO, snprintf(err, errlen, "pulled, but %s's layout hash is %s, not the peer's %s", store, got, l.hash);
	if (!e)
		snprintf(how, howlen, "%zu allocations, %llu bytes in %.3f s, layout %s", l.nallocs,
			 (unsigned long long)total, seconds_since(&t0), got);
	free(nv);
	free(ev);
	free(digests);
	free(theirs);
	nw_layout_free(&l);
	nt_close(c);
	gmsfs_disconnect(g); /* without a commit: the session rolls back */
	cp_close(cp);
	return e;
}
