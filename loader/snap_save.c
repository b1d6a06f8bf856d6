/* snap_save: gmsfs-snapshot save, its own format (snap.h; snap.c says the format and
 * restores it): under a read lock, the allocations into shards written at once by cp_save,
 * each piece hashed as it passes, then the manifest last, with the layout and content
 * hashes, and the content hash told to the daemon. */
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

static uint64_t align_up(uint64_t n)
{
	return (n + SNAP_DATA_ALIGN - 1) / SNAP_DATA_ALIGN * SNAP_DATA_ALIGN;
}

/* A run of one allocation's bytes in one shard: [start, start + len) of allocation alloc,
 * at off of shard shard.  An allocation is one part, or several where it is larger than a
 * shard's even share (whole pieces each but the last). */
struct part {
	size_t alloc;
	uint64_t start, len;
	unsigned shard;
	uint64_t off;
};

static int by_len_down(const void *a, const void *b, void *v)
{
	const struct part *p = v;
	uint64_t x = p[*(const size_t *)a].len, y = p[*(const size_t *)b].len;
	return x < y ? 1 : x > y ? -1 : *(const size_t *)a < *(const size_t *)b ? -1 : 1;
}

/* The allocations cut into parts: each larger than a shard's even share of the store (in
 * whole pieces) into parts of that share, so that no allocation goes through one writer
 * alone (tmpfs takes one writer a file at a time: a store of one 5.6 GB allocation saved
 * at 1.2 GB/s, where 16 shards of 1 GiB go at 24).  *np parts, allocation by allocation;
 * NULL: out of memory. */
static struct part *cut(const struct gmsfs_mapping *v, size_t na, size_t most, size_t *np)
{
	uint64_t total = 0;
	for (size_t i = 0; i < na; i++)
		total += v[i].size;
	uint64_t share = (total / most + CP_PIECE) / CP_PIECE * CP_PIECE; /* at least a piece */
	struct part *p = calloc(na + most + 1, sizeof *p);
	*np = 0;
	for (size_t i = 0; p && i < na; i++)
		for (uint64_t at = 0; at == 0 || at < v[i].size; at += share)
			p[(*np)++] = (struct part){ .alloc = i, .start = at,
						    .len = v[i].size - at < share ? v[i].size - at : share };
	return p;
}

/* The parts into shards of about equal bytes: the largest first, into the emptiest.
 * Each part's shard and off; the shards' sizes in sizes; in order[], the parts shard by
 * shard in file order.  The number of shards. */
static size_t plan(struct part *p, size_t np, uint64_t *sizes, size_t *order)
{
	size_t most = cp_threads(), ns = np < most ? (np ? np : 1) : most, count[SNAP_SHARDS_MAX] = { 0 }, at[SNAP_SHARDS_MAX];
	size_t *by = calloc(np + 1, sizeof *by);
	for (size_t i = 0; by && i < np; i++)
		by[i] = i;
	if (by)
		qsort_r(by, np, sizeof *by, by_len_down, p);
	memset(sizes, 0, SNAP_SHARDS_MAX * sizeof *sizes);
	for (size_t k = 0; k < np; k++) {
		size_t i = by ? by[k] : k, best = 0;
		for (size_t j = 1; j < ns; j++)
			best = sizes[j] < sizes[best] ? j : best;
		p[i].shard = (unsigned)best;
		p[i].off = sizes[best];
		sizes[best] += align_up(p[i].len);
		count[best]++;
	}
	at[0] = 0;
	for (size_t j = 1; j < ns; j++)
		at[j] = at[j - 1] + count[j - 1];
	for (size_t k = 0; k < np; k++) { /* in the order placed: each shard's in file order */
		size_t i = by ? by[k] : k;
		order[at[p[i].shard]++] = i;
	}
	free(by);
	return ns;
}

/* The digest of a part: of its pieces' (a part starts at a whole piece). */
static uint64_t part_digest(const struct part *p, uint64_t **dig)
{
	return snap_digest_of(dig[p->alloc] + p->start / CP_PIECE, snap_pieces(p->len));
}

static int write_manifest(const char *dir, const char *hash, const char *content, const struct gmsfs_mapping *v,
			  size_t na, const struct part *p, size_t np, const uint64_t *adig, size_t ns,
			  const uint64_t *sizes, const uint64_t *sdig, char **keys, const struct gmsfs_meta *m, size_t n,
			  char *err, size_t errlen)
{
	char path[4200], tmp[4300];
	snprintf(path, sizeof path, "%s/manifest.json", dir);
	snprintf(tmp, sizeof tmp, "%s.tmp", path);
	FILE *f = sf_fcreate(tmp);
	if (!f)
		return snprintf(err, errlen, "%s: %s", tmp, strerror(errno)), -errno;
	fprintf(f, "{\"format\": \"%s\", \"layout_hash\": \"%s\", \"content_hash\": \"%s\", \"piece_bytes\": %llu,\n "
		"\"shards\": [", np > na ? SNAP_FORMAT_PARTS : SNAP_FORMAT, hash, content, (unsigned long long)CP_PIECE);
	for (size_t j = 0; j < ns; j++)
		fprintf(f, "%s\n  {\"file\": \"shard-%03zu.bin\", \"size\": %" PRIu64 ", \"xxh3\": \"%016" PRIx64 "\"}",
			j ? "," : "", j, sizes[j], sdig[j]);
	fputs("],\n \"allocations\": [", f);
	for (size_t i = 0, k = 0; i < na; i++) { /* parts come allocation by allocation */
		fputs(i ? ",\n  {\"name\": " : "\n  {\"name\": ", f);
		js_write_str(f, v[i].name);
		fputs(", \"tag\": ", f);
		js_write_str(f, v[i].tag);
		fprintf(f, ", \"size\": %" PRIu64, v[i].size);
		size_t first = k;
		while (k < np && p[k].alloc == i)
			k++;
		if (k - first == 1)
			fprintf(f, ", \"shard\": %u, \"offset\": %" PRIu64, p[first].shard, p[first].off);
		for (size_t q = first; k - first > 1 && q < k; q++)
			fprintf(f, "%s{\"shard\": %u, \"offset\": %" PRIu64 ", \"size\": %" PRIu64 "}",
				q == first ? ", \"parts\": [" : ", ", p[q].shard, p[q].off, p[q].len);
		fprintf(f, "%s, \"xxh3\": \"%016" PRIx64 "\"}", k - first > 1 ? "]" : "", adig[i]);
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
static int write_shards(struct cp *c, const char *dir, const struct gmsfs_mapping *v, const struct part *p, size_t np,
			const size_t *order, uint64_t **dig, size_t ns, const uint64_t *sizes, bool quiet, char *err,
			size_t errlen)
{
	int fds[SNAP_SHARDS_MAX];
	struct cp_put *puts_ = calloc(np + 1, sizeof *puts_);
	int e = puts_ ? 0 : -ENOMEM;
	size_t k = 0, opened = 0;
	uint64_t total = 0;
	char path[4200];
	for (size_t j = ns; !e && j < SNAP_SHARDS_MAX; j++) { /* no save writes more than SNAP_SHARDS_MAX */
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
	for (size_t o = 0; !e && o < np; o++) { /* each shard's puts together, in file order */
		const struct part *q = &p[order[o]];
		puts_[k++] = (struct cp_put){ fds[q->shard], q->off, (const char *)v[q->alloc].ptr + q->start, q->len,
					      dig[q->alloc] + q->start / CP_PIECE };
		total += q->len;
	}
	struct snap_progress shown = { !quiet && isatty(2), total, { 0, 0 }, "save" };
	clock_gettime(CLOCK_MONOTONIC, &shown.t0);
	if (!e)
		e = cp_save(c, puts_, k, shown.on ? snap_show : NULL, &shown, err, errlen);
	static const char zeros[SNAP_DATA_ALIGN];
	for (size_t i = 0; !e && i < np; i++) {
		uint64_t pad = align_up(p[i].len) - p[i].len;
		if (pad && pwrite(fds[p[i].shard], zeros, pad, (off_t)(p[i].off + p[i].len)) != (ssize_t)pad)
			e = errno ? -errno : -EIO, snprintf(err, errlen, "%s/shard-%03u.bin: %s", dir, p[i].shard, strerror(-e));
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
	snap_phase(&t, "the device's context");
	if (!e && (e = gmsfs_connect(&g, store, GMSFS_RO, timeout_ms)))
		snprintf(err, errlen, "%s", g ? gmsfs_errmsg(g) : gmsfs_strerror(e));
	if (!e && ((e = gmsfs_import_all(g)) || (e = gmsfs_meta_get_all(g, "", &keys, &m, &n)) ||
		   (e = gmsfs_layout_hash(g, hash))))
		snprintf(err, errlen, "%s", gmsfs_errmsg(g));
	snap_phase(&t, "the read lock and the import");
	if (!e && (e = sf_mkdir(dir)))
		snprintf(err, errlen, "%s: %s", dir, strerror(-e));
	snprintf(path, sizeof path, "%s/manifest.json", dir); /* the old one goes first */
	if (!e && unlink(path) && errno != ENOENT)
		e = -errno, snprintf(err, errlen, "%s: %s", path, strerror(errno));
	const struct gmsfs_mapping *v = NULL;
	size_t na = e ? 0 : gmsfs_mappings(g, &v), ns = 0, np = 0;
	struct part *p = e ? NULL : cut(v, na, cp_threads(), &np);
	size_t *order = calloc(np + 1, sizeof *order);
	uint64_t *adig = calloc(na + 1, sizeof *adig);
	uint64_t **dig = calloc(na + 1, sizeof *dig), sizes[SNAP_SHARDS_MAX], sdig[SNAP_SHARDS_MAX];
	if (!e && (!p || !order || !adig || !dig))
		e = -ENOMEM, snprintf(err, errlen, "out of memory");
	for (size_t i = 0; !e && i < na; i++)
		if (!(dig[i] = calloc(snap_pieces(v[i].size) + 1, sizeof **dig)))
			e = -ENOMEM, snprintf(err, errlen, "out of memory");
	if (!e)
		ns = plan(p, np, sizes, order);
	if (!e)
		e = write_shards(c, dir, v, p, np, order, dig, ns, sizes, quiet, err, errlen);
	snap_phase(&t, "the shards written and synced");
	for (size_t i = 0; !e && i < na; i++)
		adig[i] = snap_digest_of(dig[i], snap_pieces(v[i].size));
	for (size_t o = 0, j = 0; !e && j < ns; j++) { /* a shard's: of its parts', in file order */
		size_t first = o;
		uint64_t *d = calloc(np + 1, sizeof *d);
		for (; o < np && p[order[o]].shard == j; o++)
			if (d)
				d[o - first] = part_digest(&p[order[o]], dig);
		sdig[j] = d ? snap_digest_of(d, o - first) : 0;
		free(d);
	}
	char content[33] = "";
	const char **names = calloc(na + 1, sizeof *names);
	uint64_t *asize = calloc(na + 1, sizeof *asize);
	if (!e && (!names || !asize))
		e = -ENOMEM, snprintf(err, errlen, "out of memory");
	for (size_t i = 0; !e && i < na; i++)
		names[i] = v[i].name, asize[i] = v[i].size;
	if (!e && (e = lh_content_of(hash, names, asize, dig, na, content)))
		snprintf(err, errlen, "the content hash: %s", strerror(-e));
	free(names);
	free(asize);
	if (!e)
		e = write_manifest(dir, hash, content, v, na, p, np, adig, ns, sizes, sdig, keys, m, n, err, errlen);
	if (!e) /* under the read lock still: no writer can have changed the bytes */
		snap_tell_content(store, gmsfs_generation(g), content);
	snap_phase(&t, "the manifest");
	for (size_t i = 0; dig && i < na; i++)
		free(dig[i]);
	free(dig);
	free(adig);
	free(order);
	free(p);
	if (keys)
		gmsfs_meta_free_all(keys, m, n);
	gmsfs_disconnect(g);
	cp_close(c);
	return e;
}

