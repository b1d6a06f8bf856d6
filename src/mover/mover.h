/* mover.h: the socket protocol between the daemon (vmm_cuda.c) and gmsfs-mover, its copy
 * helper for the host tier.  Both are built from this tree: no version. */
#ifndef GMSFS_MOVER_H
#define GMSFS_MOVER_H

#include <stdint.h>

#define MOVER_MAGIC 0x6d6f7665u /* "move" */
#define MOVER_FD 3              /* the helper's end of the socket */
#define MOVER_IDLE_S 10         /* the helper ends after this long without work */

/* One copy: with two descriptors, source then destination. */
struct mover_copy {
	uint32_t magic;
	uint32_t last;  /* 1: the batch's last copy, answer after it */
	uint64_t size;  /* of each allocation, bytes */
};

/* The answer to a batch. */
struct mover_reply {
	int32_t error;  /* 0, or an errno */
	char why[252];
};

#endif
