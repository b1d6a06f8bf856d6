/* serve: gmsfs-peer serve (sv_).  A mount's committed stores, read-only, to peers that
 * present the token and ask for a store the allow list names; each under an ordinary
 * read lock for the connection's length. */
#ifndef GMSFS_LOADER_SERVE_H
#define GMSFS_LOADER_SERVE_H

#include "net_wire.h"

struct sv_options {
	const char *mount;
	const char *addr;   /* "" for any */
	uint16_t port;
	uint8_t token[NW_TOKEN_MAX];
	size_t token_len;
	char **allow;       /* store names, or "*" */
	size_t nallow;
	int timeout_ms;     /* each wait on a peer */
};

/* The token of a file its owner alone reads (else -EPERM): its bytes less a final newline,
 * 16 to NW_TOKEN_MAX of them. */
int sv_read_token(const char *path, uint8_t *token, size_t *len, char *err, size_t errlen);
/* Serve until killed; -errno when it cannot listen. */
int sv_serve(const struct sv_options *o);

#endif
