/* meta: the layout of one store.  Two trees (allocs/ and meta/) of
 * directories, allocations and metadata entries; what a rollback needs to return
 * to the last commit (only what changed since); validation at commit; the layout hash.
 *
 * No locking here: the caller serializes.  Errors are -errno. */
#ifndef GMSFS_META_H
#define GMSFS_META_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include <gmsfs/abi.h>
#include "entry.h" /* GMSFS_PATH_MAX, GMSFS_TAG_MAX, GMSFS_VALUE_MAX, gmsfs_path_valid */

#define META_NODE_MAGIC 0x6d657461u /* "meta": first word of every node */

enum meta_kind { META_DIR, META_ALLOC, META_ENTRY };
enum meta_area { META_AREA_ALLOCS, META_AREA_META };

struct meta_store;

/* A node's marks: what the undo log knows of it since the last commit. */
#define META_SHARED_VALUE 0x1u /* the log holds the entry's value too (copy on write): the
				* node may not change or free it; the log gives it back */
#define META_NEW          0x2u /* made since the commit: a rollback removes it */
#define META_SAVED        0x4u /* its committed fields are in the log */
#define META_GREW         0x8u /* a committed directory with new children */

struct meta_node {
	uint32_t magic;            /* META_NODE_MAGIC: the daemon uses addresses as inode numbers */
	uint8_t kind;              /* enum meta_kind: which member of the union below is used */
	uint8_t area;              /* enum meta_area */
	bool linked;               /* part of the live layout */
	uint8_t marks;             /* META_SHARED_VALUE, META_NEW, META_SAVED, META_GREW */
	uint32_t holds;            /* live layout + undo log + callers' references */
	uint32_t slot;             /* position in the parent's kids, or in the graveyard */
	struct meta_node *parent;  /* NULL for an area's root */
	struct meta_store *store;  /* NULL once the store is gone */
	struct meta_graveyard *grave; /* where it waits for its last forget, once out of every store */
	uint64_t lookups;          /* the kernel's references: keep the struct, not the memory */
	int64_t mtime_ns;          /* nanoseconds since the epoch (meta_mtime) */

	union { /* by kind: a store of a million entries pays for the largest alone */
		struct { /* META_DIR: children, as a vector (readdir order) and an index by name */
			struct meta_node **kids;
			size_t nkids, kids_cap;
			void **index;              /* the kids by name (common/probe.h) */
			size_t index_cap;
		};
		struct { /* META_ALLOC */
			uint64_t size;     /* requested size; 0 until sized */
			uint64_t aligned;  /* size rounded up by the backend */
			char *tag;         /* interned (meta_intern) */
			void *buf;         /* the backend's memory, released through the store's hook */
		};
		struct { /* META_ENTRY */
			char *alloc;       /* allocation path relative to allocs/, or NULL; interned */
			char *value;
			uint64_t offset;
			uint64_t extent;   /* bytes from offset that the entry describes; 0: none */
			uint32_t value_len; /* at most GMSFS_VALUE_MAX */
			uint32_t flags;    /* GMSFS_ENTRY_* */
		};
	};

	char name[];               /* fixed for the node's life (no rename): kept inline */
};

static inline struct timespec meta_mtime(const struct meta_node *n)
{
	return (struct timespec){ .tv_sec = n->mtime_ns / 1000000000, .tv_nsec = n->mtime_ns % 1000000000 };
}

/* ctx is given back to release_buf and by meta_context(). */
struct meta_store *meta_store_new(void (*release_buf)(void *buf, void *ctx), void *ctx);
/* changed(n, gone, ctx) for each change to a node the kernel knows (lookups): its
 * attributes, or (gone) its name no longer leads to it. */
void meta_set_watch(struct meta_store *s, void (*changed)(struct meta_node *n, bool gone, void *ctx), void *ctx);

/* Nodes that left every store while the kernel still knew them wait here for their last
 * forget (the kernel sends none at unmount: meta_graveyard_free frees what is left).  The
 * owner outlives every store that points at it. */
struct meta_graveyard {
	struct meta_node **v;      /* a node's slot is its index here */
	size_t n, cap;
	size_t known;              /* nodes the kernel holds (lookups), in a store or here */
};
void meta_set_graveyard(struct meta_store *s, struct meta_graveyard *g);
void meta_graveyard_free(struct meta_graveyard *g);
/* The ctx of the node's store, or NULL once the node has left every store. */
void *meta_context(const struct meta_node *n);
/* Unlinks everything, forgets the undo log (memory is released as holds end). */
void meta_store_free(struct meta_store *s);

struct meta_node *meta_root(struct meta_store *s, enum meta_area area);
struct meta_node *meta_lookup(const struct meta_node *dir, const char *name);
/* kind must fit the area: directories anywhere, allocations in allocs/,
 * entries in meta/. */
int meta_create(struct meta_node *dir, const char *name, enum meta_kind kind, struct meta_node **out);
/* Unlink from the live layout; a directory must be empty. */
int meta_remove(struct meta_node *n);

int meta_alloc_size(struct meta_node *n, uint64_t size, uint64_t aligned, void *buf);
int meta_set_tag(struct meta_node *n, const char *tag, size_t len);
int meta_entry_set_alloc(struct meta_node *n, const char *path, size_t len);
/* Decimal text, as the xattrs carry it. */
int meta_entry_set_offset(struct meta_node *n, const char *text, size_t len);
int meta_entry_set_extent(struct meta_node *n, const char *text, size_t len);
/* A flag of the entry (GMSFS_ENTRY_PRIVATE or GMSFS_ENTRY_NOTE) from "1" or "0". */
int meta_entry_set_flag(struct meta_node *n, uint32_t flag, const char *text, size_t len);
/* removexattr of an entry's attribute: back to none (alloc, size, a flag) or 0 (offset). */
enum meta_entry_attr { META_ATTR_ALLOC, META_ATTR_OFFSET, META_ATTR_EXTENT, META_ATTR_PRIVATE, META_ATTR_NOTE };
int meta_entry_unset(struct meta_node *n, enum meta_entry_attr what);
int meta_entry_write(struct meta_node *n, uint64_t off, const void *data, size_t len);
int meta_entry_truncate(struct meta_node *n, uint64_t len);

/* Path of n relative to its area's root ("a/b/w0"); -ENAMETOOLONG if it does not fit. */
int meta_path(const struct meta_node *n, char *buf, size_t size);
bool meta_name_valid(const char *name);
struct meta_node *meta_resolve(struct meta_store *s, enum meta_area area, const char *path);

/* References that keep a node's memory (open handles). */
void meta_hold(struct meta_node *n);
void meta_drop(struct meta_node *n);
/* The kernel's lookups: the struct lives while there are any. */
void meta_lookup_ref(struct meta_node *n);
void meta_forget(struct meta_node *n, uint64_t nlookup);

/* ---- batches (batch.c): checked whole, then all or nothing; err names the bad item ---- */
struct meta_new_alloc {
	const char *path, *tag;    /* tag NULL: "default" */
	uint64_t size, aligned;
	void *buf;                 /* the backend's memory: the node owns it once created */
	struct meta_node *node;    /* out */
};
/* Would meta_create_allocs accept these paths and tags (bufs and sizes aside)?  0 or -errno. */
int meta_check_allocs(struct meta_store *s, const struct meta_new_alloc *v, size_t n, char *err, size_t errlen);
/* Create allocations (and their parent directories).  On failure every buf is still the caller's. */
int meta_create_allocs(struct meta_store *s, struct meta_new_alloc *v, size_t n, char *err, size_t errlen);
/* Remove allocations and every entry that names one of them. */
int meta_free_allocs(struct meta_store *s, const char *const *paths, size_t n, char *err, size_t errlen);

/* Create or replace entries (and their parent directories); each must name an existing
 * allocation with its extent inside it. */
int meta_put_entries(struct meta_store *s, const struct entry_rec *v, size_t n, char *err, size_t errlen);
int meta_delete_entries(struct meta_store *s, const char *const *keys, size_t n, char *err, size_t errlen);

/* Commit: validate (on failure -EINVAL and a message in err), hash, forget the undo log. */
int meta_commit(struct meta_store *s, char *err, size_t errlen);
/* Back to the last committed layout, or empty. */
void meta_rollback(struct meta_store *s);
/* The committed hash as 32 hex digits, or "" before the first commit. */
const char *meta_hash_hex(const struct meta_store *s);
/* The same as 16 canonical bytes; false before the first commit. */
bool meta_hash(const struct meta_store *s, uint8_t out[GMSFS_HASH_LEN]);
/* Hash of the live layout (what a commit would publish), into 16 bytes. */
int meta_layout_hash(struct meta_store *s, uint8_t out[GMSFS_HASH_LEN]);
/* user.gms.content_hash's value, "GENERATION HEX" (a newline at its end allowed: the
 * commit it was computed on, then 32 lowercase hex digits), into *gen and hash: 0, or
 * -EINVAL for anything else (untrusted input: fuzzed). */
int meta_content_parse(const char *value, size_t size, uint64_t *gen, uint8_t hash[GMSFS_HASH_LEN]);
/* A version name (gmsfs(5), NAMED VERSIONS): 1 to 64 of A-Z a-z 0-9 . _ - : + @, the first a
 * letter or digit (a newline at its end allowed), into name: 0, or -EINVAL. */
#define META_VERSION_NAME_MAX GMSFS_VERSION_NAME_MAX
int meta_version_name(const char *value, size_t size, char name[META_VERSION_NAME_MAX + 1]);
/* "GENERATION NAME" (user.gms.version's value, a line of an image's history): the commit
 * (1 on, no leading zero) and its name: 0, or -EINVAL.  Both are untrusted input: fuzzed. */
int meta_version_parse(const char *value, size_t size, uint64_t *gen, char name[META_VERSION_NAME_MAX + 1]);

struct meta_stats { uint64_t allocations, entries, bytes, aligned_bytes; };
void meta_stats(const struct meta_store *s, struct meta_stats *out);

/* ---- the committed view (view.c): the layout as the last commit published it, for
 * callers outside a writer session (the live layout is the session's) ---- */
/* A node's fields as a view shows them. */
struct meta_fields {
	const char *str;           /* an allocation's tag, an entry's allocation path */
	const char *value;         /* an entry's */
	uint32_t value_len, flags;
	uint64_t offset, extent;   /* an entry's */
	uint64_t size, aligned;    /* an allocation's (fixed once sized) */
	int64_t mtime_ns;
};
/* Part of the committed layout: not made since the commit (linked, or removed since). */
bool meta_committed(const struct meta_node *n);
/* dir's child name as committed: the live child if it was committed, else a committed one
 * removed since; NULL. */
struct meta_node *meta_committed_child(struct meta_node *dir, const char *name);
/* dir's committed children: the live ones not made since, then those removed since.
 * *out is the caller's (free), NULL when there are none; 0 or -ENOMEM. */
int meta_committed_children(struct meta_node *dir, struct meta_node ***out, size_t *count);
void meta_committed_fields(const struct meta_node *n, struct meta_fields *f);
void meta_live_fields(const struct meta_node *n, struct meta_fields *f);

/* Visit every live node below dir (pre-order); stop at the first non-zero return. */
int meta_walk(struct meta_node *dir, int (*fn)(struct meta_node *n, void *arg), void *arg);

#endif
