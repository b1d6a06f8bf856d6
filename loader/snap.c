/* snap: gmsfs-snapshot's own format (snap.h), one store at a time.
 *
 * save: under a read lock, the committed layout whole, into DIR: the allocations' bytes
 * in shards (DIR/shard-NNN.bin, each allocation at a 4096-byte boundary, written at once
 * by a thread a shard), then, last, DIR/manifest.json: every allocation's name, size,
 * tag, shard, offset and xxh3, every entry (key, allocation, offset, extent, flags,
 * value in hex), every shard's size and xxh3, and the layout hash.  A save that stops
 * midway leaves no manifest (an old one goes first): nothing restores from it.
 * restore: into an empty store, one writer session; the manifest and every shard's size
 * checked before the store is touched, every allocation's bytes hashed as they pass
 * through host memory and compared before the commit, the layout hash after it: a
 * snapshot that differs anywhere is refused, and the store is left as it was (the
 * session rolls back).  xxh3 of an allocation: XXH3-64 of its CP_PIECE pieces' XXH3-64s
 * (little-endian); of a shard: of its allocations' in its order.  See gmsfs-load(1). */
#include "snap.h"
#include "copy.h"
#include "store_files.h"
#include "json.h"
#include "layout_hash.h"
#include "clock.h"

#include <gmsfs/gmsfs.h>

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#define XXH_INLINE_ALL /* header only: the loader links nothing more */
#include <xxhash.h>

#define DATA_ALIGN 4096u
#define FORMAT "gmsfs-snapshot 2"
#define SHARDS_MAX CP_THREADS /* files written at once: a shard a thread (cp_threads) */

static uint64_t align_up(uint64_t n)
{
	return (n + DATA_ALIGN - 1) / DATA_ALIGN * DATA_ALIGN;
}

/* XXH3-64 of n digests, little-endian (what an allocation's and a shard's xxh3 are). */
static uint64_t digest_of(const uint64_t *d, size_t n)
{
	unsigned char *b = malloc(n * 8 + 1);
	if (!b)
		return 0;
	for (size_t i = 0; i < n; i++)
		for (int k = 0; k < 8; k++)
			b[8 * i + k] = (unsigned char)(d[i] >> (8 * k));
	uint64_t h = XXH3_64bits(b, n * 8);
	free(b);
	return h;
}

static uint64_t pieces(uint64_t size)
{
	return (size + CP_PIECE - 1) / CP_PIECE;
}

/* Progress on a terminal: bytes, rate, time left; nothing in scripts (-q, or no tty). */
struct progress {
	bool on;
	uint64_t total;
	struct timespec t0;
	const char *what;
};

bool snap_verbose;

/* -v: the phase that ended now, and its time since *t (then reset). */
static void phase(struct timespec *t, const char *what)
{
	if (snap_verbose)
		fprintf(stderr, "gmsfs-snapshot: %s %.3f s\n", what, clock_since_s(t));
	clock_gettime(CLOCK_MONOTONIC, t);
}

static void show(void *arg, uint64_t done)
{
	struct progress *p = arg;
	double s = clock_since_s(&p->t0), rate = s > 0 ? (double)done / s : 0;
	fprintf(stderr, "\r%s: %.2f of %.2f GB, %.2f GB/s, %.0f s left   %s", p->what, (double)done / 1e9,
		(double)p->total / 1e9, rate / 1e9, rate > 0 ? (double)(p->total - done) / rate : 0.0,
		done == p->total ? "\n" : "");
}

static int by_size_down(const void *a, const void *b, void *v)
{
	uint64_t x = ((const struct gmsfs_mapping *)v)[*(const size_t *)a].size;
	uint64_t y = ((const struct gmsfs_mapping *)v)[*(const size_t *)b].size;
	return x < y ? 1 : x > y ? -1 : *(const size_t *)a < *(const size_t *)b ? -1 : 1;
}

/* The allocations into shards of about equal bytes, each allocation whole in one: the
 * largest first, into the emptiest.  shard[i], off[i]; the shards' sizes in sizes; in
 * order[], the allocations shard by shard in file order. */
static size_t plan(const struct gmsfs_mapping *v, size_t na, unsigned *shard, uint64_t *off, uint64_t *sizes,
		   size_t *order)
{
	size_t most = cp_threads(), ns = na < most ? (na ? na : 1) : most, count[SHARDS_MAX] = { 0 }, at[SHARDS_MAX];
	size_t *by = calloc(na + 1, sizeof *by);
	for (size_t i = 0; by && i < na; i++)
		by[i] = i;
	if (by)
		qsort_r(by, na, sizeof *by, by_size_down, (void *)v);
	memset(sizes, 0, SHARDS_MAX * sizeof *sizes);
	for (size_t k = 0; k < na; k++) {
		size_t i = by ? by[k] : k, best = 0;
		for (size_t j = 1; j < ns; j++)
			best = sizes[j] < sizes[best] ? j : best;
		shard[i] = (unsigned)best;
		off[i] = sizes[best];
		sizes[best] += align_up(v[i].size);
		count[best]++;
	}
	at[0] = 0;
	for (size_t j = 1; j < ns; j++)
		at[j] = at[j - 1] + count[j - 1];
	for (size_t k = 0; k < na; k++) { /* in the order placed: each shard's in file order */
		size_t i = by ? by[k] : k;
		order[at[shard[i]]++] = i;
	}
	free(by);
	return ns;
}

static int write_manifest(const char *dir, const char *hash, const struct gmsfs_mapping *v, size_t na,
			  const unsigned *shard, const uint64_t *off, const uint64_t *adig, size_t ns,
			  const uint64_t *sizes, const uint64_t *sdig, char **keys, const struct gmsfs_meta *m, size_t n,
			  char *err, size_t errlen)
{
	char path[4200], tmp[4300];
	snprintf(path, sizeof path, "%s/manifest.json", dir);
	snprintf(tmp, sizeof tmp, "%s.tmp", path);
	FILE *f = sf_fcreate(tmp);
	if (!f)
		return snprintf(err, errlen, "%s: %s", tmp, strerror(errno)), -errno;
	fprintf(f, "{\"format\": \"%s\", \"layout_hash\": \"%s\", \"piece_bytes\": %llu,\n \"shards\": [", FORMAT, hash,
		(unsigned long long)CP_PIECE);
	for (size_t j = 0; j < ns; j++)
		fprintf(f, "%s\n  {\"file\": \"shard-%03zu.bin\", \"size\": %" PRIu64 ", \"xxh3\": \"%016" PRIx64 "\"}",
			j ? "," : "", j, sizes[j], sdig[j]);
	fputs("],\n \"allocations\": [", f);
	for (size_t i = 0; i < na; i++) {
		fputs(i ? ",\n  {\"name\": " : "\n  {\"name\": ", f);
		js_write_str(f, v[i].name);
		fputs(", \"tag\": ", f);
		js_write_str(f, v[i].tag);
		fprintf(f, ", \"size\": %" PRIu64 ", \"shard\": %u, \"offset\": %" PRIu64 ", \"xxh3\": \"%016" PRIx64 "\"}",
			v[i].size, shard[i], off[i], adig[i]);
	}
	fputs("],\n \"entries\": [", f);
	for (size_t i = 0; i < n; i++) {
		fputs(i ? ",\n  {\"key\": " : "\n  {\"key\": ", f);
		js_write_str(f, keys[i]);
		fputs(", \"alloc\": ", f);
		js_write_str(f, m[i].alloc ? m[i].alloc : "");
		fprintf(f, ", \"offset\": %" PRIu64 ", \"size\": %" PRIu64 ", \"flags\": %u, \"value\": \"", m[i].offset,
			m[i].size, m[i].flags);
		for (size_t b = 0; b < m[i].value_len; b++)
			fprintf(f, "%02x", ((const unsigned char *)m[i].value)[b]);
		fputs("\"}", f);
	}
	fputs("]}\n", f);
	int e = fflush(f) || fsync(fileno(f)) ? -errno : 0;
	if (fclose(f) && !e)
		e = -errno;
	if (!e && rename(tmp, path))
		e = -errno;
	int d = e ? -1 : open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (d >= 0) /* the rename itself on disk */
		fsync(d), close(d);
	if (e)
		snprintf(err, errlen, "%s: %s", path, strerror(-e));
	return e;
}

/* The shards: those of an earlier save past ns removed (gigabytes nothing would name);
 * the others opened, made or written again in place (the manifest is gone already, so
 * nothing restores from them meanwhile), each cut first where longer than it will be, so
 * that the folder never holds more than the new save; written by cp_save, each
 * allocation's tail up to the next 4096 bytes zeroed, cut to size, synced. */
static int write_shards(struct cp *c, const char *dir, const struct gmsfs_mapping *v, size_t na,
			const unsigned *shard, const uint64_t *off, const size_t *order, uint64_t **dig, size_t ns,
			const uint64_t *sizes, bool quiet, char *err, size_t errlen)
{
	int fds[SHARDS_MAX];
	struct cp_put *puts_ = calloc(na + 1, sizeof *puts_);
	int e = puts_ ? 0 : -ENOMEM;
	size_t k = 0, opened = 0;
	uint64_t total = 0;
	char path[4200];
	for (size_t j = ns; !e && j < SHARDS_MAX; j++) { /* no save writes more than SHARDS_MAX */
		snprintf(path, sizeof path, "%s/shard-%03zu.bin", dir, j);
		if (unlink(path) && errno != ENOENT)
			e = -errno, snprintf(err, errlen, "%s: %s", path, strerror(errno));
	}
	for (; !e && opened < ns; opened++) {
		snprintf(path, sizeof path, "%s/shard-%03zu.bin", dir, opened);
		struct stat st;
		if ((fds[opened] = sf_overwrite(path)) < 0)
			e = fds[opened], snprintf(err, errlen, "%s: %s", path, strerror(-e));
		else if (!fstat(fds[opened], &st) && (uint64_t)st.st_size > sizes[opened] &&
			 ftruncate(fds[opened], (off_t)sizes[opened])) /* no more room than the new save needs */
			e = -errno, snprintf(err, errlen, "%s: %s", path, strerror(errno));
	}
	for (size_t o = 0; !e && o < na; o++) { /* each shard's puts together, in file order */
		size_t i = order[o];
		puts_[k++] = (struct cp_put){ fds[shard[i]], off[i], v[i].ptr, v[i].size, dig[i] };
		total += v[i].size;
	}
	struct progress p = { !quiet && isatty(2), total, { 0, 0 }, "save" };
	clock_gettime(CLOCK_MONOTONIC, &p.t0);
	if (!e)
		e = cp_save(c, puts_, k, p.on ? show : NULL, &p, err, errlen);
	static const char zeros[DATA_ALIGN];
	for (size_t i = 0; !e && i < na; i++) {
		uint64_t pad = align_up(v[i].size) - v[i].size;
		if (pad && pwrite(fds[shard[i]], zeros, pad, (off_t)(off[i] + v[i].size)) != (ssize_t)pad)
			e = errno ? -errno : -EIO, snprintf(err, errlen, "%s/shard-%03u.bin: %s", dir, shard[i], strerror(-e));
	}
	for (size_t j = 0; j < opened; j++) {
		if (!e && (ftruncate(fds[j], (off_t)sizes[j]) || fsync(fds[j])))
			e = -errno, snprintf(err, errlen, "%s/shard-%03zu.bin: %s", dir, j, strerror(errno));
		if (fds[j] >= 0)
			close(fds[j]);
	}
	free(puts_);
	return e;
}

int snap_save(const char *store, const char *dir, int timeout_ms, bool quiet, char *err, size_t errlen)
{
	struct cp *c = NULL;
	gmsfs *g = NULL;
	char **keys = NULL, path[4200], hash[33];
	struct gmsfs_meta *m = NULL;
	size_t n = 0;
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	int e = cp_open(store, &c, err, errlen);
	phase(&t, "the device's context and pinned buffers");
	if (!e && (e = gmsfs_connect(&g, store, GMSFS_RO, timeout_ms)))
		snprintf(err, errlen, "%s", g ? gmsfs_errmsg(g) : gmsfs_strerror(e));
	if (!e && ((e = gmsfs_import_all(g)) || (e = gmsfs_meta_get_all(g, "", &keys, &m, &n)) ||
		   (e = gmsfs_layout_hash(g, hash))))
		snprintf(err, errlen, "%s", gmsfs_errmsg(g));
	phase(&t, "the read lock and the import");
	if (!e && (e = sf_mkdir(dir)))
		snprintf(err, errlen, "%s: %s", dir, strerror(-e));
	snprintf(path, sizeof path, "%s/manifest.json", dir); /* the old one goes first */
	if (!e && unlink(path) && errno != ENOENT)
		e = -errno, snprintf(err, errlen, "%s: %s", path, strerror(errno));
	const struct gmsfs_mapping *v = NULL;
	size_t na = e ? 0 : gmsfs_mappings(g, &v), ns = 0;
	unsigned *shard = calloc(na + 1, sizeof *shard);
	size_t *order = calloc(na + 1, sizeof *order);
	uint64_t *off = calloc(na + 1, sizeof *off), *adig = calloc(na + 1, sizeof *adig);
	uint64_t **dig = calloc(na + 1, sizeof *dig), sizes[SHARDS_MAX], sdig[SHARDS_MAX];
	if (!e && (!shard || !order || !off || !adig || !dig))
		e = -ENOMEM, snprintf(err, errlen, "out of memory");
	for (size_t i = 0; !e && i < na; i++)
		if (!(dig[i] = calloc(pieces(v[i].size) + 1, sizeof **dig)))
			e = -ENOMEM, snprintf(err, errlen, "out of memory");
	if (!e)
		ns = plan(v, na, shard, off, sizes, order);
	if (!e)
		e = write_shards(c, dir, v, na, shard, off, order, dig, ns, sizes, quiet, err, errlen);
	phase(&t, "the shards written and synced");
	for (size_t i = 0; !e && i < na; i++)
		adig[i] = digest_of(dig[i], pieces(v[i].size));
	for (size_t o = 0, j = 0; !e && j < ns; j++) { /* a shard's: of its allocations', in file order */
		size_t first = o;
		uint64_t *d = calloc(na + 1, sizeof *d);
		for (; o < na && shard[order[o]] == j; o++)
			if (d)
				d[o - first] = adig[order[o]];
		sdig[j] = d ? digest_of(d, o - first) : 0;
		free(d);
	}
	if (!e)
		e = write_manifest(dir, hash, v, na, shard, off, adig, ns, sizes, sdig, keys, m, n, err, errlen);
	phase(&t, "the manifest");
	for (size_t i = 0; dig && i < na; i++)
		free(dig[i]);
	free(dig);
	free(adig);
	free(off);
	free(order);
	free(shard);
	if (keys)
		gmsfs_meta_free_all(keys, m, n);
	gmsfs_disconnect(g);
	cp_close(c);
	return e;
}

static int unhex(const char *s, unsigned char **out, size_t *len)
{
	size_t n = strlen(s);
	if (n % 2)
		return -EINVAL;
	unsigned char *v = malloc(n / 2 ? n / 2 : 1);
	if (!v)
		return -ENOMEM;
	for (size_t i = 0; i < n / 2; i++) {
		unsigned x;
		if (sscanf(s + 2 * i, "%2x", &x) != 1 || !strchr("0123456789abcdefABCDEF", s[2 * i]) ||
		    !strchr("0123456789abcdefABCDEF", s[2 * i + 1])) {
			free(v);
			return -EINVAL;
		}
		v[i] = (unsigned char)x;
	}
	*out = v;
	*len = n / 2;
	return 0;
}

static const struct js_value *field(const struct js_value *o, const char *k, enum js_kind kind)
{
	const struct js_value *v = js_get(o, k);
	return v && v->kind == kind && (kind != JS_NUMBER || v->is_uint) ? v : NULL;
}

/* A hex digest "0123456789abcdef" as a number; false if it is not one. */
static bool parse_digest(const char *s, uint64_t *out)
{
	char *end;
	if (strlen(s) != 16 || strspn(s, "0123456789abcdef") != 16)
		return false;
	*out = strtoull(s, &end, 16);
	return !*end;
}

/* The whole manifest checked before the store is touched: its format, every field, every
 * allocation inside its shard, every shard there with its size. */
static int check_manifest(const char *dir, const struct js_value *root, char *err, size_t errlen)
{
	const struct js_value *fmt = field(root, "format", JS_STRING), *a = field(root, "allocations", JS_ARRAY),
			      *en = field(root, "entries", JS_ARRAY), *sh = field(root, "shards", JS_ARRAY),
			      *h = field(root, "layout_hash", JS_STRING), *pb = field(root, "piece_bytes", JS_NUMBER);
	uint64_t d;
	if (!fmt || strcmp(fmt->s, FORMAT))
		return snprintf(err, errlen, "manifest.json: not a \"%s\" manifest", FORMAT), -EINVAL;
	if (!a || !en || !sh || !h || !pb)
		return snprintf(err, errlen, "manifest.json: not {layout_hash, piece_bytes, shards, allocations, entries}"),
		       -EINVAL;
	if (pb->u != CP_PIECE)
		return snprintf(err, errlen, "manifest.json: pieces of %llu bytes; this gmsfs-snapshot hashes %llu",
				(unsigned long long)pb->u, (unsigned long long)CP_PIECE), -EINVAL;
	for (size_t j = 0; j < sh->n; j++) {
		const struct js_value *f = field(&sh->v[j], "file", JS_STRING), *z = field(&sh->v[j], "size", JS_NUMBER),
				      *x = field(&sh->v[j], "xxh3", JS_STRING);
		char want[32], path[4200];
		struct stat st;
		snprintf(want, sizeof want, "shard-%03zu.bin", j);
		if (!f || !z || !x || strcmp(f->s, want) || !parse_digest(x->s, &d))
			return snprintf(err, errlen, "manifest.json: shards[%zu] is not {file: %s, size, xxh3}", j, want),
			       -EINVAL;
		snprintf(path, sizeof path, "%s/%s", dir, want);
		if (stat(path, &st))
			return snprintf(err, errlen, "%s: %s", path, strerror(errno)), -errno;
		if ((uint64_t)st.st_size != z->u)
			return snprintf(err, errlen, "%s: %llu bytes, not the %llu the manifest says", path,
					(unsigned long long)st.st_size, (unsigned long long)z->u), -EIO;
	}
	for (size_t i = 0; i < a->n; i++) {
		const struct js_value *s = field(&a->v[i], "shard", JS_NUMBER), *o = field(&a->v[i], "offset", JS_NUMBER),
				      *z = field(&a->v[i], "size", JS_NUMBER), *x = field(&a->v[i], "xxh3", JS_STRING);
		if (!field(&a->v[i], "name", JS_STRING) || !field(&a->v[i], "tag", JS_STRING) || !s || !o || !z || !x ||
		    !parse_digest(x->s, &d))
			return snprintf(err, errlen, "manifest.json: allocations[%zu] is not {name, tag, size, shard, offset, "
						     "xxh3}", i), -EINVAL;
		uint64_t have = s->u < sh->n ? field(&sh->v[s->u], "size", JS_NUMBER)->u : 0;
		if (s->u >= sh->n || o->u > have || z->u > have - o->u)
			return snprintf(err, errlen, "manifest.json: allocations[%zu] (%s) lies outside its shard", i,
					field(&a->v[i], "name", JS_STRING)->s), -EINVAL;
	}
	for (size_t i = 0; i < en->n; i++)
		if (!field(&en->v[i], "key", JS_STRING) || !field(&en->v[i], "alloc", JS_STRING) ||
		    !field(&en->v[i], "offset", JS_NUMBER) || !field(&en->v[i], "size", JS_NUMBER) ||
		    !field(&en->v[i], "flags", JS_NUMBER) || !field(&en->v[i], "value", JS_STRING))
			return snprintf(err, errlen, "manifest.json: entries[%zu] is not {key, alloc, offset, size, flags, "
						     "value}", i), -EINVAL;
	return 0;
}

/* The manifest, parsed and checked; a folder without one says why. */
static int read_manifest(const char *dir, struct js_value *root, char *err, size_t errlen)
{
	char path[4200];
	snprintf(path, sizeof path, "%s/manifest.json", dir);
	if (access(path, F_OK)) {
		snprintf(path, sizeof path, "%s/layout.json", dir);
		if (!access(path, F_OK))
			snprintf(err, errlen, "%s holds a snapshot of format 1 (layout.json, data): its bytes cannot be checked; "
					      "restore it with the gmsfs-snapshot that made it and save it again", dir);
		else
			snprintf(err, errlen, "%s/manifest.json: %s (a save that did not finish leaves none)", dir,
				 strerror(errno));
		return -ENOENT;
	}
	int e = js_read_file(path, root, err, errlen);
	return e ? e : check_manifest(dir, root, err, errlen);
}

/* Each allocation's bytes as they came: its pieces' digests against the manifest's. */
static int check_bytes(const struct js_value *a, uint64_t **dig, const char *dir, char *err, size_t errlen)
{
	for (size_t i = 0; i < a->n; i++) {
		uint64_t want, size = field(&a->v[i], "size", JS_NUMBER)->u;
		parse_digest(field(&a->v[i], "xxh3", JS_STRING)->s, &want);
		if (digest_of(dig[i], pieces(size)) != want)
			return snprintf(err, errlen, "%s/shard-%03llu.bin: the bytes of allocs/%s differ from the saved ones "
						     "(xxh3): nothing restored", dir,
					(unsigned long long)field(&a->v[i], "shard", JS_NUMBER)->u,
					field(&a->v[i], "name", JS_STRING)->s), -EIO;
	}
	return 0;
}

/* The manifest's entries, as gmsfs_meta_put_many takes them (their values unhexed into
 * vals[i]).  0, or -EINVAL with err. */
static int entries_of(const struct js_value *en, size_t ne, struct gmsfs_entry *ev, unsigned char **vals, char *err,
		      size_t errlen)
{
	for (size_t i = 0; i < ne; i++) {
		const struct js_value *x = &en->v[i];
		size_t vl = 0;
		if (unhex(field(x, "value", JS_STRING)->s, &vals[i], &vl))
			return snprintf(err, errlen, "manifest.json: entries[%zu]: the value is not hex", i), -EINVAL;
		ev[i] = (struct gmsfs_entry){ .key = field(x, "key", JS_STRING)->s, .alloc = field(x, "alloc", JS_STRING)->s,
					      .offset = field(x, "offset", JS_NUMBER)->u,
					      .size = field(x, "size", JS_NUMBER)->u,
					      .flags = (uint32_t)field(x, "flags", JS_NUMBER)->u, .value = vals[i],
					      .value_len = vl };
	}
	return 0;
}

/* The manifest's allocations, as gmsfs_create_many takes them, with room for each one's
 * pieces' digests (dig[i]) and their sum in *total.  0 or -ENOMEM. */
static int allocations_of(const struct js_value *a, size_t na, struct gmsfs_new *nv, uint64_t **dig, uint64_t *total)
{
	for (size_t i = 0; i < na; i++) {
		nv[i] = (struct gmsfs_new){ .name = field(&a->v[i], "name", JS_STRING)->s,
					    .tag = field(&a->v[i], "tag", JS_STRING)->s,
					    .size = field(&a->v[i], "size", JS_NUMBER)->u };
		*total += nv[i].size;
		if (!(dig[i] = calloc(pieces(nv[i].size) + 1, sizeof **dig)))
			return -ENOMEM;
	}
	return 0;
}

/* What will be committed hashes to what the manifest records (want), before anything is:
 * an edited name, size, tag, key or value is refused here, the target left as it was. */
static int hash_checked(const struct gmsfs_new *nv, size_t na, const struct gmsfs_entry *ev, size_t ne,
			const char *want, const char *dir, char *err, size_t errlen)
{
	char mine[33];
	int e = lh_of(nv, na, ev, ne, mine);
	if (!e && strcmp(mine, want))
		e = -EINVAL, snprintf(err, errlen, "%s/manifest.json: its allocations and entries hash to %s, not the "
						   "layout hash it records (%s): edited or damaged, nothing restored", dir,
				      mine, want);
	return e;
}

int snap_restore(const char *store, const char *dir, int timeout_ms, bool quiet, char *err, size_t errlen)
{
	char hash[33];
	struct js_value root = { 0 };
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	int e = read_manifest(dir, &root, err, errlen);
	const struct js_value *a = field(&root, "allocations", JS_ARRAY), *en = field(&root, "entries", JS_ARRAY),
			      *sh = field(&root, "shards", JS_ARRAY);
	size_t na = a && !e ? a->n : 0, ne = en && !e ? en->n : 0, ns = sh && !e ? sh->n : 0;
	struct gmsfs_new *nv = calloc(na ? na : 1, sizeof *nv);
	struct gmsfs_entry *ev = calloc(ne ? ne : 1, sizeof *ev);
	unsigned char **vals = calloc(ne ? ne : 1, sizeof *vals);
	uint64_t **dig = calloc(na ? na : 1, sizeof *dig), total = 0;
	int *files = calloc(ns ? ns : 1, sizeof *files);
	if (!e && (!nv || !ev || !vals || !dig || !files))
		e = -ENOMEM;
	if (!e)
		e = entries_of(en, ne, ev, vals, err, errlen);
	if (!e)
		e = allocations_of(a, na, nv, dig, &total);
	const char *want = e ? "" : field(&root, "layout_hash", JS_STRING)->s;
	if (!e)
		e = hash_checked(nv, na, ev, ne, want, dir, err, errlen);
	struct cp *c = NULL;
	gmsfs *g = NULL;
	phase(&t, "the manifest and the shards' sizes checked");
	if (!e && sf_allocations(store) > 0) /* at once, before any wait (checked again under the lock) */
		e = -EEXIST, snprintf(err, errlen, "%s holds allocations already: restore into an empty store", store);
	if (!e)
		e = cp_open(store, &c, err, errlen);
	phase(&t, "the device's context and pinned buffers");
	for (size_t j = 0; !e && j < ns; j++) {
		char path[4200];
		snprintf(path, sizeof path, "%s/shard-%03zu.bin", dir, j);
		if ((files[j] = cp_file(c, path, err, errlen)) < 0)
			e = files[j];
	}
	if (!e && (e = gmsfs_connect(&g, store, GMSFS_RW, timeout_ms)))
		snprintf(err, errlen, "%s", g ? gmsfs_errmsg(g) : gmsfs_strerror(e));
	if (!e && sf_allocations(store) != 0)
		e = -EEXIST, snprintf(err, errlen, "%s holds allocations already: restore into an empty store", store);
	if (!e && na && (e = gmsfs_create_many(g, nv, na)))
		snprintf(err, errlen, "%s", gmsfs_errmsg(g));
	for (size_t i = 0; !e && i < na; i++)
		e = cp_add(c, files[field(&a->v[i], "shard", JS_NUMBER)->u], field(&a->v[i], "offset", JS_NUMBER)->u,
			   nv[i].ptr, nv[i].size, dig[i]);
	phase(&t, "the lock and the allocations");
	struct progress p = { !quiet && isatty(2), total, { 0, 0 }, "restore" };
	clock_gettime(CLOCK_MONOTONIC, &p.t0);
	if (!e)
		e = cp_run(c, p.on ? show : NULL, &p, err, errlen);
	if (!e)
		e = check_bytes(a, dig, dir, err, errlen);
	phase(&t, "the bytes copied and checked");
	if (!e && ne && (e = gmsfs_meta_put_many(g, ev, ne)))
		snprintf(err, errlen, "%s", gmsfs_errmsg(g));
	if (!e && (e = gmsfs_commit(g)))
		snprintf(err, errlen, "commit: %s", gmsfs_errmsg(g));
	/* The same allocations and entries give the same hash, checked above: said if the
	 * daemon's differs all the same. */
	if (!e && (e = gmsfs_layout_hash(g, hash)))
		snprintf(err, errlen, "%s", gmsfs_errmsg(g));
	if (!e && strcmp(hash, want))
		e = -EIO, snprintf(err, errlen, "restored, but the layout hash is %s, not the saved %s", hash, want);
	phase(&t, "the entries and the commit");
	for (size_t i = 0; vals && i < ne; i++)
		free(vals[i]);
	for (size_t i = 0; dig && i < na; i++)
		free(dig[i]);
	free(dig);
	free(files);
	free(vals);
	free(ev);
	free(nv);
	js_free(&root);
	gmsfs_disconnect(g); /* without a commit: the session rolls back, the store as it was */
	cp_close(c);
	return e;
}
