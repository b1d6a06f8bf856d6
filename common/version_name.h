/* version_name: what a commit may be called (gmsfs(5), NAMED VERSIONS): 1 to
 * GMSFS_VERSION_NAME_MAX of A-Z a-z 0-9 . _ - : + @, the first a letter or digit.  One
 * rule for the daemon, the library and gmsfs-peer's messages. */
#ifndef GMSFS_COMMON_VERSION_NAME_H
#define GMSFS_COMMON_VERSION_NAME_H

#include <gmsfs/abi.h>
#include <stdbool.h>
#include <stddef.h>
#include <string.h>

#define GMSFS_VERSION_NAME_WORDS "1 to 64 of A-Z a-z 0-9 . _ - : + @, the first a letter or digit"

static inline bool gmsfs_version_name_valid(const char *s, size_t n)
{
	if (!n || n > GMSFS_VERSION_NAME_MAX)
		return false;
	for (size_t i = 0; i < n; i++) {
		char c = s[i];
		bool alnum = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
		if (!alnum && (i == 0 || !c || !strchr("._-:+@", c)))
			return false;
	}
	return true;
}

#endif
