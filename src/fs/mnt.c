/* mnt: the mount point, before the daemon mounts on it.  A second daemon on a mount point
 * would stack a mount over the first one's and hide it (and with the same socket= take
 * its socket over): it is refused instead, and the first is left as it was.  A mount whose
 * daemon died (ENOTCONN) is lifted. */
#include "mnt.h"

#include <errno.h>
#include <signal.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef MOVE_MOUNT_BENEATH
#define MOVE_MOUNT_BENEATH 0x00000200 /* Linux 6.5 */
#endif

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

/* Whether the mount on dir has lost its daemon.  stat alone can be answered from the
 * kernel's cache of the root's attributes (an hour) long after the daemon died; statfs
 * always asks the daemon, so it is asked in a child, given 2 s: a daemon that is stopped
 * or stuck counts as live (nothing is lifted under it), and this one does not hang.  A
 * request the daemon had read before it stopped ends only when it answers, SIGKILL or
 * not: the child is then left to end on its own (it holds none of this process's
 * descriptors, so nobody reading this one's output waits for it either). */
static bool daemon_gone(const char *dir)
{
	/* A daemon that is dying (SIGKILLed a moment ago) ends the requests in flight with
	 * ECONNABORTED, the later ones with ENOTCONN: either says it is gone. */
	struct stat s;
	if (stat(dir, &s) < 0 && (errno == ENOTCONN || errno == ECONNABORTED))
		return true;
	pid_t pid = fork();
	if (pid == 0) {
		int null = open("/dev/null", O_RDWR);
		for (int fd = 0; null >= 0 && fd < 3; fd++)
			dup2(null, fd);
		close_range(3, ~0u, 0);
		struct statfs sf;
		_exit(statfs(dir, &sf) < 0 && (errno == ENOTCONN || errno == ECONNABORTED) ? 1 : 0);
	}
	if (pid < 0)
		return false;
	int status = 0;
	/* Naps from 0.1 ms, doubling to 10: a live daemon answers in a fraction of a
	 * millisecond, and a restart waits for this. */
	for (useconds_t nap = 100, waited = 0; waited < 2000000; waited += nap, nap = nap < 10000 ? 2 * nap : nap) {
		if (waitpid(pid, &status, WNOHANG) == pid)
			return WIFEXITED(status) && WEXITSTATUS(status) == 1;
		usleep(nap);
	}
	kill(pid, SIGKILL); /* a request not yet read by a stuck daemon ends at a fatal signal */
	for (int i = 0; i < 50 && waitpid(pid, &status, WNOHANG) != pid; i++)
		usleep(10000);
	return false;
}

int mnt_prepare(const char *dir, char *why, size_t whylen)
{
	char src[256] = "";
	struct stat s;
	if (!mnt_is_gmsfs(dir, src, sizeof src)) {
		/* Nothing of ours there: no daemon to ask (a restart's common case).  A file is no
		 * mount point (FUSE would mount over it, and answer EIO for its directories). */
		if (!stat(dir, &s) && !S_ISDIR(s.st_mode)) {
			snprintf(why, whylen, "%s is not a directory: a mount point of gmsfs is one (mkdir it)", dir);
			return -ENOTDIR;
		}
		return 0;
	}
	if (daemon_gone(dir)) {
		fprintf(stderr, "gmsfs: %s: lifting a stale mount (its daemon is gone)\n", dir);
		umount2(dir, MNT_DETACH);
		return 0;
	}
	snprintf(why, whylen, "%s is a gmsfs mount (%s) served by a live daemon already: one daemon per mount point "
			      "(unmount it first)", dir, src);
	return -EBUSY;
}

int mnt_beneath(const char *dir, const char *fsname, bool allow_other, int *devfd, char *why, size_t whylen)
{
	const char *step = "open /dev/fuse";
	int dev = open("/dev/fuse", O_RDWR | O_CLOEXEC), fsfd = -1, mfd = -1, e = 0;
	char num[32];
	if (dev < 0)
		goto fail;
	step = "fsopen fuse";
	if ((fsfd = fsopen("fuse", FSOPEN_CLOEXEC)) < 0)
		goto fail;
	/* What libfuse's mount would say: the device, the root's mode, the owner. */
	struct { const char *key, *value; } opts[] = {
		{ "source", fsname }, { "subtype", "gmsfs" }, { "fd", NULL }, { "rootmode", "40000" },
		{ "user_id", NULL }, { "group_id", NULL },
	};
	char uid[16], gid[16];
	snprintf(num, sizeof num, "%d", dev);
	snprintf(uid, sizeof uid, "%u", (unsigned)getuid());
	snprintf(gid, sizeof gid, "%u", (unsigned)getgid());
	opts[2].value = num, opts[4].value = uid, opts[5].value = gid;
	step = "fsconfig";
	for (size_t i = 0; i < sizeof opts / sizeof opts[0]; i++)
		if (fsconfig(fsfd, FSCONFIG_SET_STRING, opts[i].key, opts[i].value, 0))
			goto fail;
	if (fsconfig(fsfd, FSCONFIG_SET_FLAG, "default_permissions", NULL, 0) ||
	    (allow_other && fsconfig(fsfd, FSCONFIG_SET_FLAG, "allow_other", NULL, 0)) ||
	    fsconfig(fsfd, FSCONFIG_CMD_CREATE, NULL, NULL, 0))
		goto fail;
	step = "fsmount";
	if ((mfd = fsmount(fsfd, FSMOUNT_CLOEXEC, MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV)) < 0)
		goto fail;
	step = "move_mount beneath (Linux 6.5 or later)";
	if (move_mount(mfd, "", AT_FDCWD, dir, MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_BENEATH))
		goto fail;
	close(mfd);
	close(fsfd);
	*devfd = dev;
	return 0;
fail:
	e = -errno;
	snprintf(why, whylen, "%s: mounting beneath the old daemon's mount: %s: %s", dir, step, strerror(-e));
	if (mfd >= 0)
		close(mfd);
	if (fsfd >= 0)
		close(fsfd);
	if (dev >= 0)
		close(dev);
	return e;
}

int mnt_lift(const char *dir)
{
	return umount2(dir, MNT_DETACH) ? -errno : 0;
}
