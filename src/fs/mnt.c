/* mnt: the mount point, before the daemon mounts on it.  A second daemon on a mount point
 * would stack a mount over the first one's and hide it (and with the same socket= take
 * its socket over): it is refused instead, and the first is left as it was.  A mount whose
 * daemon died (ENOTCONN) is lifted. */
#include "mnt.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>

/* mountinfo escapes space, tab, newline and backslash as \ooo: undo it in place. */
static void unescape(char *s)
{
	char *w = s;
	for (char *r = s; *r; r++) {
		if (r[0] == '\\' && r[1] >= '0' && r[1] <= '7' && r[2] >= '0' && r[2] <= '7' && r[3] >= '0' &&
		    r[3] <= '7') {
			*w++ = (char)((r[1] - '0') << 6 | (r[2] - '0') << 3 | (r[3] - '0'));
			r += 3;
		} else {
			*w++ = *r;
		}
	}
	*w = '\0';
}

bool mnt_is_gmsfs(const char *dir, char *src, size_t srclen)
{
	FILE *f = fopen("/proc/self/mountinfo", "re");
	if (!f)
		return false;
	char *line = NULL;
	size_t cap = 0;
	bool found = false;
	/* "ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS [TAGS...] - FSTYPE SOURCE SUPER": the
	 * last mount on dir is the one a path walk meets. */
	while (getline(&line, &cap, f) > 0) {
		char point[4096], type[256], source[4096];
		char *dash = strstr(line, " - ");
		if (!dash || sscanf(line, "%*s %*s %*s %*s %4095s", point) != 1 ||
		    sscanf(dash + 3, "%255s %4095s", type, source) != 2)
			continue;
		unescape(point);
		if (strcmp(point, dir))
			continue;
		found = !strcmp(type, "fuse.gmsfs");
		if (found && src) {
			unescape(source);
			snprintf(src, srclen, "%s", source);
		}
	}
	free(line);
	fclose(f);
	return found;
}

int mnt_prepare(const char *dir, char *why, size_t whylen)
{
	struct stat s;
	if (stat(dir, &s) < 0 && errno == ENOTCONN) {
		fprintf(stderr, "gmsfs: %s: lifting a stale mount (its daemon is gone)\n", dir);
		umount2(dir, MNT_DETACH);
		return 0;
	}
	char src[256] = "";
	if (mnt_is_gmsfs(dir, src, sizeof src)) {
		snprintf(why, whylen, "%s is a gmsfs mount (%s) served by a live daemon already: one daemon per mount "
				      "point (unmount it first)", dir, src);
		return -EBUSY;
	}
	return 0;
}
