/* vmm_cuda_open: the cuda backend's device: its state and its buffers (what vmm_cuda.c and
 * vmm_cuda_open.c share), and its opening. */
#ifndef GMSFS_VMM_CUDA_OPEN_H
#define GMSFS_VMM_CUDA_OPEN_H

#include "vmm.h"
#include "cuda_api.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <sys/types.h>

struct cuda_priv {
	struct cu_api cu;
	CUdevice dev;
	CUmemAllocationProp prop;
	CUmemAllocationProp host_prop; /* the host tier: pinned host memory, exportable */
	pthread_mutex_t mover_mu;      /* one user of the helper's socket at a time */
	unsigned in_flight;            /* a switch's batches sent and not yet answered (mover_mu held) */
	bool mover_stays;              /* copies_ready: the helper runs on when idle */
	int mover_sock;                /* -1: no helper running */
	pid_t mover_pid;
	/* Host memory the helper may keep mapped (mover.h): each allocation's key, and the
	 * keys of those freed since, told to the helper at the next chance (MOVER_FORGET). */
	atomic_uint_fast64_t next_key;
	pthread_mutex_t forget_mu;
	uint64_t *forget;
	size_t nforget, forget_cap;
	bool unstay;                   /* under forget_mu: the helper to be told MOVER_UNSTAY */
	/* Opened from known facts (cuda_open_known): the driver is opened on opener, and what
	 * needs it (a create) waits.  ready, under ready_mu: 1 open, 0 opening, -errno not. */
	pthread_mutex_t ready_mu;
	pthread_cond_t ready_cv;
	int ready;
	bool wanted;                   /* a create waits for it: no waiting for a quiet mount */
	bool ending;                   /* the daemon ends: an opener not yet opening opens nothing */
	bool opening;                  /* opener was started: joined at the end */
	pthread_t opener;
	struct vmm_known known;
	atomic_bool released;          /* device memory released since the last create (cuda_settle) */
};

struct cuda_buf {
	struct vmm_buf b; /* first: the daemon sees a vmm_buf */
	CUmemGenericAllocationHandle h;
	uint64_t key; /* host memory: its key for the helper (mover.h); 0: device memory */
};

/* The backend's open: the driver and the device before it returns; cuda_open_known: at
 * once from the facts, the driver on a thread of its own (vmm.h, open_known). */
int cuda_open(struct vmm *v, const char *device, char *err, size_t errlen);
int cuda_open_known(struct vmm *v, const struct vmm_known *k, char *err, size_t errlen);
/* The driver, once opened: 0, or -ENODEV where it did not open behind the start. */
int cuda_driver_ready(struct cuda_priv *p);
/* The end of what the open made (the opener's thread joined first). */
void cuda_priv_free(struct cuda_priv *p);

#endif
