/* pull: gmsfs-peer pull (pull.h). */
#include "pull.h"
#include "../loader/copy.h"
#include "lane.h"
#include "net.h"
#include "net_wire.h"
#include "../loader/store_files.h"
#include "clock.h"

#include <gmsfs/gmsfs.h>
#include <gmsfs/load.h> /* struct gmsfs_report */

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
#include <unistd.h>
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

static void show(bool progress, uint64_t done, uint64_t total, const struct timespec *t0)
{
	if (!progress)
		return;
	double s = clock_since_s(t0);
	fprintf(stderr, "\rgmsfs-peer: %llu of %llu MB, %.0f MB/s   ", (unsigned long long)(done >> 20),
		(unsigned long long)(total >> 20), s > 0 ? (double)done / 1e6 / s : 0.0);
}

/* One piece of a stripe's bytes: allocation i's len bytes at at, in segment seg. */
struct pl_piece {
	size_t i, seg;
	uint64_t at, len;
	bool first, last; /* of its segment */
};

/* The pieces of a stripe's segments, in order: piece bytes each (the last of each segment
 * less); *count of them, the caller frees. */
static struct pl_piece *pieces(const struct nw_segment *s, size_t nseg, uint64_t piece, size_t *count)
{
	size_t k = 0, cap = 0;
	for (size_t j = 0; j < nseg; j++)
		cap += (size_t)((s[j].len + piece - 1) / piece);
	struct pl_piece *v = calloc(cap + 1, sizeof *v);
	for (size_t j = 0; v && j < nseg; j++)
		for (uint64_t o = 0; o < s[j].len; o += piece) {
			uint64_t len = s[j].len - o < piece ? s[j].len - o : piece;
			v[k++] = (struct pl_piece){ .i = s[j].i, .seg = j, .at = s[j].at + o, .len = len, .first = !o,
						    .last = o + len == s[j].len };
		}
	*count = k;
	return v;
}

/* A host-backend target's piece: received in place (PL_PIECE), or into a half of its
 * stripe's bounce buffer (PL_BOUNCE) and copied into place by the lane: a copy more a byte,
 * the socket's landing in cached memory, not fresh pages (16-core H200 host, 4 GiB: 1.59 s
 * with it, 2.02-2.08 s in place; 2-core VM, 512 MiB: 1.90 s with it, 1.47 s in place).  So
 * it is taken with PL_BOUNCE_CPUS cores or more, unless GMSFS_PEER_BOUNCE says (0 or 1). */
#define PL_PIECE (32ull << 20)
#define PL_BOUNCE (8ull << 20)
#define PL_BOUNCE_CPUS 8
#define PL_STRIPES 4           /* a pull's stripes unless its caller or GMSFS_PEER_STRIPES says */

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23 /* Linux 5.14 */
#endif

/* A host-backend target's pages, made ahead of the bytes by a thread of their own: else
 * each page's first write (262144 a GB) faults in the middle of the lane's copy into
 * place (received in place, that was 2/3 of a pull's time on the 2-core VM). */
struct pl_populate {
	pthread_t t;
	const struct gmsfs_new *nv;
	const struct pl_piece *v;
	size_t n;
	atomic_bool stop;
	bool started;
};

static void *populate(void *arg)
{
	struct pl_populate *p = arg;
	for (size_t j = 0; j < p->n && !atomic_load(&p->stop); j++)
		if (madvise((char *)p->nv[p->v[j].i].ptr + p->v[j].at, p->v[j].len, MADV_POPULATE_WRITE))
			return NULL; /* an older kernel, or no memory now: the receive faults them itself */
	return NULL;
}

static void populate_start(struct pl_populate *p, const struct gmsfs_new *nv, const struct pl_piece *v, size_t n)
{
	*p = (struct pl_populate){ .nv = nv, .v = v, .n = n };
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
	const char *at;       /* where it landed: a half of the pinned or the bounce buffer */
	bool place;           /* the bounce buffer's: memcpy'd into place after the hash (hot in the cache) */
	XXH3_state_t *x;      /* the lane's alone: pieces come in order */
	uint64_t *digests;    /* a segment's each */
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
	if (p->first)
		XXH3_64bits_reset(j->x);
	XXH3_64bits_update(j->x, j->at, p->len);
	if (p->last)
		j->digests[p->seg] = XXH3_64bits_digest(j->x);
	if (j->place)
		memcpy((char *)j->nv[p->i].ptr + p->at, j->at, p->len);
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

/* What a pull's stripes share: the bytes in so far (the progress line), and a stop that
 * a failed stripe raises so that the others end too. */
struct pl_shared {
	atomic_uint_least64_t done;
	atomic_bool stop;
	bool bounce; /* a host-backend target's bytes through bounce buffers (PL_BOUNCE) */
};

/* A stripe's segments' bytes into the store's memory, each one's digest as it passes:
 * piece j+1 received into one half of the stripe's buffer (its part of the pinned buffer
 * on a GPU, a bounce buffer of its own on the host backend) while the lane hashes piece j
 * in the other half and copies it into its place (cuMemcpyHtoDAsync, or memcpy); or, on
 * the host backend without a bounce, received into its place and hashed there. */
static int recv_bytes(struct nt_conn *c, struct cp_stage *st, struct gmsfs_new *nv, const struct nw_segment *segs,
		      size_t nseg, uint64_t *digests, struct pl_shared *sh, int timeout_ms, char *err, size_t errlen)
{
	char *pinned = st->pinned, *bounce = NULL;
	if (!pinned && sh->bounce && !(bounce = aligned_alloc(4096, 2 * PL_BOUNCE))) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	char *stage = pinned ? pinned : bounce; /* where pieces land, by halves; NULL: in place */
	uint64_t piece = pinned ? st->room / 2 : bounce ? PL_BOUNCE : PL_PIECE;
	size_t count = 0;
	struct pl_piece *v = pieces(segs, nseg, piece, &count);
	XXH3_state_t *x = XXH3_createState();
	struct ln *lane = NULL;
	struct pl_job job = { .nv = nv, .x = x, .digests = digests, .st = st, .place = bounce != NULL };
	int e = v && x ? ln_start(&lane, cp_stage_enter, st) : -ENOMEM;
	if (e)
		snprintf(err, errlen, "no thread to hash with: %s", strerror(-e));
#ifdef GMSFS_HAVE_CUDA
	CUresult r;
	if (!e && pinned && (r = st->cu->cuStreamCreate(&job.s, CU_STREAM_NON_BLOCKING)))
		e = -EIO, snprintf(err, errlen, "no stream for the GPU's bytes: %s", cu_name(st->cu, r));
#endif
	void *op = NULL;
	struct pl_populate pop = { 0 };
	if (!e && !pinned)
		populate_start(&pop, nv, v, count);
	/* Where piece j lands: the half j % 2 of the stripe's buffer, or its place. */
#define PL_AT(j) (stage ? stage + (size_t)((j) % 2) * piece : (char *)nv[v[j].i].ptr + v[j].at)
	if (!e && count)
		e = nt_recv_start(c, PL_AT(0), v[0].len, &op, err, errlen);
	for (size_t j = 0; !e && j < count; j++) {
		e = nt_finish(c, op, "receiving", timeout_ms, err, errlen);
		op = NULL;
		if (!e) /* piece j-1 is in: its half is free */
			e = ln_wait(lane, c, err, errlen);
		if (!e && atomic_load(&sh->stop))
			e = -ECANCELED, snprintf(err, errlen, "another stripe failed");
		if (!e && j + 1 < count)
			e = nt_recv_start(c, PL_AT(j + 1), v[j + 1].len, &op, err, errlen);
		if (e)
			break;
		job.p = &v[j], job.at = PL_AT(j);
		ln_give(lane, absorb, &job);
		atomic_fetch_add(&sh->done, v[j].len);
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
		st->cu->cuStreamDestroy(job.s);
#endif
	populate_stop(&pop);
	if (op) { /* started, not finished: waited for (the error stands) */
		char why[128];
		nt_finish(c, op, "receiving", timeout_ms, why, sizeof why);
	}
	XXH3_freeState(x);
	free(v);
	free(bounce);
	return e;
}

/* The peer's answer to HELLO: its layout, or its refusal as -errno with its words. */
static int ask(struct nt_conn *c, const char *url, const char *name, const uint8_t *token, size_t token_len,
	       uint32_t stripe, uint32_t stripes, struct nw_layout *l, int timeout_ms, char *err, size_t errlen)
{
	struct nw_hello *h = calloc(1, sizeof *h);
	if (!h)
		return -ENOMEM;
	h->version = NW_VERSION;
	h->stripe = stripe;
	h->stripes = stripes;
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
 * Service) whose server answers with the store's layout: its connection in *out (the
 * first of `stripes`), its address in num, the layout in *l.  A refusal (the store not served there, or not committed; the token not
 * taken) or a connection that fails: the next address; at the end, the last reason. */
static int find_peer(const char *url, const char *host, uint16_t port, const char *name, const uint8_t *token,
		     size_t token_len, uint32_t stripes, int timeout_ms, struct nt_conn **out, char *num,
		     struct nw_layout *l, char *err, size_t errlen)
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
		if (getnameinfo(a->ai_addr, a->ai_addrlen, num, INET6_ADDRSTRLEN, NULL, 0, NI_NUMERICHOST))
			continue;
		struct nt_conn *c = NULL;
		asked++;
		e = nt_connect(num, port, timeout_ms, &c, err, errlen);
		if (!e)
			e = ask(c, url, name, token, token_len, 0, stripes, l, timeout_ms, err, errlen);
		if (e == -ECONNRESET && nt_never_answered(c)) { /* UCX says "Endpoint is not connected" */
			char why[512];
			snprintf(why, sizeof why, "%s", err);
			snprintf(err, errlen, "nobody answers at %s port %u (no gmsfs-peer serve listens there, or it is not "
					      "reachable): %s", num, (unsigned)port, why);
			e = -ECONNREFUSED;
		}
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

/* One stripe of a pull: its connection (the first: find_peer's), its part of the pinned
 * buffer, its segments' bytes received and checked against the peer's trailer. */
struct pl_stripe {
	pthread_t t;
	bool started;
	uint32_t k, count, wanted; /* the peer cuts `wanted` as count stripes too (nw_stripes_for) */
	struct nt_conn *c;
	const char *url, *addr, *name;
	uint16_t port;
	const uint8_t *token;
	size_t token_len;
	const struct nw_layout *l;
	struct gmsfs_new *nv;
	struct cp_stage st;
	struct pl_shared *sh;
	int timeout_ms;
	int e;
	char err[512];
};

static int stripe_pull(struct pl_stripe *s)
{
	int e = 0;
	char *err = s->err;
	size_t errlen = sizeof s->err;
	if (!s->c) { /* its own connection, which must find the same commit */
		struct nw_layout l2 = { 0 };
		e = nt_connect(s->addr, s->port, s->timeout_ms, &s->c, err, errlen);
		if (!e)
			e = ask(s->c, s->url, s->name, s->token, s->token_len, s->k, s->wanted, &l2, s->timeout_ms, err,
				errlen);
		if (!e && (strcmp(l2.hash, s->l->hash) || l2.stripes != s->l->stripes))
			e = -ESTALE, snprintf(err, errlen, "%s was committed again during the pull (layout %s, not %s): pull "
					     "again", s->url, l2.hash, s->l->hash);
		nw_layout_free(&l2);
	}
	struct nw_segment *segs = NULL;
	size_t nseg = 0;
	uint64_t *mine = NULL, *theirs = NULL;
	if (!e && (e = nw_stripe(s->l, s->k, s->count, &segs, &nseg)) == 0 &&
	    (!(mine = calloc(nseg + 1, sizeof *mine)) || !(theirs = calloc(nseg + 1, sizeof *theirs))))
		e = -ENOMEM;
	if (e == -ENOMEM)
		snprintf(err, errlen, "out of memory");
	if (!e)
		e = recv_bytes(s->c, &s->st, s->nv, segs, nseg, mine, s->sh, s->timeout_ms, err, errlen);
	void *body = NULL;
	size_t len;
	char why[256];
	if (!e && !(e = nt_recv_frame(s->c, 64 + 9 * nseg, &body, &len, s->timeout_ms, err, errlen)) &&
	    (e = nw_parse_trailer(body, len, theirs, nseg, why, sizeof why)))
		snprintf(err, errlen, "%s: %s", s->url, why);
	free(body);
	nt_close(s->c); /* all it says is here: the peer is free for the next while this one commits */
	s->c = NULL;
	for (size_t k = 0; !e && k < nseg; k++)
		if (mine[k] != theirs[k])
			e = -EIO, snprintf(err, errlen, "%s: the bytes of %s that came differ from the peer's (xxh3)", s->url,
					   s->l->allocs[segs[k].i].name);
	free(segs);
	free(mine);
	free(theirs);
	return e;
}

static void *stripe_run(void *arg)
{
	struct pl_stripe *s = arg;
	cp_stage_enter(&s->st); /* its stream is made in the store's GPU context */
	if ((s->e = stripe_pull(s)) != 0)
		atomic_store(&s->sh->stop, true);
	return NULL;
}

/* The stripes a pull asks for: the caller's (checked by it, as an argument or a flag),
 * else GMSFS_PEER_STRIPES (1 to NW_STRIPES_MAX), else PL_STRIPES; it gets as many as the
 * server serves at once and the store's bytes fill. */
static int stripes_wanted(uint32_t asked, uint32_t *out, char *err, size_t errlen)
{
	const char *v = getenv("GMSFS_PEER_STRIPES");
	*out = asked ? asked : PL_STRIPES;
	if (asked || !v || !*v)
		return 0;
	char *end;
	unsigned long n = strtoul(v, &end, 10);
	if (*end || !n || n > NW_STRIPES_MAX) {
		snprintf(err, errlen, "GMSFS_PEER_STRIPES=%s: connections a pull, 1 to %d", v, NW_STRIPES_MAX);
		return -EINVAL;
	}
	*out = (uint32_t)n;
	return 0;
}

/* Whether a host-backend target's bytes come through bounce buffers (PL_BOUNCE). */
static int bounce_wanted(bool *out, char *err, size_t errlen)
{
	const char *v = getenv("GMSFS_PEER_BOUNCE");
	*out = sysconf(_SC_NPROCESSORS_ONLN) >= PL_BOUNCE_CPUS;
	if (!v || !*v)
		return 0;
	if (strcmp(v, "0") && strcmp(v, "1")) {
		snprintf(err, errlen, "GMSFS_PEER_BOUNCE=%s: 0 or 1 (a host mount's bytes through a buffer)", v);
		return -EINVAL;
	}
	*out = *v == '1';
	return 0;
}

/* The bytes of every stripe, each stripe in a thread of its own on its connection (the
 * first: c, find_peer's) and its part of the pinned buffer; the progress line meanwhile.
 * 0, or the most telling stripe's error. */
static int recv_stripes(struct nt_conn **c, uint32_t wanted, const char *url, const char *addr, uint16_t port,
			const char *name, const uint8_t *token, size_t token_len, const struct nw_layout *l,
			uint32_t count, struct cp *cp, gmsfs *g, struct gmsfs_new *nv, uint64_t total, bool progress,
			bool bounce, int timeout_ms, char *err, size_t errlen)
{
	struct cp_stage st;
	int e = cp_stage(cp, gmsfs_backend(g), &st, err, errlen);
	if (e)
		return e;
	struct pl_shared sh = { .bounce = bounce };
	struct pl_stripe *v = calloc(count, sizeof *v);
	if (!v)
		return -ENOMEM;
	struct timespec t0;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (uint32_t k = 0; k < count; k++) {
		struct pl_stripe *s = &v[k];
		*s = (struct pl_stripe){ .k = k, .count = count, .wanted = wanted, .c = k ? NULL : *c, .url = url, .addr = addr,
					 .name = name, .port = port, .token = token, .token_len = token_len, .l = l,
					 .nv = nv, .st = st, .sh = &sh, .timeout_ms = timeout_ms };
		if (st.pinned) { /* its part of the pinned buffer, in whole pages */
			s->st.room = st.room / count / 8192 * 8192;
			s->st.pinned = st.pinned + k * s->st.room;
		}
		s->started = !pthread_create(&s->t, NULL, stripe_run, s);
		if (!s->started)
			stripe_run(s); /* no thread: this one here */
	}
	*c = NULL; /* the first stripe's now */
	for (uint32_t k = 0; k < count; k++) {
		while (progress && v[k].started && pthread_tryjoin_np(v[k].t, NULL) == EBUSY) {
			show(progress, atomic_load(&sh.done), total, &t0);
			nanosleep(&(struct timespec){ .tv_nsec = 100000000 }, NULL);
		}
		if (v[k].started && !progress)
			pthread_join(v[k].t, NULL);
	}
	show(progress, atomic_load(&sh.done), total, &t0);
	if (progress)
		fputc('\n', stderr);
	/* The most telling failure: another commit found, else a stripe's own, else one it caused. */
	e = 0;
	for (uint32_t pass = 0; pass < 3 && !e; pass++)
		for (uint32_t k = 0; k < count && !e; k++)
			if (v[k].e && (pass == 2 || (pass == 1 && v[k].e != -ECANCELED) || v[k].e == -ESTALE))
				e = v[k].e, snprintf(err, errlen, "%s", v[k].err);
	free(v);
	return e;
}

/* An entry of the peer's layout as gmsfs_meta_put_many takes it (its strings the layout's). */
static struct gmsfs_entry entry_of(const struct nw_entry *x)
{
	return (struct gmsfs_entry){ .key = x->key, .alloc = x->alloc, .offset = x->offset, .size = x->size,
				     .flags = x->flags, .value = x->value, .value_len = x->value_len };
}

int pl_pull(const char *url, const char *store, const uint8_t *token, size_t token_len, int timeout_ms,
	    uint32_t stripes, bool progress, struct gmsfs_report *out, char *err, size_t errlen)
{
	char host[256], name[NW_NAME_MAX + 1], got[33], addr[INET6_ADDRSTRLEN] = "";
	uint16_t port;
	out->how[0] = err[0] = '\0';
	if (pl_parse_url(url, host, sizeof host, &port, name, sizeof name)) {
		snprintf(err, errlen, "%s: not gmsfs://HOST:PORT/STORE", url);
		return -EINVAL;
	}
	uint32_t wanted, count = 1;
	bool bounce;
	int e = stripes_wanted(stripes, &wanted, err, errlen) ?: bounce_wanted(&bounce, err, errlen);
	if (e)
		return e;
	struct nt_conn *c = NULL;
	struct cp *cp = NULL;
	gmsfs *g = NULL;
	struct nw_layout l = { 0 };
	struct gmsfs_new *nv = NULL;
	struct gmsfs_entry *ev = NULL;
	uint64_t total = 0;
	struct timespec t0;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	/* The target first: a store that cannot take it costs the peer nothing. */
	e = cp_open(store, &cp, err, errlen);
	if (!e && (e = gmsfs_connect(&g, store, GMSFS_RW, timeout_ms)))
		snprintf(err, errlen, "%s: %s", store, g ? gmsfs_errmsg(g) : gmsfs_strerror(e));
	if (!e && sf_allocations(store) != 0)
		e = -EEXIST, snprintf(err, errlen, "%s holds allocations already: pull into an empty store", store);
	if (!e)
		e = find_peer(url, host, port, name, token, token_len, wanted, timeout_ms, &c, addr, &l, err, errlen);
	if (!e && (!(nv = calloc(l.nallocs + 1, sizeof *nv)) || !(ev = calloc(l.nentries + 1, sizeof *ev))))
		e = -ENOMEM, snprintf(err, errlen, "out of memory");
	for (size_t i = 0; !e && i < l.nallocs; i++) {
		nv[i] = (struct gmsfs_new){ .name = l.allocs[i].name, .tag = l.allocs[i].tag, .size = l.allocs[i].size };
		total += l.allocs[i].size;
	}
	if (!e && l.nallocs && (e = gmsfs_create_many(g, nv, l.nallocs)))
		snprintf(err, errlen, "%s: %s", store, gmsfs_errmsg(g));
	double ready = clock_since_s(&t0), moved = 0;
	if (!e) {
		count = nw_stripes_for(&l, wanted);
		e = recv_stripes(&c, wanted, url, addr, port, name, token, token_len, &l, count, cp, g, nv, total,
				 progress, bounce, timeout_ms, err, errlen);
	}
	moved = clock_since_s(&t0) - ready;
	for (size_t i = 0; !e && i < l.nentries; i++)
		ev[i] = entry_of(&l.entries[i]);
	if (!e && l.nentries && (e = gmsfs_meta_put_many(g, ev, l.nentries)))
		snprintf(err, errlen, "%s: %s", store, gmsfs_errmsg(g));
	int named = !e && l.version[0] ? gmsfs_commit_version(g, l.version) : -EEXIST; /* a store's once: none */
	if (!e && named && (e = named == -EEXIST ? gmsfs_commit(g) : named))
		snprintf(err, errlen, "%s: commit: %s", store, gmsfs_errmsg(g));
	if (!e && (e = gmsfs_layout_hash(g, got)))
		snprintf(err, errlen, "%s: %s", store, gmsfs_errmsg(g));
	if (!e && strcmp(got, l.hash))
		e = -EIO, snprintf(err, errlen, "pulled, but %s's layout hash is %s, not the peer's %s", store, got, l.hash);
	uint64_t gen = e ? 0 : gmsfs_generation(g); /* every byte checked against the peer's: its content hash is ours */
	if (!e) {
		out->allocations = l.nallocs;
		out->bytes = total;
		out->seconds = clock_since_s(&t0);
		out->bytes_seconds = moved;
		memcpy(out->layout_hash, got, sizeof got);
		snprintf(out->how, sizeof out->how, "%zu allocations, %llu bytes in %.3f s (the layout made in %.3f s, "
			 "the bytes in %.3f s over %u connection%s: %.2f GB/s%s), layout %s", l.nallocs,
			 (unsigned long long)total, out->seconds, ready, moved, count, count > 1 ? "s" : "",
			 moved > 0 ? (double)total / 1e9 / moved : 0.0,
			 bounce && gmsfs_backend(g) == GMSFS_BACKEND_HOST ? ", through bounce buffers" : "", got);
	}
	free(nv);
	free(ev);
	nw_layout_free(&l);
	nt_close(c);
	gmsfs_disconnect(g); /* without a commit: the session rolls back */
	if (!e && l.content[0]) /* once the session is over; a refusal leaves it unknown */
		sf_set_content_hash(store, gen, l.content);
	cp_close(cp);
	return e;
}
