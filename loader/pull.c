/* pull: gmsfs-peer pull (pull.h). */
#include "pull.h"
#include "copy.h"
#include "lane.h"
#include "net.h"
#include "net_wire.h"
#include "store_files.h"

#include <gmsfs/gmsfs.h>

#include <errno.h>
#include <netdb.h>
#include <arpa/inet.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
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

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23 /* Linux 5.14 */
#endif

/* A host-backend target's pages, made ahead of the bytes by a thread of their own: else
 * each page's first write (262144 a GB) faults in the middle of the copy out of UCX's
 * buffers, on the thread that should be receiving (2/3 of a pull's time on the 2-core VM). */
struct pl_populate {
	pthread_t t;
	const struct gmsfs_new *nv;
	size_t n;
	atomic_bool stop;
	bool started;
};

static void *populate(void *arg)
{
	struct pl_populate *p = arg;
	for (size_t i = 0; i < p->n; i++)
		for (uint64_t at = 0; at < p->nv[i].size && !atomic_load(&p->stop); at += PL_PIECE) {
			uint64_t len = p->nv[i].size - at < PL_PIECE ? p->nv[i].size - at : PL_PIECE;
			if (madvise((char *)p->nv[i].ptr + at, len, MADV_POPULATE_WRITE))
				return NULL; /* an older kernel, or no memory now: the receive faults them itself */
		}
	return NULL;
}

static void populate_start(struct pl_populate *p, const struct gmsfs_new *nv, size_t n)
{
	*p = (struct pl_populate){ .nv = nv, .n = n };
	p->started = !pthread_create(&p->t, NULL, populate, p);
}

static void populate_stop(struct pl_populate *p)
{
	atomic_store(&p->stop, true);
	if (p->started)
		pthread_join(p->t, NULL);
	p->started = false;
}

/* The lane's job for one piece: hash it where it landed and, on a GPU, copy it in. */
struct pl_job {
	const struct pl_piece *p;
	const struct gmsfs_new *nv;
	const char *at;       /* where it landed: its place in the store's memory, or the pinned buffer's */
	XXH3_state_t *x;      /* the lane's alone: pieces come in order */
	uint64_t *digests;
	struct cp_stage *st;
#ifdef GMSFS_HAVE_CUDA
	CUstream s;           /* the copy in, beside the hash */
#endif
};

static int absorb(void *arg, char *err, size_t errlen)
{
	struct pl_job *j = arg;
	const struct pl_piece *p = j->p;
#ifdef GMSFS_HAVE_CUDA
	CUresult r = 0;
	CUdeviceptr to = (CUdeviceptr)(uintptr_t)j->nv[p->i].ptr + p->at;
	if (j->st->pinned && (r = j->st->cu->cuMemcpyHtoDAsync(to, j->at, p->len, j->s)))
		goto fail;
#endif
	if (!p->at)
		XXH3_64bits_reset(j->x);
	XXH3_64bits_update(j->x, j->at, p->len);
	if (p->at + p->len == j->nv[p->i].size)
		j->digests[p->i] = XXH3_64bits_digest(j->x);
#ifdef GMSFS_HAVE_CUDA
	if (j->st->pinned && (r = j->st->cu->cuStreamSynchronize(j->s))) /* its half is free again */
		goto fail;
	return 0;
fail:
	snprintf(err, errlen, "%s: into the GPU: %s", j->nv[p->i].name, cu_name(j->st->cu, r));
	return -EIO;
#else
	return 0;
#endif
}

/* Every allocation's bytes into the store's memory, each one's digest as it passes: piece
 * j+1 received (into its place, or into one half of the pinned buffer) while the lane
 * hashes piece j (and on a GPU copies it in from the other half). */
static int recv_bytes(struct nt_conn *c, struct cp *cp, gmsfs *g, struct gmsfs_new *nv, size_t n,
		      uint64_t *digests, uint64_t total, bool progress, int timeout_ms, char *err, size_t errlen)
{
	struct cp_stage st;
	int e = cp_stage(cp, gmsfs_backend(g), &st, err, errlen);
	if (e)
		return e;
	char *pinned = st.pinned;
	uint64_t piece = pinned ? st.room / 2 : PL_PIECE;
	size_t count = 0;
	struct pl_piece *v = pieces(nv, n, piece, &count);
	XXH3_state_t *x = XXH3_createState();
	struct ln *lane = NULL;
	struct pl_job job = { .nv = nv, .x = x, .digests = digests, .st = &st };
	e = v && x ? ln_start(&lane, cp_stage_enter, &st) : -ENOMEM;
	if (e)
		snprintf(err, errlen, "no thread to hash with: %s", strerror(-e));
#ifdef GMSFS_HAVE_CUDA
	CUresult r;
	if (!e && pinned && (r = st.cu->cuStreamCreate(&job.s, CU_STREAM_NON_BLOCKING)))
		e = -EIO, snprintf(err, errlen, "no stream for the GPU's bytes: %s", cu_name(st.cu, r));
#endif
	struct timespec t0;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	uint64_t done = 0;
	void *op = NULL;
	struct pl_populate pop = { 0 };
	if (!e && !pinned)
		populate_start(&pop, nv, n);
	/* Where piece j lands: its place in the store's memory, or the half j % 2 of the pinned buffer. */
#define PL_AT(j) (pinned ? pinned + (size_t)((j) % 2) * piece : (char *)nv[v[j].i].ptr + v[j].at)
	if (!e && count)
		e = nt_recv_start(c, PL_AT(0), v[0].len, &op, err, errlen);
	for (size_t j = 0; !e && j < count; j++) {
		e = nt_finish(c, op, "receiving", timeout_ms, err, errlen);
		op = NULL;
		if (!e) /* piece j-1 is in: its half is free */
			e = ln_wait(lane, c, err, errlen);
		if (!e && j + 1 < count)
			e = nt_recv_start(c, PL_AT(j + 1), v[j + 1].len, &op, err, errlen);
		if (e)
			break;
		job.p = &v[j], job.at = PL_AT(j);
		ln_give(lane, absorb, &job);
		show(progress, done += v[j].len, total, &t0);
	}
#undef PL_AT
	if (lane) {
		char why[256];
		int e2 = ln_wait(lane, c, why, sizeof why);
		if (e2 && !e)
			e = e2, snprintf(err, errlen, "%s", why);
		ln_stop(lane);
	}
#ifdef GMSFS_HAVE_CUDA
	if (job.s)
		st.cu->cuStreamDestroy(job.s);
#endif
	populate_stop(&pop);
	if (op) { /* started, not finished: waited for (the error stands) */
		char why[128];
		nt_finish(c, op, "receiving", timeout_ms, why, sizeof why);
	}
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

/* The first of host's addresses (a name may have several: the pods behind a headless
 * Service) whose server answers with the store's layout: its connection in *out, the
 * layout in *l.  A refusal (the store not served there, or not committed; the token not
 * taken) or a connection that fails: the next address; at the end, the last reason. */
static int find_peer(const char *url, const char *host, uint16_t port, const char *name, const uint8_t *token,
		     size_t token_len, int timeout_ms, struct nt_conn **out, struct nw_layout *l, char *err,
		     size_t errlen)
{
	char ps[8];
	snprintf(ps, sizeof ps, "%u", port);
	struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM }, *ai;
	int r = getaddrinfo(host, ps, &hints, &ai);
	if (r) {
		snprintf(err, errlen, "%s: %s", host, gai_strerror(r));
		return -EHOSTUNREACH;
	}
	int e = -EHOSTUNREACH;
	size_t asked = 0;
	for (struct addrinfo *a = ai; a && e; a = a->ai_next) {
		char num[INET6_ADDRSTRLEN];
		if (getnameinfo(a->ai_addr, a->ai_addrlen, num, sizeof num, NULL, 0, NI_NUMERICHOST))
			continue;
		struct nt_conn *c = NULL;
		asked++;
		e = nt_connect(num, port, timeout_ms, &c, err, errlen);
		if (!e)
			e = ask(c, url, name, token, token_len, l, timeout_ms, err, errlen);
		if (!e) {
			*out = c;
			break;
		}
		nt_close(c);
		nw_layout_free(l);
		*l = (struct nw_layout){ 0 };
	}
	freeaddrinfo(ai);
	if (e && asked > 1) {
		char last[512];
		snprintf(last, sizeof last, "%s", err);
		snprintf(err, errlen, "none of the %zu addresses of %s served %s; the last: %s", asked, host, name, last);
	}
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
		e = find_peer(url, host, port, name, token, token_len, timeout_ms, &c, &l, err, errlen);
	if (!e && (!(nv = calloc(l.nallocs + 1, sizeof *nv)) || !(ev = calloc(l.nentries + 1, sizeof *ev)) ||
		   !(digests = calloc(l.nallocs + 1, sizeof *digests)) || !(theirs = calloc(l.nallocs + 1, sizeof *theirs))))
		e = -ENOMEM, snprintf(err, errlen, "out of memory");
	for (size_t i = 0; !e && i < l.nallocs; i++) {
		nv[i] = (struct gmsfs_new){ .name = l.allocs[i].name, .tag = l.allocs[i].tag, .size = l.allocs[i].size };
		total += l.allocs[i].size;
	}
	if (!e && l.nallocs && (e = gmsfs_create_many(g, nv, l.nallocs)))
		snprintf(err, errlen, "%s: %s", store, gmsfs_errmsg(g));
	double ready = seconds_since(&t0), moved = 0;
	if (!e)
		e = recv_bytes(c, cp, g, nv, l.nallocs, digests, total, progress, timeout_ms, err, errlen);
	moved = seconds_since(&t0) - ready;
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
		snprintf(how, howlen, "%zu allocations, %llu bytes in %.3f s (the layout made in %.3f s, the bytes "
			 "in %.3f s: %.2f GB/s), layout %s", l.nallocs, (unsigned long long)total, seconds_since(&t0),
			 ready, moved, moved > 0 ? (double)total / 1e9 / moved : 0.0, got);
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
