/* mover.h: the socket protocol between the daemon (vmm_cuda.c) and gmsfs-mover, its copy
 * helper for the host tier.  Both are built from this tree: no version. */
#ifndef GMSFS_MOVER_H
#define GMSFS_MOVER_H

#include <stdint.h>

#define MOVER_MAGIC 0x6d6f7665u /* "move" */
#define MOVER_FD 3              /* the helper's end of the socket */
#define MOVER_IDLE_S 10         /* the helper ends after this long without work */
#define MOVER_LINGER_S 3        /* and this long after its daemon went (mover.c, linger) */

/* The source stays after the answer (host memory the daemon keeps for the next move
 * out): its mapping may go after the answer, off the move's time.  Without it the
 * source is unmapped first (device memory is freed as soon as the answer comes, and a
 * mapping would hold it). */
#define MOVER_SOURCE_STAYS 1u
/* Not a copy: no descriptors, and no answer.  The mapping kept under src_key goes (the
 * daemon freed that host memory).  Sent between batches only. */
#define MOVER_FORGET 2u
/* Not a copy either: from now on the helper runs on when idle, as if started with
 * "stay" (the host memory it keeps mapped stays with it). */
#define MOVER_STAY 4u
/* Not a copy either: nothing the daemon holds needs the helper any more (no host memory
 * left): it ends once idle MOVER_IDLE_S, as if started without "stay", and its context's
 * device memory goes back. */
#define MOVER_UNSTAY 8u

/* One copy: with two descriptors, source then destination.  A key (nonzero) names host
 * memory the daemon keeps across moves (a store's host tier, what it keeps for its next
 * move out): the helper keeps that mapping under the key and uses it again, until a
 * MOVER_FORGET names it.  Mapping 1 GiB of host memory costs the helper milliseconds:
 * a switch would spend more of its time mapping than copying. */
struct mover_copy {
	uint32_t magic;
	uint32_t last;  /* 1: the batch's last copy, answer after it */
	uint64_t size;  /* of each allocation, bytes */
	uint32_t flags; /* MOVER_SOURCE_STAYS or MOVER_FORGET; no other bit may be set */
	uint32_t reserved; /* 0 */
	uint64_t src_key, dst_key; /* 0: not kept */
};

/* The answer to a batch. */
struct mover_reply {
	int32_t error;  /* 0, or an errno */
	char why[252];
};

#endif
