/* digest: the content hash of the committed layout a reader holds (gmsfs_digest;
 * gmsfs(5), CONTENT HASH): each allocation's bytes hashed where they are (host memory in
 * place; GPU memory read into pinned host memory a chunk at a time), then one hash over
 * the layout hash and theirs; told to the daemon on request (user.gms.content_hash, which
 * needs write permission on the store), so that `cat STORE/content_hash` says it. */
#include "internal.h"

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
#define DIGEST_CHUNK (64ull << 20) /* GPU memory read a chunk at a time, a whole number of pieces */

static void put_le(XXH3_state_t *st, uint64_t v, int bytes)
{
	uint8_t b[8];
	for (int i = 0; i < bytes; i++)
		b[i] = (uint8_t)(v >> (8 * i));
	XXH3_128bits_update(st, b, (size_t)bytes);
}

/* An allocation's digest: XXH3-128 over the canonical XXH3-128 of each DIGEST_PIECE of its
 * first size bytes (the last piece shorter), in canonical (big-endian) form; GPU memory,
 * read a chunk at a time into host memory. */
static int hash_mapping(gmsfs *g, const void *ptr, uint64_t size, void *buf, XXH3_state_t *st,
			uint8_t out[GMSFS_HASH_LEN])
{
	XXH3_128bits_reset(st);
	for (uint64_t off = 0; off < size;) {
		uint64_t n = size - off < DIGEST_CHUNK ? size - off : DIGEST_CHUNK;
		const char *from = (const char *)ptr + off;
		if (g->be->read) {
			int e = g->be->read(g, buf, from, n);
			if (e)
				return e;
			from = buf;
		}
		for (uint64_t at = 0; at < n; at += DIGEST_PIECE) {
			XXH128_canonical_t piece;
			XXH128_canonicalFromHash(&piece, XXH3_128bits(from + at, n - at < DIGEST_PIECE ? n - at : DIGEST_PIECE));
			XXH3_128bits_update(st, piece.digest, sizeof piece.digest);
		}
		off += n;
	}
	XXH128_canonical_t c;
	XXH128_canonicalFromHash(&c, XXH3_128bits_digest(st));
	memcpy(out, c.digest, GMSFS_HASH_LEN);
	return 0;
}

/* Host memory is hashed in place, its pieces by as many threads as there are cores (at
 * most DIGEST_THREADS): each piece's hash into its slot, then each allocation's over its
 * slots in order, as hash_mapping does one after the other. */
#define DIGEST_THREADS 16
struct pieces {
	const char **at;
	uint64_t *len;
	XXH128_canonical_t *out;
	size_t n;
	atomic_size_t next;
};

static void *hash_pieces(void *arg)
{
	struct pieces *p = arg;
	for (size_t i; (i = atomic_fetch_add(&p->next, 1)) < p->n;)
		XXH128_canonicalFromHash(&p->out[i], XXH3_128bits(p->at[i], p->len[i]));
	return NULL;
}

static int hash_host(gmsfs *g, const struct gmsfs_mapping *const *order, size_t n, XXH3_state_t *st,
		     uint8_t (*digests)[GMSFS_HASH_LEN])
{
	size_t total = 0;
	for (size_t i = 0; i < n; i++)
		total += (size_t)((order[i]->size + DIGEST_PIECE - 1) / DIGEST_PIECE);
	struct pieces p = { .at = calloc(total + 1, sizeof *p.at), .len = calloc(total + 1, sizeof *p.len),
			    .out = calloc(total + 1, sizeof *p.out), .n = total };
	if (!p.at || !p.len || !p.out) {
		free(p.at), free(p.len), free(p.out);
		return gm_error(g, -ENOMEM, "out of memory");
	}
	for (size_t i = 0, k = 0; i < n; i++)
		for (uint64_t off = 0; off < order[i]->size; off += DIGEST_PIECE, k++) {
			p.at[k] = (const char *)order[i]->ptr + off;
			p.len[k] = order[i]->size - off < DIGEST_PIECE ? order[i]->size - off : DIGEST_PIECE;
		}
	atomic_init(&p.next, 0);
	long cores = sysconf(_SC_NPROCESSORS_ONLN);
	size_t want = cores < 1 ? 1 : cores > DIGEST_THREADS ? DIGEST_THREADS : (size_t)cores, started = 0;
	pthread_t t[DIGEST_THREADS];
	while (started + 1 < want && started + 1 < total && !pthread_create(&t[started], NULL, hash_pieces, &p))
		started++; /* a thread that cannot start leaves its share to the others */
	hash_pieces(&p);
	for (size_t i = 0; i < started; i++)
		pthread_join(t[i], NULL);
	for (size_t i = 0, k = 0; i < n; i++) {
		XXH3_128bits_reset(st);
		for (uint64_t off = 0; off < order[i]->size; off += DIGEST_PIECE, k++)
			XXH3_128bits_update(st, p.out[k].digest, sizeof p.out[k].digest);
		XXH128_canonical_t c;
		XXH128_canonicalFromHash(&c, XXH3_128bits_digest(st));
		memcpy(digests[i], c.digest, GMSFS_HASH_LEN);
	}
	free(p.at), free(p.len), free(p.out);
	return 0;
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
	void *buf = NULL;
	if (!order || !digests || !one || !all)
		e = gm_error(g, -ENOMEM, "out of memory");
	if (!e && g->be->read && (e = g->be->host_alloc(g, DIGEST_CHUNK, &buf)))
		gm_error(g, e, "digest: %llu bytes of host memory to read into: %s", DIGEST_CHUNK, strerror(-e));
	for (size_t i = 0; !e && i < g->nmaps; i++)
		order[i] = &g->maps[i];
	if (!e && g->nmaps)
		qsort(order, g->nmaps, sizeof *order, by_name);
	if (!e && !g->be->read) /* host memory: every piece at once */
		e = hash_host(g, order, g->nmaps, one, digests);
	if (!e) {
		XXH3_128bits_reset(all);
		XXH3_128bits_update(all, "GMSFSCH1", 8);
		XXH3_128bits_update(all, g->info.layout_hash, GMSFS_HASH_LEN);
		put_le(all, g->nmaps, 8);
	}
	for (size_t i = 0; !e && i < g->nmaps; i++) {
		const struct gmsfs_mapping *m = order[i];
		if (g->be->read && (e = hash_mapping(g, m->ptr, m->size, buf, one, digests[i]))) {
			gm_error(g, e, "digest: reading %s: %s", m->name, strerror(-e));
			break;
		}
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
	if (buf)
		g->be->host_free(g, buf);
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
