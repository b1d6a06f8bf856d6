/* snap: gmsfs-snapshot's own format (snap.h), one store at a time; its restore here, its
 * save in snap_save.c.
 *
 * save: under a read lock, the committed layout whole, into DIR: the allocations' bytes
 * in shards (DIR/shard-NNN.bin, each allocation at a 4096-byte boundary, whole or, past
 * a shard's even share, in parts of whole pieces over several: format 3; written at once
 * by a thread a shard), then, last, DIR/manifest.json: every allocation's name, size,
 * tag, shard and offset (or its parts) and xxh3, every entry (key, allocation, offset, extent, flags,
 * value in hex), every shard's size and xxh3, the layout hash and the content hash
 * (gmsfs(5), CONTENT HASH: from the same pieces' hashes, no second pass; told to the
 * daemon too where the saver may write the store).  A save that stops
 * midway leaves no manifest (an old one goes first): nothing restores from it.
 * restore: into an empty store, one writer session; the manifest and every shard's size
 * checked before the store is touched, every allocation's bytes hashed as they pass
 * through host memory and compared before the commit, the layout hash after it: a
 * snapshot that differs anywhere is refused, and the store is left as it was (the
 * session rolls back); the content hash recorded is checked the same way and told to
 * the daemon after the commit.  xxh3 of an allocation: XXH3-64 of its CP_PIECE pieces'
 * XXH3-64s (little-endian); of a shard: of its allocations' (parts') in its order.  See
 * gmsfs-load(1). */
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

_Static_assert(CP_PIECE == LH_PIECE, "the content hash is over the pieces a snapshot hashes");

/* XXH3-64 of n digests, little-endian (what an allocation's and a shard's xxh3 are). */
uint64_t snap_digest_of(const uint64_t *d, size_t n)
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

uint64_t snap_pieces(uint64_t size)
{
	return (size + CP_PIECE - 1) / CP_PIECE;
}

bool snap_verbose;
const char *snap_version;

/* -v: the phase that ended now, and its time since *t (then reset). */
void snap_phase(struct timespec *t, const char *what)
{
	if (snap_verbose)
		fprintf(stderr, "gmsfs-snapshot: %s %.3f s\n", what, clock_since_s(t));
	clock_gettime(CLOCK_MONOTONIC, t);
}

void snap_show(void *arg, uint64_t done)
{
	struct snap_progress *p = arg;
	double s = clock_since_s(&p->t0), rate = s > 0 ? (double)done / s : 0;
	fprintf(stderr, "\r%s: %.2f of %.2f GB, %.2f GB/s, %.0f s left   %s", p->what, (double)done / 1e9,
		(double)p->total / 1e9, rate / 1e9, rate > 0 ? (double)(p->total - done) / rate : 0.0,
		done == p->total ? "\n" : "");
}

/* The daemon told the content hash of commit gen where this process may write the store;
 * a refusal changes nothing and is said with -v only. */
void snap_tell_content(const char *store, uint64_t gen, const char *hex)
{
	int e = sf_set_content_hash(store, gen, hex);
	if (e && snap_verbose)
		fprintf(stderr, "gmsfs-snapshot: the content hash %s not told to the daemon: %s\n", hex, strerror(-e));
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
	if (!fmt || (strcmp(fmt->s, SNAP_FORMAT) && strcmp(fmt->s, SNAP_FORMAT_PARTS)))
		return snprintf(err, errlen, "manifest.json: not a \"%s\" or \"%s\" manifest", SNAP_FORMAT,
				SNAP_FORMAT_PARTS), -EINVAL;
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
	bool parted = !strcmp(fmt->s, SNAP_FORMAT_PARTS);
	for (size_t i = 0; i < a->n; i++) {
		const struct js_value *z = field(&a->v[i], "size", JS_NUMBER), *x = field(&a->v[i], "xxh3", JS_STRING),
				      *parts = parted ? field(&a->v[i], "parts", JS_ARRAY) : NULL;
		if (!field(&a->v[i], "name", JS_STRING) || !field(&a->v[i], "tag", JS_STRING) || !z || !x ||
		    !parse_digest(x->s, &d))
			return snprintf(err, errlen, "manifest.json: allocations[%zu] is not {name, tag, size, shard, offset "
						     "(or parts), xxh3}", i), -EINVAL;
		size_t np = parts ? parts->n : 1;
		uint64_t sum = 0;
		for (size_t k = 0; k < np; k++) { /* each part inside its shard, whole pieces but the last */
			const struct js_value *q = parts ? &parts->v[k] : &a->v[i], *s = field(q, "shard", JS_NUMBER),
					      *o = field(q, "offset", JS_NUMBER), *n = parts ? field(q, "size", JS_NUMBER) : z;
			if (!s || !o || !n)
				return snprintf(err, errlen, "manifest.json: allocations[%zu] is not {name, tag, size, shard, "
						"offset (or parts of shard, offset, size), xxh3}", i), -EINVAL;
			uint64_t have = s->u < sh->n ? field(&sh->v[s->u], "size", JS_NUMBER)->u : 0;
			if (s->u >= sh->n || o->u > have || n->u > have - o->u ||
			    (k + 1 < np && (!n->u || n->u % CP_PIECE)) || n->u > z->u - sum)
				return snprintf(err, errlen, "manifest.json: allocations[%zu] (%s): a part lies outside its shard, "
						"or its parts are not the allocation in whole pieces", i,
						field(&a->v[i], "name", JS_STRING)->s), -EINVAL;
			sum += n->u;
		}
		if (sum != z->u || (parts && !np))
			return snprintf(err, errlen, "manifest.json: allocations[%zu] (%s): its parts are %llu bytes, not its %llu",
					i, field(&a->v[i], "name", JS_STRING)->s, (unsigned long long)sum,
					(unsigned long long)z->u), -EINVAL;
	}
	const struct js_value *ch = js_get(root, "content_hash"); /* saves before it have none */
	if (ch && (ch->kind != JS_STRING || strlen(ch->s) != 32 || strspn(ch->s, "0123456789abcdef") != 32))
		return snprintf(err, errlen, "manifest.json: content_hash is not 32 hex digits"), -EINVAL;
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
		const struct js_value *s = field(&a->v[i], "shard", JS_NUMBER);
		char where[64] = "its shards";
		if (s)
			snprintf(where, sizeof where, "shard-%03llu.bin", (unsigned long long)s->u);
		if (snap_digest_of(dig[i], snap_pieces(size)) != want)
			return snprintf(err, errlen, "%s/%s: the bytes of allocs/%s differ from the saved ones (xxh3): nothing "
						     "restored", dir, where, field(&a->v[i], "name", JS_STRING)->s), -EIO;
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
		if (!(dig[i] = calloc(snap_pieces(nv[i].size) + 1, sizeof **dig)))
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

/* An allocation's copies queued: its one run (shard, offset), or each of its parts (the
 * pieces' digests of each from where it starts). */
static int add_parts(struct cp *c, const int *files, const struct js_value *a, const struct gmsfs_new *nv,
		     uint64_t *dig, bool parted)
{
	const struct js_value *parts = parted ? js_get(a, "parts") : NULL; /* as check_manifest read it */
	if (!parts || parts->kind != JS_ARRAY)
		return cp_add(c, files[field(a, "shard", JS_NUMBER)->u], field(a, "offset", JS_NUMBER)->u, nv->ptr,
			      nv->size, dig);
	int e = 0;
	uint64_t at = 0;
	for (size_t k = 0; !e && k < parts->n; k++) {
		const struct js_value *q = &parts->v[k];
		uint64_t n = field(q, "size", JS_NUMBER)->u;
		e = cp_add(c, files[field(q, "shard", JS_NUMBER)->u], field(q, "offset", JS_NUMBER)->u, (char *)nv->ptr + at,
			   n, dig + at / CP_PIECE);
		at += n;
	}
	return e;
}

/* The shards, each opened for the copies (files[j]: cp_file's number).  0 or -errno. */
static int open_shards(struct cp *c, const char *dir, int *files, size_t ns, char *err, size_t errlen)
{
	for (size_t j = 0; j < ns; j++) {
		char path[4200];
		snprintf(path, sizeof path, "%s/shard-%03zu.bin", dir, j);
		if ((files[j] = cp_file(c, path, err, errlen)) < 0)
			return files[j];
	}
	return 0;
}

/* The restored bytes' content hash, from the pieces' hashes the copies made, against the
 * one the manifest records (a save before it records none). */
static int restored_content(const struct js_value *root, const struct gmsfs_new *nv, size_t na, uint64_t **dig,
			    const char *dir, char hex[33], char *err, size_t errlen)
{
	const char **names = calloc(na + 1, sizeof *names);
	uint64_t *sizes = calloc(na + 1, sizeof *sizes);
	int e = names && sizes ? 0 : -ENOMEM;
	for (size_t i = 0; !e && i < na; i++)
		names[i] = nv[i].name, sizes[i] = nv[i].size;
	if (e)
		snprintf(err, errlen, "out of memory");
	else if ((e = lh_content_of(field(root, "layout_hash", JS_STRING)->s, names, sizes, dig, na, hex)))
		snprintf(err, errlen, "the content hash: %s", strerror(-e));
	free(names);
	free(sizes);
	const struct js_value *want = js_get(root, "content_hash");
	if (!e && want && strcmp(want->s, hex))
		e = -EIO, snprintf(err, errlen, "%s/manifest.json: the bytes hash to the content hash %s, not the %s it "
						"records: edited or damaged, nothing restored", dir, hex, want->s);
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
	snap_phase(&t, "the manifest and the shards' sizes checked");
	if (!e && sf_allocations(store) > 0) /* at once, before any wait (checked again under the lock) */
		e = -EEXIST, snprintf(err, errlen, "%s holds allocations already: restore into an empty store", store);
	if (!e)
		e = cp_open(store, &c, err, errlen);
	snap_phase(&t, "the device's context");
	if (!e)
		e = open_shards(c, dir, files, ns, err, errlen);
	if (!e && (e = gmsfs_connect(&g, store, GMSFS_RW, timeout_ms)))
		snprintf(err, errlen, "%s", g ? gmsfs_errmsg(g) : gmsfs_strerror(e));
	if (!e && sf_allocations(store) != 0)
		e = -EEXIST, snprintf(err, errlen, "%s holds allocations already: restore into an empty store", store);
	if (!e && na && (e = gmsfs_create_many(g, nv, na)))
		snprintf(err, errlen, "%s", gmsfs_errmsg(g));
	for (size_t i = 0; !e && i < na; i++)
		e = add_parts(c, files, &a->v[i], &nv[i], dig[i],
			      !strcmp(field(&root, "format", JS_STRING)->s, SNAP_FORMAT_PARTS));
	snap_phase(&t, "the lock and the allocations");
	struct snap_progress p = { !quiet && isatty(2), total, { 0, 0 }, "restore" };
	clock_gettime(CLOCK_MONOTONIC, &p.t0);
	if (!e)
		e = cp_run(c, p.on ? snap_show : NULL, &p, err, errlen);
	if (!e)
		e = check_bytes(a, dig, dir, err, errlen);
	char content[33] = "";
	e = e ? e : restored_content(&root, nv, na, dig, dir, content, err, errlen);
	snap_phase(&t, "the bytes copied and checked");
	if (!e && ne && (e = gmsfs_meta_put_many(g, ev, ne)))
		snprintf(err, errlen, "%s", gmsfs_errmsg(g));
	if (!e && (e = snap_version ? gmsfs_commit_version(g, snap_version) : gmsfs_commit(g)))
		snprintf(err, errlen, "commit: %s", gmsfs_errmsg(g));
	/* The same allocations and entries give the same hash, checked above: said if the
	 * daemon's differs all the same. */
	if (!e && (e = gmsfs_layout_hash(g, hash)))
		snprintf(err, errlen, "%s", gmsfs_errmsg(g));
	if (!e && strcmp(hash, want))
		e = -EIO, snprintf(err, errlen, "restored, but the layout hash is %s, not the saved %s", hash, want);
	uint64_t gen = e ? 0 : gmsfs_generation(g);
	snap_phase(&t, "the entries and the commit");
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
	if (!e) /* once the session is over (the daemon takes none while one runs) */
		snap_tell_content(store, gen, content);
	cp_close(c);
	return e;
}
