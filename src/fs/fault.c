/* fault: the test points of fault.h. */
#include "fault.h"

#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char armed[64];   /* "WHAT.STEP", "" when unset; fixed once threads run */
static atomic_long left; /* passes to go before the kill */

void fault_init(void)
{
	const char *s = getenv("GMSFS_FAULT");
	if (!s || !*s)
		return;
	size_t n = strcspn(s, ":");
	long count = s[n] == ':' ? atol(s + n + 1) : 1;
	if (n >= sizeof armed || count < 1) {
		fprintf(stderr, "gmsfs: GMSFS_FAULT=%s: WHAT.STEP or WHAT.STEP:N (N >= 1): ignored\n", s);
		return;
	}
	memcpy(armed, s, n);
	armed[n] = '\0';
	atomic_store(&left, count);
	fprintf(stderr, "gmsfs: GMSFS_FAULT: the daemon kills itself at %s, pass %ld\n", armed, count);
}

void fault_point(const char *what, const char *step)
{
	if (!armed[0])
		return;
	size_t n = strlen(what);
	if (strncmp(armed, what, n) || armed[n] != '.' || strcmp(armed + n + 1, step))
		return;
	if (atomic_fetch_sub(&left, 1) == 1) {
		fprintf(stderr, "gmsfs: GMSFS_FAULT: killed at %s.%s\n", what, step);
		kill(getpid(), SIGKILL);
	}
}
