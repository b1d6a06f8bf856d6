/* net_wire: the messages gmsfs-peer's two sides exchange (nw_), each a frame of a 4-byte
 * little-endian length and a msgpack map.  The puller says HELLO (the token, the store,
 * the stripe); the server answers LAYOUT (an errno and why, or the store's layout hash,
 * allocations, entries and the stripes it serves at once), then sends the stripe's bytes
 * in order, raw, then the TRAILER (the xxh3 of each of the stripe's segments).  A pull
 * has a connection a stripe: one TCP stream (one core copying on each side) carries 3-5
 * GB/s, a link may carry more.  Every parse checks every field, count and size: a peer's
 * message is untrusted input (fuzz_net). */
#ifndef GMSFS_LOADER_NET_WIRE_H
#define GMSFS_LOADER_NET_WIRE_H

#include <stddef.h>
#include <stdint.h>

#define NW_VERSION 2
#define NW_HELLO_MAX 8192           /* a HELLO frame's most bytes */
#define NW_LAYOUT_MAX (256u << 20)  /* a LAYOUT frame's */
#define NW_TOKEN_MAX 4096
#define NW_NAME_MAX 255
#define NW_ALLOCS_MAX (1u << 20)
#define NW_ENTRIES_MAX (1u << 22)
#define NW_STRIPES_MAX 16
#define NW_STRIPE_ALIGN (2ull << 20) /* where the stripes are cut */

struct nw_hello {
	uint32_t version;
	uint8_t token[NW_TOKEN_MAX];
	size_t token_len;
	char store[NW_NAME_MAX + 1];
	uint32_t stripe, stripes; /* the stripe this connection asks for, of the stripes the pull
				   * wants; both sides cut nw_stripes_for(layout, stripes) */
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
	char content[33]; /* the content hash where the server's daemon knows it for the commit
			   * served, 32 hex digits; "" (and no key sent) otherwise */
	char version[65]; /* that commit's version name (gmsfs(5), NAMED VERSIONS); "" (and no
			   * key sent) where it has none */
	struct nw_alloc *allocs;
	size_t nallocs;
	struct nw_entry *entries;
	size_t nentries;
	uint32_t stripes; /* connections the server serves at once: a pull's most stripes */
};

/* A part of a stripe: allocation i's len bytes from at; each has its xxh3 in the trailer. */
struct nw_segment {
	size_t i;
	uint64_t at, len;
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
/* Stripe k of count: the layout's bytes, the allocations end to end, cut in count parts
 * at NW_STRIPE_ALIGN; part k as its segments in order (one an allocation it touches; an
 * allocation of no bytes has none): *out (malloc'ed; NULL with none) and *n.  Both sides
 * compute it.  0 or -ENOMEM. */
int nw_stripe(const struct nw_layout *l, uint32_t k, uint32_t count, struct nw_segment **out, size_t *n);
/* The stripes a pull of the layout uses: wanted, at most the server's and as many as
 * hold bytes (at least 1). */
uint32_t nw_stripes_for(const struct nw_layout *l, uint32_t wanted);
/* A version name as gmsfs(5) has it: 1 to 64 of A-Z a-z 0-9 . _ - : + @, the first a
 * letter or digit. */
int nw_version_name_ok(const char *name);
/* A store's name as a peer may ask for it: one path component, no dot names. */
int nw_store_name_ok(const char *name);

#endif
