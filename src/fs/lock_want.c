/* lock_want: the forms of a lock mode (lock_want.h): what an open or a socket's mode
 * asks for, what a handle holds, whether a want writes.  Reads the lock only. */
#include "lock_want.h"

#include <gmsfs/abi.h>
#include <errno.h>
#include <fcntl.h>

enum lock_want lock_want_of_open(int flags, bool lock_file)
{
	int acc = flags & O_ACCMODE;
	if (acc == O_RDONLY)
		return WANT_READ;
	if (lock_file && acc == O_WRONLY && (flags & O_APPEND))
		return WANT_DATA;
	return acc == O_RDWR && lock_file ? WANT_RW_OR_RO : WANT_WRITE;
}

int lock_want_of_mode(uint32_t mode, enum lock_want *out)
{
	switch (mode) {
	case GMSFS_RO: *out = WANT_READ; return 0;
	case GMSFS_RW: *out = WANT_WRITE; return 0;
	case GMSFS_RW_OR_RO: *out = WANT_RW_OR_RO; return 0;
	case GMSFS_RW_DATA: *out = WANT_DATA; return 0;
	default: return -EINVAL;
	}
}

uint32_t lock_mode_of(const struct fs_handle *h)
{
	if (h->hold == HOLD_SESSION)
		return h->writable ? GMSFS_RW : GMSFS_RO;
	return h->hold == HOLD_READ ? GMSFS_RO : 0;
}

bool lock_writes(const struct fs_handle *h)
{
	return h->hold == HOLD_SESSION && h->writable;
}

bool lock_wants_write(const struct store *st, enum lock_want want)
{
	return want == WANT_WRITE || want == WANT_DATA || (want == WANT_RW_OR_RO && !store_lock(st)->fsm.committed);
}

/* A data-only session on a store with versions is granted beside its readers. */
bool lock_wants_beside(const struct store *st, enum lock_want want)
{
	return want == WANT_DATA && st->versions.allowed > 1;
}

bool lock_waits_as_writer(const struct store *st, enum lock_want want)
{
	return lock_wants_write(st, want) && !lock_wants_beside(st, want);
}
