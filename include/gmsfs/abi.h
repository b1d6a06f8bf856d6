/* gmsfs/abi.h: the contract between the gmsfs daemon and its clients, defined once.
 * libgmsfs and the daemon both include it; so can anyone who talks to a mount
 * without libgmsfs.  See gmsfs(5).
 *
 * 1. ioctl(2) on an open file of a mount, with one struct gmsfs_ioc:
 *    GMSFS_IOC_INFO        any file of a store: the store's lock and layout facts.
 *    GMSFS_IOC_LOCK        a store directory opened O_RDONLY|O_DIRECTORY: wait up to
 *                          timeout_ms for the lock in `mode` (read permission on STORE/lock
 *                          for RO, write permission for RW, as an open would check); the
 *                          directory handle then holds it like a handle of STORE/lock, until
 *                          closed.  The reply's ticket binds a socket connection to the handle.
 *    GMSFS_IOC_EXPORT      an allocation: a one-time ticket for its descriptor.
 *    GMSFS_IOC_EXPORT_ALL  a lock holder (STORE/lock or a locked directory): a ticket for
 *                          the descriptors and metadata of the whole layout the handle sees.
 *    GMSFS_IOC_CHANNEL     a lock holder: a ticket that binds a socket connection to it.
 *    GMSFS_IOC_UNLOCK      a directory that took the lock: give it back now.  Its close
 *                          would too, but the release reaches the daemon after close()
 *                          returned: a process that locks again at once must not find
 *                          itself still holding the old lock.  Also a read handle of
 *                          STORE/lock (a committed session's too): its read hold goes now.
 *    GMSFS_IOC_LET_GO      a store directory: the caller's read locks that this daemon kept
 *                          from the daemon before it (a restart or takeover while the caller
 *                          mapped the store: gmsfs(5), RESTART) are given back, one per call;
 *                          ENOLCK when it holds none.  On the mount's root, for a store
 *                          removed since (its name is gone): the one whose layout_hash the
 *                          caller sets.
 *    GMSFS_IOC_PAUSE       a store directory that holds a read lock: give it back, the
 *                          caller's mappings kept (gmsfs(5), Pause); a data-only writer may
 *                          write in place meanwhile, nothing else changes that memory.
 *                          LOCK on the same handle resumes it (remap says whether to map
 *                          again); UNLOCK or its close ends it.  ENOLCK without a read lock.
 *    Inputs are checked: size must be sizeof(struct gmsfs_ioc), flags 0 and reserved
 *    zero, else EINVAL.  An unknown command is ENOTTY.
 * 2. The daemon's socket (path in gmsfs_ioc.socket), AF_UNIX SOCK_SEQPACKET.  Every
 *    request is one struct gmsfs_sock_req, followed in the same message by body_len bytes
 *    of msgpack; GMSFS_REQ_MORE says the body goes on in the next message.  Each message
 *    must come from the process (thread group) and uid that made the ioctl.  Replies are
 *    msgpack maps (GMSFS_K_* keys, gmsfs(5)); manifests come in one or more messages,
 *    each with at most GMSFS_FDS_PER_MSG descriptors attached by SCM_RIGHTS.
 *
 * Every struct has fixed-width fields and explicit padding, so 32- and 64-bit callers
 * share one layout. */
#ifndef GMSFS_ABI_H
#define GMSFS_ABI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/ioctl.h>

/* ---- lock modes: what connect and GMSFS_IOC_LOCK ask for, what a handle holds ---- */
#define GMSFS_RO 1
#define GMSFS_RW 2
#define GMSFS_RW_OR_RO 3 /* a request only: RW on a store with nothing committed, else RO */
#define GMSFS_RW_DATA 4  /* a request only: RW whose session writes the committed allocations'
                          * bytes and changes no allocation or entry (GMS's RW_DATA); it
                          * waits, as a reader does, for a first commit */

#define GMSFS_BACKEND_HOST 1
#define GMSFS_BACKEND_CUDA 2

/* ---- names, limits and attributes of the tree ---- */
#define GMSFS_NAME_MAX 255          /* bytes of one path component */
#define GMSFS_PATH_MAX 4096         /* bytes of a path below allocs/ or meta/ */
#define GMSFS_TAG_MAX 255           /* bytes of a tag */
#define GMSFS_VALUE_MAX (1u << 20)  /* bytes of one metadata value */

#define GMSFS_XATTR_TAG "user.gms.tag"         /* allocation: its tag */
#define GMSFS_XATTR_ALLOC "user.gms.alloc"     /* entry: allocation path, relative to allocs/ */
#define GMSFS_XATTR_OFFSET "user.gms.offset"   /* entry: decimal byte offset in it */
#define GMSFS_XATTR_SIZE "user.gms.size"       /* entry: decimal bytes of its extent (optional) */
#define GMSFS_XATTR_PRIVATE "user.gms.private" /* entry: "1": each importer gets its own copy */
#define GMSFS_XATTR_NOTE "user.gms.note"       /* entry: "1": a note, which the layout hash leaves out */
#define GMSFS_XATTR_QUOTA "user.gms.quota"       /* store directory: most bytes its allocations hold */
#define GMSFS_XATTR_PRIORITY "user.gms.priority" /* store directory: -1000..1000, who stays on the device */
#define GMSFS_XATTR_MIN "user.gms.min"           /* store directory: bytes kept free for it while it holds less */
#define GMSFS_XATTR_VERSIONS "user.gms.versions" /* store directory: 1, or 2: a next version is built beside its readers */
#define GMSFS_XATTR_RESERVED "user.gms.reserved" /* store directory: address space its pages may fill (shown) */
#define GMSFS_XATTR_CONTENT "user.gms.content_hash" /* store directory: "GENERATION HEX", its bytes' hash (gmsfs(5)) */
#define GMSFS_XATTR_VERSION "user.gms.version" /* store directory: "GENERATION NAME", the last commit's name (gmsfs(5)) */
#define GMSFS_VERSION_NAME_MAX 64 /* a version name's bytes: A-Z a-z 0-9 . _ - : + @, the first a letter or digit */

/* Entry flags (the hash covers them). */
#define GMSFS_ENTRY_PRIVATE 1u
/* A note about the layout, which its hash leaves out (gmsfs(5), user.gms.note): what a client
 * keeps beside the layout and may change without changing it (GMS's allocation ids). */
#define GMSFS_ENTRY_NOTE 2u
#define GMSFS_ENTRY_FLAGS 3u /* every flag defined */

/* A path below allocs/ or meta/: components of 1..GMSFS_NAME_MAX bytes, no "", ".", ".."
 * or NUL; no leading, trailing or doubled '/'.  The kernel would resolve a ".." before
 * the daemon saw it, so clients check too. */
static inline bool gmsfs_path_valid(const char *path, size_t len)
{
	if (!len || len > GMSFS_PATH_MAX || memchr(path, '\0', len))
		return false;
	size_t start = 0;
	for (size_t i = 0; i <= len; i++) {
		if (i < len && path[i] != '/')
			continue;
		size_t clen = i - start;
		if (!clen || clen > GMSFS_NAME_MAX)
			return false;
		if ((clen == 1 && path[start] == '.') || (clen == 2 && path[start] == '.' && path[start + 1] == '.'))
			return false;
		start = i + 1;
	}
	return true;
}

/* A tag: 1..GMSFS_TAG_MAX bytes, no control characters. */
static inline bool gmsfs_tag_valid(const char *tag, size_t len)
{
	if (!len || len > GMSFS_TAG_MAX)
		return false;
	for (size_t i = 0; i < len; i++)
		if ((unsigned char)tag[i] < 0x20 || tag[i] == 0x7f)
			return false;
	return true;
}

/* ---- ioctl ---- */
#define GMSFS_TICKET_LEN 16 /* bytes of a one-time ticket */
#define GMSFS_HASH_LEN 16   /* bytes of a layout hash (XXH3-128) */
#define GMSFS_IOC_MAGIC 0xE6 /* free in Documentation/userspace-api/ioctl/ioctl-number.rst (fuse is 0xE5) */

struct gmsfs_ioc {
	/* in */
	uint32_t size;          /* sizeof(struct gmsfs_ioc) */
	uint32_t flags;         /* LOCK: GMSFS_LOCK_ASKS_IN_PLACE, GMSFS_LOCK_OWN; others: 0 */
	uint32_t mode;          /* LOCK: GMSFS_RO, GMSFS_RW or GMSFS_RW_OR_RO; others: 0 */
	int32_t timeout_ms;     /* LOCK: -1 waits as long as it takes, 0 tries once; others: 0 */
	uint64_t reserved[4];   /* 0 */
	/* out */
	uint32_t lock;          /* what the handle holds: GMSFS_RO, GMSFS_RW or 0 */
	uint32_t backend;       /* GMSFS_BACKEND_* */
	int32_t device;         /* device index */
	uint32_t has_hash;      /* 1 when layout_hash is set (something was committed) */
	uint64_t generation;    /* commits so far */
	uint64_t granularity;   /* allocation sizes are rounded up to this */
	uint64_t count;         /* allocations: 1 for EXPORT, the layout's for the others */
	uint64_t size_bytes;    /* their requested sizes, summed */
	uint64_t aligned_bytes; /* their aligned sizes, summed */
	uint8_t layout_hash[GMSFS_HASH_LEN]; /* committed layout, XXH3-128, canonical (big-endian) bytes */
	uint8_t ticket[GMSFS_TICKET_LEN]; /* LOCK, EXPORT, EXPORT_ALL, CHANNEL: present once on the socket */
	char socket[108];       /* the socket's path, NUL-terminated */
	uint32_t remap;         /* LOCK that resumed a paused handle: 1 when its memory changed
	                         * since it paused (a version committed beside it): map again */
};

/* LOCK's flags: a paused handle resumed into a writer's session says before it writes the
 * last commit's bytes through the mappings it kept (EXPORT with GMSFS_K_IN_PLACE); without
 * it the resume itself counts as such a write (TORN if the session ends without commit). */
#define GMSFS_LOCK_ASKS_IN_PLACE 0x1u
/* LOCK: the handle is a session of its own, as a GMS connection is (gmsfs(5), "Sessions of
 * their own"): it waits as another process's request would.  It does not join its
 * process's writer session, a read does not pass waiting writers because its process
 * reads already, and a write waits for its own process's reads (it is a waiting writer,
 * granted when they end) where a plain request is refused with EDEADLK at once. */
#define GMSFS_LOCK_OWN 0x2u

#define GMSFS_IOC_INFO       _IOWR(GMSFS_IOC_MAGIC, 1, struct gmsfs_ioc)
#define GMSFS_IOC_LOCK       _IOWR(GMSFS_IOC_MAGIC, 2, struct gmsfs_ioc)
#define GMSFS_IOC_EXPORT     _IOWR(GMSFS_IOC_MAGIC, 3, struct gmsfs_ioc)
#define GMSFS_IOC_EXPORT_ALL _IOWR(GMSFS_IOC_MAGIC, 4, struct gmsfs_ioc)
#define GMSFS_IOC_CHANNEL    _IOWR(GMSFS_IOC_MAGIC, 5, struct gmsfs_ioc)
#define GMSFS_IOC_UNLOCK     _IOWR(GMSFS_IOC_MAGIC, 6, struct gmsfs_ioc)
#define GMSFS_IOC_LET_GO     _IOWR(GMSFS_IOC_MAGIC, 7, struct gmsfs_ioc)
#define GMSFS_IOC_PAUSE      _IOWR(GMSFS_IOC_MAGIC, 8, struct gmsfs_ioc)

/* ---- the socket ---- */
#define GMSFS_SOCK_MAGIC 0x58534d47u /* "GMSX" little-endian */
#define GMSFS_SOCK_VERSION 2
struct gmsfs_sock_req {
	uint32_t magic;         /* GMSFS_SOCK_MAGIC */
	uint16_t version;       /* GMSFS_SOCK_VERSION */
	uint16_t op;            /* GMSFS_OP_* */
	uint8_t ticket[GMSFS_TICKET_LEN]; /* REDEEM, BIND: the ticket; otherwise zero */
	uint32_t flags;         /* GMSFS_REQ_MORE */
	uint32_t body_len;      /* bytes of msgpack after this header, in this message */
};
#define GMSFS_REQ_MORE 1u       /* the body continues in the next message */

/* Ops.  REDEEM and BIND present a ticket; the rest need a connection bound by BIND
 * (a writer's: a handle that holds the writer session, opened for writing). */
enum gmsfs_op {
	GMSFS_OP_REDEEM = 1,    /* the export an EXPORT or EXPORT_ALL ticket stands for */
	GMSFS_OP_BIND = 2,      /* bind this connection to the ticket's handle: {err} */
	GMSFS_OP_EXPORT = 3,    /* {paths?, fds, meta}: a manifest of the layout the handle sees */
	GMSFS_OP_CREATE = 4,    /* {allocs: [{path, size, tag}]}: a manifest of them, read-write */
	GMSFS_OP_FREE = 5,      /* {paths}: remove allocations and the entries naming them */
	GMSFS_OP_META_PUT = 6,  /* {entries: [{key, alloc, offset, size, flags, value}]} */
	GMSFS_OP_META_DELETE = 7, /* {keys} */
	GMSFS_OP_COMMIT = 8,    /* validate, hash, publish: {err, msg} */
	GMSFS_OP_HANDOVER = 9,  /* daemon to daemon (gmsfs -o takeover): no body, no ticket */
	GMSFS_OP_FLIP = 10,     /* a reader of a store with versions: move to the last commit; a
	                         * manifest of the allocations that changed, read-only (no body) */
	GMSFS_OP_KEEP = 11,     /* commit, the session going on, kept: its end rolls back to this
	                         * layout, never torn (an elastic store's pages only; no body) */
	GMSFS_OP_COMMIT_NAMED = 12, /* {name}: COMMIT, the commit called name (gmsfs(5), NAMED
	                         * VERSIONS) in the same round trip: EINVAL not a name, EEXIST the
	                         * store's already; a failure commits nothing and keeps no name */
	GMSFS_OP_COMMIT_LEAVE = 13, /* {name?}: COMMIT (COMMIT_NAMED with name), then the holds the
	                         * committing process has from the session (the bound handle's, its
	                         * STORE/lock's) go, as its UNLOCKs would: a writer that disconnects
	                         * after its commit (gmsfs_commit_disconnect); a failure changes nothing */
	GMSFS_OP_SOON = 14,     /* no body, and the one op without a reply: the connection's next
	                         * request follows within milliseconds (a commit once the copies
	                         * queued land), so its thread watches for it, up to
	                         * GMSFS_SOON_WATCH_MS, instead of sleeping, where the daemon spins
	                         * (GMSFS_SPIN_US, 8 cores), once a request served; a writer's only
	                         * (EPERM, ENOLCK unbound: answered, then hung up) */
	GMSFS_OP_UNLOCK = 15,   /* no body: the bound store directory's read lock given back, as its
	                         * GMSFS_IOC_UNLOCK would, the connection unbound (the reply its last
	                         * on that binding): a reader's unmap_all sends it before it unmaps
	                         * and reads the reply after.  EPERM: not a read lock of a store
	                         * directory (the writer session ends by its ioctl, or a commit) */
	GMSFS_OP_MAX = 15
};

#define GMSFS_SOON_WATCH_MS 50       /* how long a SOON keeps its connection's thread watching */
#define GMSFS_FDS_PER_MSG 253        /* SCM_MAX_FD */
/* An allocation larger than the mount's piece size (gmsfs -o piece_bytes=) is memory in
 * pieces, each its own descriptor, mapped side by side: at most this many, all in one
 * message of a manifest. */
#define GMSFS_PIECES_MAX 64
/* Allocations named below this (PAGES/<range>/<number>) are an elastic store's pages
 * (libgmsfs's gmsfs_pages_*): the daemon keeps one given back for the store's next. */
#define GMSFS_PAGES_PREFIX "pages/"
#define GMSFS_MSG_MAX 65536          /* bytes of msgpack in one message, at most */
#define GMSFS_REQ_BODY_MAX (256u << 20) /* bytes of one request's body, all messages */

/* Keys of the msgpack maps on the socket (gmsfs(5) spells out each message). */
#define GMSFS_K_VERSION "v"         /* 2 */
#define GMSFS_K_ERR "err"           /* errno, 0 on success */
#define GMSFS_K_MSG "msg"           /* why, in words */
#define GMSFS_K_TOTAL "total"       /* manifest: allocations in the whole reply */
#define GMSFS_K_NENTRIES "nentries" /* manifest: metadata entries in the whole reply */
#define GMSFS_K_FIRST "first"       /* manifest: index of this message's first allocation */
#define GMSFS_K_LAST "last"         /* manifest: true on the reply's last message */
#define GMSFS_K_GEN "gen"           /* manifest (optional): the generation it shows */
#define GMSFS_K_ALLOCS "allocs"     /* array of allocation maps */
#define GMSFS_K_META "meta"         /* array of entry maps (values in chunks) */
#define GMSFS_K_PATH "path"
#define GMSFS_K_PATHS "paths"
#define GMSFS_K_SIZE "size"
#define GMSFS_K_ALIGNED "aligned"
#define GMSFS_K_TAG "tag"
#define GMSFS_K_FD "fd"             /* index into the message's descriptors */
#define GMSFS_K_FD_OFFSET "fdoff"   /* where the allocation starts in that descriptor */
#define GMSFS_K_PIECE "piece"       /* an allocation in pieces: the size of each but the last */
#define GMSFS_K_PIECES "pieces"     /* and each piece's [fd, fdoff], in order (fd, fdoff: the first's) */
#define GMSFS_K_KEY "key"
#define GMSFS_K_KEYS "keys"
#define GMSFS_K_ALLOC "alloc"
#define GMSFS_K_OFFSET "offset"
#define GMSFS_K_FLAGS "flags"
#define GMSFS_K_VALUE "value"       /* bytes (msgpack bin) */
#define GMSFS_K_VALUE_LEN "vlen"    /* the whole value's length */
#define GMSFS_K_VALUE_OFF "voff"    /* where this chunk starts in the value */
#define GMSFS_K_FDS "fds"           /* EXPORT: send descriptors (false: the manifest only) */
#define GMSFS_K_WANT_META "withmeta" /* EXPORT: include the metadata entries */
#define GMSFS_K_IN_PLACE "inplace"  /* EXPORT (a writer's): the named allocations writable, to write
                                     * the last commit's bytes in place (said ahead: TORN if the
                                     * session then ends without commit) */
#define GMSFS_K_OVERWRITE "overwrite" /* EXPORT (a writer's, optional, true): it writes every byte
                                     * of what it asks for: a next version's memory of those is
                                     * made without a copy of the last commit's bytes */
#define GMSFS_K_RO "ro"             /* manifest (optional, true): a writer's allocation of the last
                                     * commit, sent read-only: map it read-only until an EXPORT
                                     * with inplace asks for it writable */
#define GMSFS_K_ENTRIES "entries"   /* META_PUT: array of entry maps */
#define GMSFS_K_NAME "name"         /* COMMIT_NAMED: the commit's version name */

#ifdef __cplusplus
static_assert(sizeof(struct gmsfs_ioc) == 248, "gmsfs_ioc layout");
static_assert(sizeof(struct gmsfs_sock_req) == 32, "gmsfs_sock_req layout");
#else
_Static_assert(sizeof(struct gmsfs_ioc) == 248, "gmsfs_ioc layout");
_Static_assert(sizeof(struct gmsfs_sock_req) == 32, "gmsfs_sock_req layout");
#endif

#endif
