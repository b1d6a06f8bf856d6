/* json: see json.h.  Recursive descent with a depth limit; every length is checked
 * against the bytes left before anything is allocated. */
#include "json.h"
#include "why.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define JS_MAX_DEPTH 64

struct js_in {
	const char *p, *end, *start;
	char *err;
	size_t errlen;
};

static int fail(struct js_in *in, const char *what)
{
	snprintf(in->err, in->errlen, "JSON: %s at byte %zu", what, (size_t)(in->p - in->start));
	return -EINVAL;
}

static void skip_ws(struct js_in *in)
{
	while (in->p < in->end && (*in->p == ' ' || *in->p == '\t' || *in->p == '\n' || *in->p == '\r'))
		in->p++;
}

static int hex4(struct js_in *in, unsigned *out)
{
	if (in->end - in->p < 4)
		return fail(in, "short \\u escape");
	*out = 0;
	for (int i = 0; i < 4; i++) {
		char c = *in->p++;
		unsigned d = c >= '0' && c <= '9' ? (unsigned)(c - '0') : c >= 'a' && c <= 'f' ? (unsigned)(c - 'a' + 10) :
			     c >= 'A' && c <= 'F' ? (unsigned)(c - 'A' + 10) : 16;
		if (d == 16)
			return fail(in, "bad \\u escape");
		*out = *out << 4 | d;
	}
	return 0;
}

static size_t utf8(unsigned cp, char *o)
{
	if (cp < 0x80)
		return o[0] = (char)cp, 1;
	if (cp < 0x800)
		return o[0] = (char)(0xc0 | cp >> 6), o[1] = (char)(0x80 | (cp & 0x3f)), 2;
	if (cp < 0x10000)
		return o[0] = (char)(0xe0 | cp >> 12), o[1] = (char)(0x80 | (cp >> 6 & 0x3f)),
		       o[2] = (char)(0x80 | (cp & 0x3f)), 3;
	return o[0] = (char)(0xf0 | cp >> 18), o[1] = (char)(0x80 | (cp >> 12 & 0x3f)),
	       o[2] = (char)(0x80 | (cp >> 6 & 0x3f)), o[3] = (char)(0x80 | (cp & 0x3f)), 4;
}

/* A string at in->p (after its opening quote); the decoded text is never longer. */
static int string(struct js_in *in, char **out)
{
	const char *q = in->p;
	while (q < in->end && *q != '"')
		q += *q == '\\' ? 2 : 1;
	if (q >= in->end)
		return fail(in, "unterminated string");
	char *s = malloc((size_t)(q - in->p) + 1), *o = s;
	if (!s)
		return -ENOMEM;
	while (*in->p != '"') {
		unsigned char c = (unsigned char)*in->p++;
		if (c < 0x20) {
			free(s);
			return fail(in, "control character in a string");
		}
		if (c != '\\') {
			*o++ = (char)c;
			continue;
		}
		char e = *in->p++;
		unsigned cp, lo;
		int r = 0;
		switch (e) {
		case '"': case '\\': case '/': *o++ = e; break;
		case 'b': *o++ = '\b'; break;
		case 'f': *o++ = '\f'; break;
		case 'n': *o++ = '\n'; break;
		case 'r': *o++ = '\r'; break;
		case 't': *o++ = '\t'; break;
		case 'u':
			if ((r = hex4(in, &cp)))
				break;
			if (cp >= 0xd800 && cp < 0xdc00) { /* a surrogate pair */
				if (in->end - in->p < 6 || in->p[0] != '\\' || in->p[1] != 'u') {
					r = fail(in, "lone surrogate");
					break;
				}
				in->p += 2;
				if ((r = hex4(in, &lo)))
					break;
				if (lo < 0xdc00 || lo >= 0xe000) {
					r = fail(in, "bad surrogate pair");
					break;
				}
				cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
			} else if (cp >= 0xdc00 && cp < 0xe000) {
				r = fail(in, "lone surrogate");
				break;
			}
			if (!cp) {
				r = fail(in, "NUL in a string");
				break;
			}
			o += utf8(cp, o);
			break;
		default:
			r = fail(in, "bad escape");
		}
		if (r) {
			free(s);
			return r;
		}
	}
	in->p++;
	*o = '\0';
	*out = s;
	return 0;
}

static int value(struct js_in *in, struct js_value *v, int depth);

static int members(struct js_in *in, struct js_value *v, int depth, bool object)
{
	char close = object ? '}' : ']';
	size_t cap = 0;
	skip_ws(in);
	if (in->p < in->end && *in->p == close) {
		in->p++;
		return 0;
	}
	for (;;) {
		if (v->n == cap) {
			cap = cap ? 2 * cap : 8;
			struct js_value *nv = realloc(v->v, cap * sizeof *nv);
			char **nk = object ? realloc(v->keys, cap * sizeof *nk) : NULL;
			if (nv)
				v->v = nv;
			if (nk)
				v->keys = nk;
			if (!nv || (object && !nk))
				return -ENOMEM;
		}
		v->v[v->n] = (struct js_value){0};
		if (object) {
			skip_ws(in);
			if (in->p >= in->end || *in->p != '"')
				return fail(in, "expected a member name");
			in->p++;
			int e = string(in, &v->keys[v->n]);
			if (e)
				return e;
			skip_ws(in);
			if (in->p >= in->end || *in->p != ':') {
				free(v->keys[v->n]);
				return fail(in, "expected ':'");
			}
			in->p++;
		}
		int e = value(in, &v->v[v->n], depth + 1);
		v->n++; /* freed by js_free, whole or not */
		if (e)
			return e;
		skip_ws(in);
		if (in->p < in->end && *in->p == ',') {
			in->p++;
			continue;
		}
		if (in->p < in->end && *in->p == close) {
			in->p++;
			return 0;
		}
		return fail(in, object ? "expected ',' or '}'" : "expected ',' or ']'");
	}
}

static int number(struct js_in *in, struct js_value *v)
{
	const char *q = in->p;
	bool neg = q < in->end && *q == '-';
	q += neg;
	if (q >= in->end || *q < '0' || *q > '9' || (*q == '0' && q + 1 < in->end && q[1] >= '0' && q[1] <= '9'))
		return fail(in, "bad number");
	uint64_t u = 0;
	bool fits = !neg;
	for (; q < in->end && *q >= '0' && *q <= '9'; q++) {
		unsigned d = (unsigned)(*q - '0');
		if (u > (UINT64_MAX - d) / 10)
			fits = false;
		u = u * 10 + d;
	}
	if (q < in->end && (*q == '.' || *q == 'e' || *q == 'E')) {
		fits = false;
		if (*q == '.' && (++q >= in->end || *q < '0' || *q > '9'))
			return fail(in, "bad number");
		while (q < in->end && *q >= '0' && *q <= '9')
			q++;
		if (q < in->end && (*q == 'e' || *q == 'E')) {
			q++;
			if (q < in->end && (*q == '+' || *q == '-'))
				q++;
			if (q >= in->end || *q < '0' || *q > '9')
				return fail(in, "bad exponent");
			while (q < in->end && *q >= '0' && *q <= '9')
				q++;
		}
	}
	v->kind = JS_NUMBER;
	v->is_uint = fits;
	v->u = fits ? u : 0;
	in->p = q;
	return 0;
}

static int word(struct js_in *in, const char *w, struct js_value *v, enum js_kind k, bool b)
{
	size_t n = strlen(w);
	if ((size_t)(in->end - in->p) < n || memcmp(in->p, w, n))
		return fail(in, "unexpected character");
	in->p += n;
	v->kind = k;
	v->u = b;
	return 0;
}

static int value(struct js_in *in, struct js_value *v, int depth)
{
	if (depth > JS_MAX_DEPTH)
		return fail(in, "nested too deep");
	skip_ws(in);
	if (in->p >= in->end)
		return fail(in, "unexpected end");
	switch (*in->p) {
	case '{':
		in->p++;
		v->kind = JS_OBJECT;
		return members(in, v, depth, true);
	case '[':
		in->p++;
		v->kind = JS_ARRAY;
		return members(in, v, depth, false);
	case '"':
		in->p++;
		v->kind = JS_STRING;
		return string(in, &v->s);
	case 't': return word(in, "true", v, JS_BOOL, true);
	case 'f': return word(in, "false", v, JS_BOOL, false);
	case 'n': return word(in, "null", v, JS_NULL, false);
	default: return number(in, v);
	}
}

int js_parse(const char *text, size_t len, struct js_value *out, char *err, size_t errlen)
{
	struct js_in in = { text, text + len, text, err, errlen };
	*out = (struct js_value){0};
	int e = value(&in, out, 0);
	if (!e) {
		skip_ws(&in);
		if (in.p != in.end)
			e = fail(&in, "text after the document");
	}
	if (e) {
		if (e == -ENOMEM)
			snprintf(err, errlen, "JSON: out of memory");
		js_free(out);
	}
	return e;
}

void js_free(struct js_value *v)
{
	if (!v)
		return;
	for (size_t i = 0; i < v->n; i++) {
		js_free(&v->v[i]);
		if (v->keys)
			free(v->keys[i]);
	}
	free(v->v);
	free(v->keys);
	free(v->s);
	*v = (struct js_value){0};
}

const struct js_value *js_get(const struct js_value *obj, const char *key)
{
	if (!obj || obj->kind != JS_OBJECT)
		return NULL;
	for (size_t i = 0; i < obj->n; i++)
		if (!strcmp(obj->keys[i], key))
			return &obj->v[i];
	return NULL;
}

void js_write_str(FILE *f, const char *s)
{
	fputc('"', f);
	for (; *s; s++)
		if (*s == '"' || *s == '\\')
			fprintf(f, "\\%c", *s);
		else if ((unsigned char)*s < 0x20)
			fprintf(f, "\\u%04x", *s);
		else
			fputc(*s, f);
	fputc('"', f);
}

int js_read_file(const char *path, struct js_value *out, char *err, size_t errlen)
{
	struct stat st;
	int fd = why_open_read(path, &st, err, errlen);
	if (fd < 0)
		return fd;
	size_t len = (size_t)st.st_size;
	char *text = malloc(len ? len : 1);
	int e = text && pread(fd, text, len, 0) == (ssize_t)len ? 0 : -EIO;
	close(fd);
	if (e)
		snprintf(err, errlen, "%s: could not read it", path);
	char why[512];
	if (!e && js_parse(text, len, out, why, sizeof why)) {
		snprintf(err, errlen, "%s: %s", path, why);
		e = -EINVAL;
	}
	free(text);
	return e;
}
