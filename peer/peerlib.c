/* peerlib: gmsfs_pull (<gmsfs/peer.h>), what a program or a Python engine calls in its own
 * process to pull a store from a peer: the token read as gmsfs-peer reads it, then pl_pull. */
#include "net_wire.h"
#include "pull.h"
#include "serve.h"

#include <gmsfs/peer.h>

#include <errno.h>
#include <stdio.h>

GMSFS_API int gmsfs_pull(const char *url, const char *store, const char *token_file, int timeout_ms, unsigned flags,
			 char *how, size_t howlen, char *err, size_t errlen)
{
	char none[1];
	if (!how || !howlen)
		how = none, howlen = sizeof none;
	if (!url || !store || !token_file || !err || !errlen)
		return -EINVAL;
	if (flags & ~(GMSFS_PULL_PROGRESS | GMSFS_PULL_STRIPES_MASK)) {
		snprintf(err, errlen, "flags 0x%x: only GMSFS_PULL_PROGRESS and GMSFS_PULL_STRIPES(n) are known", flags);
		return -EINVAL;
	}
	unsigned stripes = (flags & GMSFS_PULL_STRIPES_MASK) >> 8;
	if (stripes > NW_STRIPES_MAX) {
		snprintf(err, errlen, "GMSFS_PULL_STRIPES(%u): connections a pull, 1 to %d", stripes, NW_STRIPES_MAX);
		return -EINVAL;
	}
	if (timeout_ms <= 0) {
		snprintf(err, errlen, "a timeout of %d ms: more than 0", timeout_ms);
		return -EINVAL;
	}
	uint8_t token[NW_TOKEN_MAX + 1];
	size_t len;
	int e = sv_read_token(token_file, token, &len, err, errlen);
	if (!e)
		e = pl_pull(url, store, token, len, timeout_ms, stripes, flags & GMSFS_PULL_PROGRESS, how, howlen, err,
			    errlen);
	return e;
}
