/* keep's own, shared by keep.c (the service manager's store, the images on disk, the
 * stores' hooks) and keep_start.c (the start: the stores the manager passed back).
 * Not part of keep's interface (keep.h). */
#ifndef GMSFS_FS_KEEP_INTERNAL_H
#define GMSFS_FS_KEEP_INTERNAL_H

#include "keep.h"
#include "keep_disk.h"
#include "image.h"
#include "lock.h"
#include "store.h"
#include "wire.h"

#include <pthread.h>
#include <stdbool.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/un.h>

#define KEEP_NAME 40
#define LISTEN_FDS_START 3

struct kept_fd {                /* by descriptor number */
	char name[KEEP_NAME];       /* "": not in the manager's store */
	const void *owner;          /* the store whose image on disk names it, or NULL */
	uint64_t stamp;             /* the last image write that named it */
};

struct pending {                /* closed, but an image on disk still names it */
	char name[KEEP_NAME];
	const void *owner;
};

struct failed {
	char *store, *why;
};

struct keep {
	pthread_mutex_t mu;         /* everything below */
	char dir[3584];
	unsigned max_fds, nkept;
	bool gone;                  /* the manager's socket does not answer: what it held went with it
	                             * (status.json says 0 kept until everything is handed anew) */
	struct kept_fd *fds;
	size_t nfds;
	struct pending *pending;
	size_t npending, pending_cap;
	struct failed *failed;
	size_t nfailed, failed_cap;
	size_t restored;
	uint64_t serial, stamp;
	char prefix[24];            /* this daemon's names: unique across restarts */
	int sock;                   /* a datagram socket for NOTIFY_SOCKET */
	struct sockaddr_un addr;
	socklen_t alen;
	/* Whether the manager's store holds what the images on disk name (keep_watch.c): off
	 * when it went (a keeper killed) or a message to it failed, and why; the socket's
	 * file as last seen (another inode there: a new manager, which holds nothing yet). */
	bool armed;
	char why[256];
	dev_t sock_dev;
	ino_t sock_ino;
	struct timespec sock_ctime; /* with the inode: a socket bound anew at once may reuse its number */
	unsigned retry_s, retry_in_s; /* a failed hand-over is tried again after these seconds */
	pthread_t watch;
	pthread_cond_t wake;
	bool watching, stopping;
	/* The state directory's writes (keep_disk.h): while one has not returned, the stores
	 * are not kept (said beside armed); once it has (disk_back), keep_watch writes every
	 * store's image again. */
	struct keep_disk *disk;
	bool disk_back;
};

/* keep's record of a store (st->kept). */
struct kept_store {
	struct image_ref *named;    /* the memory its image on disk names, sorted */
	size_t nnamed;
	struct wire_reader *readers; /* as its readers file says, by pid */
	size_t nreaders;
};

/* k->mu held: the manager's store forgets name (FDSTOREREMOVE=1). */
void keep_remove_name(struct keep *k, const char *name);
/* The service's mark in the manager's store, under this name: one empty memfd, handed
 * over once, so that a start finds a descriptor passed back whenever the service was not
 * stopped (a stop drops the whole store), even where no store holds memory.  0 or -errno. */
#define KEEP_SERVICE_NAME "gmsfs-service"
int keep_mark_service(struct keep *k);
/* k->mu held: the table's slot of descriptor fd, grown to it; NULL: out of memory. */
struct kept_fd *keep_slot(struct keep *k, int fd);
/* DIR/STORE.image and a suffix (".new" while written). */
void keep_path(const struct keep *k, const char *store, const char *suffix, char *out, size_t size);
/* keep's record of st, made at the first use; NULL: out of memory. */
struct kept_store *keep_record(struct store *st);
/* The image on disk names refs now (taken over, sorted). */
void keep_set_named(struct kept_store *r, struct image_ref *refs, size_t n);
/* The stores' hook: DIR/NAME.readers written again if who reads st changed. */
void keep_readers(struct store *st);
/* The same, written even when unchanged if again (what was written before may not have
 * landed: keep_watch, once the disk answers again). */
void keep_readers_file(struct store *st, bool again);
/* The backends' closing hook (vmm->closing): a descriptor that held memory is closed,
 * from any thread; it leaves the manager's store once no image on disk names it. */
void keep_on_close(void *arg, int fd);
/* What the stores call (fs->persist), set once the stores are restored. */
extern const struct fs_persist keep_hooks;
/* k->mu held: the manager's store did not take a message (why: its errno's words):
 * persistence is off until keep_watch hands everything again. */
void keep_broken(struct keep *k, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* At the end, once the watch has ended: what keep holds freed, nothing taken out of the
 * manager's store (keep_stop). */
void keep_free(struct fs *fs);

/* keep_watch.c: a thread that looks at the manager's socket every second and hands every
 * store's descriptors again to a new one, or after a failure. */
int keep_watch_start(struct fs *fs);
/* keep_disk's back: a write given up on returned; the watch writes every image again. */
void keep_watch_disk_back(void *arg);
void keep_watch_stop(struct fs *fs);

#endif
