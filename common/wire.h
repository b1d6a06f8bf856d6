/* wire: the messages of the daemon's socket, packed and checked in one place.
 * The daemon parses request headers and bodies and packs replies; libgmsfs packs
 * requests and parses replies.  Both compile this file; nothing else speaks msgpack.
 *
 * Parsers trust nothing: every count a container declares is checked against the
 * bytes that remain before msgpack-c sees it (msgpack-c allocates for the declared
 * count first), nesting is shallow, every key is known and appears once, strings hold
 * no NUL, paths and tags follow the rules of abi.h, sizes are bounded.  Errors: -EPROTO
 * for a reply and -EINVAL for a request, with the reason in why. */
#ifndef GMSFS_COMMON_WIRE_H
#define GMSFS_COMMON_WIRE_H

#include <gmsfs/abi.h>
#include "entry.h"
#include <msgpack.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* A store's tier, or an allocation's or piece's own in an image, where a store's memory
 * is not all on one (a switch's store going out, mid-way); WIRE_TIER_STORE: the head's. */
enum wire_tier { WIRE_TIER_STORE, WIRE_TIER_DEVICE, WIRE_TIER_HOST };

/* One piece of an allocation in pieces (abi.h, GMSFS_PIECES_MAX). */
struct wire_piece {
	uint32_t fd;            /* index into the message's (or image's) descriptors */
	uint64_t fd_offset;
	enum wire_tier tier;    /* images only */
};

/* One allocation: of a CREATE request (path, size, tag) or of a manifest (all). */
struct wire_alloc {
	char *path, *tag;
	uint64_t size, aligned;
	uint64_t fd_offset;     /* where it starts in its descriptor */
	uint32_t fd;            /* index into the message's descriptors */
	enum wire_tier tier;    /* images only */
	/* In pieces (npieces >= 2; 0: one piece, at fd and fd_offset, which then name the
	 * first): piece bytes each but the last, side by side from the start. */
	uint64_t piece;
	struct wire_piece *pieces;
	uint32_t npieces;
	bool ro;                /* manifests: the last commit's, read-only to its writer (GMSFS_K_RO) */
	/* Images only: the host memory made ahead for each piece (npieces of them, or one),
	 * fd WIRE_NO_FD where a piece has none; NULL (nstandby 0): none at all. */
	struct wire_piece *standby;
	uint32_t nstandby;
};
#define WIRE_NO_FD UINT32_MAX
/* What a parsed allocation owns (path, tag, pieces, standby). */
void wire_alloc_free(struct wire_alloc *a);

/* A META_PUT request's entries: struct entry_rec (entry.h). */

/* A piece of an entry in a manifest: entries travel in chunks so that a value of up to
 * GMSFS_VALUE_MAX bytes fits messages of GMSFS_MSG_MAX.  The first chunk (voff 0) has
 * every field; the next ones continue the same key at voff = the bytes sent so far. */
struct wire_chunk {
	char *key, *alloc;      /* alloc: "" when the entry names none yet */
	uint64_t offset, size;
	uint32_t flags;
	uint64_t value_len;     /* the whole value */
	uint64_t voff;          /* this chunk's place in it */
	uint8_t *bytes;
	size_t nbytes;
};

/* ---- requests ---- */
void wire_req_init(struct gmsfs_sock_req *r, enum gmsfs_op op, const uint8_t ticket[GMSFS_TICKET_LEN], uint32_t flags,
		   uint32_t body_len);
/* The header at the start of a message of len bytes: 0 or -EINVAL. */
int wire_req_parse(const void *buf, size_t len, struct gmsfs_sock_req *out, char *why, size_t whylen);
/* Whether op takes a body (EXPORT .. META_DELETE, COMMIT_NAMED). */
bool wire_op_has_body(unsigned op);

/* A request's body, parsed; everything in it is owned by it. */
struct wire_body {
	struct wire_alloc *allocs;   /* CREATE */
	size_t nallocs;
	struct entry_rec *entries;  /* META_PUT */
	size_t nentries;
	char **names;                /* FREE: paths; META_DELETE: keys; EXPORT: paths if has_names */
	size_t nnames;
	bool has_names;
	bool fds, meta;              /* EXPORT */
	bool in_place;               /* EXPORT: writable, into the last commit's bytes */
	bool overwrite;              /* EXPORT: every byte written: a next version's copies need none */
	char *version;               /* COMMIT_NAMED: a valid version name; COMMIT_LEAVE: one or NULL */
};
int wire_parse_body(enum gmsfs_op op, const void *buf, size_t len, struct wire_body *out, char *why, size_t whylen);
void wire_body_free(struct wire_body *b);

/* Bodies, packed by the client.  0 or -ENOMEM. */
int wire_pack_create(msgpack_sbuffer *sb, const struct wire_alloc *v, size_t n);
int wire_pack_entries(msgpack_sbuffer *sb, const struct entry_rec *v, size_t n);
/* key: GMSFS_K_PATHS (FREE) or GMSFS_K_KEYS (META_DELETE). */
int wire_pack_names(msgpack_sbuffer *sb, const char *key, const char *const *names, size_t n);
/* paths NULL: the whole layout. */
int wire_pack_export(msgpack_sbuffer *sb, const char *const *paths, size_t n, bool fds, bool meta);
/* The same, with inplace (GMSFS_K_IN_PLACE) said. */
int wire_pack_export_in_place(msgpack_sbuffer *sb, const char *const *paths, size_t n, bool fds);
/* A writer's export of what it will write whole (GMSFS_K_OVERWRITE), descriptors and no
 * metadata; paths NULL: the whole layout. */
int wire_pack_export_overwrite(msgpack_sbuffer *sb, const char *const *paths, size_t n);
/* COMMIT_NAMED's and COMMIT_LEAVE's: the commit's name (NULL: none, LEAVE's only). */
int wire_pack_commit_named(msgpack_sbuffer *sb, const char *version);

/* ---- replies ---- */
struct wire_head {
	int err;                /* errno, 0 on success */
	const char *msg;        /* NULL: none */
	bool manifest;          /* the fields below are sent */
	uint64_t total;         /* allocations in the whole reply */
	uint64_t nentries;      /* entries in the whole reply */
	uint64_t first;         /* index of this message's first allocation */
	bool last;
	bool has_gen;           /* gen is sent */
	uint64_t gen;           /* the generation the manifest shows */
};
/* One message: a plain reply (manifest false) or a part of a manifest. */
int wire_pack_reply(msgpack_sbuffer *sb, const struct wire_head *h, const struct wire_alloc *a, size_t na,
		    const struct wire_chunk *c, size_t nc);
/* Upper bounds of what one item adds to a message, for splitting. */
size_t wire_alloc_cost(const char *path, const char *tag);
size_t wire_chunk_cost(const char *key, const char *alloc, size_t nbytes);
#define WIRE_HEAD_COST 160

struct wire_reply {
	int err;
	char msg[256];
	bool manifest;
	uint64_t total, nentries, first;
	bool last;
	bool has_gen;
	uint64_t gen;
	struct wire_alloc *allocs;
	size_t nallocs;
	struct wire_chunk *chunks;
	size_t nchunks;
};
int wire_parse_reply(const void *buf, size_t len, struct wire_reply *r, char *why, size_t whylen);
void wire_reply_free(struct wire_reply *r);

/* ---- store images (the daemon's alone: a handover, a state file) ---- */
/* An image is records, each a u32 length (little-endian) and one msgpack map: the head,
 * then ndirs directories, nallocs allocations (fd: an index below nfds, the image's own
 * descriptors), nentries entries.  Parsers are as strict as the socket's. */
struct wire_image {
	char *store, *device, *backend;  /* the store's name; the device (uuid) and backend it lives on */
	uint64_t generation, commits, quota;
	uint64_t min;                    /* user.gms.min; 0: none (then not packed, so that a daemon
	                                  * before it reads the image) */
	int64_t priority;
	bool host;                       /* on the host tier */
	bool torn;                       /* the committed bytes were written in place by a session
	                                  * that has not committed (packed only when true) */
	uint64_t versions;               /* user.gms.versions: packed only when 2 (0 read: 1) */
	uint8_t hash[GMSFS_HASH_LEN];    /* the committed layout's */
	bool has_content;                /* the committed bytes' hash is known (packed only then) */
	uint8_t content[GMSFS_HASH_LEN]; /* ... for generation (gmsfs(5), CONTENT HASH) */
	char *named;                     /* its named versions, "GENERATION NAME\n" each, oldest first
	                                  * (gmsfs(5), NAMED VERSIONS; packed only when some) */
	uint64_t ndirs, nallocs, nentries, nfds;
	char **fdnames;                  /* a state file's: each descriptor's name in the service manager's
	                                  * store, nfds of them and a NULL */
	struct wire_reader *readers;     /* a handover's: the processes that hold read locks */
	uint64_t nreaders;
};
/* A process that reads a store, in an image: its pid, start time (/proc/PID/stat, field
 * 22) and how many read locks it holds; or a kept session's leader (writer), held as a
 * reader across the restart so that no other writer maps its pages while it lives. */
struct wire_reader {
	uint32_t pid, count;
	uint64_t start;
	uint32_t writer; /* 1: a kept session's leader (gmsfs(5), Kept caches): its own RW takes it back */
};
/* The next record at *off of buf: 0, or -1 when none is whole there. */
int wire_image_next(const void *buf, size_t len, size_t *off, const void **rec, size_t *reclen);
int wire_pack_image(msgpack_sbuffer *sb, const struct wire_image *h);
int wire_parse_image(const void *buf, size_t len, struct wire_image *h, char *why, size_t whylen);
void wire_image_free(struct wire_image *h);
/* area: 0 allocs/, 1 meta/ */
int wire_pack_image_dir(msgpack_sbuffer *sb, int area, const char *path);
int wire_parse_image_dir(const void *buf, size_t len, int *area, char **path);
/* An allocation record: its tier ("tier") only where it is not WIRE_TIER_STORE. */
int wire_pack_image_alloc(msgpack_sbuffer *sb, const struct wire_alloc *a);
int wire_parse_image_alloc(const void *buf, size_t len, struct wire_alloc *a, uint64_t nfds);
int wire_pack_image_entry(msgpack_sbuffer *sb, const struct entry_rec *e);
int wire_parse_image_entry(const void *buf, size_t len, struct entry_rec *e);

#endif
