/* lock_want: the forms of a lock mode, converted only here (lock_want.c). */
#ifndef GMSFS_FS_LOCK_WANT_H
#define GMSFS_FS_LOCK_WANT_H

#include "handle.h"
#include "store.h"

#include <stdbool.h>
#include <stdint.h>

/* What a request asks for: RW_OR_RO is a write while nothing is committed, else a read;
 * DATA a write whose session changes bytes only (it waits for a first commit). */
enum lock_want { WANT_READ, WANT_WRITE, WANT_RW_OR_RO, WANT_DATA };

/* An open's flags: O_RDONLY reads; O_RDWR of STORE/lock is RW_OR_RO, O_WRONLY|O_APPEND of
 * it (a shell's >>) DATA; other writes write. */
enum lock_want lock_want_of_open(int flags, bool lock_file);
/* GMSFS_RO, GMSFS_RW, GMSFS_RW_OR_RO, GMSFS_RW_DATA (abi.h); -EINVAL for anything else. */
int lock_want_of_mode(uint32_t mode, enum lock_want *out);
/* What a handle holds, as the ioctl reports it: GMSFS_RO, GMSFS_RW or 0. */
uint32_t lock_mode_of(const struct fs_handle *h);
/* May the handle hand out writable descriptors and change the store? */
bool lock_writes(const struct fs_handle *h);
/* Would want be a write on st now? */
bool lock_wants_write(const struct store *st, enum lock_want want);

/* Would want, waiting, hold new readers back as a writer does?  Not a session that is
 * granted beside them (a data-only one on a store with versions). */
bool lock_waits_as_writer(const struct store *st, enum lock_want want);
/* A data-only session on a store with versions is granted beside its readers. */
bool lock_wants_beside(const struct store *st, enum lock_want want);

#endif
