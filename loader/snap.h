/* snap: gmsfs-snapshot's own format, one store at a time: shards written at once, a
 * manifest last with every allocation's xxh3 and the content hash, every byte checked at
 * restore (snap.c says how; gmsfs-load(1) too). */
#ifndef GMSFS_LOADER_SNAP_H
#define GMSFS_LOADER_SNAP_H

#include "copy.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

/* -v: each phase's time on stderr. */
extern bool snap_verbose;
/* restore: the name its commit carries (gmsfs(5), NAMED VERSIONS); NULL: none. */
extern const char *snap_version;
/* The committed layout of store into dir (made if missing); 0 or -errno with err. */
int snap_save(const char *store, const char *dir, int timeout_ms, bool quiet, char *err, size_t errlen);
/* dir's snapshot into the empty store, checked before the commit; 0 or -errno with err. */
int snap_restore(const char *store, const char *dir, int timeout_ms, bool quiet, char *err, size_t errlen);

/* What the save (snap_save.c) and the restore (snap.c) share. */
#define SNAP_FORMAT "gmsfs-snapshot 2"
/* ... where an allocation is cut into parts over several shards ("parts" in place of its
 * "shard" and "offset"): a gmsfs-snapshot before it refuses the manifest, never misreads it. */
#define SNAP_FORMAT_PARTS "gmsfs-snapshot 3"
#define SNAP_DATA_ALIGN 4096u
#define SNAP_SHARDS_MAX CP_THREADS /* files written at once: a shard a thread (cp_threads) */

/* XXH3-64 of n digests, little-endian (what an allocation's and a shard's xxh3 are). */
uint64_t snap_digest_of(const uint64_t *d, size_t n);
/* The CP_PIECE pieces of size bytes. */
uint64_t snap_pieces(uint64_t size);

/* Progress on a terminal: bytes, rate, time left; nothing in scripts (-q, or no tty). */
struct snap_progress {
	bool on;
	uint64_t total;
	struct timespec t0;
	const char *what;
};
void snap_show(void *arg, uint64_t done);
/* -v: the phase that ended now, and its time since *t (then reset). */
void snap_phase(struct timespec *t, const char *what);
/* The daemon told the content hash of commit gen where this process may write the store. */
void snap_tell_content(const char *store, uint64_t gen, const char *hex);

#endif
