/* gmsfs/peer.h: a committed store pulled from another node that serves it
 * (`gmsfs-peer serve`), into an empty store of this machine's mounts, over UCX
 * (libgmsfs-peer, built where UCX is; `gmsfs-peer pull` and `gmsfsctl pull` are commands
 * around it, and the Python package's gmsfs.pull calls it).  See gmsfs-peer(1). */
#ifndef GMSFS_PEER_H
#define GMSFS_PEER_H

#include <stddef.h>
#include <gmsfs/gmsfs.h>

#ifdef __cplusplus
extern "C" {
#endif

#define GMSFS_PULL_PROGRESS 1u /* bytes and rate on stderr as they land */
/* The connections a pull asks for, n 1 to 16, or'd into flags; none given (0): the
 * environment's GMSFS_PEER_STRIPES, else 4.  An engine with threads says it here, not
 * by setenv. */
#define GMSFS_PULL_STRIPES(n) ((unsigned)(n) << 8)
#define GMSFS_PULL_STRIPES_MASK (0xffu << 8)

/* Pull url (gmsfs://HOST:PORT/NAME, HOST a name, an IPv4 address or [IPv6]) into store,
 * an empty store of a local mount, showing the peer the token in token_file (a regular
 * file that its owner alone may read, 16 to 4096 bytes, a trailing newline not counted):
 * the layout and entries first, then the bytes into the store's memory in stripes, a
 * connection each (GMSFS_PULL_STRIPES(n) in flags, else GMSFS_PEER_STRIPES in the
 * environment, else 4; see gmsfs-peer(1)), each part's xxh3 checked against the peer's,
 * then the commit, which must give the peer's layout hash.  timeout_ms: how long any wait
 * may last with nothing moving (the store's writer lock, the peer), more than 0.  0, or
 * -errno with the reason in err:
 * -EINVAL (a URL, a flag, a timeout), -EACCES (the peer refused the token or the store),
 * -EEXIST (store holds allocations), -EIO (bytes or layout hash not the peer's), -ESTALE
 * (the peer's store was committed again during the pull: pull again),
 * -ETIMEDOUT, -ECONNRESET; on any failure store is as it was.  how: what was done
 * (allocations, bytes, seconds, rate, the layout hash). */
GMSFS_API int gmsfs_pull(const char *url, const char *store, const char *token_file, int timeout_ms, unsigned flags,
			 char *how, size_t howlen, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif

#endif
