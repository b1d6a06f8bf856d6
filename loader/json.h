/* json: a small strict JSON reader, enough for safetensors headers and their index
 * files: objects, arrays, strings (escapes and \u included), non-negative integers,
 * other numbers, true, false, null.  A document becomes a tree of js_value; errors say
 * where (byte offset) and what. */
#ifndef GMSFS_LOADER_JSON_H
#define GMSFS_LOADER_JSON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

enum js_kind { JS_NULL, JS_BOOL, JS_NUMBER, JS_STRING, JS_ARRAY, JS_OBJECT };

struct js_value {
	enum js_kind kind;
	bool is_uint;              /* JS_NUMBER: a non-negative integer that fits 64 bits */
	uint64_t u;                /* its value */
	char *s;                   /* JS_STRING: UTF-8, NUL-terminated (no NUL inside: refused) */
	size_t n;                  /* JS_ARRAY, JS_OBJECT: members */
	char **keys;               /* JS_OBJECT: member names */
	struct js_value *v;        /* members */
};

/* Parse len bytes; *out is the caller's (js_free).  -EINVAL with err set on bad input. */
int js_parse(const char *text, size_t len, struct js_value *out, char *err, size_t errlen);
void js_free(struct js_value *v);
/* The file at path, parsed (js_parse); -errno with err naming the file. */
int js_read_file(const char *path, struct js_value *out, char *err, size_t errlen);
/* The member named key of an object, or NULL. */
const struct js_value *js_get(const struct js_value *obj, const char *key);
/* s as a JSON string (quotes, backslashes and control characters escaped) on f. */
void js_write_str(FILE *f, const char *s);

#endif
