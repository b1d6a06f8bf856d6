/* wire_req: requests (wire.h): the header, and the bodies the client packs and the
 * daemon parses. */
#include "wire_msgpack.h"
#include "version_name.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* ---- requests ---- */

void wire_req_init(struct gmsfs_sock_req *r, enum gmsfs_op op, const uint8_t ticket[GMSFS_TICKET_LEN], uint32_t flags,
		   uint32_t body_len)
{
	memset(r, 0, sizeof *r);
	r->magic = GMSFS_SOCK_MAGIC;
	r->version = GMSFS_SOCK_VERSION;
	r->op = (uint16_t)op;
	if (ticket)
		memcpy(r->ticket, ticket, sizeof r->ticket);
	r->flags = flags;
	r->body_len = body_len;
}

int wire_req_parse(const void *buf, size_t len, struct gmsfs_sock_req *out, char *why, size_t whylen)
{
	if (len < sizeof *out)
		return why_fmt(why, whylen, -EINVAL, "request of %zu bytes, shorter than its %zu-byte header", len,
			    sizeof *out);
	memcpy(out, buf, sizeof *out);
	if (out->magic != GMSFS_SOCK_MAGIC || out->version != GMSFS_SOCK_VERSION)
		return why_fmt(why, whylen, -EINVAL, "bad magic or version (this daemon speaks version %d)",
			    GMSFS_SOCK_VERSION);
	if (out->op < GMSFS_OP_REDEEM || out->op > GMSFS_OP_MAX)
		return why_fmt(why, whylen, -EINVAL, "unknown op %u", (unsigned)out->op);
	if (out->flags & ~GMSFS_REQ_MORE)
		return why_fmt(why, whylen, -EINVAL, "unknown flags 0x%x", (unsigned)out->flags);
	if (out->body_len != len - sizeof *out)
		return why_fmt(why, whylen, -EINVAL, "body of %zu bytes, the header says %u", len - sizeof *out,
			    (unsigned)out->body_len);
	bool ticketed = out->op == GMSFS_OP_REDEEM || out->op == GMSFS_OP_BIND;
	uint8_t any = 0;
	for (int i = 0; i < GMSFS_TICKET_LEN; i++)
		any |= out->ticket[i];
	if (!ticketed && any)
		return why_fmt(why, whylen, -EINVAL, "a ticket on op %u, which takes none", (unsigned)out->op);
	bool bodied = wire_op_has_body(out->op);
	if (!bodied && (out->body_len || (out->flags & GMSFS_REQ_MORE)))
		return why_fmt(why, whylen, -EINVAL, "a body on op %u, which takes none", (unsigned)out->op);
	return 0;
}

bool wire_op_has_body(unsigned op)
{
	return (op >= GMSFS_OP_EXPORT && op <= GMSFS_OP_META_DELETE) || op == GMSFS_OP_COMMIT_NAMED ||
	       op == GMSFS_OP_COMMIT_LEAVE;
}

static void names_free(char **v, size_t n)
{
	for (size_t i = 0; i < n; i++)
		free(v[i]);
	free(v);
}

void wire_body_free(struct wire_body *b)
{
	for (size_t i = 0; i < b->nallocs; i++) {
		free(b->allocs[i].path);
		free(b->allocs[i].tag);
	}
	free(b->allocs);
	entry_recs_clear(b->entries, b->nentries);
	free(b->entries);
	names_free(b->names, b->nnames);
	free(b->version);
	memset(b, 0, sizeof *b);
}

/* An array of 1.. valid paths (keys are paths below meta/). */
static int parse_names(const msgpack_object *o, struct wire_body *b)
{
	if (o->type != MSGPACK_OBJECT_ARRAY || !o->via.array.size)
		return -1;
	b->names = calloc(o->via.array.size, sizeof *b->names);
	if (!b->names)
		return -1;
	for (uint32_t i = 0; i < o->via.array.size; i++) {
		if (!(b->names[i] = wire_get_path(&o->via.array.ptr[i])))
			return -1;
		b->nnames++;
	}
	b->has_names = true;
	return 0;
}

static int parse_create_item(const msgpack_object *o, struct wire_alloc *a)
{
	if (o->type != MSGPACK_OBJECT_MAP)
		return -1;
	unsigned seen = 0;
	for (uint32_t i = 0; i < o->via.map.size; i++) {
		const msgpack_object *k = &o->via.map.ptr[i].key, *v = &o->via.map.ptr[i].val;
		if (wire_key_is(k, GMSFS_K_PATH)) {
			if (SEEN(0) || !(a->path = wire_get_path(v)))
				return -1;
		} else if (wire_key_is(k, GMSFS_K_SIZE)) {
			if (SEEN(1) || wire_get_u64(v, &a->size) || !a->size)
				return -1;
		} else if (wire_key_is(k, GMSFS_K_TAG)) {
			if (SEEN(2) || !(a->tag = wire_get_tag(v)))
				return -1;
		} else {
			return -1;
		}
	}
	return (seen & 3) == 3 ? 0 : -1;
}

/* COMMIT_NAMED's name: a valid version name (no NUL, no room for one in a path). */
static int parse_version(const msgpack_object *v, struct wire_body *b)
{
	if (v->type != MSGPACK_OBJECT_STR || !gmsfs_version_name_valid(v->via.str.ptr, v->via.str.size))
		return -1;
	return (b->version = strndup(v->via.str.ptr, v->via.str.size)) ? 0 : -1;
}

int wire_parse_body(enum gmsfs_op op, const void *buf, size_t len, struct wire_body *b, char *why, size_t whylen)
{
	memset(b, 0, sizeof *b);
	if (!wire_op_has_body(op))
		return len ? why_fmt(why, whylen, -EINVAL, "op %d takes no body", (int)op) : 0;
	msgpack_unpacked u;
	msgpack_unpacked_init(&u);
	const char *bad = "not one msgpack map";
	int e = -EINVAL;
	if (wire_unpack_map(buf, len, &u))
		goto out;
	const msgpack_object_map *map = &u.data.via.map;
	unsigned seen = 0;
	b->fds = b->meta = true;
	for (uint32_t i = 0; i < map->size; i++) {
		const msgpack_object *k = &map->ptr[i].key, *v = &map->ptr[i].val;
		if (op == GMSFS_OP_CREATE && wire_key_is(k, GMSFS_K_ALLOCS)) {
			bad = "bad allocation (path, size >= 1, tag)";
			if (SEEN(0) || v->type != MSGPACK_OBJECT_ARRAY || !v->via.array.size ||
			    !(b->allocs = calloc(v->via.array.size, sizeof *b->allocs)))
				goto out;
			for (uint32_t j = 0; j < v->via.array.size; j++, b->nallocs++)
				if (parse_create_item(&v->via.array.ptr[j], &b->allocs[j])) {
					b->nallocs++; /* free what it parsed */
					goto out;
				}
		} else if (op == GMSFS_OP_META_PUT && wire_key_is(k, GMSFS_K_ENTRIES)) {
			bad = "bad entry (key, alloc, offset, size, flags, value)";
			if (SEEN(0) || v->type != MSGPACK_OBJECT_ARRAY || !v->via.array.size ||
			    !(b->entries = calloc(v->via.array.size, sizeof *b->entries)))
				goto out;
			for (uint32_t j = 0; j < v->via.array.size; j++, b->nentries++)
				if (wire_parse_entry(&v->via.array.ptr[j], &b->entries[j])) {
					b->nentries++;
					goto out;
				}
		} else if ((op == GMSFS_OP_FREE || op == GMSFS_OP_EXPORT) && wire_key_is(k, GMSFS_K_PATHS)) {
			bad = "bad list of paths";
			if (SEEN(0) || parse_names(v, b))
				goto out;
		} else if (op == GMSFS_OP_META_DELETE && wire_key_is(k, GMSFS_K_KEYS)) {
			bad = "bad list of keys";
			if (SEEN(0) || parse_names(v, b))
				goto out;
		} else if (op == GMSFS_OP_EXPORT && wire_key_is(k, GMSFS_K_FDS)) {
			bad = "bad fds flag";
			if (SEEN(1) || wire_get_bool(v, &b->fds))
				goto out;
		} else if (op == GMSFS_OP_EXPORT && wire_key_is(k, GMSFS_K_WANT_META)) {
			bad = "bad withmeta flag";
			if (SEEN(2) || wire_get_bool(v, &b->meta))
				goto out;
		} else if (op == GMSFS_OP_EXPORT && wire_key_is(k, GMSFS_K_IN_PLACE)) {
			bad = "bad inplace flag";
			if (SEEN(3) || wire_get_bool(v, &b->in_place))
				goto out;
		} else if (op == GMSFS_OP_EXPORT && wire_key_is(k, GMSFS_K_OVERWRITE)) {
			bad = "bad overwrite flag";
			if (SEEN(4) || wire_get_bool(v, &b->overwrite))
				goto out;
		} else if ((op == GMSFS_OP_COMMIT_NAMED || op == GMSFS_OP_COMMIT_LEAVE) && wire_key_is(k, GMSFS_K_NAME)) {
			bad = "bad version: a name is " GMSFS_VERSION_NAME_WORDS;
			if (SEEN(0) || parse_version(v, b))
				goto out;
		} else {
			bad = "unknown or repeated field";
			goto out;
		}
	}
	bad = "a required field is missing";
	if (op != GMSFS_OP_EXPORT && op != GMSFS_OP_COMMIT_LEAVE && !(seen & 1)) /* LEAVE's name: optional */
		goto out;
	e = 0;
out:
	msgpack_unpacked_destroy(&u);
	if (e) {
		wire_body_free(b);
		why_fmt(why, whylen, e, "%s", bad);
	}
	return e;
}

int wire_pack_create(msgpack_sbuffer *sb, const struct wire_alloc *v, size_t n)
{
	struct wire_packer p;
	wire_packer_init(&p, sb);
	msgpack_pack_map(&p.pk, 1);
	wire_pack_str(&p.pk, GMSFS_K_ALLOCS);
	msgpack_pack_array(&p.pk, n);
	for (size_t i = 0; i < n; i++) {
		msgpack_pack_map(&p.pk, v[i].tag ? 3 : 2);
		wire_pack_str(&p.pk, GMSFS_K_PATH), wire_pack_str(&p.pk, v[i].path);
		wire_pack_str(&p.pk, GMSFS_K_SIZE), msgpack_pack_uint64(&p.pk, v[i].size);
		if (v[i].tag)
			wire_pack_str(&p.pk, GMSFS_K_TAG), wire_pack_str(&p.pk, v[i].tag);
	}
	return p.err;
}

int wire_pack_entries(msgpack_sbuffer *sb, const struct entry_rec *v, size_t n)
{
	struct wire_packer p;
	wire_packer_init(&p, sb);
	msgpack_pack_map(&p.pk, 1);
	wire_pack_str(&p.pk, GMSFS_K_ENTRIES);
	msgpack_pack_array(&p.pk, n);
	for (size_t i = 0; i < n; i++)
		wire_pack_entry(&p.pk, &v[i]);
	return p.err;
}

int wire_pack_names(msgpack_sbuffer *sb, const char *key, const char *const *names, size_t n)
{
	struct wire_packer p;
	wire_packer_init(&p, sb);
	msgpack_pack_map(&p.pk, 1);
	wire_pack_str(&p.pk, key);
	msgpack_pack_array(&p.pk, n);
	for (size_t i = 0; i < n; i++)
		wire_pack_str(&p.pk, names[i]);
	return p.err;
}

static int pack_export(msgpack_sbuffer *sb, const char *const *paths, size_t n, bool fds, bool meta, bool in_place,
		       bool overwrite)
{
	struct wire_packer p;
	wire_packer_init(&p, sb);
	msgpack_pack_map(&p.pk, 2 + !!paths + in_place + overwrite);
	if (in_place)
		wire_pack_str(&p.pk, GMSFS_K_IN_PLACE), msgpack_pack_true(&p.pk);
	if (overwrite)
		wire_pack_str(&p.pk, GMSFS_K_OVERWRITE), msgpack_pack_true(&p.pk);
	wire_pack_str(&p.pk, GMSFS_K_FDS), fds ? msgpack_pack_true(&p.pk) : msgpack_pack_false(&p.pk);
	wire_pack_str(&p.pk, GMSFS_K_WANT_META), meta ? msgpack_pack_true(&p.pk) : msgpack_pack_false(&p.pk);
	if (paths) {
		wire_pack_str(&p.pk, GMSFS_K_PATHS);
		msgpack_pack_array(&p.pk, n);
		for (size_t i = 0; i < n; i++)
			wire_pack_str(&p.pk, paths[i]);
	}
	return p.err;
}

int wire_pack_export(msgpack_sbuffer *sb, const char *const *paths, size_t n, bool fds, bool meta)
{
	return pack_export(sb, paths, n, fds, meta, false, false);
}

int wire_pack_export_in_place(msgpack_sbuffer *sb, const char *const *paths, size_t n, bool fds)
{
	return pack_export(sb, paths, n, fds, false, true, false);
}

int wire_pack_export_overwrite(msgpack_sbuffer *sb, const char *const *paths, size_t n)
{
	return pack_export(sb, paths, n, true, false, false, true);
}

int wire_pack_commit_named(msgpack_sbuffer *sb, const char *version)
{
	struct wire_packer p;
	wire_packer_init(&p, sb);
	msgpack_pack_map(&p.pk, version != NULL);
	if (version)
		wire_pack_str(&p.pk, GMSFS_K_NAME), wire_pack_str(&p.pk, version);
	return p.err;
}
