/* refit: a trainer's tensors copied into a store's by name (gmsfs_refit), as
 * gmsfs.torch.refit does from Python: every name, dtype and shape checked against the
 * store's tensor entries (gmsfs/torch.h) before a byte is written, both sides named. */
#include "internal.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <gmsfs/torch.h>

#define RF_DIMS_MAX 16

/* A tensor entry's value, as gmsfs/torch.h says it. */
struct rf_entry {
	char dtype[32];
	int64_t shape[RF_DIMS_MAX], stride[RF_DIMS_MAX];
	int ndim, nstride;
	int64_t storage_offset;
};

/* PyTorch's names of the dtypes a tensor entry may have, and their sizes. */
static int rf_itemsize(const char *dtype)
{
	static const struct { const char *name; int size; } t[] = {
		{ "float64", 8 }, { "float32", 4 }, { "float16", 2 }, { "bfloat16", 2 }, { "int64", 8 },
		{ "int32", 4 }, { "int16", 2 }, { "int8", 1 }, { "uint8", 1 }, { "bool", 1 },
		{ "float8_e4m3fn", 1 }, { "float8_e5m2", 1 }, { "complex64", 8 }, { "complex128", 16 },
		{ "uint16", 2 }, { "uint32", 4 }, { "uint64", 8 },
	};
	for (size_t i = 0; i < sizeof t / sizeof *t; i++)
		if (!strcmp(t[i].name, dtype))
			return t[i].size;
	return 0;
}

/* Where key's value starts in the JSON object v (just after its colon), or NULL. */
static const char *rf_field(const char *v, const char *key)
{
	char pat[40];
	snprintf(pat, sizeof pat, "\"%s\"", key);
	const char *p = strstr(v, pat);
	if (!p)
		return NULL;
	p += strlen(pat);
	while (*p == ' ')
		p++;
	return *p == ':' ? p + 1 : NULL;
}

/* [a, b, ...] at p into out (at most RF_DIMS_MAX): the count, or -1. */
static int rf_ints(const char *p, int64_t *out)
{
	while (p && *p == ' ')
		p++;
	if (!p || *p++ != '[')
		return -1;
	int n = 0;
	for (;;) {
		while (*p == ' ')
			p++;
		if (*p == ']')
			return n;
		char *end;
		long long x = strtoll(p, &end, 10);
		if (end == p || n == RF_DIMS_MAX)
			return -1;
		out[n++] = x;
		for (p = end; *p == ' '; p++)
			;
		if (*p == ',')
			p++;
		else if (*p != ']')
			return -1;
	}
}

/* The value of a tensor entry (a JSON object, value_len bytes), parsed: 0 or -EINVAL. */
static int rf_parse(const char *value, size_t len, struct rf_entry *out)
{
	char *v = strndup(value, len);
	if (!v)
		return -ENOMEM;
	*out = (struct rf_entry){0};
	const char *d = rf_field(v, "dtype"), *so = rf_field(v, "storage_offset");
	while (d && *d == ' ')
		d++;
	int e = d && *d == '"' ? 0 : -EINVAL;
	size_t n = e ? 0 : strcspn(d + 1, "\"");
	if (!e && n < sizeof out->dtype)
		memcpy(out->dtype, d + 1, n);
	else
		e = -EINVAL;
	if (!e && ((out->ndim = rf_ints(rf_field(v, "shape"), out->shape)) < 0 ||
		   (out->nstride = rf_ints(rf_field(v, "stride"), out->stride)) != out->ndim))
		e = -EINVAL;
	out->storage_offset = so ? strtoll(so, NULL, 10) : 0;
	free(v);
	return e;
}

/* "[4096, 4096]" into buf. */
static const char *rf_shape(const int64_t *s, int n, char *buf, size_t size)
{
	size_t k = (size_t)snprintf(buf, size, "[");
	for (int i = 0; i < n && k < size; i++)
		k += (size_t)snprintf(buf + k, size - k, "%s%" PRId64, i ? ", " : "", s[i]);
	if (k < size)
		snprintf(buf + k, size - k, "]");
	return buf;
}

/* Where tensor x goes: its allocation and the byte offset in it.  0, or -errno with the
 * difference, both sides named, appended to why. */
static int rf_check(gmsfs *g, const struct gmsfs_tensor *x, char **alloc, uint64_t *at, uint64_t *bytes,
		    char *why, size_t whylen)
{
	char key[GMSFS_PATH_MAX + 1], a[160], b[160];
	size_t k = strlen(why);
	struct gmsfs_meta m;
	*alloc = NULL;
	if (x->name && (x->ndim < 0 || x->ndim > RF_DIMS_MAX || (x->ndim && !x->shape) || !x->data)) {
		snprintf(why + k, whylen - k, "%s%s: the source's %s", k ? "; " : "", x->name,
			 x->data ? "ndim is not 0 to 16, or its shape is missing" : "data is missing");
		return -EINVAL;
	}
	snprintf(key, sizeof key, "%s%s", GMSFS_TORCH_PREFIX, x->name ? x->name : "");
	if (!x->name || gmsfs_meta_get(g, key, &m)) {
		snprintf(why + k, whylen - k, "%s%s: the store has no such tensor", k ? "; " : "", x->name ? x->name : "(null)");
		return -ENOENT;
	}
	struct rf_entry t;
	int e = rf_parse(m.value, m.value_len, &t), isz = e ? 0 : rf_itemsize(t.dtype);
	uint64_t n = 1, want = 1;
	for (int i = 0; !e && i < t.ndim; i++)
		if (t.shape[i] < 0 || __builtin_mul_overflow(n, (uint64_t)t.shape[i], &n))
			e = -EINVAL;
	if (!e && (t.storage_offset < 0 || (uint64_t)t.storage_offset > m.size || n > m.size))
		e = -EINVAL;
	for (int i = t.ndim - 1; !e && i >= 0; i--) { /* contiguous: each stride the product of the dims after it */
		if (t.shape[i] != 1 && t.stride[i] != (int64_t)want)
			e = -EOPNOTSUPP;
		want *= (uint64_t)t.shape[i];
	}
	if (!e && !isz)
		e = -EINVAL;
	if (e)
		snprintf(why + k, whylen - k, "%s%s: the store's entry %s", k ? "; " : "", x->name,
			 e == -EOPNOTSUPP ? "is not contiguous (refit it from Python)" : "is not a tensor's (gmsfs/torch.h)");
	else if (x->ndim != t.ndim || (x->ndim && memcmp(x->shape, t.shape, (size_t)t.ndim * sizeof *t.shape)))
		e = -EINVAL, snprintf(why + k, whylen - k, "%ssize mismatch for %s: the store has shape %s, the source has shape %s",
				     k ? "; " : "", x->name, rf_shape(t.shape, t.ndim, a, sizeof a),
				     rf_shape(x->shape, x->ndim < 0 ? 0 : x->ndim, b, sizeof b));
	else if (!x->dtype || strcmp(x->dtype, t.dtype))
		e = -EINVAL, snprintf(why + k, whylen - k, "%sdtype mismatch for %s: the store has %s, the source has %s",
				     k ? "; " : "", x->name, t.dtype, x->dtype ? x->dtype : "(null)");
	else if ((uint64_t)t.storage_offset * (uint64_t)isz + n * (uint64_t)isz > m.size)
		e = -EINVAL, snprintf(why + k, whylen - k, "%s%s: the store's entry is shorter than its shape", k ? "; " : "",
				     x->name);
	*at = m.offset + (uint64_t)t.storage_offset * (uint64_t)isz;
	*bytes = n * (uint64_t)isz;
	*alloc = m.alloc, m.alloc = NULL;
	gmsfs_meta_free(&m);
	return e;
}

struct rf_span {
	uint64_t at, end;
};

static int rf_by_start(const void *a, const void *b)
{
	uint64_t x = ((const struct rf_span *)a)->at, y = ((const struct rf_span *)b)->at;
	return x < y ? -1 : x > y;
}

/* Does the refit write every byte of alloc (its tensors' ranges, at and bytes, together
 * span the allocation's size, as STORE/allocs says it)? */
static bool rf_whole(gmsfs *g, char *const *alloc, const uint64_t *at, const uint64_t *bytes, size_t n,
		     const char *name)
{
	char path[8192];
	struct stat sb;
	if (snprintf(path, sizeof path, "%s/allocs/%s", g->dir, name) >= (int)sizeof path || stat(path, &sb) ||
	    sb.st_size <= 0)
		return false;
	struct rf_span *s = calloc(n ? n : 1, sizeof *s);
	size_t k = 0;
	for (size_t i = 0; s && i < n; i++)
		if (bytes[i] && !strcmp(alloc[i], name))
			s[k++] = (struct rf_span){ at[i], at[i] + bytes[i] };
	if (s)
		qsort(s, k, sizeof *s, rf_by_start);
	uint64_t end = 0; /* what is written from 0 on, without a gap */
	for (size_t i = 0; s && i < k && s[i].at <= end; i++)
		end = s[i].end > end ? s[i].end : end;
	free(s);
	return end >= (uint64_t)sb.st_size;
}

/* The allocations the refit writes whole and has not mapped: imported in one request,
 * their next version (beside readers) made without a copy of the last commit's bytes. */
static int rf_import_whole(gmsfs *g, char *const *alloc, const uint64_t *at, const uint64_t *bytes, size_t n)
{
	const char **whole = calloc(n ? n : 1, sizeof *whole);
	size_t k = 0;
	if (!whole)
		return gm_error(g, -ENOMEM, "out of memory");
	struct gmsfs_mapping m;
	for (size_t i = 0; i < n; i++) {
		bool seen = false;
		for (size_t j = 0; j < k && !seen; j++)
			seen = !strcmp(whole[j], alloc[i]);
		if (!seen && gmsfs_find(g, alloc[i], &m) && rf_whole(g, alloc, at, bytes, n, alloc[i]))
			whole[k++] = alloc[i];
	}
	int e = k ? gmsfs_import_overwrite(g, whole, k) : 0;
	free(whole);
	return e;
}

int gmsfs_refit(gmsfs *g, const struct gmsfs_tensor *v, size_t n)
{
	if (!g || (n && !v))
		return g ? gm_error(g, -EINVAL, "refit: no tensors") : -EINVAL;
	int e = gm_need_lock(g, GMSFS_RW);
	if (e)
		return e;
	char **alloc = calloc(n ? n : 1, sizeof *alloc), why[sizeof g->err - 64] = "";
	uint64_t *at = calloc(n ? n : 1, sizeof *at), *bytes = calloc(n ? n : 1, sizeof *bytes);
	if (!alloc || !at || !bytes)
		e = gm_error(g, -ENOMEM, "out of memory");
	int bad = 0, first = 0;
	for (size_t i = 0; !e && i < n; i++) { /* every one checked, each difference said */
		int r = rf_check(g, &v[i], &alloc[i], &at[i], &bytes[i], why, sizeof why);
		if (r && !bad++)
			first = r;
	}
	if (!e && bad)
		e = gm_error(g, first, "refit %s: %d tensor(s) do not match, nothing was written: %s", g->dir, bad, why);
	/* Then the bytes: each allocation imported writable where it is not mapped (beside
	 * the readers, that makes its copy), or made writable where a resume kept it
	 * read-only (while the copies queued before run), the tensors copied, the copies done. */
	if (!e)
		e = rf_import_whole(g, alloc, at, bytes, n);
	for (size_t i = 0; !e && i < n; i++) {
		struct gmsfs_mapping m;
		void *p;
		if (gmsfs_find(g, alloc[i], &m) && (e = gmsfs_import(g, alloc[i], &p)))
			break;
		if ((e = gmsfs_find(g, alloc[i], &m)) || !bytes[i])
			continue;
		if (!m.writable && (e = gmsfs_protect(g, alloc[i], 1)))
			break;
		if ((e = g->be->copy(g, (char *)m.ptr + at[i], v[i].data, bytes[i])))
			gm_error(g, e, "refit: copying %s: %s", v[i].name, strerror(-e));
	}
	if (!e && g->be->drain && (e = g->be->drain(g)))
		gm_error(g, e, "refit: waiting for the copies: %s", strerror(-e));
	for (size_t i = 0; alloc && i < n; i++)
		free(alloc[i]);
	free(alloc);
	free(at);
	free(bytes);
	return e;
}
