/* libgmsfs internals: the handle, the export client (xp_) and the mapping
 * backends (one per memory backend of the daemon). */
#ifndef GMSFS_INTERNAL_H
#define GMSFS_INTERNAL_H

#include "gmsfs.h"
#include "gmsfs_ioctl.h"

#include <stdbool.h>
#include <stdint.h>

#ifdef GMSFS_HAVE_CUDA
#include "cuda_api.h"
#endif

/* How a client maps the descriptors of one backend.  Errors: -errno, with words in err. */
struct gm_backend {
	const char *name;
	/* Ready to map in this thread?  (cuda: a current context.) */
	int (*attach)(gmsfs *g, char *err, size_t errlen);
	/* Reserve aligned bytes of address space, mapped to nothing. */
	int (*reserve)(gmsfs *g, uint64_t aligned, void **va);
	/* Give the range back (unmapping first if mapped). */
	void (*unreserve)(gmsfs *g, void *va, uint64_t aligned, bool mapped);
	/* Map fd (not consumed) over the reservation at va. */
	int (*map)(gmsfs *g, void *va, uint64_t aligned, int fd, bool writable, char *err, size_t errlen);
	/* Unmap, keeping the reservation. */
	int (*unmap)(gmsfs *g, void *va, uint64_t aligned);
	int (*protect_ro)(gmsfs *g, void *va, uint64_t aligned);
};
extern const struct gm_backend gm_host_backend;
#ifdef GMSFS_HAVE_CUDA
extern const struct gm_backend gm_cuda_backend;
#endif

struct gmsfs {
	char *dir;              /* the store directory */
	int dirfd;              /* its open handle: holds the lock; -1 while unmapped */
	int mode;               /* what connect asked for */
	int lock;               /* GMSFS_RO, GMSFS_RW or 0 */
	int unmapped_lock;      /* the lock given up by unmap_all */
	struct gmsfs_ioc info;  /* the latest facts from the daemon */
	uint8_t saved_hash[16]; /* the layout at unmap_all */
	bool saved_has_hash;
	const struct gm_backend *be;
#ifdef GMSFS_HAVE_CUDA
	struct cu_api cu;       /* loaded at the first connect to a cuda store */
	CUdevice cudev;         /* the device of the caller's context */
#endif
	struct gmsfs_mapping *maps; /* what gmsfs_mappings shows */
	bool *mapped;           /* maps[i] is mapped now (else only reserved) */
	size_t nmaps, cap;      /* both arrays have cap elements */
	size_t *index;          /* open addressing by name: map index + 1, 0 empty */
	size_t index_cap;       /* a power of two, at least twice nmaps */
	char err[512];
};

int gm_error(gmsfs *g, int e, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* ---- export client ---- */
struct xp_entry {
	char *path, *tag;
	uint64_t size, aligned;
	int fd;
};

/* One message of the export socket, parsed (descriptors are attached apart). */
struct xp_manifest {
	int err;
	char msg[256];
	uint64_t total, first;
	bool last;
	struct xp_entry *v;
	size_t n;
};
/* Parse and check one message; 0 or -EPROTO (with the reason in why). */
int xp_parse(const void *buf, size_t len, struct xp_manifest *m, char *why, size_t whylen);
void xp_manifest_free(struct xp_manifest *m);

/* ioctl(fd, cmd) for a ticket, then fetch the descriptors from the socket.
 * On success *v holds *n entries, each with an fd the caller closes (xp_free). */
int xp_fetch(gmsfs *g, int fd, unsigned long cmd, struct xp_entry **v, size_t *n);
void xp_free(struct xp_entry *v, size_t n);

#endif
