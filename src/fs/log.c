/* log: stdout and stderr of a detached daemon are a pipe whose lines a thread of its own
 * sends to syslog, so that every message (ours, libfuse's, the CUDA driver's) lands in the
 * journal or syslog instead of /dev/null.  No state but the thread's descriptor. */
#include "log.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <syslog.h>
#include <unistd.h>

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
	return NULL;
}

int log_to_syslog(void)
{
	int p[2];
	if (pipe2(p, O_CLOEXEC))
		return -errno;
	openlog("gmsfs", LOG_PID | LOG_NDELAY, LOG_DAEMON);
	pthread_t t;
	pthread_attr_t a;
	pthread_attr_init(&a);
	pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
	int e = pthread_create(&t, &a, forward, (void *)(long)p[0]);
	pthread_attr_destroy(&a);
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
	return 0;
}
