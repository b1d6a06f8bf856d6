/* gmsfs-save [-t SECONDS] STORE DIR: the store's tensors (entries "torch/NAME", as
 * gmsfs-load and gmsfs.torch.publish make them) back into DIR/model.safetensors, under
 * a read lock: names, dtypes, shapes and bytes as they are in the store.  A tensor that
 * is not contiguous in its allocation, or whose entry is not one gmsfs-load or
 * gmsfs.torch would write, is refused by name and nothing is written.  See gmsfs-load(1). */
#include "copy.h"
#include "copy_cuda.h"
#include "json.h"
#include "safetensors.h"
#include "unheld.h"

#include <gmsfs/gmsfs.h>
#include <gmsfs/torch.h>

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

struct out {
	const char *name;       /* after "torch/" */
	const char *dtype;      /* safetensors' */
	unsigned ndim;
	uint64_t shape[ST_DIMS_MAX];
	const void *src;        /* in this process's mapping */
	uint64_t len, at;       /* bytes, and where in the data */
};

/* Check one entry: a contiguous tensor inside its extent. */
static int describe(const char *key, const struct gmsfs_meta *m, struct out *o, char *err, size_t errlen)
{
	struct js_value v;
	char why[256];
	o->name = key + strlen(GMSFS_TORCH_PREFIX);
	if (js_parse(m->value, m->value_len, &v, why, sizeof why)) {
		snprintf(err, errlen, "%s: %s", key, why);
		return -EINVAL;
	}
	const struct js_value *dt = js_get(&v, "dtype"), *sh = js_get(&v, "shape"), *st = js_get(&v, "stride"),
			      *so = js_get(&v, "storage_offset");
	unsigned size;
	int e = 0;
	if (!dt || dt->kind != JS_STRING || !(o->dtype = st_dtype_of_torch(dt->s, &size)))
		e = -EINVAL, snprintf(err, errlen, "%s: no dtype safetensors has", key);
	else if (!sh || sh->kind != JS_ARRAY || sh->n > ST_DIMS_MAX || !st || st->kind != JS_ARRAY || st->n != sh->n ||
		 !so || so->kind != JS_NUMBER || !so->is_uint)
		e = -EINVAL, snprintf(err, errlen, "%s: not {dtype, shape, stride, storage_offset}", key);
	uint64_t count = 1, want = 1;
	for (size_t d = sh ? sh->n : 0; !e && d-- > 0;) {
		if (sh->v[d].kind != JS_NUMBER || !sh->v[d].is_uint || st->v[d].kind != JS_NUMBER || !st->v[d].is_uint)
			e = -EINVAL, snprintf(err, errlen, "%s: a size or stride is not a non-negative integer", key);
		else if (sh->v[d].u > 1 && st->v[d].u != want)
			e = -EINVAL, snprintf(err, errlen, "%s: not contiguous (save a contiguous copy)", key);
		else if (sh->v[d].u && count > UINT64_MAX / sh->v[d].u)
			e = -EINVAL, snprintf(err, errlen, "%s: its shape overflows", key);
		if (!e) {
			o->shape[d] = sh->v[d].u;
			count *= sh->v[d].u;
			want *= sh->v[d].u ? sh->v[d].u : 1;
		}
	}
	if (!e) {
		o->ndim = (unsigned)sh->n;
		o->len = count * size;
		uint64_t start = so->u * size;
		if (count && (!m->ptr || start > m->size || o->len > m->size - start))
			e = -EINVAL, snprintf(err, errlen, "%s: its bytes are not inside its extent", key);
		o->src = count ? (const char *)m->ptr + start : NULL;
	}
	js_free(&v);
	return e;
}

/* The header, padded with spaces to a multiple of 8 as safetensors writes it. */
static char *header(struct out *o, size_t n, size_t *len)
{
	char *s = NULL;
	FILE *f = open_memstream(&s, len);
	if (!f)
		return NULL;
	uint64_t at = 0;
	fputc('{', f);
	for (size_t i = 0; i < n; i++) {
		o[i].at = at;
		fputs(i ? "," : "", f);
		js_write_str(f, o[i].name);
		fprintf(f, ":{\"dtype\":\"%s\",\"shape\":[", o[i].dtype);
		for (unsigned d = 0; d < o[i].ndim; d++)
			fprintf(f, "%s%llu", d ? "," : "", (unsigned long long)o[i].shape[d]);
		fprintf(f, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)at, (unsigned long long)(at + o[i].len));
		at += o[i].len;
	}
	fputc('}', f);
	fflush(f);
	while (*len % 8) {
		fputc(' ', f);
		fflush(f);
	}
	return fclose(f) ? (free(s), NULL) : s;
}

static int run(int argc, char **argv)
{
	int timeout_ms = 60000, i = 1;
	if (argc == 5 && !strcmp(argv[1], "-t")) {
		char *end;
		double t = strtod(argv[2], &end);
		if (*end || t < 0 || t > 86400)
			argc = 0;
		timeout_ms = (int)(t * 1000);
		i = 3;
	}
	if (argc - i != 2) {
		fprintf(stderr, "usage: gmsfs-save [-t SECONDS] STORE DIR\n");
		return 2;
	}
	const char *store = argv[i], *dir = argv[i + 1];
	char path[4096], tmp[4200], err[8400] = "";
	snprintf(path, sizeof path, "%s/model.safetensors", dir);
	snprintf(tmp, sizeof tmp, "%s.partial", path);
	struct cp *c = NULL;
	gmsfs *g = NULL;
	char **keys = NULL;
	struct gmsfs_meta *m = NULL;
	struct out *o = NULL;
	size_t n = 0, hlen = 0;
	char *h = NULL;
	int fd = -1;
	cpc_show_only(&store, 1); /* the store's GPU alone: cuInit sets up no other */
	cpc_one_queue();
	int e = cp_open(store, &c, err, sizeof err);
	if (!e && (e = gmsfs_connect(&g, store, GMSFS_RO, timeout_ms)))
		snprintf(err, sizeof err, "%s", g ? gmsfs_errmsg(g) : gmsfs_strerror(e));
	if (!e && ((e = gmsfs_import_all(g)) || (e = gmsfs_meta_get_all(g, GMSFS_TORCH_PREFIX, &keys, &m, &n))))
		snprintf(err, sizeof err, "%s", gmsfs_errmsg(g));
	if (!e && !n)
		e = -ENOENT, snprintf(err, sizeof err, "%s: no torch/ entries (nothing gmsfs-load or publish made)", store);
	if (!e && !(o = calloc(n, sizeof *o)))
		e = -ENOMEM;
	for (size_t k = 0; !e && k < n; k++)
		e = describe(keys[k], &m[k], &o[k], err, sizeof err);
	if (!e && !(h = header(o, n, &hlen)))
		e = -ENOMEM;
	if (!e && mkdir(dir, 0755) && errno != EEXIST) /* one level, as mkdir(1) without -p */
		e = -errno, snprintf(err, sizeof err, "%s: %s", dir, strerror(errno));
	if (!e && (fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644)) < 0)
		e = -errno, snprintf(err, sizeof err, "%s: %s", tmp, strerror(errno));
	unsigned char lenb[8];
	for (int b = 0; b < 8; b++)
		lenb[b] = (unsigned char)((uint64_t)hlen >> (8 * b));
	if (!e && (pwrite(fd, lenb, 8, 0) != 8 || pwrite(fd, h, hlen, 8) != (ssize_t)hlen))
		e = -errno, snprintf(err, sizeof err, "%s: %s", tmp, strerror(errno));
	for (size_t k = 0; !e && k < n; k++) {
		char why[512];
		if (o[k].len && (e = cp_store_to_file(c, o[k].src, o[k].len, fd, 8 + hlen + o[k].at, why, sizeof why)))
			snprintf(err, sizeof err, "%s: %s", o[k].name, why);
	}
	if (fd >= 0 && (fsync(fd) || close(fd)) && !e)
		e = -errno, snprintf(err, sizeof err, "%s: %s", tmp, strerror(errno));
	if (!e && rename(tmp, path))
		e = -errno, snprintf(err, sizeof err, "%s: %s", path, strerror(errno));
	if (e && fd >= 0)
		unlink(tmp);
	free(h);
	free(o);
	if (keys)
		gmsfs_meta_free_all(keys, m, n);
	gmsfs_disconnect(g);
	cp_close(c);
	if (e) {
		fprintf(stderr, "gmsfs-save: %s\n", err[0] ? err : strerror(-e));
		return 1;
	}
	return 0;
}

int main(int argc, char **argv)
{
	return unheld_run(run, argc, argv); /* a daemon that does not answer holds a child, not the command */
}
