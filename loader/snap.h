/* snap: gmsfs-snapshot's own format, one store at a time: shards written at once, a
 * manifest last with every allocation's xxh3, every byte checked at restore (snap.c says
 * how; gmsfs-load(1) too). */
#ifndef GMSFS_LOADER_SNAP_H
#define GMSFS_LOADER_SNAP_H

#include <stdbool.h>
#include <stddef.h>

/* -v: each phase's time on stderr. */
extern bool snap_verbose;
/* The committed layout of store into dir (made if missing); 0 or -errno with err. */
int snap_save(const char *store, const char *dir, int timeout_ms, bool quiet, char *err, size_t errlen);
/* dir's snapshot into the empty store, checked before the commit; 0 or -errno with err. */
int snap_restore(const char *store, const char *dir, int timeout_ms, bool quiet, char *err, size_t errlen);

#endif
