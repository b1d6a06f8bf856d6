/* options: the daemon's -o options (gmsfs(8)): parsed and checked, kept from the daemon
 * a takeover replaces, and said back in the device file's options line. */
#ifndef GMSFS_FS_OPTIONS_H
#define GMSFS_FS_OPTIONS_H

#include "fs.h"
#include "handover.h"

#include <stdint.h>

struct options {
	int allow_other;
	char *backend;
	char *device;
	char *socket;
	char *max_bytes;
	char *host_bytes;
	char *piece_bytes;     /* allocations past this size are made of pieces (vmm_pieces.c) */
	int host_ahead;        /* make committed stores' host memory ahead of their first move out
	                        * (1, the default; 0: no_host_ahead; -1: not said) */
	int next_ahead;        /* make a store's next version's memory ahead, between refits
	                        * (1, the default; 0: no_next_ahead; -1: not said) */
	char *mover;           /* the cuda backend's copy helper for the host tier */
	char *fsname;          /* the mount's source, as mount(8) and fstab name it */
	int ready_fd;
	int detach_fd;         /* without -f: where the waiting parent learns that the mount is live */
	int max_threads;
	int gpu;               /* the gpu label of the metrics (-1: the device's index) */
	int takeover;          /* take the stores of the daemon serving the mount point over */
	char *state;           /* keep what a restart needs here (and in the service manager) */
	unsigned fdstore;      /* descriptors the service manager keeps (FileDescriptorStoreMax=) */
	/* Where a start's time went (the serving line says it): its beginning, the device
	 * opened, the stores handed over or restored. */
	uint64_t t_begin, t_device, t_stores;
};

/* 0: go on; otherwise the exit status (help and version: -1, for 0; bad options: 2). */
int options_parse(struct fuse_args *args, struct options *opts, struct fuse_cmdline_opts *cmd, uint64_t *max_bytes,
		  const char *prog);
/* Takeover: what the command line leaves unset comes from the daemon replaced.  0, or 2. */
int options_inherit(struct options *o, struct fuse_args *args, const struct handover_peer *peer, uint64_t *max_bytes);
/* The device file's options line: what a successor keeps.  NULL: out of memory. */
char *options_text(const struct fs *fs, const struct options *o);
/* The copy helper's path: as asked, else beside this binary, else the package's. */
const char *options_mover(const char *asked);
/* What the options own. */
void options_free(struct options *o);

#endif
