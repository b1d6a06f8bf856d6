/* gmsfs_ioctl.h: the daemon's binary interface, for libgmsfs and for anyone
 * who talks to a gmsfs mount without it.
 *
 * 1. ioctl(2) on an open file of a mount, with one struct gmsfs_ioc:
 *    GMSFS_IOC_INFO        any file of a store: the store's lock and layout facts.
 *    GMSFS_IOC_LOCK        a store directory opened O_RDONLY|O_DIRECTORY: wait up to
 *                          timeout_ms for the lock in `mode`; the directory handle then
 *                          holds it, exactly like a handle of STORE/lock, until closed.
 *    GMSFS_IOC_EXPORT      an allocation: a one-time ticket for its descriptor.
 *    GMSFS_IOC_EXPORT_ALL  a lock holder (STORE/lock or a locked directory): a ticket for
 *                          the descriptors of the whole layout the handle sees.
 *    Inputs are checked: size must be sizeof(struct gmsfs_ioc), flags 0 and reserved
 *    zero, else EINVAL.  An unknown command is ENOTTY.
 * 2. The export socket (path in gmsfs_ioc.socket), AF_UNIX SOCK_SEQPACKET.  The client
 *    sends one struct gmsfs_sock_req per ticket, from the process (thread group) and uid
 *    that made the ioctl.  Replies: one or more messages, each a msgpack map (the
 *    manifest, see gmsfs(5)) with at most GMSFS_FDS_PER_MSG descriptors attached by
 *    SCM_RIGHTS, in the manifest's order; the last one has "last": true.
 *
 * Every field has a fixed width and explicit padding, so 32- and 64-bit callers
 * share one layout. */
#ifndef GMSFS_IOCTL_H
#define GMSFS_IOCTL_H

#include <stdint.h>
#include <sys/ioctl.h>

#define GMSFS_IOC_MAGIC 0xE6 /* free in Documentation/userspace-api/ioctl/ioctl-number.rst (fuse is 0xE5) */

/* Lock modes (gmsfs_ioc.mode in, gmsfs_ioc.lock out). */
#define GMSFS_LOCK_RO 1
#define GMSFS_LOCK_RW 2
#define GMSFS_LOCK_RW_OR_RO 3 /* request only: RW on a store with nothing committed, else RO */

#define GMSFS_BACKEND_HOST 1
#define GMSFS_BACKEND_CUDA 2

struct gmsfs_ioc {
	/* in */
	uint32_t size;          /* sizeof(struct gmsfs_ioc) */
	uint32_t flags;         /* none defined: 0 */
	uint32_t mode;          /* LOCK: GMSFS_LOCK_*; others: 0 */
	int32_t timeout_ms;     /* LOCK: -1 waits as long as it takes, 0 tries once; others: 0 */
	uint64_t reserved[4];   /* 0 */
	/* out */
	uint32_t lock;          /* what the handle holds: GMSFS_LOCK_RO, GMSFS_LOCK_RW or 0 */
	uint32_t backend;       /* GMSFS_BACKEND_* */
	int32_t device;         /* device index */
	uint32_t has_hash;      /* 1 when layout_hash is set (something was committed) */
	uint64_t generation;    /* commits so far */
	uint64_t granularity;   /* allocation sizes are rounded up to this */
	uint64_t count;         /* allocations: 1 for EXPORT, the layout's for the others */
	uint64_t size_bytes;    /* their requested sizes, summed */
	uint64_t aligned_bytes; /* their aligned sizes, summed */
	uint8_t layout_hash[16];/* committed layout, XXH3-128, canonical (big-endian) bytes */
	uint8_t ticket[16];     /* EXPORT, EXPORT_ALL: present once on the socket */
	char socket[108];       /* the export socket's path, NUL-terminated */
	uint32_t pad;
};

#define GMSFS_IOC_INFO       _IOWR(GMSFS_IOC_MAGIC, 1, struct gmsfs_ioc)
#define GMSFS_IOC_LOCK       _IOWR(GMSFS_IOC_MAGIC, 2, struct gmsfs_ioc)
#define GMSFS_IOC_EXPORT     _IOWR(GMSFS_IOC_MAGIC, 3, struct gmsfs_ioc)
#define GMSFS_IOC_EXPORT_ALL _IOWR(GMSFS_IOC_MAGIC, 4, struct gmsfs_ioc)

/* One request on the export socket: exactly this many bytes. */
#define GMSFS_SOCK_MAGIC 0x58534d47u /* "GMSX" little-endian */
#define GMSFS_SOCK_VERSION 1
struct gmsfs_sock_req {
	uint32_t magic;         /* GMSFS_SOCK_MAGIC */
	uint16_t version;       /* GMSFS_SOCK_VERSION */
	uint16_t op;            /* 1: redeem a ticket */
	uint8_t ticket[16];
	uint64_t reserved;      /* 0 */
};
#define GMSFS_SOCK_OP_REDEEM 1

#define GMSFS_FDS_PER_MSG 253   /* SCM_MAX_FD */
#define GMSFS_MANIFEST_MAX 65536 /* bytes of msgpack per message, at most */

#ifdef __cplusplus
static_assert(sizeof(struct gmsfs_ioc) == 248, "gmsfs_ioc layout");
static_assert(sizeof(struct gmsfs_sock_req) == 32, "gmsfs_sock_req layout");
#else
_Static_assert(sizeof(struct gmsfs_ioc) == 248, "gmsfs_ioc layout");
_Static_assert(sizeof(struct gmsfs_sock_req) == 32, "gmsfs_sock_req layout");
#endif

#endif
