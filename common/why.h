/* why.h: the reason for an error, in words, into a caller's buffer.  Every module that
 * says why (the daemon's socket and commit, the codec, the library) formats it here. */
#ifndef GMSFS_COMMON_WHY_H
#define GMSFS_COMMON_WHY_H

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Format into why (nothing when len is 0) and return e, so that `return why_fmt(...)`
 * both says why and fails. */
static inline int why_vfmt(char *why, size_t len, int e, const char *fmt, va_list ap)
{
	if (len)
		vsnprintf(why, len, fmt, ap);
	return e;
}

static inline int why_fmt(char *why, size_t len, int e, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static inline int why_fmt(char *why, size_t len, int e, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	why_vfmt(why, len, e, fmt, ap);
	va_end(ap);
	return e;
}

/* path opened to read (a symlink followed), and its stat in *st: the descriptor, or
 * -errno with "PATH: its words" in why. */
static inline int why_open_read(const char *path, struct stat *st, char *why, size_t len)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd >= 0 && !fstat(fd, st))
		return fd;
	int e = errno;
	if (fd >= 0)
		close(fd);
	return why_fmt(why, len, -e, "%s: %s", path, strerror(e));
}

#endif
