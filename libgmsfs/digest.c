/* digest: the content hash of the committed layout a reader holds (gmsfs_digest;
 * gmsfs(5), CONTENT HASH): each allocation's bytes hashed where they are (host memory in
 * place; GPU memory by the GPU, hash_cuda.c, or where it cannot, read into pinned host
 * memory a chunk at a time), then one hash over the layout hash and theirs; told to the daemon on request (user.gms.content_hash, which
 * needs write permission on the store), so that `cat STORE/content_hash` says it. */
#include "internal.h"
#include "piece_hash.h"

#define XXH_INLINE_ALL /* header only: libgmsfs links nothing more */
#include <xxhash.h>

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/xattr.h>
#include <unistd.h>

#define DIGEST_PIECE (2ull << 20)  /* an allocation is hashed in pieces (gmsfs(5)): they can go at once */
/* GPU memory read a chunk at a time (a whole number of pieces) into DIGEST_BUFS pinned
 * buffers: some being read while the others are hashed.  Few and small: new pinned
 * memory costs ~0.2 ms a MiB to make (an H200's host; 64 MiB: ~4% of reading 16 GiB). */
#define DIGEST_CHUNK (16ull << 20)
#define DIGEST_BUFS 4
#define DIGEST_THREADS 16

static void put_le(XXH3_state_t *st, uint64_t v, int bytes)
{
	uint8_t b[8];
	for (int i = 0; i < bytes; i++)
		b[i] = (uint8_t)(v >> (8 * i));
	XXH3_128bits_update(st, b, (size_t)bytes);
}

/* The pieces of every allocation (in the order of the hash), each hashed into its slot by
 * as many threads as there are cores, then each allocation's digest over its slots in
 * order.  Host memory is hashed in place; GPU memory is read a chunk at a time by the
 * calling thread (its CUDA context) into DIGEST_BUFS pinned buffers, round robin, copies
 * queued ahead on a stream of its own so the copy engine never waits for a thread, while
 * the threads hash the chunks read before: the copy engine, not the hash, sets the pace.
 * A thread sleeps only when it must, and is woken only when it sleeps. */
struct digest_job {
	gmsfs *g;
	size_t npieces, nchunks;
	const char **at;          /* a piece's bytes where they are mapped */
	uint64_t *len;
	size_t *chunk;            /* the chunk a piece is in */
	XXH64_canonical_t *out;   /* its hash: XXH3-64, canonical (big-endian) */
	const char **chunk_at;    /* a chunk's first byte, mapped */
	uint64_t *chunk_len;
	size_t *chunk_pieces;
	atomic_size_t *chunk_done; /* its pieces hashed */
	char *buf[DIGEST_BUFS];   /* NULL: hashed in place */
	void *reader;             /* the backend's queue of reads (NULL: copied at once) */
	atomic_size_t next;       /* the next piece to hash */
	atomic_size_t read;       /* chunks read (all of them in place) */
	atomic_bool failed;
	pthread_mutex_t mu;       /* for sleeping: */
	pthread_cond_t cv;
	size_t sleepers;          /* hashing threads waiting for a chunk to be read */
	atomic_bool reader_sleeps; /* the reading thread waiting for a buffer */
	double us_read, us_waited; /* GMSFS_TRACE_IMPORT: the reading's time, and its waits for a buffer */
};

/* A piece's bytes, once its chunk is read: false when the reading failed. */
static bool piece_ready(struct digest_job *j, size_t k, const char **bytes)
{
	size_t c = j->chunk[k];
	if (!j->buf[0]) {
		*bytes = j->at[k];
		return true;
	}
	if (atomic_load(&j->read) <= c && !atomic_load(&j->failed)) {
		pthread_mutex_lock(&j->mu);
		j->sleepers++;
		while (atomic_load(&j->read) <= c && !atomic_load(&j->failed))
			pthread_cond_wait(&j->cv, &j->mu);
		j->sleepers--;
		pthread_mutex_unlock(&j->mu);
	}
	*bytes = j->buf[c % DIGEST_BUFS] + (j->at[k] - j->chunk_at[c]);
	return !atomic_load(&j->failed);
}

static void *hash_pieces(void *arg)
{
	struct digest_job *j = arg;
	const char *bytes;
	for (size_t k; (k = atomic_fetch_add(&j->next, 1)) < j->npieces && piece_ready(j, k, &bytes);) {
		XXH64_canonicalFromHash(&j->out[k], piece_hash(bytes, j->len[k]));
		size_t c = j->chunk[k];
		/* Its buffer free for the chunk DIGEST_BUFS on: the reader told, if it waits
		 * (seq_cst both ways: it sees this count, or this sees it wait). */
		if (atomic_fetch_add(&j->chunk_done[c], 1) + 1 == j->chunk_pieces[c] && atomic_load(&j->reader_sleeps)) {
			pthread_mutex_lock(&j->mu);
			pthread_cond_broadcast(&j->cv);
			pthread_mutex_unlock(&j->mu);
		}
	}
	return NULL;
}

/* GPU memory read into host memory through the backend's queue; host memory copied at
 * once where GMSFS_DIGEST_COPY is set (the tests' way through this path on the host). */
static int chunk_queue(struct digest_job *j, size_t c)
{
	void *to = j->buf[c % DIGEST_BUFS];
	if (!j->reader) {
		memcpy(to, j->chunk_at[c], j->chunk_len[c]);
		return 0;
	}
	return j->g->be->read_queue(j->g, j->reader, (int)(c % DIGEST_BUFS), to, j->chunk_at[c], j->chunk_len[c]);
}

static int chunk_alloc(gmsfs *g, uint64_t n, void **p)
{
	if (g->be->host_alloc)
		return g->be->host_alloc(g, n, p);
	return (*p = malloc(n)) ? 0 : -ENOMEM;
}

static void chunk_free(gmsfs *g, void *p)
{
	if (g->be->host_free)
		g->be->host_free(g, p, DIGEST_CHUNK);
	else
		free(p);
}

static bool hashed(struct digest_job *j, size_t c)
{
	return atomic_load(&j->chunk_done[c]) == j->chunk_pieces[c];
}

/* The hashing threads told that chunks up to n are read (or that reading failed). */
static void publish(struct digest_job *j, size_t n, int e)
{
	atomic_store(&j->read, n);
	if (e)
		atomic_store(&j->failed, true);
	pthread_mutex_lock(&j->mu);
	if (j->sleepers || e)
		pthread_cond_broadcast(&j->cv);
	pthread_mutex_unlock(&j->mu);
}

/* The calling thread's part when GPU memory is read: each chunk queued into its buffer
 * once the chunk DIGEST_BUFS before it is hashed, the oldest waited for when nothing
 * more can be queued.  0 or -errno (then the threads stop). */
static int read_chunks(struct digest_job *j)
{
	const struct gm_backend *be = j->g->be;
	size_t queued = 0, copied = 0;
	int e = 0;
	while (copied < j->nchunks && !e) {
		double t0 = gm_us();
		if (queued < j->nchunks && (queued < DIGEST_BUFS || hashed(j, queued - DIGEST_BUFS))) {
			e = chunk_queue(j, queued++);
		} else if (copied < queued) {
			if (j->reader)
				e = be->read_wait(j->g, j->reader, (int)(copied % DIGEST_BUFS));
			publish(j, copied += !e, e);
			j->us_read += gm_us() - t0;
		} else { /* every buffer read and not yet hashed */
			pthread_mutex_lock(&j->mu);
			atomic_store(&j->reader_sleeps, true);
			while (!hashed(j, queued - DIGEST_BUFS))
				pthread_cond_wait(&j->cv, &j->mu);
			atomic_store(&j->reader_sleeps, false);
			pthread_mutex_unlock(&j->mu);
			j->us_waited += gm_us() - t0;
		}
	}
	if (e)
		publish(j, copied, e);
	return e;
}

static void job_free(struct digest_job *j)
{
	if (j->reader)
		j->g->be->reader_close(j->g, j->reader);
	for (int b = 0; b < DIGEST_BUFS; b++)
		if (j->buf[b])
			chunk_free(j->g, j->buf[b]);
	free(j->at), free(j->len), free(j->chunk), free(j->out);
	free(j->chunk_at), free(j->chunk_len), free(j->chunk_pieces), free(j->chunk_done);
}

/* The job's pieces and chunks over the mappings in order; its buffers where GPU memory
 * must be read.  0 or -errno, said. */
static int job_plan(gmsfs *g, const struct gmsfs_mapping *const *order, size_t n, struct digest_job *j)
{
	*j = (struct digest_job){ .g = g };
	for (size_t i = 0; i < n; i++) {
		j->npieces += (size_t)((order[i]->size + DIGEST_PIECE - 1) / DIGEST_PIECE);
		j->nchunks += (size_t)((order[i]->size + DIGEST_CHUNK - 1) / DIGEST_CHUNK);
	}
	j->at = calloc(j->npieces + 1, sizeof *j->at);
	j->len = calloc(j->npieces + 1, sizeof *j->len);
	j->chunk = calloc(j->npieces + 1, sizeof *j->chunk);
	j->out = calloc(j->npieces + 1, sizeof *j->out);
	j->chunk_at = calloc(j->nchunks + 1, sizeof *j->chunk_at);
	j->chunk_len = calloc(j->nchunks + 1, sizeof *j->chunk_len);
	j->chunk_pieces = calloc(j->nchunks + 1, sizeof *j->chunk_pieces);
	j->chunk_done = calloc(j->nchunks + 1, sizeof *j->chunk_done);
	if (!j->at || !j->len || !j->chunk || !j->out || !j->chunk_at || !j->chunk_len || !j->chunk_pieces ||
	    !j->chunk_done)
		return gm_error(g, -ENOMEM, "out of memory");
	size_t k = 0, c = 0;
	for (size_t i = 0; i < n; i++)
		for (uint64_t off = 0; off < order[i]->size; off += DIGEST_CHUNK, c++) {
			uint64_t left = order[i]->size - off;
			j->chunk_at[c] = (const char *)order[i]->ptr + off;
			j->chunk_len[c] = left < DIGEST_CHUNK ? left : DIGEST_CHUNK;
			for (uint64_t at = 0; at < j->chunk_len[c]; at += DIGEST_PIECE, k++) {
				j->at[k] = j->chunk_at[c] + at;
				j->len[k] = j->chunk_len[c] - at < DIGEST_PIECE ? j->chunk_len[c] - at : DIGEST_PIECE;
				j->chunk[k] = c;
				j->chunk_pieces[c]++;
			}
		}
	atomic_init(&j->read, j->nchunks);
	size_t bufs = j->nchunks < DIGEST_BUFS ? j->nchunks : DIGEST_BUFS;
	bool copy = g->be->read_queue || getenv("GMSFS_DIGEST_COPY");
	int e = copy && bufs && g->be->read_queue ? g->be->reader_open(g, DIGEST_BUFS, &j->reader) : 0;
	if (e)
		return gm_error(g, e, "digest: a stream to read GPU memory on: %s", strerror(-e));
	for (size_t b = 0; copy && b < bufs; b++) {
		if ((e = chunk_alloc(g, DIGEST_CHUNK, (void **)&j->buf[b])))
			return gm_error(g, e, "digest: %llu bytes of host memory to read into: %s", DIGEST_CHUNK,
					strerror(-e));
		atomic_store(&j->read, 0);
	}
	return 0;
}

/* On the GPU that holds the bytes (hash_cuda.c): every piece's hash into (*out)[k], in
 * the order of the hash.  -errno where it cannot (a driver whose PTX is older than the
 * kernel's, say): the caller reads the bytes into host memory instead, for the same hash. */
static int hash_on_device(gmsfs *g, const struct gmsfs_mapping *const *order, size_t n, XXH64_canonical_t **out)
{
	size_t npieces = 0, k = 0;
	for (size_t i = 0; i < n; i++)
		npieces += (size_t)((order[i]->size + DIGEST_PIECE - 1) / DIGEST_PIECE);
	const void **at = calloc(npieces + 1, sizeof *at);
	uint64_t *len = calloc(npieces + 1, sizeof *len), *h = calloc(npieces + 1, sizeof *h);
	*out = calloc(npieces + 1, sizeof **out);
	char why[200] = "out of memory";
	double t0 = gm_us();
	int e = at && len && h && *out ? 0 : -ENOMEM;
	for (size_t i = 0; !e && i < n; i++)
		for (uint64_t off = 0; off < order[i]->size; off += DIGEST_PIECE, k++) {
			at[k] = (const char *)order[i]->ptr + off;
			len[k] = order[i]->size - off < DIGEST_PIECE ? order[i]->size - off : DIGEST_PIECE;
		}
	if (!e)
		e = g->be->hash_pieces(g, npieces, at, len, h, why, sizeof why);
	for (k = 0; !e && k < npieces; k++)
		XXH64_canonicalFromHash(&(*out)[k], h[k]);
	if (gm_tracing())
		fprintf(stderr, "gmsfs: digest: %zu pieces hashed on the GPU: %.0f us (%s%s)\n", npieces, gm_us() - t0,
			e ? "it cannot: " : "", why);
	free(at), free(len), free(h);
	if (e)
		free(*out), *out = NULL;
	return e;
}

/* Every piece's hash into (*out)[k], the bytes read where they are: host memory in place,
 * GPU memory through pinned host memory.  0 or -errno, said. */
static int hash_by_reading(gmsfs *g, const struct gmsfs_mapping *const *order, size_t n, XXH64_canonical_t **out)
{
	struct digest_job j;
	double t0 = gm_us();
	int e = job_plan(g, order, n, &j);
	double t1 = gm_us();
	if (e) {
		job_free(&j);
		return e;
	}
	pthread_mutex_init(&j.mu, NULL);
	pthread_cond_init(&j.cv, NULL);
	atomic_init(&j.next, 0);
	long cores = sysconf(_SC_NPROCESSORS_ONLN);
	size_t want = cores < 1 ? 1 : cores > DIGEST_THREADS ? DIGEST_THREADS : (size_t)cores, started = 0;
	/* Reading, this thread waits for the copies (the driver may spin): the others hash. */
	bool reads = j.buf[0] != NULL;
	size_t hashers = want > 1 ? want - 1 : 1;
	pthread_t t[DIGEST_THREADS];
	while (started < hashers && started < j.npieces && !pthread_create(&t[started], NULL, hash_pieces, &j))
		started++; /* a thread that cannot start leaves its share to the others */
	if (reads && !started)
		e = gm_error(g, -EAGAIN, "digest: no thread to hash with");
	else if (reads && (e = read_chunks(&j)))
		gm_error(g, e, "digest: reading GPU memory: %s", strerror(-e));
	else if (!reads)
		hash_pieces(&j);
	if (e) /* the threads stop at their next piece */
		atomic_store(&j.next, j.npieces);
	for (size_t i = 0; i < started; i++)
		pthread_join(t[i], NULL);
	if (gm_tracing())
		fprintf(stderr, "gmsfs: digest: %zu pieces in %zu chunks, %zu threads hashing%s: buffers %.0f us, "
			"then %.0f us (reading %.0f us, waiting for a free buffer %.0f us)\n", j.npieces, j.nchunks,
			started + !reads, reads ? " while this one reads" : "", t1 - t0, gm_us() - t1, j.us_read,
			j.us_waited);
	pthread_cond_destroy(&j.cv);
	pthread_mutex_destroy(&j.mu);
	if (!e)
		*out = j.out, j.out = NULL; /* the caller's now */
	job_free(&j);
	return e;
}

/* Every allocation's digest into digests[i]: XXH3-128 over the canonical XXH3-64 of each
 * DIGEST_PIECE of its bytes (the last piece shorter): the pieces' hashes gmsfs-snapshot
 * keeps, so that a snapshot's save and restore know the content hash with no second pass.
 * The pieces are hashed by the GPU where the bytes are in its memory and it can
 * (GMSFS_DIGEST_GPU=0: never), else read. */
static int hash_all(gmsfs *g, const struct gmsfs_mapping *const *order, size_t n, XXH3_state_t *st,
		    uint8_t (*digests)[GMSFS_HASH_LEN])
{
	XXH64_canonical_t *out = NULL;
	const char *gpu = getenv("GMSFS_DIGEST_GPU");
	int e = -ENOTSUP;
	if (g->be->hash_pieces && !(gpu && !strcmp(gpu, "0")))
		e = hash_on_device(g, order, n, &out);
	if (e)
		e = hash_by_reading(g, order, n, &out);
	for (size_t i = 0, k = 0; !e && i < n; i++) {
		XXH3_128bits_reset(st);
		for (uint64_t off = 0; off < order[i]->size; off += DIGEST_PIECE, k++)
			XXH3_128bits_update(st, out[k].digest, sizeof out[k].digest);
		XXH128_canonical_t c;
		XXH128_canonicalFromHash(&c, XXH3_128bits_digest(st));
		memcpy(digests[i], c.digest, GMSFS_HASH_LEN);
	}
	free(out);
	return e;
}

static int by_name(const void *a, const void *b)
{
	return strcmp((*(const struct gmsfs_mapping *const *)a)->name, (*(const struct gmsfs_mapping *const *)b)->name);
}

int gmsfs_digest(gmsfs *g, unsigned flags, char hex[33])
{
	if (!g || !hex)
		return g ? gm_error(g, -EINVAL, "digest: no place for the hash") : -EINVAL;
	hex[0] = '\0';
	if (flags & ~GMSFS_DIGEST_RECORD)
		return gm_error(g, -EINVAL, "digest: flags 0x%x: GMSFS_DIGEST_RECORD is known", flags);
	if (g->lock != GMSFS_RO)
		return gm_error(g, -EPERM, "digest: a reader's (a committed layout's bytes, which no writer changes "
				"meanwhile); this handle holds %s", g->lock ? "the writer session" : "no lock");
	int e = gmsfs_import_all(g);
	if (e)
		return e;
	uint64_t generation = g->info.generation;
	const struct gmsfs_mapping **order = calloc(g->nmaps + 1, sizeof *order);
	uint8_t (*digests)[GMSFS_HASH_LEN] = calloc(g->nmaps + 1, sizeof *digests);
	XXH3_state_t *one = XXH3_createState(), *all = XXH3_createState();
	if (!order || !digests || !one || !all)
		e = gm_error(g, -ENOMEM, "out of memory");
	for (size_t i = 0; !e && i < g->nmaps; i++)
		order[i] = &g->maps[i];
	if (!e && g->nmaps)
		qsort(order, g->nmaps, sizeof *order, by_name);
	if (!e)
		e = hash_all(g, order, g->nmaps, one, digests);
	if (!e) {
		XXH3_128bits_reset(all);
		XXH3_128bits_update(all, "GMSFSCH1", 8);
		XXH3_128bits_update(all, g->info.layout_hash, GMSFS_HASH_LEN);
		put_le(all, g->nmaps, 8);
	}
	for (size_t i = 0; !e && i < g->nmaps; i++) {
		const struct gmsfs_mapping *m = order[i];
		size_t len = strlen(m->name);
		put_le(all, len, 4);
		XXH3_128bits_update(all, m->name, len);
		put_le(all, m->size, 8);
		XXH3_128bits_update(all, digests[i], GMSFS_HASH_LEN);
	}
	if (!e) {
		XXH128_canonical_t c;
		XXH128_canonicalFromHash(&c, XXH3_128bits_digest(all));
		for (int i = 0; i < GMSFS_HASH_LEN; i++)
			snprintf(hex + 2 * i, 3, "%02x", c.digest[i]);
	}
	XXH3_freeState(one);
	XXH3_freeState(all);
	free(digests);
	free(order);
	if (e || !(flags & GMSFS_DIGEST_RECORD))
		return e;
	/* Told while the read lock still holds the bytes: the daemon takes it for the commit
	 * it was computed on only (ESTALE for another). */
	char value[64];
	snprintf(value, sizeof value, "%llu %s", (unsigned long long)generation, hex);
	if (setxattr(g->dir, GMSFS_XATTR_CONTENT, value, strlen(value), 0)) {
		e = -errno;
		return gm_error(g, e, "digest %s: computed, not recorded: %s", hex,
				e == -EACCES || e == -EPERM ? "recording needs write permission on the store's lock"
							    : strerror(-e));
	}
	return 0;
}
