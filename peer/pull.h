/* pull: gmsfs-peer pull (pl_), a store filled from a peer's served store: the layout and
 * entries first, then the bytes into the store's memory in stripes (a connection and a
 * thread each), each part's xxh3 checked, then the commit, which must give the peer's
 * layout hash.  Anything that fails before the commit leaves the store as it was (its
 * session rolls back). */
#ifndef GMSFS_LOADER_PULL_H
#define GMSFS_LOADER_PULL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct gmsfs_report;

/* gmsfs://HOST:PORT/NAME ([IPv6]:PORT too) into host, *port and name. */
int pl_parse_url(const char *url, char *host, size_t hostlen, uint16_t *port, char *name, size_t namelen);
/* Pull url into store (an empty store of a local mount).  stripes: the connections asked
 * for, 1 to NW_STRIPES_MAX (the caller's check), or 0 for GMSFS_PEER_STRIPES (else
 * PL_STRIPES).  out: what was done (allocations, bytes, seconds, the layout hash, and in
 * words).  progress: a line on stderr as bytes land. */
int pl_pull(const char *url, const char *store, const uint8_t *token, size_t token_len, int timeout_ms,
	    uint32_t stripes, bool progress, struct gmsfs_report *out, char *err, size_t errlen);

#endif
