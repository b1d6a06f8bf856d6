/* copy: bytes between files and a store's mappings, on either backend.  Host: straight
 * pread/pwrite on the mapping.  cuda: through small pinned host buffers, two per thread, each
 * with its own stream, so that reading the next chunk overlaps copying this one; what the
 * page cache lacks is read with O_DIRECT. */
#ifndef GMSFS_LOADER_COPY_H
#define GMSFS_LOADER_COPY_H

#include <stddef.h>
#include <stdint.h>

struct cp;

/* The store's mount root holds "device": its backend and uuid.  On cuda this makes the
 * GPU's primary context current in the calling thread (libgmsfs connects and maps in it)
 * and allocates the pinned buffers.  *out is freed by cp_close. */
int cp_open(const char *store, struct cp **out, char *err, size_t errlen);
void cp_close(struct cp *c);
/* A file to copy from, opened until cp_close: its number for cp_add, or -errno. */
int cp_file(struct cp *c, const char *path, char *err, size_t errlen);
/* Queue len bytes of a file at off for dst (a mapping of the store); cp_run copies all that
 * is queued with CP_THREADS threads (page-cache reads are bound by one core's memcpy),
 * each with two pinned buffers and two streams on cuda. */
int cp_add(struct cp *c, int file, uint64_t off, void *dst, uint64_t len);
/* How many of the bytes copied so far came past the page cache (O_DIRECT). */
uint64_t cp_direct_bytes(const struct cp *c);
/* 0, or the first error (the others stop soon after); *done grows as bytes land. */
int cp_run(struct cp *c, void (*progress)(void *arg, uint64_t done), void *arg, char *err, size_t errlen);
/* len bytes of src (a mapping) to fd at off. */
int cp_store_to_file(struct cp *c, const void *src, uint64_t len, int fd, uint64_t off, char *err, size_t errlen);

#endif
