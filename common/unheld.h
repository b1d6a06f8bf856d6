/* unheld: a command's work in a child process, its exit status taken the moment the work
 * returns.  A mount whose daemon has read a request and does not answer (stuck in a
 * driver call with its lock held) holds the thread that asked in the kernel, where no
 * signal ends it, and a process with such a thread cannot be reaped: its parent (a shell,
 * a probe, `timeout`) waits with it, whatever bound the command kept.  Done in a child,
 * the work's end is a byte on a pipe: the command exits with it, and the child, its
 * output closed, ends with the daemon.  SIGINT, SIGTERM and SIGHUP are passed on, and a
 * SIGKILL of the command ends the child too (PR_SET_PDEATHSIG). */
#ifndef GMSFS_COMMON_UNHELD_H
#define GMSFS_COMMON_UNHELD_H

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <poll.h>
#include <stdio.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#define UNHELD_END_MS 1000 /* the child's end, waited for after its work's */

/* LeakSanitizer's check, where it is linked in: the child ends by _exit, which runs none. */
int __lsan_do_recoverable_leak_check(void) __attribute__((weak));

static pid_t unheld_child;

static void unheld_pass(int sig)
{
	if (unheld_child > 0)
		kill(unheld_child, sig);
}

static inline int unheld_run(int (*work)(int, char **), int argc, char **argv)
{
	int p[2];
	if (pipe2(p, O_CLOEXEC))
		return work(argc, argv);
	fflush(NULL);
	pid_t parent = getpid(), pid = fork();
	if (pid < 0) {
		close(p[0]);
		close(p[1]);
		return work(argc, argv);
	}
	if (pid == 0) {
		close(p[0]);
		prctl(PR_SET_PDEATHSIG, SIGKILL); /* the command killed: its work ends with it */
		if (getppid() != parent)
			_exit(137); /* it already was */
		int rc = work(argc, argv);
		fflush(NULL);
		if (__lsan_do_recoverable_leak_check && __lsan_do_recoverable_leak_check())
			rc = 23; /* LeakSanitizer's own exit status */
		unsigned char b = (unsigned char)rc;
		ssize_t n = write(p[1], &b, 1);
		(void)n;
		int null = open("/dev/null", O_RDWR | O_CLOEXEC);
		for (int fd = 0; null >= 0 && fd <= 2; fd++)
			dup2(null, fd); /* a thread left in the kernel would keep them, and our reader waiting */
		_exit(rc);
	}
	close(p[1]);
	unheld_child = pid;
	struct sigaction sa = { .sa_handler = unheld_pass };
	sigemptyset(&sa.sa_mask);
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGHUP, &sa, NULL);
	unsigned char b;
	ssize_t n;
	while ((n = read(p[0], &b, 1)) < 0 && errno == EINTR)
		;
	int st;
	if (n == 1) {
		/* Its end: the pipe's other end closes with its last thread, and with it every file it
		 * held (its read locks too), at once unless a thread is left in the kernel. */
		struct pollfd end = { p[0], POLLIN, 0 };
		char c;
		if (poll(&end, 1, UNHELD_END_MS) == 1 && read(p[0], &c, 1) == 0)
			waitpid(pid, &st, 0);
		return b; /* else reaped by whoever outlives us */
	}
	while (waitpid(pid, &st, 0) < 0)
		if (errno != EINTR)
			return 1;
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

#endif
