/* meta_path.h: what a layout path may be.  Header-only: the daemon checks what
 * it is sent, libgmsfs checks before building a path (a ".." would be resolved
 * by the kernel and never reach the daemon). */
#ifndef GMSFS_META_PATH_H
#define GMSFS_META_PATH_H

#include <stdbool.h>
#include <stddef.h>
#include <string.h>

#define META_PATH_MAX 4096

/* A relative path: components of 1..255 bytes, no "", ".", "..", NUL; no leading or trailing '/'. */
static inline bool meta_path_valid(const char *path, size_t len)
{
	if (!len || len > META_PATH_MAX || memchr(path, '\0', len))
		return false;
	size_t start = 0;
	for (size_t i = 0; i <= len; i++) {
		if (i < len && path[i] != '/')
			continue;
		size_t clen = i - start;
		if (!clen || clen > 255)
			return false; /* leading, trailing or doubled '/' */
		if ((clen == 1 && path[start] == '.') || (clen == 2 && path[start] == '.' && path[start + 1] == '.'))
			return false;
		start = i + 1;
	}
	return true;
}

#endif
