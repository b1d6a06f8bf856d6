/* image: a committed store as records (common/wire.h, wire_image) and the descriptors
 * that hold its memory: what a handover gives the next daemon and what a state file
 * keeps for a restart (gmsfs(5), RESTART).  Everything under fs->mu. */
#ifndef GMSFS_FS_IMAGE_H
#define GMSFS_FS_IMAGE_H

#include "fs.h"

#include <msgpack.h>

struct store;

/* Memory an image names: an allocation's descriptor and where it starts in it. */
struct image_ref {
	int fd;
	uint64_t offset;
};

/* The distinct descriptors of an image, in the order its records index them: the
 * buffers' own (not the caller's to close); and the memory of each allocation. */
struct image_fds {
	int *v;
	size_t n, cap;
	struct image_ref *refs;
	size_t nrefs, refs_cap;
};

struct image_pack_opts {
	/* A state file's: the name each descriptor has in the service manager's store. */
	const char *(*fdname)(void *arg, int fd);
	void *arg;
	/* A handover's: the processes that hold read locks, so that the next daemon keeps
	 * their holds (a state file keeps them apart: they change more often). */
	bool readers;
	/* The host memory each allocation has on standby (made ahead, or from its last move
	 * in), so that the next daemon does not pin it again: a handover's and a state
	 * file's (saved again when it comes or goes: tier.c, tier_move.c). */
	bool standby;
};

/* Append st's committed layout (what a reader outside any session sees) to sb, its
 * descriptors to fds (an image's indices start at 0 whatever fds held before), each
 * allocation's memory where it is now (a switch moves a store piece by piece: its
 * allocations then say their tiers).  0 or -errno. */
int image_pack(struct store *st, msgpack_sbuffer *sb, struct image_fds *fds, const struct image_pack_opts *o);
void image_fds_free(struct image_fds *f);
/* The memory of st's committed allocations (what an image of it names), one reference
 * each, appended to out.  0 or -ENOMEM (out emptied). */
int image_committed_bufs(struct store *st, struct vmm_bufs *out);

/* Called for each descriptor an image's memory now lies in, in this daemon: its index in
 * the image, and the daemon's own descriptor (the backend's dup). */
typedef void image_adopted_fn(void *arg, const struct store *st, uint64_t index, int fd);

/* The image whose head is at *off of buf (len bytes), as a new committed store: its
 * records, its memory at fds[index] (each dup'd by the backend: fds stay the caller's),
 * its layout hash checked against the image's.  *off moves past it (on failure: somewhere
 * inside).  -errno and why (the store named): nothing is left behind. */
int image_restore(struct fs *fs, const uint8_t *buf, size_t len, size_t *off, const int *fds, size_t nfds,
		  image_adopted_fn *adopted, void *arg, struct store **out, char *why, size_t whylen);

/* The head at *off without moving it: 0 and h (wire_image_free it), or -errno and why. */
struct wire_image;
int image_head(const uint8_t *buf, size_t len, size_t off, struct wire_image *h, char *why, size_t whylen);

#endif
