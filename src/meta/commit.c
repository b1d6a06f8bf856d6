/* commit: validate, hash, and forget what a rollback would have undone (undo.c). */
#include "meta.h"
#include "meta_internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int validate_entry(struct meta_node *n, void *arg)
{
	struct meta_check *c = arg;
	char key[GMSFS_PATH_MAX + 1] = "?";
	if (n->kind == META_ALLOC && !n->size) {
		meta_path(n, key, sizeof key);
		snprintf(c->err, c->errlen, "allocs/%s: never sized (ftruncate it)", key);
		return -EINVAL;
	}
	if (n->kind != META_ENTRY)
		return 0;
	meta_path(n, key, sizeof key);
	if (!n->alloc) {
		snprintf(c->err, c->errlen, "meta/%s: no user.gms.alloc", key);
		return -EINVAL;
	}
	struct meta_node *a = meta_resolve(c->store, META_AREA_ALLOCS, n->alloc);
	if (!a || a->kind != META_ALLOC) {
		snprintf(c->err, c->errlen, "meta/%s: allocation '%s' does not exist", key, n->alloc);
		return -EINVAL;
	}
	if (n->offset >= a->size) {
		snprintf(c->err, c->errlen, "meta/%s: offset %llu is past the end of '%s' (size %llu)", key,
			 (unsigned long long)n->offset, n->alloc, (unsigned long long)a->size);
		return -EINVAL;
	}
	if (n->extent > a->size - n->offset) {
		snprintf(c->err, c->errlen, "meta/%s: offset %llu + size %llu passes the end of '%s' (size %llu)", key,
			 (unsigned long long)n->offset, (unsigned long long)n->extent, n->alloc,
			 (unsigned long long)a->size);
		return -EINVAL;
	}
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
	uint8_t digest[16];
	int e = meta_layout_hash(s, digest);
	if (e)
		return e;

	meta_undo_forget(s, true);
	memcpy(s->hash, digest, sizeof s->hash);
	for (int i = 0; i < 16; i++)
		sprintf(s->hash_hex + 2 * i, "%02x", digest[i]);
	s->committed = true;
	return 0;
}
