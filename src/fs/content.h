/* content: a store's content hash (gmsfs(5), CONTENT HASH): the digest of its committed
 * bytes, which the daemon never reads (it never maps a store's memory), as a client that
 * may write the store computed and told it (user.gms.content_hash: "GENERATION HEX").  It
 * is known for the generation it was computed on, while nothing can have changed those
 * bytes: a later commit, a session writing in place or a torn store make it unknown, and
 * the file says why.  Under fs->mu. */
#ifndef GMSFS_FS_CONTENT_H
#define GMSFS_FS_CONTENT_H

#include "store.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

/* The hash of st's committed bytes, or NULL with why (words) when it is not known now. */
const uint8_t *content_known(const struct store *st, const char **why);
/* STORE/content_hash: 32 hex digits and a newline, or "unknown: WHY\n". */
int content_text(const struct store *st, char **out, size_t *len);
/* status.json: `, "content_hash": "HEX"`, or null and "content_hash_why". */
void content_json(const struct store *st, FILE *f);
/* The content hash as 32 hex digits, or "unknown" (a metrics label). */
void content_label(const struct store *st, char out[2 * GMSFS_HASH_LEN + 1]);
/* user.gms.content_hash: "GENERATION HEX" (value's length), -ENODATA when not known. */
int content_xattr_get(const struct store *st, char *buf, size_t size);
/* Set it from value, "GENERATION HEX" (32 hex digits): -EINVAL (not that), -ESTALE (not the
 * committed generation, or nothing committed), -EBUSY (a writer session runs: the bytes may
 * change), -EUCLEAN (torn); last_error says why.  Nothing changes on failure. */
int content_xattr_set(struct store *st, const char *value, size_t size);
/* removexattr: unknown again. */
void content_forget(struct store *st);
/* A restart: what the image said, for the generation it restores (ignored for another). */
void content_restore(struct store *st, uint64_t generation, const uint8_t hash[GMSFS_HASH_LEN]);

#endif
