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
	uint8_t token[NW_TOKEN_MAX + 1]; /* sv_read_token's room */
	size_t token_len;
	char **allow;       /* store names, or "*" */
	size_t nallow;
	int timeout_ms;     /* each wait on a peer */
	int peers;          /* served at once, 1 to SV_PEERS_MAX */
};

#define SV_PEERS_MAX 16

/* The token of a file its owner alone reads (else -EPERM): its bytes less a final newline,
 * 16 to NW_TOKEN_MAX of them, into token (room for NW_TOKEN_MAX + 1: a longer file is
 * seen to be one). */
int sv_read_token(const char *path, uint8_t *token, size_t *len, char *err, size_t errlen);
/* Serve until killed, o->peers at once, each by a thread of its own; -errno when it
 * cannot listen. */
int sv_serve(const struct sv_options *o);

#endif
