/* store_files: what a store's and its mount's text files say (state, device), read
 * without a lock, as the tools need it before and around their sessions. */
#ifndef GMSFS_LOADER_STORE_FILES_H
#define GMSFS_LOADER_STORE_FILES_H

#include <stddef.h>
#include <stdio.h>

/* The value of "key: value" in STORE/NAME ("state"), or in STORE/../NAME ("../device");
 * 0, or -errno (-ENOENT: no such key; -ETIMEDOUT: the mount's daemon did not answer
 * within SF_READ_MS, stopped or stuck: the read is left to a thread of its own). */
#define SF_READ_MS 5000
int sf_field(const char *store, const char *name, const char *key, char *out, size_t len);
/* The same, given ms instead of SF_READ_MS (a read whose answer only tunes what follows). */
int sf_field_within(const char *store, const char *name, const char *key, char *out, size_t len, int ms);
/* The layout's allocations as STORE/state counts them, or -1. */
long sf_allocations(const char *store);
/* The daemon told that commit gen's bytes have the content hash hex (user.gms.content_hash,
 * gmsfs(5) CONTENT HASH; needs write permission on the store).  0 or -errno. */
int sf_set_content_hash(const char *store, unsigned long long gen, const char *hex);

/* A snapshot holds a model's bytes: a folder it makes is its owner's alone (0700), and
 * its files are readable by whom their folder lets in, nobody else (the folder's mode
 * less execute, the umask on top; an old file more open than that is narrowed).
 * sf_mkdir: 0 (made, or there) or -errno; sf_create: a descriptor (O_WRONLY, truncated)
 * or -errno; sf_overwrite: the same, not truncated (a file written again in place keeps
 * its pages or blocks: on tmpfs truncating a shard of 1 GiB costs about 0.1 s, one at a
 * time); sf_fcreate: sf_create's as a stream, NULL with errno set. */
int sf_mkdir(const char *dir);
int sf_create(const char *path);
int sf_overwrite(const char *path);
FILE *sf_fcreate(const char *path);

#endif
