/* copy: bytes between files and a store's mappings, on either backend.  Host: straight
 * pread/pwrite on the mapping.  cuda: through small pinned host buffers, two per thread, each
 * with its own stream, so that reading the next chunk overlaps copying this one; what the
 * page cache lacks is read with O_DIRECT. */
#ifndef GMSFS_LOADER_COPY_H
#define GMSFS_LOADER_COPY_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct cp;

/* The pieces cp_add and cp_save hash: a store's bytes are checked by the xxh3 of each
 * piece as it passes through host memory (gmsfs-snapshot's manifest). */
#define CP_PIECE (2ull << 20)

/* The store's mount root holds "device": its backend and uuid.  On cuda this makes the
 * GPU's primary context current in the calling thread (libgmsfs connects and maps in it)
 * and allocates the pinned buffers.  *out is freed by cp_close. */
int cp_open(const char *store, struct cp **out, char *err, size_t errlen);
void cp_close(struct cp *c);
/* Its GPU's context current in the calling thread, for a cp opened by another: 0 or -EIO. */
int cp_enter(struct cp *c);
/* A file to copy from, opened until cp_close: its number for cp_add, or -errno. */
int cp_file(struct cp *c, const char *path, char *err, size_t errlen);
/* Threads that copy at once, each with its pinned buffers: at most 16 (the GPU machines'
 * cores: a save's 16 shards of 1 GiB go in one round, where tmpfs takes one writer a file
 * at a time; with 14, two threads wrote two shards and the save took 1.75x), no more than
 * the cores here, or GMSFS_COPY_THREADS (1 to 16; cp_open refuses another value). */
#define CP_THREADS 16
size_t cp_threads(void);
/* Queue len bytes of a file at off for dst (a mapping of the store); cp_run copies all that
 * is queued with CP_THREADS threads (page-cache reads are bound by one core's memcpy),
 * each with two pinned buffers and two streams on cuda.  digests (NULL: none): the xxh3
 * of each CP_PIECE bytes from off, as they pass through host memory, one a piece. */
int cp_add(struct cp *c, int file, uint64_t off, void *dst, uint64_t len, uint64_t *digests);
/* One part of a piece for cp_add_piece: len bytes of a file at off, at offset at of the piece. */
struct cp_part {
	int file;
	uint32_t at;
	uint64_t off, len;
};
/* Queue one piece of an allocation made of parts of files (gmsfs-load's slabs, whose
 * tensors lie GMSFS_TORCH_ALIGN apart): dst its first byte, len at most CP_PIECE, parts
 * in order of at and not overlapping (copied, n of them); the bytes between and after
 * them are zeros.  The piece goes whole, and *digest is its bytes' xxh3 as they pass. */
int cp_add_piece(struct cp *c, void *dst, uint64_t len, const struct cp_part *parts, size_t n, uint64_t *digest);
/* How many of the bytes copied so far came past the page cache (O_DIRECT). */
uint64_t cp_direct_bytes(const struct cp *c);
/* 0, or the first error (the others stop soon after); *done grows as bytes land. */
int cp_run(struct cp *c, void (*progress)(void *arg, uint64_t done), void *arg, char *err, size_t errlen);
/* One run of a store's bytes into a file for cp_save: len bytes of src (a mapping) to fd at
 * off, and the xxh3 of each CP_PIECE of them (digests: one a piece; NULL: none) as they pass. */
struct cp_put {
	int fd;
	uint64_t off;
	const void *src;
	uint64_t len;
	uint64_t *digests;
};
/* Every put written, those to one file in order by one thread, files at once (up to
 * CP_THREADS); puts to one file must be next to each other in v.  0, or the first error. */
int cp_save(struct cp *c, struct cp_put *v, size_t n, void (*progress)(void *arg, uint64_t done), void *arg,
	    char *err, size_t errlen);
/* len bytes of src (a mapping) to fd at off: one put of cp_save. */
int cp_store_to_file(struct cp *c, const void *src, uint64_t len, int fd, uint64_t off, char *err, size_t errlen);

/* How a store's bytes pass through host memory to or from elsewhere (a peer): straight on
 * the host backend (pinned NULL: the mappings are host memory), through c's pinned buffer
 * (room bytes) on cuda.  cp_stage: 0, or -errno with err said (a GPU store in a build
 * without CUDA: -ENOTSUP). */
#ifdef GMSFS_HAVE_CUDA
#include "cuda_api.h"
#endif
struct cp_stage {
	char *pinned;
	size_t room;
#ifdef GMSFS_HAVE_CUDA
	struct cu_api *cu;
	CUcontext ctx; /* current in a thread that copies */
#endif
};
int cp_stage(struct cp *c, int backend, struct cp_stage *s, char *err, size_t errlen);
/* The stage's GPU context current in the calling thread (a thread that copies: a lane's
 * first call, lane.h); nothing on the host backend.  stage: a struct cp_stage. */
void cp_stage_enter(void *stage);

#ifdef GMSFS_HAVE_CUDA
/* On cuda: its libcuda, the store's GPU's primary context, and its pinned buffers (for
 * peer.c); -ENODEV on the host backend. */
int cp_cuda(struct cp *c, struct cu_api **cu, CUcontext *ctx, char **pinned, size_t *pinned_bytes);
#endif

/* ---- copy's own, shared by copy.c (into a store) and copy_save.c (out of one); no
 * other file uses it ---- */

/* Per pinned buffer.  From the page cache on the H100 host, 14 threads: 2 MiB 40-42 GB/s,
 * 1 MiB 34-37, 4 MiB 20-43, 8 MiB 24-26 (page-cache memcpy and the DMA share memory
 * bandwidth; smaller chunks stay in the caches). */
#define CP_CHUNK CP_PIECE /* a chunk is a hashed piece (copy.h) */
#define CP_PAGE 4096ull
#define CP_BUF (CP_CHUNK + 2 * CP_PAGE) /* a chunk widened to whole pages, for O_DIRECT */

struct cp_file {
	int fd;          /* through the page cache */
	int dfd;         /* O_DIRECT; -1 on the host backend or where the file system has none */
	char *map;       /* the file, mapped for mincore only (never touched); NULL with dfd -1 */
	uint64_t size;
};

struct cp_chunk {
	size_t file;
	uint64_t off, len;
	char *dst;
	uint64_t *digest; /* where its bytes' xxh3 goes, as they pass through host memory (NULL: none) */
	bool piece;       /* cp_add_piece's: parts[part] on, nparts of them (file and off unused) */
	size_t part, nparts;
};

struct cp {
	bool cuda;
	struct cp_file *files;  /* what cp_file opened */
	size_t nfiles, fcap;
	struct cp_chunk *q;     /* what cp_add and cp_add_piece queued */
	size_t n, cap;
	struct cp_part *parts;  /* cp_add_piece's */
	size_t np, pcap;
	/* while cp_run runs */
	atomic_size_t next;
	atomic_uint_fast64_t done, direct;
	pthread_mutex_t mu;
	int err;
	char why[512];
#ifdef GMSFS_HAVE_CUDA
	struct cu_api cu;
	CUcontext ctx;
	char *pinned;           /* CP_THREADS x 2 x CP_BUF, one buffer: cp_cuda's (peer.c, cp_stage), at its first call */
	char *tbuf[CP_THREADS]; /* worker i's own two CP_BUF buffers (cp_thread_buffers), made by it at its first run */
#endif
};

/* Where a piece starts in its pinned buffer (an offset below CP_PAGE) so that its part at
 * offset at, read with O_DIRECT from file offset off, lands where it goes: the read's
 * first page then starts at (that offset + at - off % CP_PAGE), a multiple of CP_PAGE, not
 * below the buffer, and the read (widened to whole pages) ends within CP_BUF
 * (tests/unit/test_copy.c checks it). */
static inline size_t cp_piece_shift(uint64_t off, uint64_t at)
{
	return (size_t)(((off & (CP_PAGE - 1)) - at) & (CP_PAGE - 1));
}

/* c's first error, said once (fmt with what); the other threads stop at their next chunk. */
void cp_set_error(struct cp *c, int e, const char *fmt, const char *what);
/* len bytes of p at off of fd, whole: 0, or -errno with err. */
int cp_full_pwrite(int fd, const void *p, uint64_t len, uint64_t off, char *err, size_t errlen);
#ifdef GMSFS_HAVE_CUDA
/* A driver call that failed, said in err: -EIO. */
int cp_cu_fail(struct cp *c, char *err, size_t errlen, const char *what, CUresult r);
/* Worker me's two pinned buffers of CP_BUF, made by the worker itself at its first run (c's
 * context current in it), kept until cp_close: NULL, with err said, on a failure. */
char *cp_thread_buffers(struct cp *c, size_t me, char *err, size_t errlen);
#endif

#endif
