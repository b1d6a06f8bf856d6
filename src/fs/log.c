/* log: stdout and stderr of a detached daemon are a pipe whose lines a thread of its own
 * sends to syslog, so that every message (ours, libfuse's, the CUDA driver's) lands in the
 * journal or syslog instead of /dev/null.  No state but the thread. */
#include "log.h"
#include "clock.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <syslog.h>
#include <unistd.h>

static pthread_t forwarder;
static bool forwarding;

static void *forward(void *arg)
{
	FILE *in = fdopen((int)(long)arg, "r");
	char line[1024];
	while (in && fgets(line, sizeof line, in)) {
		line[strcspn(line, "\n")] = '\0';
		/* gmsfs's own lines start "gmsfs: "; syslog says who already. */
		const char *msg = strncmp(line, "gmsfs: ", 7) ? line : line + 7;
		if (*msg)
			syslog(strstr(msg, "error") || strstr(msg, "fail") ? LOG_ERR : LOG_NOTICE, "%s", msg);
	}
	if (in)
		fclose(in);
	return NULL;
}

int log_to_syslog(void)
{
	int p[2];
	if (pipe2(p, O_CLOEXEC))
		return -errno;
	openlog("gmsfs", LOG_PID | LOG_NDELAY, LOG_DAEMON);
	int e = pthread_create(&forwarder, NULL, forward, (void *)(long)p[0]);
	if (e) {
		close(p[0]);
		close(p[1]);
		return -e;
	}
	dup2(p[1], 1);
	dup2(p[1], 2);
	close(p[1]);
	setvbuf(stdout, NULL, _IOLBF, 0);
	setvbuf(stderr, NULL, _IOLBF, 0);
	forwarding = true;
	return 0;
}

void log_end(void)
{
	if (!forwarding)
		return;
	forwarding = false;
	int null = open("/dev/null", O_WRONLY | O_CLOEXEC);
	fflush(stdout);
	fflush(stderr);
	if (null >= 0) { /* the pipe's last writers here: the thread reads to its end */
		dup2(null, 1);
		dup2(null, 2);
		close(null);
	}
	/* A child that inherited the pipe (gmsfs-mover) keeps it open: wait 2 s at most. */
	struct timespec until = clock_after_ms(CLOCK_REALTIME, 2000);
	if (pthread_timedjoin_np(forwarder, NULL, &until))
		pthread_detach(forwarder);
}

bool log_trace_rpc(void)
{
	static int traced = -1;
	if (traced < 0)
		traced = getenv("GMSFS_TRACE_RPC") != NULL;
	return traced;
}
