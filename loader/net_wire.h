/* net_wire: the messages gmsfs-peer's two sides exchange (nw_), each a frame of a 4-byte
 * little-endian length and a msgpack map.  The puller says HELLO (the token, the store);
 * the server answers LAYOUT (an errno and why, or the store's layout hash, allocations
 * and entries), then sends every allocation's bytes in order, raw, then the TRAILER (the
 * xxh3 of each allocation's bytes).  Every parse checks every field, count and size: a
 * peer's message is untrusted input (fuzz_net). */
#ifndef GMSFS_LOADER_NET_WIRE_H
#define GMSFS_LOADER_NET_WIRE_H

#include <stddef.h>
#include <stdint.h>

#define NW_VERSION 1
#define NW_HELLO_MAX 8192           /* a HELLO frame's most bytes */
#define NW_LAYOUT_MAX (256u << 20)  /* a LAYOUT frame's */
#define NW_TOKEN_MAX 4096
#define NW_NAME_MAX 255
#define NW_ALLOCS_MAX (1u << 20)
#define NW_ENTRIES_MAX (1u << 22)

struct nw_hello {
	uint32_t version;
	uint8_t token[NW_TOKEN_MAX];
	size_t token_len;
	char store[NW_NAME_MAX + 1];
};

struct nw_alloc {
	char *name, *tag;
	uint64_t size;
};

struct nw_entry {
	char *key, *alloc; /* alloc "": none */
	uint64_t offset, size;
	uint32_t flags;
	char *value;
	size_t value_len;
};

struct nw_layout {
	int error;       /* 0, or the errno of the refusal */
	char why[512];   /* its words */
	char hash[33];   /* the layout hash, 32 hex digits */
	struct nw_alloc *allocs;
	size_t nallocs;
	struct nw_entry *entries;
	size_t nentries;
};

/* Each pack makes one whole frame (length and body) in *out (malloc'ed, *len bytes). */
int nw_pack_hello(const struct nw_hello *h, void **out, size_t *len);
int nw_pack_layout(const struct nw_layout *l, void **out, size_t *len);
int nw_pack_trailer(const uint64_t *digests, size_t n, void **out, size_t *len);
/* A frame's body (after its length): 0, or -EPROTO with why. */
int nw_parse_hello(const void *buf, size_t len, struct nw_hello *h, char *why, size_t whylen);
int nw_parse_layout(const void *buf, size_t len, struct nw_layout *l, char *why, size_t whylen);
int nw_parse_trailer(const void *buf, size_t len, uint64_t *digests, size_t n, char *why, size_t whylen);
void nw_layout_free(struct nw_layout *l);
/* A store's name as a peer may ask for it: one path component, no dot names. */
int nw_store_name_ok(const char *name);

#endif
