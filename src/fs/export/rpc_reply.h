/* rpc_reply: what a socket request's reply carries, copied under fs->mu (rpc.c collects
 * it), and its sending after: a plain reply, an error with words, or a manifest in
 * messages of at most RPC_FDS_PER_MSG descriptors and GMSFS_MSG_MAX bytes. */
#ifndef GMSFS_FS_RPC_REPLY_H
#define GMSFS_FS_RPC_REPLY_H

#include "../handle.h"
#include "entry.h"
#include "wire.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Descriptors per message: few, so a client that maps and closes each message's
 * descriptors before the next keeps its descriptor table small.  Growing that table
 * in a process with threads (every CUDA process) waits for an RCU grace period, and
 * 128 descriptors in one message cost a fresh CUDA process (which holds ~38 already)
 * 15-30 ms on an H100 machine, 16 at a time under 2 ms in all (bench-gpu). */
#define RPC_FDS_PER_MSG 16

struct xalloc {
	char *path, *tag;
	uint64_t size, aligned;
	struct vmm_buf *buf; /* a reference, put when sent */
	bool ro;             /* the last commit's bytes, sent read-only to their writer */
};

struct xset {
	struct xalloc *a;
	size_t na, cap_a;
	struct entry_rec *e;
	size_t ne, cap_e;
	bool read_only, fds;
	bool in_place; /* a committed allocation's memory, writable: the session may write it in place */
	/* A plain writer's session (not data-only, not kept) gets the last commit's allocations
	 * read-only (GMSFS_K_RO), unless it asks to write them in place (GMSFS_K_IN_PLACE):
	 * a writer that only read them leaves the last commit whole when it dies. */
	bool guard, ask_in_place;
	const struct fs_handle *h; /* whose view: which version's memory (version_buf) */
	bool has_gen;  /* a flip's reply says the generation it shows */
	uint64_t gen;
};

/* Everything s holds let go (its references put). */
void reply_free(struct xset *s);
/* A plain reply (no manifest); an error with its words; a manifest of s.  0 or -errno. */
int reply_plain(int sock, const struct wire_head *h);
int reply_error(int sock, int err, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
int reply_set(int sock, const struct xset *s);

#endif
