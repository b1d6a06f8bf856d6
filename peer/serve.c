/* serve: gmsfs-peer serve, committed stores of a mount (or of a directory of mounts) sent
 * read-only to peers that show the token (serve.h).  Several peers at once, each by a
 * thread of its own, each wait bounded: a peer that stops reading loses its connection
 * after the timeout, and its place. */
#include "serve.h"
#include "../loader/copy.h"
#include "lane.h"
#include "net.h"
#include "net_wire.h"
#include "../loader/store_files.h"
#include "why.h"

#include <gmsfs/gmsfs.h>

#include <dirent.h>
#include <errno.h>
#include <pthread.h>
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
	/* A symlink is followed (a Kubernetes Secret's files are links into its ..data): the
	 * file reached must be regular and its owner's alone. */
	struct stat st;
	int fd = why_open_read(path, &st, err, errlen);
	if (fd < 0)
		return fd;
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

/* A line on stderr, whole: peers served at once log at once. */
static void logf_(const char *peer, const char *fmt, ...)
{
	char line[1024];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(line, sizeof line, fmt, ap);
	va_end(ap);
	fprintf(stderr, "gmsfs-peer: %s: %s\n", peer, line);
}

/* Per peer served at once: a GPU's context and a pinned buffer, made for the first peer
 * that needs one and kept for the next (a context costs 0.1-0.3 s to make; a peer would
 * wait for it), each for the device of the mount it was made for (a directory of mounts
 * has a GPU a mount). */
static struct {
	pthread_mutex_t mu;
	struct cp *cp[SV_PEERS_MAX];
	char dev[SV_PEERS_MAX][128]; /* its mount's device uuid */
	bool busy[SV_PEERS_MAX];
} pool = { .mu = PTHREAD_MUTEX_INITIALIZER };

/* A free slot's cp for store's device, its context current in this thread: one kept for
 * that device, else an empty slot, else one kept for another device, closed. */
static int cp_take(const char *store, struct cp **out, int *slot, char *err, size_t errlen)
{
	char dev[128];
	if (sf_field(store, "../device", "uuid", dev, sizeof dev)) {
		snprintf(err, errlen, "no ../device");
		return -ENOENT;
	}
	int e = 0, pick = -1;
	pthread_mutex_lock(&pool.mu);
	for (int pass = 0; pass < 3 && pick < 0; pass++)
		for (int i = 0; i < SV_PEERS_MAX && pick < 0; i++)
			if (!pool.busy[i] && (pass == 2 || (pass == 0 ? pool.cp[i] && !strcmp(pool.dev[i], dev) : !pool.cp[i])))
				pick = i;
	if (pick < 0) {
		e = -EBUSY;
		snprintf(err, errlen, "every pinned buffer in use");
	} else if (pool.cp[pick] && !strcmp(pool.dev[pick], dev)) {
		if ((e = cp_enter(pool.cp[pick])))
			snprintf(err, errlen, "the GPU's context");
	} else {
		cp_close(pool.cp[pick]);
		pool.cp[pick] = NULL;
		if (!(e = cp_open(store, &pool.cp[pick], err, errlen)))
			snprintf(pool.dev[pick], sizeof pool.dev[pick], "%s", dev);
	}
	if (!e)
		pool.busy[pick] = true, *out = pool.cp[pick], *slot = pick;
	pthread_mutex_unlock(&pool.mu);
	return e;
}

static void cp_give(int slot)
{
	pthread_mutex_lock(&pool.mu);
	pool.busy[slot] = false;
	pthread_mutex_unlock(&pool.mu);
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

static bool served(const char *state)
{
	return !strcmp(state, "COMMITTED") || !strcmp(state, "RO");
}

/* Served, or a writer's session over a commit (generation past 0): the read lock waits for
 * its end, as a reader's does, and the layout then read is the one served (a stripe of a
 * pull whose source was committed again meanwhile says so, not "not committed"). */
static bool served_at(const char *path, const char *state)
{
	char gen[32];
	return served(state) ||
	       (!strcmp(state, "RW") && !sf_field(path, "state", "generation", gen, sizeof gen) && strcmp(gen, "0"));
}

/* The store name of mount, or of the first mount under it that has it committed (a
 * node's /run/gmsfs, a mount per GPU, mounts that come and go: looked for at each
 * request), into path: 0; -ENOENT where none has it; -EAGAIN where the first that has
 * it has not committed it (its state in state). */
static int find_store(const char *mount, const char *name, char *path, size_t pathlen, char *state, size_t statelen)
{
	char dev[4096], first[32] = "";
	snprintf(dev, sizeof dev, "%s/device", mount);
	if (!access(dev, F_OK)) { /* a mount */
		snprintf(path, pathlen, "%s/%s", mount, name);
		if (sf_field(path, "state", "state", state, statelen))
			return -ENOENT;
		return served_at(path, state) ? 0 : -EAGAIN;
	}
	DIR *d = opendir(mount);
	struct dirent *de;
	int e = -ENOENT;
	while (d && e && (de = readdir(d))) {
		if (de->d_name[0] == '.')
			continue;
		snprintf(dev, sizeof dev, "%s/%s/device", mount, de->d_name);
		snprintf(path, pathlen, "%s/%s/%s", mount, de->d_name, name);
		if (access(dev, F_OK) || sf_field(path, "state", "state", state, statelen))
			continue;
		if (served_at(path, state))
			e = 0;
		else if (!first[0])
			snprintf(first, sizeof first, "%s", state), e = -EAGAIN;
	}
	if (d)
		closedir(d);
	if (e == -EAGAIN)
		snprintf(state, statelen, "%s", first);
	return e;
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
	gmsfs_content_hash(g, l->content); /* "" where unknown; else the puller may tell its daemon */
	gmsfs_version_name(g, l->version); /* "" where that commit has none; else the puller's commit has it */
	return gmsfs_layout_hash(g, l->hash);
}

#define SV_PIECE (32ull << 20) /* host memory: bytes hashed and sent a piece */
#define SV_STEP (4ull << 20)   /* out of the GPU: bytes copied, then hashed, a step */
#define SV_STEPS 64            /* steps a piece at most (a piece is half the pinned buffer) */

/* One piece of an allocation's bytes, as the lane readies it to be sent: out of the GPU
 * into a half of the pinned buffer, hashed. */
struct sv_job {
	const char *src;      /* in the store's memory */
	char *stage;          /* a half of the pinned buffer; NULL: sent from src */
	uint64_t len;
	bool first, last;     /* of its allocation */
	XXH3_state_t *x;      /* the lane's alone: pieces go in order */
	uint64_t *digest;
	uint64_t *digests;    /* every allocation's: digest is one of them */
	const char *name;
	struct cp_stage *st;
#ifdef GMSFS_HAVE_CUDA
	CUstream s;           /* the copies out of the GPU */
	CUevent ev[SV_STEPS]; /* each step's copy done */
#endif
};

static int ready(void *arg, char *err, size_t errlen)
{
	struct sv_job *j = arg;
	if (j->first)
		XXH3_64bits_reset(j->x);
	if (!j->stage) {
		XXH3_64bits_update(j->x, j->src, j->len);
	} else {
#ifdef GMSFS_HAVE_CUDA
		/* Out of the GPU a step at a time, each step hashed once its copy is in, while
		 * the next ones copy. */
		struct cu_api *cu = j->st->cu;
		CUresult r = 0;
		size_t steps = 0;
		for (uint64_t o = 0; !r && o < j->len; o += SV_STEP, steps++)
			if (!(r = cu->cuMemcpyDtoHAsync(j->stage + o, (CUdeviceptr)(uintptr_t)j->src + o,
							 j->len - o < SV_STEP ? j->len - o : SV_STEP, j->s)))
				r = cu->cuEventRecord(j->ev[steps], j->s);
		for (size_t k = 0; !r && k < steps; k++) {
			uint64_t o = (uint64_t)k * SV_STEP;
			if (!(r = cu->cuEventSynchronize(j->ev[k])))
				XXH3_64bits_update(j->x, j->stage + o, j->len - o < SV_STEP ? j->len - o : SV_STEP);
		}
		if (r) {
			cu->cuStreamSynchronize(j->s); /* nothing left copying into the stage */
			snprintf(err, errlen, "%s: out of the GPU: %s", j->name, cu_name(cu, r));
			return -EIO;
		}
#endif
	}
	if (j->last)
		*j->digest = XXH3_64bits_digest(j->x);
	return 0;
}


/* Where send_bytes is: segment k, at bytes into it. */
struct sv_cursor {
	const struct gmsfs_mapping *v;
	const struct nw_segment *s;
	size_t nseg, k;
	uint64_t at, piece;
};

/* The next piece, as job j (base's lane fields; staged in the half j % 2 of pinned, if
 * any) into *job: false when none is left.  Segments hold bytes (nw_stripe). */
static bool next_piece(struct sv_cursor *q, const struct sv_job *base, char *pinned, size_t j, struct sv_job *job)
{
	if (q->k < q->nseg && q->at == q->s[q->k].len)
		q->k++, q->at = 0;
	if (q->k == q->nseg)
		return false;
	const struct nw_segment *s = &q->s[q->k];
	const struct gmsfs_mapping *m = &q->v[s->i];
	uint64_t len = s->len - q->at < q->piece ? s->len - q->at : q->piece;
	*job = *base;
	job->src = (const char *)m->ptr + s->at + q->at;
	job->stage = pinned ? pinned + (j % 2) * q->piece : NULL;
	job->len = len;
	job->first = !q->at;
	job->last = q->at + len == s->len;
	job->digest = &base->digests[q->k];
	job->name = m->name;
	q->at += len;
	return true;
}

/* A stripe's bytes (its segments), in order, and each segment's digest: straight from
 * host memory, or out of the GPU through the pinned buffer of the store's context, in two
 * halves.  Piece j goes while the lane readies piece j+1. */
static int send_bytes(struct nt_conn *c, struct cp *cp, gmsfs *g, const struct nw_segment *segs, size_t nseg,
		      uint64_t *digests, int timeout_ms, char *err, size_t errlen)
{
	const struct gmsfs_mapping *v;
	gmsfs_mappings(g, &v);
	struct cp_stage st;
	int e = cp_stage(cp, gmsfs_backend(g), &st, err, errlen);
	if (e)
		return e;
	char *pinned = st.pinned;
	uint64_t piece = pinned ? st.room / 2 : SV_PIECE;
	XXH3_state_t *x = XXH3_createState();
	struct ln *lane = NULL;
	struct sv_job base = { .x = x, .st = &st, .digests = digests };
	e = x ? ln_start(&lane, cp_stage_enter, &st) : -ENOMEM;
	if (e)
		snprintf(err, errlen, "no thread to hash with: %s", strerror(-e));
#ifdef GMSFS_HAVE_CUDA
	if (!e && pinned && piece > SV_STEPS * SV_STEP)
		piece = SV_STEPS * SV_STEP;
	CUresult r = 0;
	if (!e && pinned && !(r = st.cu->cuStreamCreate(&base.s, CU_STREAM_NON_BLOCKING)))
		for (size_t k = 0; !r && k < SV_STEPS; k++)
			r = st.cu->cuEventCreate(&base.ev[k], CU_EVENT_DISABLE_TIMING);
	if (r)
		e = -EIO, snprintf(err, errlen, "no stream for the GPU's bytes: %s", cu_name(st.cu, r));
#endif
	struct sv_job jobs[2]; /* piece j's in jobs[j % 2]; its stage the half j % 2 */
	size_t j = 0;
	void *op = NULL;       /* piece j-1's send */
	struct sv_cursor q = { .v = v, .s = segs, .nseg = nseg, .piece = piece };
	bool more = !e && next_piece(&q, &base, pinned, j, &jobs[0]);
	if (more)
		ln_give(lane, ready, &jobs[0]);
	while (more && !e) {
		e = ln_wait(lane, c, err, errlen); /* piece j ready, piece j-1 moving */
		if (!e && op) /* piece j-1 gone: its half is free for piece j+1 */
			e = nt_finish(c, op, "sending", timeout_ms, err, errlen);
		op = NULL;
		struct sv_job *now = &jobs[j % 2];
		if (!e)
			e = nt_send_start(c, now->stage ? now->stage : now->src, now->len, &op, err, errlen);
		if (e)
			break;
		j++;
		if ((more = next_piece(&q, &base, pinned, j, &jobs[j % 2])))
			ln_give(lane, ready, &jobs[j % 2]);
	}
	char why[256];
	int e2 = lane ? ln_wait(lane, NULL, why, sizeof why) : 0;
	if (!e && e2)
		e = e2, snprintf(err, errlen, "%s", why);
	if (op) { /* waited for also after an error: the request ends with it */
		e2 = nt_finish(c, op, "sending", timeout_ms, why, sizeof why);
		if (!e && e2)
			e = e2, snprintf(err, errlen, "%s", why);
	}
	ln_stop(lane);
#ifdef GMSFS_HAVE_CUDA
	for (size_t k = 0; k < SV_STEPS; k++)
		if (base.ev[k])
			st.cu->cuEventDestroy(base.ev[k]);
	if (base.s)
		st.cu->cuStreamDestroy(base.s);
#endif
	XXH3_freeState(x);
	return e;
}

/* The peer's hello, read and checked: its token, a store served here and committed (its
 * path in path).  0 with *out (the caller frees it), or -errno: refused, said to the peer
 * where it sent a hello (*out then NULL, or the hello refused). */
static int hello_checked(const struct sv_options *o, struct nt_conn *c, const char *peer, struct nw_hello **out,
			 char *path, size_t pathlen)
{
	char err[512] = "";
	void *body;
	size_t len;
	int e = nt_recv_frame(c, NW_HELLO_MAX, &body, &len, o->timeout_ms, err, sizeof err);
	if (e) {
		logf_(peer, "refused: hello: %s", err);
		return e;
	}
	struct nw_hello *h = *out = malloc(sizeof *h);
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
	int found = e ? 0 : find_store(o->mount, h->store, path, pathlen, state, sizeof state);
	if (found == -ENOENT)
		e = refuse(c, peer, o->timeout_ms, ENOENT, "%s: no such store", h->store);
	else if (found)
		e = refuse(c, peer, o->timeout_ms, EAGAIN, "%s is %s, not committed", h->store, state);
	return e;
}

static int serve_one(const struct sv_options *o, struct nt_conn *c, const char *peer)
{
	char err[512] = "", path[4096];
	size_t len;
	struct nw_hello *h = NULL;
	int e = hello_checked(o, c, peer, &h, path, sizeof path);
	if (!h)
		return e;
	struct cp *cp = NULL;
	int slot = -1;
	gmsfs *g = NULL;
	char **keys = NULL;
	struct gmsfs_meta *m = NULL;
	size_t ne = 0;
	if (!e && (e = cp_take(path, &cp, &slot, err, sizeof err)))
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
	l.stripes = o->peers < NW_STRIPES_MAX ? (uint32_t)o->peers : NW_STRIPES_MAX;
	if (!e && !(e = nw_pack_layout(&l, &f, &len)))
		e = send_frame(c, f, len, o->timeout_ms, err, sizeof err);
	struct nw_segment *segs = NULL;
	size_t nseg = 0;
	uint32_t count = nw_stripes_for(&l, h->stripes); /* as the peer counts them */
	if (!e && h->stripe >= count) /* the layout went: the peer sees the cut, and goes */
		e = -EPROTO, snprintf(err, sizeof err, "stripe %u of %u asked for", h->stripe + 1, count);
	if (!e && (e = nw_stripe(&l, h->stripe, count, &segs, &nseg)) == 0 &&
	    !(digests = calloc(nseg + 1, sizeof *digests)))
		e = -ENOMEM;
	uint64_t bytes = 0;
	for (size_t k = 0; k < nseg; k++)
		bytes += segs[k].len;
	if (!e)
		e = send_bytes(c, cp, g, segs, nseg, digests, o->timeout_ms, err, sizeof err);
	if (!e && !(e = nw_pack_trailer(digests, nseg, &f, &len)))
		e = send_frame(c, f, len, o->timeout_ms, err, sizeof err);
	char part[48] = "";
	if (count > 1)
		snprintf(part, sizeof part, ", stripe %u of %u", h->stripe + 1, count);
	if (!e)
		logf_(peer, "sent %s (%zu allocations, %llu bytes%s, layout %s)", h->store, l.nallocs,
		      (unsigned long long)bytes, part, l.hash);
	else if (answered)
		logf_(peer, "%s: %s (%s)", h->store, err[0] ? err : strerror(-e), part[0] ? part + 2 : "one stripe");
	free(segs);
	free(digests);
	free(l.allocs);
	free(l.entries);
	if (keys)
		gmsfs_meta_free_all(keys, m, ne);
	gmsfs_disconnect(g); /* the read lock goes with the connection */
	if (slot >= 0)
		cp_give(slot);
	free(h);
	return e;
}

/* Peers served at once, each by a thread of its own; at most o->peers. */
static struct {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int n;
} active = { .mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER };

struct sv_peer {
	const struct sv_options *o;
	struct nt_conn *c;
	char name[64];
};

static void *serve_peer(void *arg)
{
	struct sv_peer *p = arg;
	serve_one(p->o, p->c, p->name);
	nt_await_close(p->c, p->o->timeout_ms); /* the peer has read the refusal or the trailer */
	nt_close(p->c);
	free(p);
	pthread_mutex_lock(&active.mu);
	active.n--;
	pthread_cond_signal(&active.cv);
	pthread_mutex_unlock(&active.mu);
	return NULL;
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
	fprintf(stderr, "gmsfs-peer: serving %s on %s:%u, %d peers at once\n", o->mount, o->addr[0] ? o->addr : "*",
		o->port, o->peers);
	pthread_attr_t attr;
	pthread_attr_init(&attr);
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	for (;;) {
		pthread_mutex_lock(&active.mu); /* a free place first: the others wait in UCX's queue */
		while (active.n >= o->peers)
			pthread_cond_wait(&active.cv, &active.mu);
		pthread_mutex_unlock(&active.mu);
		struct sv_peer *p = calloc(1, sizeof *p);
		if (!p || (e = nt_accept(l, -1, &p->c, p->name, sizeof p->name, err, sizeof err))) {
			fprintf(stderr, "gmsfs-peer: %s\n", p ? err : "out of memory");
			free(p);
			continue;
		}
		p->o = o;
		pthread_mutex_lock(&active.mu);
		active.n++;
		pthread_mutex_unlock(&active.mu);
		pthread_t t;
		if (pthread_create(&t, &attr, serve_peer, p))
			serve_peer(p); /* no thread: served here */
	}
}
