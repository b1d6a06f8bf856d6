/* gms_format: GMS's snapshot format (gms_format.h), read from its public description:
 *   DIR/manifest.json   {"version": "1.0", "timestamp", "layout_hash", "device",
 *                        "allocations": [{allocation_id, size, aligned_size, tag,
 *                        tensor_file ("shards/shard_NNNN.bin"), tensor_offset}]}
 *   DIR/shards/shard_NNNN.bin   the allocations' aligned bytes back to back, a new shard
 *                        where the next would pass 4 GiB
 *   DIR/gms_metadata.json {key: {allocation_id, offset_bytes, value (base64)}}
 * Mapped onto gmsfs as gmsfs.gms maps GMS's API: an allocation of a GMS snapshot is the
 * layout slot of its place in the manifest (slot000000, ...), unless the snapshot came
 * from gmsfs (its manifest says "gmsfs": 1), whose ids are the allocations' names and
 * whose entries carry their gmsfs key, extent and flags beside GMS's fields (a gmsfs
 * store comes back with the same layout hash); a GMS key that is no gmsfs path is kept
 * %-hex-escaped, as gmsfs.gms keeps it.  What GMS's format cannot carry for GMS: an
 * entry's extent and flags; for either: any check of the bytes (GMS keeps no digests;
 * the shards' sizes are checked). */
#include "gms_format.h"
#include "copy.h"
#include "json.h"
#include "store_files.h"

#include <gmsfs/gmsfs.h>

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define GMS_VERSION "1.0"
#define GMS_SHARD (4ull << 30)

bool gmsfmt_is(const char *dir)
{
	char path[4200];
	snprintf(path, sizeof path, "%s/gms_metadata.json", dir);
	return !access(path, F_OK);
}

static const char B64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

static void b64_write(FILE *f, const unsigned char *p, size_t n)
{
	for (size_t i = 0; i < n; i += 3) {
		unsigned v = (unsigned)p[i] << 16 | (i + 1 < n ? (unsigned)p[i + 1] << 8 : 0) | (i + 2 < n ? p[i + 2] : 0);
		fputc(B64[v >> 18 & 63], f);
		fputc(B64[v >> 12 & 63], f);
		fputc(i + 1 < n ? B64[v >> 6 & 63] : '=', f);
		fputc(i + 2 < n ? B64[v & 63] : '=', f);
	}
}

/* s (base64, padded) into a new buffer; -EINVAL if it is not base64. */
static int b64_read(const char *s, unsigned char **out, size_t *len)
{
	size_t n = strlen(s);
	if (n % 4)
		return -EINVAL;
	unsigned char *v = malloc(n / 4 * 3 + 1);
	if (!v)
		return -ENOMEM;
	size_t k = 0;
	for (size_t i = 0; i < n; i += 4) {
		unsigned q = 0, pad = 0;
		for (int j = 0; j < 4; j++) {
			const char *c = s[i + j] == '=' ? NULL : strchr(B64, s[i + j]);
			if (s[i + j] == '=' && i + 4 == n && j >= 2)
				pad++;
			else if (!c || !s[i + j] || pad) {
				free(v);
				return -EINVAL;
			}
			q = q << 6 | (c ? (unsigned)(c - B64) : 0);
		}
		v[k++] = (unsigned char)(q >> 16);
		if (pad < 2)
			v[k++] = (unsigned char)(q >> 8);
		if (pad < 1)
			v[k++] = (unsigned char)q;
	}
	*out = v;
	*len = k;
	return 0;
}

/* GMS's key as a gmsfs key, as gmsfs.gms keeps it: itself where it is a path (not
 * starting with %, components neither empty nor . or .., at most 1024 bytes), else %
 * and its bytes in hex.  The result is the caller's. */
static char *key_path(const char *key)
{
	bool plain = key[0] && key[0] != '%' && strlen(key) <= 1024;
	for (const char *c = key; plain && *c;) {
		size_t n = strcspn(c, "/");
		plain = n && !(n == 1 && c[0] == '.') && !(n == 2 && c[0] == '.' && c[1] == '.');
		c += n;
		if (*c == '/' && !*++c)
			plain = false; /* a trailing / */
	}
	if (plain)
		return strdup(key);
	size_t n = strlen(key);
	char *p = malloc(2 * n + 2);
	if (p) {
		p[0] = '%';
		for (size_t i = 0; i < n; i++)
			sprintf(p + 1 + 2 * i, "%02x", (unsigned char)key[i]);
	}
	return p;
}

/* A gmsfs key as GMS's: one gmsfs.gms escaped (% and its bytes in hex, which key_path
 * gives back) decoded; any other as it is. */
static char *key_of(const char *path)
{
	size_t n = strlen(path + 1) / 2;
	bool hex = path[0] == '%' && n && strlen(path + 1) == 2 * n && strspn(path + 1, "0123456789abcdef") == 2 * n;
	char *k = hex ? malloc(n + 1) : NULL;
	for (size_t i = 0; k && i < n; i++) {
		unsigned x = 0;
		sscanf(path + 1 + 2 * i, "%2x", &x);
		k[i] = (char)x;
	}
	if (k)
		k[n] = '\0';
	char *back = k && strlen(k) == n ? key_path(k) : NULL;
	bool same = back && !strcmp(back, path);
	free(back);
	if (same)
		return k;
	free(k);
	return strdup(path);
}

/* The allocations into shards as GMS plans them: in order, a new shard where the next
 * would pass GMS_SHARD (an allocation never split). */
static void plan(const struct gmsfs_mapping *v, size_t n, unsigned *shard, uint64_t *off, unsigned *nshards)
{
	unsigned s = 0;
	uint64_t at = 0;
	for (size_t i = 0; i < n; i++) {
		if (at && at + v[i].aligned > GMS_SHARD)
			s++, at = 0;
		shard[i] = s, off[i] = at;
		at += v[i].aligned;
	}
	*nshards = n ? s + 1 : 0;
}

static int write_json_files(const char *dir, const char *hash, int device, const struct gmsfs_mapping *v, size_t n,
			    const unsigned *shard, const uint64_t *off, char **keys, const struct gmsfs_meta *m, size_t ne,
			    char *err, size_t errlen)
{
	char path[4200];
	snprintf(path, sizeof path, "%s/gms_metadata.json", dir);
	FILE *f = sf_fcreate(path);
	if (!f)
		return snprintf(err, errlen, "%s: %s", path, strerror(errno)), -errno;
	fputc('{', f);
	for (size_t i = 0; i < ne; i++) {
		char *k = key_of(keys[i]);
		fputs(i ? ",\n  " : "\n  ", f);
		js_write_str(f, k ? k : keys[i]);
		free(k);
		fputs(": {\"allocation_id\": ", f);
		js_write_str(f, m[i].alloc ? m[i].alloc : "");
		fprintf(f, ", \"offset_bytes\": %llu, \"value\": \"", (unsigned long long)m[i].offset);
		b64_write(f, m[i].value, m[i].value_len);
		/* What GMS's fields cannot say, beside them (GMS reads only its own): back into
		 * gmsfs, the same key, extent and flags, so the same layout hash. */
		fputs("\", \"gmsfs_key\": ", f);
		js_write_str(f, keys[i]);
		fprintf(f, ", \"gmsfs_size\": %llu, \"gmsfs_flags\": %u}", (unsigned long long)m[i].size, m[i].flags);
	}
	fputs("\n}\n", f);
	int e = fclose(f) ? -errno : 0;
	snprintf(path, sizeof path, "%s/manifest.json", dir); /* last: GMS reads it first */
	if (!e && !(f = sf_fcreate(path)))
		e = -errno;
	if (e)
		return snprintf(err, errlen, "%s: %s", path, strerror(-e)), e;
	fprintf(f, "{\"version\": \"%s\", \"timestamp\": %lld, \"layout_hash\": \"%s\", \"device\": %d, \"gmsfs\": 1,\n"
		   " \"allocations\": [", GMS_VERSION, (long long)time(NULL), hash, device);
	for (size_t i = 0; i < n; i++) {
		fputs(i ? ",\n  {\"allocation_id\": " : "\n  {\"allocation_id\": ", f);
		js_write_str(f, v[i].name);
		fprintf(f, ", \"size\": %llu, \"aligned_size\": %llu, \"tag\": ", (unsigned long long)v[i].size,
			(unsigned long long)v[i].aligned);
		js_write_str(f, v[i].tag);
		fprintf(f, ", \"tensor_file\": \"shards/shard_%04u.bin\", \"tensor_offset\": %llu}", shard[i],
			(unsigned long long)off[i]);
	}
	fputs("]}\n", f);
	return fclose(f) ? (snprintf(err, errlen, "%s: %s", path, strerror(errno)), -errno) : 0;
}

int gmsfmt_save(const char *store, const char *dir, int timeout_ms, char *err, size_t errlen)
{
	struct cp *c = NULL;
	gmsfs *g = NULL;
	char **keys = NULL, hash[33], path[4200], idx[32] = "0";
	struct gmsfs_meta *m = NULL;
	size_t ne = 0, n = 0;
	const struct gmsfs_mapping *v = NULL;
	int e = cp_open(store, &c, err, errlen);
	if (!e && (e = gmsfs_connect(&g, store, GMSFS_RO, timeout_ms)))
		snprintf(err, errlen, "%s", g ? gmsfs_errmsg(g) : gmsfs_strerror(e));
	if (!e && ((e = gmsfs_import_all(g)) || (e = gmsfs_meta_get_all(g, "", &keys, &m, &ne)) ||
		   (e = gmsfs_layout_hash(g, hash))))
		snprintf(err, errlen, "%s", gmsfs_errmsg(g));
	sf_field(store, "../device", "index", idx, sizeof idx);
	snprintf(path, sizeof path, "%s/shards", dir);
	if (!e && ((e = sf_mkdir(dir)) || (e = sf_mkdir(path))))
		snprintf(err, errlen, "%s: %s", path, strerror(-e));
	snprintf(path, sizeof path, "%s/manifest.json", dir); /* an old one goes first */
	if (!e && unlink(path) && errno != ENOENT)
		e = -errno, snprintf(err, errlen, "%s: %s", path, strerror(errno));
	if (!e)
		n = gmsfs_mappings(g, &v);
	unsigned *shard = calloc(n + 1, sizeof *shard), ns = 0;
	uint64_t *off = calloc(n + 1, sizeof *off);
	struct cp_put *puts_ = calloc(n + 1, sizeof *puts_);
	int *fds = calloc(n + 1, sizeof *fds);
	if (!e && (!shard || !off || !puts_ || !fds))
		e = -ENOMEM, snprintf(err, errlen, "out of memory");
	if (!e)
		plan(v, n, shard, off, &ns);
	for (unsigned j = 0; !e && j < ns; j++) {
		snprintf(path, sizeof path, "%s/shards/shard_%04u.bin", dir, j);
		if ((fds[j] = sf_create(path)) < 0)
			e = fds[j], snprintf(err, errlen, "%s: %s", path, strerror(-e)), ns = j;
	}
	for (size_t i = 0; !e && i < n; i++) /* the aligned bytes, as GMS writes them */
		puts_[i] = (struct cp_put){ fds[shard[i]], off[i], v[i].ptr, v[i].aligned, NULL };
	if (!e)
		e = cp_save(c, puts_, n, NULL, NULL, err, errlen);
	for (unsigned j = 0; j < ns; j++) {
		if (!e && fsync(fds[j]))
			e = -errno, snprintf(err, errlen, "a shard: %s", strerror(errno));
		close(fds[j]);
	}
	if (!e)
		e = write_json_files(dir, hash, atoi(idx), v, n, shard, off, keys, m, ne, err, errlen);
	free(off), free(shard), free(puts_), free(fds);
	if (keys)
		gmsfs_meta_free_all(keys, m, ne);
	gmsfs_disconnect(g);
	cp_close(c);
	return e;
}

static const struct js_value *member(const struct js_value *o, const char *k, enum js_kind kind)
{
	const struct js_value *v = o ? js_get(o, k) : NULL;
	return v && v->kind == kind && (kind != JS_NUMBER || v->is_uint) ? v : NULL;
}

/* The manifest's allocations checked (fields, shards there and long enough) before the
 * store is touched. */
static int check(const char *dir, const struct js_value *man, const struct js_value *meta, char *err, size_t errlen)
{
	const struct js_value *ver = member(man, "version", JS_STRING), *a = member(man, "allocations", JS_ARRAY);
	if (!ver || strcmp(ver->s, GMS_VERSION) || !a || !meta || meta->kind != JS_OBJECT)
		return snprintf(err, errlen, "%s: not a GMS snapshot of version %s (manifest.json, gms_metadata.json)", dir,
				GMS_VERSION), -EINVAL;
	for (size_t i = 0; i < a->n; i++) {
		const struct js_value *x = &a->v[i], *f = member(x, "tensor_file", JS_STRING);
		const struct js_value *z = member(x, "size", JS_NUMBER), *o = member(x, "tensor_offset", JS_NUMBER);
		char path[4200];
		struct stat st;
		if (!member(x, "allocation_id", JS_STRING) || !member(x, "tag", JS_STRING) || !z || !o || !f ||
		    strncmp(f->s, "shards/", 7) || strstr(f->s, ".."))
			return snprintf(err, errlen, "manifest.json: allocations[%zu] is not {allocation_id, size, tag, "
						     "tensor_file: shards/..., tensor_offset}", i), -EINVAL;
		snprintf(path, sizeof path, "%s/%s", dir, f->s);
		if (stat(path, &st))
			return snprintf(err, errlen, "%s: %s", path, strerror(errno)), -errno;
		if (o->u > (uint64_t)st.st_size || z->u > (uint64_t)st.st_size - o->u)
			return snprintf(err, errlen, "%s: %llu bytes, too short for %s", path, (unsigned long long)st.st_size,
					member(x, "allocation_id", JS_STRING)->s), -EIO;
	}
	for (size_t i = 0; i < meta->n; i++)
		if (!member(&meta->v[i], "allocation_id", JS_STRING) || !member(&meta->v[i], "offset_bytes", JS_NUMBER) ||
		    !member(&meta->v[i], "value", JS_STRING))
			return snprintf(err, errlen, "gms_metadata.json: %s is not {allocation_id, offset_bytes, value}",
					meta->keys[i]), -EINVAL;
	return 0;
}

/* The file number cp_file gave dir/rel, opening it the first time it is named. */
static int file_of(struct cp *c, const char *dir, const char *rel, char **names, int *nums, size_t *n, char *err,
		   size_t errlen)
{
	for (size_t i = 0; i < *n; i++)
		if (!strcmp(names[i], rel))
			return nums[i];
	char path[4200];
	snprintf(path, sizeof path, "%s/%s", dir, rel);
	int f = cp_file(c, path, err, errlen);
	if (f >= 0)
		names[*n] = (char *)rel, nums[(*n)++] = f;
	return f;
}

int gmsfmt_restore(const char *store, const char *dir, int timeout_ms, char *err, size_t errlen)
{
	char path[4200];
	struct js_value man = { 0 }, meta = { 0 };
	snprintf(path, sizeof path, "%s/manifest.json", dir);
	int e = js_read_file(path, &man, err, errlen);
	snprintf(path, sizeof path, "%s/gms_metadata.json", dir);
	if (!e)
		e = js_read_file(path, &meta, err, errlen);
	if (!e)
		e = check(dir, &man, &meta, err, errlen);
	const struct js_value *a = e ? NULL : member(&man, "allocations", JS_ARRAY), *mark = member(&man, "gmsfs", JS_NUMBER);
	size_t n = a ? a->n : 0, ne = e ? 0 : meta.n, nf = 0;
	bool own_names = mark && mark->u == 1; /* from gmsfs: its ids are the allocations' names */
	struct gmsfs_new *nv = calloc(n + 1, sizeof *nv);
	struct gmsfs_entry *ev = calloc(ne + 1, sizeof *ev);
	char (*slots)[32] = calloc(n + 1, sizeof *slots), **fnames = calloc(n + 1, sizeof *fnames);
	int *fnums = calloc(n + 1, sizeof *fnums);
	if (!e && (!nv || !ev || !slots || !fnames || !fnums))
		e = -ENOMEM, snprintf(err, errlen, "out of memory");
	for (size_t i = 0; !e && i < n; i++) {
		snprintf(slots[i], sizeof slots[i], "slot%06zu", i);
		nv[i] = (struct gmsfs_new){ .name = own_names ? member(&a->v[i], "allocation_id", JS_STRING)->s : slots[i],
					    .tag = member(&a->v[i], "tag", JS_STRING)->s,
					    .size = member(&a->v[i], "size", JS_NUMBER)->u };
	}
	for (size_t i = 0; !e && i < ne; i++) {
		const struct js_value *x = &meta.v[i];
		const char *id = member(x, "allocation_id", JS_STRING)->s;
		size_t k = 0;
		while (k < n && strcmp(member(&a->v[k], "allocation_id", JS_STRING)->s, id))
			k++;
		unsigned char *val = NULL;
		size_t vl = 0;
		if (k == n && id[0])
			e = -EINVAL, snprintf(err, errlen, "gms_metadata.json: %s names allocation %s, which the manifest "
							   "lacks", meta.keys[i], id);
		else if (b64_read(member(x, "value", JS_STRING)->s, &val, &vl))
			e = -EINVAL, snprintf(err, errlen, "gms_metadata.json: %s: the value is not base64", meta.keys[i]);
		const struct js_value *own = own_names ? member(x, "gmsfs_key", JS_STRING) : NULL;
		const struct js_value *z = own ? member(x, "gmsfs_size", JS_NUMBER) : NULL;
		const struct js_value *fl = own ? member(x, "gmsfs_flags", JS_NUMBER) : NULL;
		ev[i] = (struct gmsfs_entry){ .key = own ? strdup(own->s) : key_path(meta.keys[i]),
					      .alloc = k < n ? nv[k].name : "",
					      .offset = member(x, "offset_bytes", JS_NUMBER)->u, .size = z ? z->u : 0,
					      .flags = fl ? (uint32_t)fl->u : 0, .value = val, .value_len = vl };
		if (!e && !ev[i].key)
			e = -ENOMEM, snprintf(err, errlen, "out of memory");
	}
	struct cp *c = NULL;
	gmsfs *g = NULL;
	if (!e)
		e = cp_open(store, &c, err, errlen);
	if (!e && (e = gmsfs_connect(&g, store, GMSFS_RW, timeout_ms)))
		snprintf(err, errlen, "%s", g ? gmsfs_errmsg(g) : gmsfs_strerror(e));
	if (!e && sf_allocations(store) != 0)
		e = -EEXIST, snprintf(err, errlen, "%s holds allocations already: restore into an empty store", store);
	if (!e && n && (e = gmsfs_create_many(g, nv, n)))
		snprintf(err, errlen, "%s", gmsfs_errmsg(g));
	for (size_t i = 0; !e && i < n; i++) {
		int f = file_of(c, dir, member(&a->v[i], "tensor_file", JS_STRING)->s, fnames, fnums, &nf, err, errlen);
		e = f < 0 ? f : cp_add(c, f, member(&a->v[i], "tensor_offset", JS_NUMBER)->u, nv[i].ptr, nv[i].size, NULL);
	}
	if (!e)
		e = cp_run(c, NULL, NULL, err, errlen);
	if (!e && ne && (e = gmsfs_meta_put_many(g, ev, ne)))
		snprintf(err, errlen, "%s", gmsfs_errmsg(g));
	if (!e && (e = gmsfs_commit(g)))
		snprintf(err, errlen, "commit: %s", gmsfs_errmsg(g));
	for (size_t i = 0; ev && i < ne; i++) {
		free((char *)ev[i].key);
		free((void *)ev[i].value);
	}
	free(ev), free(nv), free(slots), free(fnames), free(fnums);
	js_free(&man);
	js_free(&meta);
	gmsfs_disconnect(g); /* without a commit: the session rolls back */
	cp_close(c);
	return e;
}
