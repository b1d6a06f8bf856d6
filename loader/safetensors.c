/* safetensors: see safetensors.h. */
#include "safetensors.h"
#include "json.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const struct { const char *st, *torch; unsigned size; } dtypes[] = {
	{ "F64", "float64", 8 }, { "F32", "float32", 4 }, { "F16", "float16", 2 }, { "BF16", "bfloat16", 2 },
	{ "I64", "int64", 8 }, { "I32", "int32", 4 }, { "I16", "int16", 2 }, { "I8", "int8", 1 },
	{ "U8", "uint8", 1 }, { "BOOL", "bool", 1 }, { "U16", "uint16", 2 }, { "U32", "uint32", 4 },
	{ "U64", "uint64", 8 }, { "F8_E4M3", "float8_e4m3fn", 1 }, { "F8_E5M2", "float8_e5m2", 1 },
};

const char *st_torch_name(const char *dtype, unsigned *itemsize)
{
	for (size_t i = 0; i < sizeof dtypes / sizeof *dtypes; i++)
		if (!strcmp(dtypes[i].st, dtype)) {
			*itemsize = dtypes[i].size;
			return dtypes[i].torch;
		}
	return NULL;
}

const char *st_dtype_of_torch(const char *torch, unsigned *itemsize)
{
	for (size_t i = 0; i < sizeof dtypes / sizeof *dtypes; i++)
		if (!strcmp(dtypes[i].torch, torch)) {
			*itemsize = dtypes[i].size;
			return dtypes[i].st;
		}
	return NULL;
}

static int fail(char *err, size_t errlen, const char *path, const char *tensor, const char *what)
{
	if (tensor)
		snprintf(err, errlen, "%s: tensor %s: %s", path, tensor, what);
	else
		snprintf(err, errlen, "%s: %s", path, what);
	return -EINVAL;
}

static int by_begin(const void *a, const void *b)
{
	const struct st_tensor *x = a, *y = b;
	return x->begin < y->begin ? -1 : x->begin > y->begin ? 1 : x->end < y->end ? -1 : x->end > y->end;
}

/* One tensor's description; t->name is set by the caller. */
static int tensor(const char *path, const struct js_value *d, struct st_tensor *t, uint64_t data_len, char *err,
		  size_t errlen)
{
	const struct js_value *dt = js_get(d, "dtype"), *sh = js_get(d, "shape"), *off = js_get(d, "data_offsets");
	if (d->kind != JS_OBJECT || !dt || !sh || !off)
		return fail(err, errlen, path, t->name, "not {dtype, shape, data_offsets}");
	if (dt->kind != JS_STRING || !(t->torch = st_torch_name(dt->s, &t->itemsize)))
		return fail(err, errlen, path, t->name, "unknown dtype");
	t->dtype = st_dtype_of_torch(t->torch, &t->itemsize);
	if (sh->kind != JS_ARRAY || sh->n > ST_DIMS_MAX)
		return fail(err, errlen, path, t->name, "shape is not a list of at most 16 sizes");
	uint64_t count = 1;
	t->ndim = (unsigned)sh->n;
	for (size_t i = 0; i < sh->n; i++) {
		if (sh->v[i].kind != JS_NUMBER || !sh->v[i].is_uint)
			return fail(err, errlen, path, t->name, "a size in shape is not a non-negative integer");
		t->shape[i] = sh->v[i].u;
		if (t->shape[i] && count > UINT64_MAX / t->shape[i])
			return fail(err, errlen, path, t->name, "shape overflows");
		count *= t->shape[i];
	}
	if (off->kind != JS_ARRAY || off->n != 2 || off->v[0].kind != JS_NUMBER || !off->v[0].is_uint ||
	    off->v[1].kind != JS_NUMBER || !off->v[1].is_uint)
		return fail(err, errlen, path, t->name, "data_offsets is not [begin, end]");
	t->begin = off->v[0].u;
	t->end = off->v[1].u;
	if (t->begin > t->end || t->end > data_len)
		return fail(err, errlen, path, t->name, "data_offsets outside the file's data");
	if (count > UINT64_MAX / t->itemsize || count * t->itemsize != t->end - t->begin)
		return fail(err, errlen, path, t->name, "shape and dtype do not match the size of its data");
	return 0;
}

int st_parse(const char *path, const char *json, size_t len, uint64_t file_size, struct st_file *f, char *err,
	     size_t errlen)
{
	*f = (struct st_file){0};
	struct js_value root;
	char why[256];
	if (js_parse(json, len, &root, why, sizeof why))
		return fail(err, errlen, path, NULL, why);
	int e = 0;
	if (root.kind != JS_OBJECT) {
		e = fail(err, errlen, path, NULL, "the header is not a JSON object");
		goto out;
	}
	if (file_size < 8 || len > file_size - 8) {
		e = fail(err, errlen, path, NULL, "the header length passes the end of the file (truncated?)");
		goto out;
	}
	f->data_start = 8 + (uint64_t)len;
	f->data_len = file_size - f->data_start;
	f->t = calloc(root.n ? root.n : 1, sizeof *f->t);
	if (!(f->path = strdup(path)) || !f->t) {
		e = -ENOMEM;
		snprintf(err, errlen, "out of memory");
		goto out;
	}
	for (size_t i = 0; i < root.n && !e; i++) {
		if (!strcmp(root.keys[i], "__metadata__"))
			continue;
		struct st_tensor *t = &f->t[f->n];
		if (!(t->name = strdup(root.keys[i]))) {
			e = -ENOMEM;
			break;
		}
		f->n++;
		e = tensor(path, &root.v[i], t, f->data_len, err, errlen);
	}
	if (!e) { /* no two tensors share bytes */
		struct st_tensor *v = malloc((f->n ? f->n : 1) * sizeof *v);
		if (!v) {
			e = -ENOMEM;
		} else {
			memcpy(v, f->t, f->n * sizeof *v);
			qsort(v, f->n, sizeof *v, by_begin);
			uint64_t reached = 0; /* the furthest end of the non-empty tensors so far */
			for (size_t i = 0; i < f->n && !e; i++) {
				if (v[i].begin == v[i].end)
					continue;
				if (v[i].begin < reached)
					e = fail(err, errlen, path, v[i].name, "its data overlaps another tensor's");
				reached = v[i].end;
			}
			free(v);
		}
	}
out:
	js_free(&root);
	if (e)
		st_free(f);
	return e;
}

int st_open(const char *path, struct st_file *f, char *err, size_t errlen)
{
	*f = (struct st_file){0};
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		snprintf(err, errlen, "%s: %s", path, strerror(errno));
		return -errno;
	}
	struct stat s;
	unsigned char h[8];
	int e = 0;
	char *json = NULL;
	if (fstat(fd, &s) || pread(fd, h, 8, 0) != 8) {
		e = fail(err, errlen, path, NULL, "shorter than the 8 bytes of a header length");
		goto out;
	}
	uint64_t len = 0;
	for (int i = 7; i >= 0; i--)
		len = len << 8 | h[i];
	if (len > ST_HEADER_MAX || len > (uint64_t)s.st_size - 8) {
		e = fail(err, errlen, path, NULL, "the header length passes the end of the file (truncated?)");
		goto out;
	}
	if (!(json = malloc(len ? len : 1))) {
		e = -ENOMEM;
		goto out;
	}
	if (pread(fd, json, len, 8) != (ssize_t)len) {
		e = fail(err, errlen, path, NULL, "could not read the header");
		goto out;
	}
	e = st_parse(path, json, len, (uint64_t)s.st_size, f, err, errlen);
out:
	free(json);
	close(fd);
	return e;
}

void st_free(struct st_file *f)
{
	for (size_t i = 0; f->t && i < f->n; i++)
		free(f->t[i].name);
	free(f->t);
	free(f->path);
	*f = (struct st_file){0};
}

int st_index(const char *index_path, char ***files, size_t *n, char *err, size_t errlen)
{
	*files = NULL;
	*n = 0;
	int fd = open(index_path, O_RDONLY | O_CLOEXEC);
	struct stat st;
	if (fd < 0 || fstat(fd, &st)) {
		int e = -errno;
		snprintf(err, errlen, "%s: %s", index_path, strerror(errno));
		if (fd >= 0)
			close(fd);
		return e;
	}
	if ((uint64_t)st.st_size > ST_HEADER_MAX) {
		close(fd);
		return fail(err, errlen, index_path, NULL, "larger than an index can be");
	}
	size_t len = (size_t)st.st_size;
	char *text = malloc(len ? len : 1);
	if (!text || pread(fd, text, len, 0) != (ssize_t)len) {
		free(text);
		close(fd);
		return fail(err, errlen, index_path, NULL, "could not read it");
	}
	close(fd);
	struct js_value root;
	char why[256];
	if (js_parse(text, len, &root, why, sizeof why)) {
		free(text);
		return fail(err, errlen, index_path, NULL, why);
	}
	free(text);
	const struct js_value *map = js_get(&root, "weight_map");
	int e = 0;
	if (!map || map->kind != JS_OBJECT)
		e = fail(err, errlen, index_path, NULL, "no weight_map object");
	const char *slash = strrchr(index_path, '/');
	int dirlen = slash ? (int)(slash - index_path) : 1;
	const char *dir = slash ? index_path : ".";
	char **v = e ? NULL : calloc(map->n ? map->n : 1, sizeof *v);
	if (!e && !v)
		e = -ENOMEM;
	for (size_t i = 0; !e && i < map->n; i++) {
		const struct js_value *s = &map->v[i];
		if (s->kind != JS_STRING || !s->s[0] || strchr(s->s, '/')) {
			e = fail(err, errlen, index_path, map->keys[i], "its shard is not a file name of this folder");
			break;
		}
		size_t j = 0;
		char *p;
		if (asprintf(&p, "%.*s/%s", dirlen, dir, s->s) < 0) {
			e = -ENOMEM;
			break;
		}
		while (j < *n && strcmp(v[j], p))
			j++;
		if (j < *n)
			free(p);
		else
			v[(*n)++] = p;
	}
	js_free(&root);
	if (e) {
		for (size_t i = 0; i < *n; i++)
			free(v[i]);
		free(v);
		*n = 0;
		return e;
	}
	*files = v;
	return 0;
}
