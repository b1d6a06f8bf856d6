/* fetch.h: the descriptors of a store's whole layout, fetched the raw way (abi.h,
 * the wire codec), for a benchmark's floor: what a process holds before it maps
 * anything.  The store is locked RO through fd; the caller closes fds[i]. */
#ifndef GMSFS_BENCH_FETCH_H
#define GMSFS_BENCH_FETCH_H

#include <fcntl.h>
#include <gmsfs/abi.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "fdpass.h"
#include "wire.h"

struct fetched {
	int lockfd;
	size_t n;
	int *fds;            /* one per allocation (dup'd where several share one) */
	uint64_t *aligned;
	uint64_t *offset;
};

static int fetch_all(const char *store, struct fetched *f)
{
	memset(f, 0, sizeof *f);
	f->lockfd = open(store, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	struct gmsfs_ioc io = { .size = sizeof io, .mode = GMSFS_RO, .timeout_ms = 10000 };
	if (f->lockfd < 0 || ioctl(f->lockfd, GMSFS_IOC_LOCK, &io) < 0)
		return -1;
	struct gmsfs_ioc ex = { .size = sizeof ex };
	if (ioctl(f->lockfd, GMSFS_IOC_EXPORT_ALL, &ex) < 0)
		return -1;
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	snprintf(a.sun_path, sizeof a.sun_path, "%s", ex.socket);
	int s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (s < 0 || connect(s, (struct sockaddr *)&a, sizeof a) < 0)
		return -1;
	struct gmsfs_sock_req req;
	wire_req_init(&req, GMSFS_OP_REDEEM, ex.ticket, 0, 0);
	if (send(s, &req, sizeof req, 0) != sizeof req)
		return -1;
	static uint8_t buf[GMSFS_MSG_MAX + 1];
	for (;;) {
		int fds[GMSFS_FDS_PER_MSG], nfds;
		struct fdpass_info info;
		ssize_t r = fdpass_recv(s, buf, sizeof buf, fds, GMSFS_FDS_PER_MSG, &info);
		nfds = (int)info.nfds;
		struct wire_reply rep;
		char why[160];
		if (r <= 0 || wire_parse_reply(buf, (size_t)r, &rep, why, sizeof why) || rep.err || !rep.manifest)
			return -1;
		if (!f->fds) {
			f->fds = calloc(rep.total + 1, sizeof *f->fds);
			f->aligned = calloc(rep.total + 1, sizeof *f->aligned);
			f->offset = calloc(rep.total + 1, sizeof *f->offset);
		}
		bool *used = calloc((size_t)nfds + 1, sizeof *used);
		for (size_t i = 0; i < rep.nallocs; i++) {
			int fd = fds[rep.allocs[i].fd];
			f->fds[f->n] = used[rep.allocs[i].fd] ? dup(fd) : fd;
			used[rep.allocs[i].fd] = true;
			f->aligned[f->n] = rep.allocs[i].aligned;
			f->offset[f->n++] = rep.allocs[i].fd_offset;
		}
		for (int i = 0; i < nfds; i++)
			if (!used[i])
				close(fds[i]);
		free(used);
		bool last = rep.last;
		wire_reply_free(&rep);
		if (last)
			break;
	}
	close(s);
	return 0;
}

static void fetched_free(struct fetched *f)
{
	for (size_t i = 0; i < f->n; i++)
		close(f->fds[i]);
	free(f->fds);
	free(f->aligned);
	free(f->offset);
	if (f->lockfd >= 0)
		close(f->lockfd);
	memset(f, 0, sizeof *f);
}

#endif
