/* caller: who is asking.  FUSE gives the thread id of the caller in the pid
 * namespace of whoever mounted, or 0 when the caller is outside it. */
#include "caller.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

static int read_small(const char *path, char *buf, size_t size)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	ssize_t n = read(fd, buf, size - 1);
	int e = n < 0 ? -errno : 0;
	close(fd);
	if (e)
		return e;
	buf[n] = '\0';
	return 0;
}

int caller_tgid(fuse_req_t req, pid_t *tgid)
{
	pid_t tid = fuse_req_ctx(req)->pid;
	if (tid <= 0)
		return -EPERM; /* outside the daemon's pid namespace: no identity to lock with */
	/* Most callers are their process's main thread: pidfd_open takes only a thread-group
	 * leader (EINVAL for another thread), one system call where reading /proc costs tens
	 * of microseconds.  The caller waits in its request: its tid is its own meanwhile. */
	int pidfd = (int)syscall(SYS_pidfd_open, tid, 0);
	if (pidfd >= 0) {
		close(pidfd);
		*tgid = tid;
		return 0;
	}
	char path[64], buf[1024];
	snprintf(path, sizeof path, "/proc/%d/status", tid);
	int e = read_small(path, buf, sizeof buf);
	if (e)
		return e == -ENOENT ? -ESRCH : e; /* -EMFILE: the daemon is out of descriptors */
	char *p = strstr(buf, "\nTgid:");
	if (!p)
		return -ESRCH;
	*tgid = (pid_t)strtol(p + 6, NULL, 10);
	return *tgid > 0 ? 0 : -ESRCH;
}

bool caller_killed(fuse_req_t req)
{
	pid_t tid = fuse_req_ctx(req)->pid;
	char path[64], buf[2048];
	snprintf(path, sizeof path, "/proc/%d/status", tid);
	if (tid <= 0 || read_small(path, buf, sizeof buf))
		return false;
	/* The thread's own pending set and its process's: a fatal signal marks SIGKILL. */
	for (const char *f = buf; (f = strstr(f, "Pnd:\t")); f += 5) {
		unsigned long long mask = strtoull(f + 5, NULL, 16);
		if (mask >> (SIGKILL - 1) & 1)
			return true;
	}
	return false;
}

/* Fields of /proc/PID/stat after the command name, which may hold spaces and ')'. */
static int proc_stat(pid_t pid, pid_t *ppid, uint64_t *start)
{
	char path[64], buf[2048];
	snprintf(path, sizeof path, "/proc/%d/stat", pid);
	int e = read_small(path, buf, sizeof buf);
	if (e)
		return e;
	char *p = strrchr(buf, ')');
	if (!p)
		return -EIO;
	/* ") S ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime
	 *  cutime cstime priority nice threads itrealvalue starttime" */
	char state;
	int pp;
	unsigned long long st;
	if (sscanf(p + 1, " %c %d %*d %*d %*d %*d %*u %*u %*u %*u %*u %*u %*u %*d %*d %*d %*d %*d %*d %llu",
		   &state, &pp, &st) != 3)
		return -EIO;
	if (ppid)
		*ppid = pp;
	if (start)
		*start = st;
	return 0;
}

int caller_start_time(pid_t pid, uint64_t *start)
{
	return proc_stat(pid, NULL, start);
}

/* The daemon out of descriptors cannot tell: an error, not a wrong "no". */
static bool out_of_fds(int e)
{
	return e == -EMFILE || e == -ENFILE || e == -ENOMEM;
}

int caller_descends(pid_t tgid, pid_t ancestor, uint64_t ancestor_start)
{
	for (int depth = 0; tgid > 1 && depth < 4096; depth++) {
		pid_t ppid;
		uint64_t start;
		int e = proc_stat(tgid, &ppid, &start);
		if (e)
			return out_of_fds(e) ? e : 0;
		if (tgid == ancestor)
			return start == ancestor_start;
		tgid = ppid;
	}
	return 0;
}

int caller_holds(pid_t tgid, const uint64_t *inos, size_t n, bool *which)
{
	char path[64];
	snprintf(path, sizeof path, "/proc/%d/fdinfo", tgid);
	DIR *d = opendir(path);
	if (!d)
		return out_of_fds(-errno) ? -errno : 0;
	int found = 0, e;
	for (struct dirent *de; (which || !found) && (de = readdir(d));) {
		char p[300], buf[512];
		if (de->d_name[0] == '.')
			continue;
		snprintf(p, sizeof p, "/proc/%d/fdinfo/%s", tgid, de->d_name);
		if ((e = read_small(p, buf, sizeof buf))) {
			if (out_of_fds(e)) {
				found = e;
				break;
			}
			continue; /* closed meanwhile */
		}
		char *ino = strstr(buf, "\nino:");
		if (!ino)
			continue;
		uint64_t v = strtoull(ino + 5, NULL, 10);
		for (size_t i = 0; i < n; i++)
			if (inos[i] == v) {
				found = 1;
				if (!which)
					break;
				which[i] = true;
			}
	}
	closedir(d);
	return found;
}

static bool in_group(fuse_req_t req, gid_t gid)
{
	if (fuse_req_ctx(req)->gid == gid)
		return true;
	gid_t groups[64];
	int n = fuse_req_getgroups(req, 64, groups);
	for (int i = 0; i < n && i < 64; i++)
		if (groups[i] == gid)
			return true;
	return false;
}

int caller_may(fuse_req_t req, mode_t mode, int want)
{
	uid_t uid = fuse_req_ctx(req)->uid;
	if (uid == 0)
		return 0; /* as the kernel lets root open any file */
	unsigned bits = uid == getuid() ? mode >> 6 : in_group(req, getgid()) ? mode >> 3 : mode;
	return (bits & (unsigned)want) == (unsigned)want ? 0 : -EACCES;
}
