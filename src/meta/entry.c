/* entry: a metadata entry's attributes (the xattrs alloc, offset, size, private) and
 * its value (the file's bytes).  Every change is saved for rollback first (meta_save). */
#include "meta.h"
#include "node.h"
#include "undo.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

int meta_entry_set_alloc(struct meta_node *n, const char *path, size_t len)
{
	if (n->kind != META_ENTRY)
		return -EINVAL;
	if (!gmsfs_path_valid(path, len))
		return -EINVAL;
	int e = meta_save(n);
	return e ? e : meta_set_str(n, path, len);
}

/* Decimal digits only, no sign, no spaces, fits 64 bits. */
static int parse_decimal(const char *text, size_t len, uint64_t *out)
{
	if (!len || len > 20)
		return -EINVAL;
	uint64_t v = 0;
	for (size_t i = 0; i < len; i++) {
		if (text[i] < '0' || text[i] > '9')
			return -EINVAL;
		unsigned d = text[i] - '0';
		if (v > (UINT64_MAX - d) / 10)
			return -EINVAL;
		v = v * 10 + d;
	}
	*out = v;
	return 0;
}

/* A decimal field of an entry (offset, extent): checked, saved for rollback, set. */
static int set_number(struct meta_node *n, uint64_t *field, const char *text, size_t len)
{
	uint64_t v;
	if (n->kind != META_ENTRY || parse_decimal(text, len, &v))
		return -EINVAL;
	int e = meta_save(n);
	if (!e)
		*field = v;
	return e;
}

int meta_entry_set_offset(struct meta_node *n, const char *text, size_t len)
{
	return set_number(n, &n->offset, text, len);
}

int meta_entry_set_extent(struct meta_node *n, const char *text, size_t len)
{
	return set_number(n, &n->extent, text, len);
}

int meta_entry_set_flag(struct meta_node *n, uint32_t flag, const char *text, size_t len)
{
	if (n->kind != META_ENTRY || len != 1 || (text[0] != '0' && text[0] != '1'))
		return -EINVAL;
	int e = meta_save(n);
	if (e)
		return e;
	n->flags = text[0] == '1' ? n->flags | flag : n->flags & ~flag;
	return 0;
}

int meta_entry_unset(struct meta_node *n, enum meta_entry_attr what)
{
	if (n->kind != META_ENTRY)
		return -EINVAL;
	int e = meta_save(n);
	if (e)
		return e;
	switch (what) {
	case META_ATTR_ALLOC:
		meta_put_ref(&n->alloc, NULL);
		break;
	case META_ATTR_OFFSET:
		n->offset = 0;
		break;
	case META_ATTR_EXTENT:
		n->extent = 0;
		break;
	case META_ATTR_PRIVATE:
		n->flags &= ~GMSFS_ENTRY_PRIVATE;
		break;
	case META_ATTR_NOTE:
		n->flags &= ~GMSFS_ENTRY_NOTE;
		break;
	}
	return 0;
}

int meta_entry_write(struct meta_node *n, uint64_t off, const void *data, size_t len)
{
	if (n->kind != META_ENTRY)
		return -EINVAL;
	if (off > GMSFS_VALUE_MAX || len > GMSFS_VALUE_MAX - off)
		return -EFBIG;
	int e = meta_save(n);
	if (e)
		return e;
	size_t end = off + len, have = n->value_len;
	bool shared = n->marks & META_SHARED_VALUE;
	if (end > have || shared) {
		/* Grow, or copy what the undo log shares before changing it. */
		size_t want = end > have ? end : have;
		char *v = shared ? malloc(want ? want : 1) : realloc(n->value, want ? want : 1);
		if (!v)
			return -ENOMEM;
		if (shared && have)
			memcpy(v, n->value, have);
		memset(v + have, 0, want - have);
		n->marks &= ~META_SHARED_VALUE;
		n->value = v;
		n->value_len = (uint32_t)want;
	}
	memcpy(n->value + off, data, len);
	meta_changed(n);
	return 0;
}

int meta_entry_truncate(struct meta_node *n, uint64_t len)
{
	if (n->kind != META_ENTRY)
		return -EINVAL;
	if (len > GMSFS_VALUE_MAX)
		return -EFBIG;
	if (len > n->value_len)
		return meta_entry_write(n, len, "", 0);
	int e = meta_save(n);
	if (e)
		return e;
	n->value_len = (uint32_t)len;
	meta_changed(n);
	return 0;
}
