/* history: a store's last lock events, for operators and GMS's event history (gmsfs(5),
 * STORE/history): a writer session begun, committed, kept, aborted, left without commit
 * (a crash included), torn.  A ring of STORE_HISTORY_KEEP in memory, under fs->mu. */
#ifndef GMSFS_FS_HISTORY_H
#define GMSFS_FS_HISTORY_H

#include "store.h"

/* The event kinds: what STORE/history calls them. */
extern const char HISTORY_RW[], HISTORY_DATA[], HISTORY_COMMITTED[], HISTORY_KEPT[], HISTORY_ABORTED[],
	HISTORY_LEFT[], HISTORY_TORN[];

/* A session of st began now (kind: HISTORY_RW or HISTORY_DATA), pid its leader. */
void history_begin(struct store *st, const char *kind, pid_t pid);
/* An event of st's session now (kind: one of the others), its leader's. */
void history_add(struct store *st, const char *kind);
/* STORE/history: "SEQ TIME KIND PID GENERATION\n" per event kept, oldest first; TIME is
 * seconds since the epoch with microseconds. */
int history_text(const struct store *st, char **out, size_t *len);

#endif
