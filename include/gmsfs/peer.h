/* gmsfs/peer.h: a committed store pulled from another node that serves it
 * (`gmsfs-peer serve`), into an empty store of this machine's mounts, over UCX
 * (libgmsfs-peer, built where UCX is; `gmsfs-peer pull` and `gmsfsctl pull` are commands
 * around it, and the Python package's gmsfs.pull calls it).  See gmsfs-peer(1). */
#ifndef GMSFS_PEER_H
#define GMSFS_PEER_H

#include <stddef.h>
#include <stdint.h>
#include <gmsfs/gmsfs.h>
#include <gmsfs/load.h> /* struct gmsfs_report */

#ifdef __cplusplus
extern "C" {
#endif

#define GMSFS_PULL_PROGRESS 1u /* bytes and rate on stderr as they land */

struct gmsfs_pull_options {
	uint32_t size;          /* sizeof(struct gmsfs_pull_options) (see <gmsfs/load.h>) */
	uint32_t flags;         /* GMSFS_PULL_PROGRESS */
	const char *token_file; /* the token shown to the peer: required */
	int32_t timeout_ms;     /* how long any wait may last with nothing moving: more than 0 */
	uint32_t stripes;       /* connections, 1 to 16; 0: GMSFS_PEER_STRIPES, else 4 */
};
#define GMSFS_PULL_OPTIONS { sizeof(struct gmsfs_pull_options), 0, NULL, 30000, 0 }

/* Pull url (gmsfs://HOST:PORT/NAME, HOST a name, an IPv4 address or [IPv6]) into store,
 * an empty store of a local mount, showing the peer the token in opt->token_file (a
 * regular file that its owner alone may read, 16 to 4096 bytes, a trailing newline not
 * counted): the layout and entries first, then the bytes into the store's memory in
 * stripes, a connection each (opt->stripes; an engine with threads says it here, not by
 * setenv; see gmsfs-peer(1)), each part's xxh3 checked against the peer's, then the
 * commit, which must give the peer's layout hash.  out (may be NULL): what was done.
 * 0, or -errno with the reason in gmsfs_errmsg(NULL):
 * -EINVAL (a URL, an option), -EACCES (the peer refused the token or the store),
 * -EEXIST (store holds allocations), -EIO (bytes or layout hash not the peer's), -ESTALE
 * (the peer's store was committed again during the pull: pull again),
 * -ETIMEDOUT, -ECONNRESET; on any failure store is as it was. */
GMSFS_API int gmsfs_pull(const char *url, const char *store, const struct gmsfs_pull_options *opt,
			 struct gmsfs_report *out);

#ifdef __cplusplus
}
#endif

#endif
