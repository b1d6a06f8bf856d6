/* store: a store's life and the changes to its tree that a rollback undoes (each logged
 * in undo.c before it is made).  Commit is in commit.c, the hash in layout_hash.c. */
#include "node.h"
#include "undo.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

struct meta_store *meta_store_new(void (*release_buf)(void *buf, void *ctx), void *ctx)
{
	struct meta_store *s = calloc(1, sizeof *s);
	if (!s)
		return NULL;
	s->release_buf = release_buf;
	s->release_ctx = ctx;
	s->root[META_AREA_ALLOCS] = meta_node_new(s, META_DIR, META_AREA_ALLOCS, "allocs");
	s->root[META_AREA_META] = meta_node_new(s, META_DIR, META_AREA_META, "meta");
	if (!s->root[0] || !s->root[1]) {
		meta_store_free(s);
		return NULL;
	}
	for (int a = 0; a < 2; a++) {
		s->root[a]->linked = true;
		s->root[a]->holds = 1;
	}
	return s;
}

void meta_store_free(struct meta_store *s)
{
	if (!s)
		return;
	meta_undo_forget(s, false); /* first: its records name nodes the tree may free */
	struct meta_nodes v = {0};
	if (s->root[0] && s->root[1] && meta_unlink_all(s, &v) == 0)
		for (size_t i = 0; i < v.n; i++)
			meta_unhold(v.v[i]);
	free(v.v);
	for (int a = 0; a < 2; a++)
		if (s->root[a]) {
			s->root[a]->linked = false;
			meta_unhold(s->root[a]);
		}
	meta_strtab_free(&s->strs);
	free(s);
}

int meta_create(struct meta_node *dir, const char *name, enum meta_kind kind, struct meta_node **out)
{
	if (dir->kind != META_DIR)
		return -ENOTDIR;
	if (!dir->linked || !dir->store)
		return -ENOENT;
	if (strlen(name) > 255)
		return -ENAMETOOLONG;
	if (!meta_name_valid(name))
		return -EINVAL;
	if (kind == META_ALLOC && dir->area != META_AREA_ALLOCS)
		return -EPERM;
	if (kind == META_ENTRY && dir->area != META_AREA_META)
		return -EPERM;
	if (meta_lookup(dir, name))
		return -EEXIST;
	struct meta_node *n = meta_node_new(dir->store, kind, dir->area, name);
	if (!n)
		return -ENOMEM;
	n->marks = META_NEW;
	int e = kind == META_ALLOC && !(n->tag = meta_intern(meta_strs(dir->store), "default", 7)) ? -ENOMEM : meta_undo_grew(dir);
	if (e || (e = meta_link(dir, n))) {
		meta_node_free(n);
		return e;
	}
	dir->mtime_ns = n->mtime_ns;
	if (out)
		*out = n;
	return 0;
}

int meta_remove(struct meta_node *n)
{
	if (!n->parent)
		return -EBUSY; /* an area's root */
	if (!n->linked)
		return -ENOENT;
	if (n->kind == META_DIR && n->nkids)
		return -ENOTEMPTY;
	struct meta_node *dir = n->parent;
	int e = meta_undo_removed(n);
	if (e)
		return e;
	meta_unlink(n);
	meta_touch(dir);
	if (n->marks & META_NEW)
		meta_unhold(n); /* else the undo record keeps the tree's hold */
	return 0;
}

int meta_alloc_size(struct meta_node *n, uint64_t size, uint64_t aligned, void *buf)
{
	if (n->kind != META_ALLOC)
		return -EINVAL;
	if (n->size)
		return -EPERM; /* sized once */
	if (!size || aligned < size)
		return -EINVAL;
	n->size = size;
	n->aligned = aligned;
	n->buf = buf;
	if (n->linked && n->store) {
		n->store->stats.bytes += size;
		n->store->stats.aligned_bytes += aligned;
	}
	meta_changed(n);
	return 0;
}

int meta_set_tag(struct meta_node *n, const char *tag, size_t len)
{
	if (n->kind != META_ALLOC || !gmsfs_tag_valid(tag, len))
		return -EINVAL;
	int e = meta_save(n);
	return e ? e : meta_set_str(n, tag, len);
}
