/* peerlib: gmsfs_pull (<gmsfs/peer.h>), what a program or a Python engine calls in its own
 * process to pull a store from a peer: the token read as gmsfs-peer reads it, then pl_pull. */
#include "net_wire.h"
#include "pull.h"
#include "serve.h"

#include <gmsfs/peer.h>

#include <errno.h>

GMSFS_API int gmsfs_pull(const char *url, const char *store, const struct gmsfs_pull_options *opt,
			 struct gmsfs_report *out)
{
	struct gmsfs_pull_options o = GMSFS_PULL_OPTIONS;
	struct gmsfs_report r = GMSFS_REPORT;
	gmsfs_seterr(NULL, 0, NULL);
	if (!url || !store)
		return gmsfs_seterr(NULL, -EINVAL, "gmsfs_pull: no URL or no store");
	if (opt && opt->size != sizeof o)
		return gmsfs_seterr(NULL, -EINVAL, "gmsfs_pull: options of %u bytes: this libgmsfs-peer knows %zu "
				    "(set .size, or start from GMSFS_PULL_OPTIONS)", opt->size, sizeof o);
	if (out && out->size != sizeof r)
		return gmsfs_seterr(NULL, -EINVAL, "gmsfs_pull: a report of %u bytes: this libgmsfs-peer knows %zu "
				    "(start from GMSFS_REPORT)", out->size, sizeof r);
	if (opt)
		o = *opt;
	if (o.flags & ~GMSFS_PULL_PROGRESS)
		return gmsfs_seterr(NULL, -EINVAL, "gmsfs_pull: flags 0x%x: only GMSFS_PULL_PROGRESS is known", o.flags);
	if (o.stripes > NW_STRIPES_MAX)
		return gmsfs_seterr(NULL, -EINVAL, "gmsfs_pull: %u stripes: connections a pull, 1 to %d (0: "
				    "GMSFS_PEER_STRIPES, else 4)", o.stripes, NW_STRIPES_MAX);
	if (o.timeout_ms <= 0)
		return gmsfs_seterr(NULL, -EINVAL, "gmsfs_pull: a timeout of %d ms: more than 0", (int)o.timeout_ms);
	if (!o.token_file)
		return gmsfs_seterr(NULL, -EINVAL, "gmsfs_pull: no token_file: the token the peer is shown");
	uint8_t token[NW_TOKEN_MAX + 1];
	size_t len;
	char err[1024] = "";
	int e = sv_read_token(o.token_file, token, &len, err, sizeof err);
	if (!e)
		e = pl_pull(url, store, token, len, o.timeout_ms, o.stripes, o.flags & GMSFS_PULL_PROGRESS, &r, err,
			    sizeof err);
	if (e)
		return gmsfs_seterr(NULL, e, "%s", err[0] ? err : gmsfs_strerror(e));
	if (out)
		*out = r;
	return 0;
}
