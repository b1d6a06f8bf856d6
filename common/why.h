/* why.h: the reason for an error, in words, into a caller's buffer.  Every module that
 * says why (the daemon's socket and commit, the codec, the library) formats it here. */
#ifndef GMSFS_COMMON_WHY_H
#define GMSFS_COMMON_WHY_H

#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>

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

#endif
