/* log: where the daemon's messages go.  In the foreground (-f: systemd, tests) they go to
 * stderr; detached (started by mount or fstab), to syslog, which journald reads. */
#ifndef GMSFS_FS_LOG_H
#define GMSFS_FS_LOG_H

#include <stdbool.h>

/* From now on stdout and stderr are lines to syslog (ident "gmsfs", facility daemon),
 * forwarded by a thread of their own; 0 or -errno (then they go to /dev/null). */
int log_to_syslog(void);
/* At the end: the lines written so far are sent before the process exits (the last ones,
 * "unmounting", were lost when exit came first). */
void log_end(void);
/* GMSFS_TRACE_RPC: each socket request's and lock ioctl's time in the daemon is logged. */
bool log_trace_rpc(void);

#endif
