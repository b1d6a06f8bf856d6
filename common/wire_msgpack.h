/* wire_msgpack: what the codec's files share, not part of wire.h. */
#ifndef GMSFS_COMMON_WIRE_MSGPACK_H
#define GMSFS_COMMON_WIRE_MSGPACK_H

#include "wire.h"
#include "why.h"

#include <string.h>

#define WIRE_DEPTH 6

/* Exactly one map that fills buf, after the guard: 0 or -1. */
int wire_unpack_map(const void *buf, size_t len, msgpack_unpacked *u);

/* Inline, as wire_pack_str: name is a literal. */
static inline bool wire_key_is(const msgpack_object *k, const char *name)
{
	return k->type == MSGPACK_OBJECT_STR && k->via.str.size == strlen(name) &&
	       !memcmp(k->via.str.ptr, name, k->via.str.size);
}
int wire_get_u64(const msgpack_object *o, uint64_t *out);
int wire_get_bool(const msgpack_object *o, bool *out);
/* Copies, NULL when it is not one: a string of at most max bytes without NUL; a valid
 * path; a valid tag. */
char *wire_get_str(const msgpack_object *o, size_t max);
char *wire_get_path(const msgpack_object *o);
char *wire_get_tag(const msgpack_object *o);
/* Bytes (bin, or str) of at most max, copied: 0 or -1. */
int wire_get_bytes(const msgpack_object *o, size_t max, uint8_t **out, size_t *len);

/* Each known key at most once: a bit per key of the map being read. */
#define SEEN(bit) (seen & (1u << (bit)) ? -1 : (seen |= 1u << (bit), 0))

/* msgpack-c's packer ignores a failed write and goes on: the first failure is kept here. */
struct wire_packer {
	msgpack_packer pk;
	msgpack_sbuffer *sb;
	int err;
};
void wire_packer_init(struct wire_packer *p, msgpack_sbuffer *sb);
/* Inline: the keys are literals, so their strlen is folded at compile time. */
static inline void wire_pack_str(msgpack_packer *pk, const char *s)
{
	size_t n = strlen(s);
	msgpack_pack_str(pk, n);
	msgpack_pack_str_body(pk, s, n);
}
void wire_pack_bin(msgpack_packer *pk, const void *p, size_t n);

/* One allocation's map (path, size, aligned, tag, fd, fdoff; fd below nfds) and one
 * entry's (key, alloc; offset, size, flags, value default to 0 and ""): 0 or -1. */
void wire_pack_alloc(msgpack_packer *pk, const struct wire_alloc *a);
/* image: an image's record, which may say its tier (a reply's may not). */
#define WIRE_K_TIER "tier"
#define WIRE_K_STANDBY "standby"
int wire_parse_alloc(const msgpack_object *o, struct wire_alloc *a, uint64_t nfds, bool image);
void wire_pack_entry(msgpack_packer *pk, const struct entry_rec *e);
int wire_parse_entry(const msgpack_object *o, struct entry_rec *e);

#endif
