/* gmsfs-snapshot save STORE DIR | restore STORE DIR [-t SECONDS]
 *
 * save: under a read lock, the committed layout whole: DIR/layout.json (every
 * allocation's name, size, tag and place in DIR/data, every entry's key, allocation,
 * offset, extent, flags and value in hex, and the layout hash) and DIR/data (the
 * allocations' bytes, each at a 4096-byte boundary).  restore: into an empty store, one
 * writer session (create_many, the bytes, the entries in one request), and commit only
 * if the layout hash is the one saved.  See gmsfs-load(1). */
#include "copy.h"
#include "store_files.h"
#include "json.h"

#include <gmsfs/gmsfs.h>

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define DATA_ALIGN 4096u

static int save(const char *store, const char *dir, int timeout_ms, char *err, size_t errlen)
{
	struct cp *c = NULL;
	gmsfs *g = NULL;
	char **keys = NULL, path[4200], hash[33];
	struct gmsfs_meta *m = NULL;
	size_t n = 0;
	FILE *f = NULL;
	int fd = -1, e = cp_open(store, &c, err, errlen);
	if (!e && (e = gmsfs_connect(&g, store, GMSFS_RO, timeout_ms)))
		snprintf(err, errlen, "%s", g ? gmsfs_errmsg(g) : gmsfs_strerror(e));
	if (!e && ((e = gmsfs_import_all(g)) || (e = gmsfs_meta_get_all(g, "", &keys, &m, &n)) ||
		   (e = gmsfs_layout_hash(g, hash))))
		snprintf(err, errlen, "%s", gmsfs_errmsg(g));
	if (!e && mkdir(dir, 0755) && errno != EEXIST)
		e = -errno, snprintf(err, errlen, "%s: %s", dir, strerror(errno));
	snprintf(path, sizeof path, "%s/data", dir);
	if (!e && (fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644)) < 0)
		e = -errno, snprintf(err, errlen, "%s: %s", path, strerror(errno));
	snprintf(path, sizeof path, "%s/layout.json", dir);
	if (!e && !(f = fopen(path, "we")))
		e = -errno, snprintf(err, errlen, "%s: %s", path, strerror(errno));
	const struct gmsfs_mapping *v = NULL;
	size_t na = e ? 0 : gmsfs_mappings(g, &v);
	if (!e)
		fprintf(f, "{\"format\": \"gmsfs-snapshot 1\", \"layout_hash\": \"%s\",\n \"allocations\": [", hash);
	uint64_t at = 0;
	for (size_t i = 0; !e && i < na; i++) {
		char why[512];
		fputs(i ? ",\n  {\"name\": " : "\n  {\"name\": ", f);
		js_write_str(f, v[i].name);
		fputs(", \"tag\": ", f);
		js_write_str(f, v[i].tag);
		fprintf(f, ", \"size\": %llu, \"data\": %llu}", (unsigned long long)v[i].size, (unsigned long long)at);
		if ((e = cp_store_to_file(c, v[i].ptr, v[i].size, fd, at, why, sizeof why)))
			snprintf(err, errlen, "allocs/%s: %s", v[i].name, why);
		at += (v[i].size + DATA_ALIGN - 1) / DATA_ALIGN * DATA_ALIGN;
	}
	if (!e)
		fputs("],\n \"entries\": [", f);
	for (size_t i = 0; !e && i < n; i++) {
		fputs(i ? ",\n  {\"key\": " : "\n  {\"key\": ", f);
		js_write_str(f, keys[i]);
		fputs(", \"alloc\": ", f);
		js_write_str(f, m[i].alloc ? m[i].alloc : "");
		fprintf(f, ", \"offset\": %llu, \"size\": %llu, \"flags\": %u, \"value\": \"", (unsigned long long)m[i].offset,
			(unsigned long long)m[i].size, m[i].flags);
		for (size_t b = 0; b < m[i].value_len; b++)
			fprintf(f, "%02x", ((const unsigned char *)m[i].value)[b]);
		fputs("\"}", f);
	}
	if (!e)
		fputs("]}\n", f);
	if (f && fclose(f) && !e)
		e = -EIO, snprintf(err, errlen, "%s: %s", path, strerror(errno));
	if (fd >= 0 && (ftruncate(fd, (off_t)at) || fsync(fd) || close(fd)) && !e)
		e = -EIO, snprintf(err, errlen, "%s/data: %s", dir, strerror(errno));
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

/* Check the whole layout.json before the store is touched. */
static int check_layout(const struct js_value *root, char *err, size_t errlen)
{
	const struct js_value *a = field(root, "allocations", JS_ARRAY), *en = field(root, "entries", JS_ARRAY),
			      *h = field(root, "layout_hash", JS_STRING);
	if (!a || !en || !h) {
		snprintf(err, errlen, "layout.json: not {layout_hash, allocations, entries}");
		return -EINVAL;
	}
	for (size_t i = 0; i < a->n; i++)
		if (!field(&a->v[i], "name", JS_STRING) || !field(&a->v[i], "tag", JS_STRING) ||
		    !field(&a->v[i], "size", JS_NUMBER) || !field(&a->v[i], "data", JS_NUMBER)) {
			snprintf(err, errlen, "layout.json: allocations[%zu] is not {name, tag, size, data}", i);
			return -EINVAL;
		}
	for (size_t i = 0; i < en->n; i++)
		if (!field(&en->v[i], "key", JS_STRING) || !field(&en->v[i], "alloc", JS_STRING) ||
		    !field(&en->v[i], "offset", JS_NUMBER) || !field(&en->v[i], "size", JS_NUMBER) ||
		    !field(&en->v[i], "flags", JS_NUMBER) || !field(&en->v[i], "value", JS_STRING)) {
			snprintf(err, errlen, "layout.json: entries[%zu] is not {key, alloc, offset, size, flags, value}", i);
			return -EINVAL;
		}
	return 0;
}

static int read_text(const char *path, char **text, size_t *len, char *err, size_t errlen)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	struct stat s;
	if (fd < 0 || fstat(fd, &s)) {
		snprintf(err, errlen, "%s: %s", path, strerror(errno));
		if (fd >= 0)
			close(fd);
		return -errno;
	}
	*len = (size_t)s.st_size;
	*text = malloc(*len ? *len : 1);
	int e = *text && pread(fd, *text, *len, 0) == (ssize_t)*len ? 0 : -EIO;
	if (e)
		snprintf(err, errlen, "%s: could not read it", path);
	close(fd);
	return e;
}

static int restore(const char *store, const char *dir, int timeout_ms, char *err, size_t errlen)
{
	char path[4200], hash[33], *text = NULL;
	size_t len = 0;
	struct js_value root = { 0 };
	snprintf(path, sizeof path, "%s/layout.json", dir);
	int e = read_text(path, &text, &len, err, errlen);
	if (!e && js_parse(text, len, &root, err, errlen))
		e = -EINVAL;
	free(text);
	if (!e)
		e = check_layout(&root, err, errlen);
	const struct js_value *a = field(&root, "allocations", JS_ARRAY), *en = field(&root, "entries", JS_ARRAY);
	size_t na = a ? a->n : 0, ne = en ? en->n : 0;
	struct gmsfs_new *nv = calloc(na ? na : 1, sizeof *nv);
	struct gmsfs_entry *ev = calloc(ne ? ne : 1, sizeof *ev);
	unsigned char **vals = calloc(ne ? ne : 1, sizeof *vals);
	if (!e && (!nv || !ev || !vals))
		e = -ENOMEM;
	for (size_t i = 0; !e && i < ne; i++) {
		const struct js_value *x = &en->v[i];
		size_t vl = 0;
		if (unhex(field(x, "value", JS_STRING)->s, &vals[i], &vl)) {
			e = -EINVAL, snprintf(err, errlen, "layout.json: entries[%zu]: the value is not hex", i);
			break;
		}
		ev[i] = (struct gmsfs_entry){ .key = field(x, "key", JS_STRING)->s, .alloc = field(x, "alloc", JS_STRING)->s,
					      .offset = field(x, "offset", JS_NUMBER)->u,
					      .size = field(x, "size", JS_NUMBER)->u,
					      .flags = (uint32_t)field(x, "flags", JS_NUMBER)->u, .value = vals[i],
					      .value_len = vl };
	}
	for (size_t i = 0; !e && i < na; i++)
		nv[i] = (struct gmsfs_new){ .name = field(&a->v[i], "name", JS_STRING)->s,
					    .tag = field(&a->v[i], "tag", JS_STRING)->s,
					    .size = field(&a->v[i], "size", JS_NUMBER)->u };
	struct cp *c = NULL;
	gmsfs *g = NULL;
	int data = -1;
	snprintf(path, sizeof path, "%s/data", dir);
	if (!e)
		e = cp_open(store, &c, err, errlen);
	if (!e && (data = cp_file(c, path, err, errlen)) < 0)
		e = data;
	if (!e && (e = gmsfs_connect(&g, store, GMSFS_RW, timeout_ms)))
		snprintf(err, errlen, "%s", g ? gmsfs_errmsg(g) : gmsfs_strerror(e));
	if (!e && sf_allocations(store) != 0)
		e = -EEXIST, snprintf(err, errlen, "%s holds allocations already: restore into an empty store", store);
	if (!e && na && (e = gmsfs_create_many(g, nv, na)))
		snprintf(err, errlen, "%s", gmsfs_errmsg(g));
	for (size_t i = 0; !e && i < na; i++)
		e = cp_add(c, data, field(&a->v[i], "data", JS_NUMBER)->u, nv[i].ptr, nv[i].size);
	if (!e && (e = cp_run(c, NULL, NULL, err, errlen)))
		snprintf(err + strlen(err), errlen - strlen(err), " (%s: shorter than layout.json says?)", path);
	if (!e && ne && (e = gmsfs_meta_put_many(g, ev, ne)))
		snprintf(err, errlen, "%s", gmsfs_errmsg(g));
	if (!e && (e = gmsfs_commit(g)))
		snprintf(err, errlen, "commit: %s", gmsfs_errmsg(g));
	/* The same allocations and entries give the same hash; say so if they did not. */
	const char *want = e ? "" : field(&root, "layout_hash", JS_STRING)->s;
	if (!e && (e = gmsfs_layout_hash(g, hash)))
		snprintf(err, errlen, "%s", gmsfs_errmsg(g));
	if (!e && strcmp(hash, want))
		e = -EIO, snprintf(err, errlen, "restored, but the layout hash is %s, not the saved %s", hash, want);
	for (size_t i = 0; vals && i < ne; i++)
		free(vals[i]);
	free(vals);
	free(ev);
	free(nv);
	js_free(&root);
	gmsfs_disconnect(g);
	cp_close(c);
	return e;
}

int main(int argc, char **argv)
{
	int timeout_ms = 60000;
	if (argc == 6 && !strcmp(argv[4], "-t")) {
		timeout_ms = (int)(atof(argv[5]) * 1000);
		argc = 4;
	}
	if (argc != 4 || (strcmp(argv[1], "save") && strcmp(argv[1], "restore"))) {
		fprintf(stderr, "usage: gmsfs-snapshot save|restore STORE DIR [-t SECONDS]\n");
		return 2;
	}
	char err[8400] = "";
	int e = argv[1][0] == 's' ? save(argv[2], argv[3], timeout_ms, err, sizeof err)
				  : restore(argv[2], argv[3], timeout_ms, err, sizeof err);
	if (e) {
		fprintf(stderr, "gmsfs-snapshot: %s\n", err[0] ? err : strerror(-e));
		return 1;
	}
	return 0;
}
