/* wire_msgpack: what the codec's files share, not part of wire.h. */
#ifndef GMSFS_COMMON_WIRE_MSGPACK_H
#define GMSFS_COMMON_WIRE_MSGPACK_H

#include "wire.h"

#define WIRE_DEPTH 6

int wire_why(char *why, size_t whylen, int e, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
/* Exactly one map that fills buf, after the guard: 0 or -1. */
int wire_unpack_map(const void *buf, size_t len, msgpack_unpacked *u);

bool wire_key_is(const msgpack_object *k, const char *name);
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
void wire_pack_str(msgpack_packer *pk, const char *s);
void wire_pack_bin(msgpack_packer *pk, const void *p, size_t n);

#endif
