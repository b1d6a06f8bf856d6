/* gmsfs-open: open a path with given flags, report the errno name, optionally
 * hold it open.  What shell redirections cannot do (O_NONBLOCK, O_RDWR with a
 * verdict, truncate(2) by path) for the tests.
 *
 *   gmsfs-open [-n] [-w|-r|-rw] [-hold SECONDS] PATH      open, print "ok" or the errno name
 *   gmsfs-open -truncate SIZE PATH                        truncate(2) by path
 *   gmsfs-open -poll MS PATH                             read PATH, then poll it: "changed" or "timeout"
 *   gmsfs-open -w -write DATA PATH                       open, write DATA, print the verdict */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *errname(int e)
{
	switch (e) {
	case 0: return "ok";
	case EAGAIN: return "EAGAIN";
	case EBUSY: return "EBUSY";
	case EROFS: return "EROFS";
	case EINTR: return "EINTR";
	case EINVAL: return "EINVAL";
	case EPERM: return "EPERM";
	case ENOENT: return "ENOENT";
	case ESTALE: return "ESTALE";
	case ENOSPC: return "ENOSPC";
	case EFBIG: return "EFBIG";
	case EACCES: return "EACCES";
	default: return strerror(e);
	}
}

static void on_usr1(int sig) { (void)sig; }

int main(int argc, char **argv)
{
	/* SIGUSR1 interrupts a waiting open without killing us: the open shows EINTR. */
	struct sigaction sa = { .sa_handler = on_usr1 };
	sigaction(SIGUSR1, &sa, NULL);
	int flags = O_RDONLY, hold = 0, i = 1;
	const char *write_data = NULL;
	for (; i < argc - 1; i++) {
		if (!strcmp(argv[i], "-n")) flags |= O_NONBLOCK;
		else if (!strcmp(argv[i], "-w")) flags = (flags & ~O_ACCMODE) | O_WRONLY;
		else if (!strcmp(argv[i], "-rw")) flags = (flags & ~O_ACCMODE) | O_RDWR;
		else if (!strcmp(argv[i], "-r")) flags = (flags & ~O_ACCMODE) | O_RDONLY;
		else if (!strcmp(argv[i], "-hold")) hold = atoi(argv[++i]);
		else if (!strcmp(argv[i], "-write")) write_data = argv[++i];
		else if (!strcmp(argv[i], "-poll")) {
			int ms = atoi(argv[++i]), fd = open(argv[argc - 1], O_RDONLY);
			char buf[4096];
			if (fd < 0 || read(fd, buf, sizeof buf) < 0) {
				printf("%s\n", errname(errno));
				return 1;
			}
			printf("ready\n");
			fflush(stdout);
			struct pollfd p = { .fd = fd, .events = POLLIN };
			int r = poll(&p, 1, ms);
			printf("%s\n", r > 0 ? "changed" : r == 0 ? "timeout" : errname(errno));
			return 0;
		} else if (!strcmp(argv[i], "-truncate")) {
			long long size = atoll(argv[++i]);
			int r = truncate(argv[argc - 1], size);
			printf("%s\n", errname(r ? errno : 0));
			return r ? 1 : 0;
		} else break;
	}
	if (i != argc - 1) {
		fprintf(stderr, "usage: gmsfs-open [-n] [-r|-w|-rw] [-write DATA] [-hold SECONDS] PATH\n");
		return 2;
	}
	int fd = open(argv[i], flags);
	if (fd < 0) {
		printf("%s\n", errname(errno));
		return 1;
	}
	if (write_data) {
		ssize_t n = write(fd, write_data, strlen(write_data));
		printf("%s\n", errname(n < 0 ? errno : 0));
		fflush(stdout);
		if (n < 0)
			return 1;
	} else {
		printf("ok\n");
		fflush(stdout);
	}
	if (hold)
		sleep((unsigned)hold);
	close(fd);
	return 0;
}
