/* version: a store's next version built beside its readers (user.gms.versions 2,
 * gmsfs(5) VERSIONS).  A data-only session granted while readers read never writes the
 * committed memory: an allocation's first writable use in it makes a copy (its memory asked of the
 * daemon's one door, fs->make_memory, then filled by vmm_copy),
 * which the session's members see and write.  Its commit swaps each copy in: the
 * allocation's buffer takes the new memory, and the memory before is the version before,
 * kept for the read handles the commit found (h->on_prev) until each flips
 * (GMSFS_OP_FLIP) or goes; they see it meanwhile.  Data only: lock.c decides who holds
 * what and calls here.  Everything under fs->mu. */
#ifndef GMSFS_FS_VERSION_H
#define GMSFS_FS_VERSION_H

#include "store.h"

/* Does st's writer session run beside its readers? */
static inline bool version_beside(const struct store *st)
{
	return store_lock(st)->fsm.beside;
}

/* The memory handle h sees for allocation n: the session's copy (h is the session's), the
 * version before (h is on it), or n's own; NULL: n has no memory. */
struct vmm_buf *version_buf(const struct store *st, const struct fs_handle *h, const struct meta_node *n);
/* Does h's writable use of n need a copy made first (version_copy)? */
bool version_needs_copy(const struct store *st, const struct fs_handle *h, const struct meta_node *n);
/* Each of nodes whose writable use by h needs it (version_needs_copy) gets its copy;
 * overwrite: h's writer writes every byte of them, so their memory is made and not filled
 * (what new memory holds until written).  fs->mu is let go while they are made, so a
 * caller that may see h go meanwhile looks it up again after.  0, or -errno, why in
 * last_error and in why (may be NULL): -EDQUOT, -ENOSPC (no room for a copy), -ENOLCK
 * (the session ended meanwhile); nothing is kept of a failure. */
int version_copy(struct store *st, const struct fs_handle *h, struct meta_node *const *nodes, size_t n, bool overwrite,
		 char *why, size_t whylen);
/* The same for the allocations named (a name that is not one is left to the caller), or,
 * names NULL, every one. */
int version_copy_named(struct store *st, const struct fs_handle *h, char *const *names, size_t n, bool overwrite,
		       char *why, size_t whylen);
/* The allocations of the version before that read handle h is on (none when it is on the
 * last commit): *out is the caller's to free.  0 or -ENOMEM. */
int version_prev(const struct store *st, const struct fs_handle *h, struct meta_node ***out, size_t *n);
/* The session ended without commit, or aborted: its copies go. */
void version_drop_next(struct store *st);
/* The session's commit, before its handles become readers: each copy is swapped in, and
 * every read handle now becomes one on the version before, which keeps the memory the
 * copies replaced; with none, that memory is given back.  How many handles are on it. */
unsigned version_commit(struct store *st);
/* h leaves the version before (it flips, or goes).  True when it was the last: that
 * version's memory was given back. */
bool version_leave(struct store *st, struct fs_handle *h);

#endif
