/* named: a store's named versions (gmsfs(5), NAMED VERSIONS).  A member of the writer
 * session names the commit it will make (user.gms.version, set on the store directory);
 * the commit carries the name with its generation, and the store keeps the names of its
 * last STORE_NAMED_KEEP named commits, in its image too (restarts, takeovers).  A name is
 * a store's once.  Readers read the last commit's name (STORE/version, user.gms.version
 * "GENERATION NAME"), the list (STORE/versions), and wait on the generation file.
 * Under fs->mu. */
#ifndef GMSFS_FS_NAMED_H
#define GMSFS_FS_NAMED_H

#include "store.h"

#include <stdio.h>

/* The last commit's name, or NULL with why (words) when it has none. */
const char *named_current(const struct store *st, const char **why);
/* STORE/version: the name and a newline, or "none: WHY\n". */
int named_text(const struct store *st, char **out, size_t *len);
/* STORE/versions: "GENERATION NAME STATE\n" per name kept, oldest first; STATE is
 * "serving" (the last commit), "held N" (the version before, N read handles on it) or
 * "gone" (its memory is no longer the store's). */
int named_list_text(const struct store *st, char **out, size_t *len);
/* status.json: `, "version": "NAME"` or null. */
void named_json(const struct store *st, FILE *f);
/* user.gms.version: "GENERATION NAME" of the last commit (value's length), -ENODATA when
 * it has no name. */
int named_xattr_get(const struct store *st, char *buf, size_t size);
/* The writer session's name for its commit (the caller checked it is a member):
 * -EINVAL (not a name), -EEXIST (a commit of the store had it); last_error says why. */
int named_set_pending(struct store *st, const char *value, size_t size);
/* The session ended without commit, aborted, or took its name back. */
void named_drop_pending(struct store *st);
/* The session's commit (its generation counted): it carries the name given, if any. */
void named_commit(struct store *st);
/* The names kept, "GENERATION NAME\n" each, for the store's image: NULL when none (or
 * out of memory: the image then lacks them, and says nothing wrong). */
char *named_history(const struct store *st);
/* A restart: the names an image kept, each line checked (a bad one is skipped). */
void named_restore(struct store *st, const char *text, size_t len);

#endif
