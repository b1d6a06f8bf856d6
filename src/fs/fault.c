/* fault: the test points of fault.h. */
#include "fault.h"

#include <signal.h>
#include <stdbool.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char armed[64];   /* "WHAT.STEP", "" when unset; fixed once threads run */
static atomic_long left; /* passes to go before the kill */
static bool hang;        /* ":hang": the thread stops there for good instead, what it holds held */

void fault_init(void)
{
	const char *s = getenv("GMSFS_FAULT");
	if (!s || !*s)
		return;
	size_t n = strcspn(s, ":");
	const char *rest = s + n;
	long count = 1;
	if (*rest == ':' && rest[1] >= '0' && rest[1] <= '9')
		count = strtol(rest + 1, (char **)&rest, 10);
	hang = !strcmp(rest, ":hang");
	if (n >= sizeof armed || count < 1 || (*rest && !hang)) {
		fprintf(stderr, "gmsfs: GMSFS_FAULT=%s: WHAT.STEP[:N][:hang] (N >= 1): ignored\n", s);
		return;
	}
	memcpy(armed, s, n);
	armed[n] = '\0';
	atomic_store(&left, count);
	fprintf(stderr, "gmsfs: GMSFS_FAULT: the daemon %s at %s, pass %ld\n", hang ? "hangs" : "kills itself", armed,
		count);
}

void fault_point(const char *what, const char *step)
{
	if (!armed[0])
		return;
	size_t n = strlen(what);
	if (strncmp(armed, what, n) || armed[n] != '.' || strcmp(armed + n + 1, step))
		return;
	if (atomic_fetch_sub(&left, 1) != 1)
		return;
	if (hang) {
		fprintf(stderr, "gmsfs: GMSFS_FAULT: hung at %s.%s\n", what, step);
		for (;;) /* as a driver call that never returns would: every lock it holds stays held */
			pause();
	}
	fprintf(stderr, "gmsfs: GMSFS_FAULT: killed at %s.%s\n", what, step);
	kill(getpid(), SIGKILL);
}
