/* commit: validate, hash, and forget what a rollback would have undone (undo.c). */
#include "meta.h"
#include "node.h"
#include "undo.h"
#include "hash.h"
#include "why.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* -EINVAL, and why in c->err: "AREA/PATH: " and the rest.  The path is built only here,
 * not for every node that passes. */
static int refuse(struct meta_check *c, struct meta_node *n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int refuse(struct meta_check *c, struct meta_node *n, const char *fmt, ...)
{
	char key[GMSFS_PATH_MAX + 1] = "?", why[512];
	meta_path(n, key, sizeof key);
	va_list ap;
	va_start(ap, fmt);
	why_vfmt(why, sizeof why, 0, fmt, ap);
	va_end(ap);
	snprintf(c->err, c->errlen, "%s/%s: %s", n->kind == META_ALLOC ? "allocs" : "meta", key, why);
	return -EINVAL;
}

static int validate_entry(struct meta_node *n, void *arg)
{
	struct meta_check *c = arg;
	if (n->kind == META_ALLOC && !n->size)
		return refuse(c, n, "never sized (ftruncate it)");
	if (n->kind != META_ENTRY)
		return 0;
	if (!n->alloc)
		return refuse(c, n, "no user.gms.alloc");
	struct meta_node *a = meta_resolve(c->store, META_AREA_ALLOCS, n->alloc);
	if (!a || a->kind != META_ALLOC)
		return refuse(c, n, "allocation '%s' does not exist", n->alloc);
	if (n->offset >= a->size)
		return refuse(c, n, "offset %llu is past the end of '%s' (size %llu)", (unsigned long long)n->offset,
			      n->alloc, (unsigned long long)a->size);
	if (n->extent > a->size - n->offset)
		return refuse(c, n, "offset %llu + size %llu passes the end of '%s' (size %llu)",
			      (unsigned long long)n->offset, (unsigned long long)n->extent, n->alloc,
			      (unsigned long long)a->size);
	return 0;
}

int meta_commit(struct meta_store *s, char *err, size_t errlen)
{
	struct meta_check c = { .store = s, .err = err, .errlen = errlen };
	if (errlen)
		err[0] = '\0';
	for (int a = 0; a < 2; a++) {
		int e = meta_walk(s->root[a], validate_entry, &c);
		if (e)
			return e;
	}
	uint8_t digest[GMSFS_HASH_LEN];
	int e = meta_layout_hash(s, digest);
	if (e)
		return e;

	meta_undo_forget(s, true);
	memcpy(s->hash, digest, sizeof s->hash);
	hex_of(digest, GMSFS_HASH_LEN, s->hash_hex);
	s->committed = true;
	return 0;
}
