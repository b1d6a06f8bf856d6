/* gmsfs-mover DEVICE-UUID [stay]: the daemon's copy helper for the host tier (cuda backend).
 *
 * The daemon makes no CUDA context, so it cannot copy device memory; this process, which
 * the daemon starts on its first move, has one.  On its socket (descriptor 3, SEQPACKET)
 * each message is one copy, struct mover_copy with two descriptors (source, destination:
 * exported CUDA VMM handles, device or host-located, of the same size); a message with
 * last set ends a batch, which is answered with struct mover_reply once every copy of it
 * is done (copies from host memory on a stream of their own: a batch with both
 * directions, a switch's, copies both ways at once).  It maps nothing else and keeps no mapping past a batch (what is not undone
 * before the answer is undone after it, or, when the next request is already there,
 * while that one's copies run); it ends when the socket closes, or after MOVER_IDLE_S
 * seconds without a batch (its context holds device memory: it is not kept for
 * nothing), unless started with "stay" (the daemon's -o host_ahead). */
#include "mover.h"
#include "clock.h"
#include "cuda_api.h"
#include "fdpass.h"

#include <poll.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct mapped {
	CUdeviceptr va;
	size_t size;
	CUmemGenericAllocationHandle h;
	bool early; /* unmapped before the answer: a source the daemon frees once answered */
	bool prev;  /* an earlier batch's, left mapped for the next request: unmapped once its copies are queued */
};

struct mover {
	bool trace;                 /* GMSFS_MOVER_TRACE: each batch's times on stderr (the daemon's log) */
	struct cu_api cu;
	CUdevice dev;
	/* Out (a device source) and in (a host source: MOVER_SOURCE_STAYS): a switch's batch
	 * has both, and each direction has its own copy engine. */
	CUstream stream[2];
	struct mapped *m;
	size_t n, cap;
};

static int map_fd(struct mover *mv, int fd, size_t size, bool early, CUdeviceptr *va, char *why, size_t whylen)
{
	struct cu_api *cu = &mv->cu;
	if (mv->n == mv->cap) {
		size_t cap = mv->cap ? 2 * mv->cap : 64;
		struct mapped *m = realloc(mv->m, cap * sizeof *m);
		if (!m)
			return snprintf(why, whylen, "out of memory"), -1;
		mv->m = m, mv->cap = cap;
	}
	struct mapped *m = &mv->m[mv->n];
	CUresult r = cu->cuMemImportFromShareableHandle(&m->h, (void *)(uintptr_t)fd,
							CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
	const char *what = "cuMemImportFromShareableHandle";
	if (!r && (what = "cuMemAddressReserve", r = cu->cuMemAddressReserve(&m->va, size, 0, 0, 0))) {
		cu->cuMemRelease(m->h);
	} else if (!r && (what = "cuMemMap", r = cu->cuMemMap(m->va, size, 0, m->h, 0))) {
		cu->cuMemAddressFree(m->va, size);
		cu->cuMemRelease(m->h);
	} else if (!r) {
		CUmemAccessDesc a = { .location = { CU_MEM_LOCATION_TYPE_DEVICE, mv->dev },
				      .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE };
		m->size = size;
		m->early = early;
		m->prev = false;
		mv->n++; /* unmapped at the batch's end, whatever happens next */
		what = "cuMemSetAccess";
		r = cu->cuMemSetAccess(m->va, size, &a, 1);
	}
	if (r)
		return snprintf(why, whylen, "%s: %s", what, cu_name(cu, r)), -1;
	*va = m->va;
	return 0;
}

static void unmap(struct mover *mv, struct mapped *m)
{
	mv->cu.cuMemUnmap(m->va, m->size);
	mv->cu.cuMemAddressFree(m->va, m->size);
	mv->cu.cuMemRelease(m->h);
}

/* Unmap those that match: early ones (before the answer) or an earlier batch's (prev). */
enum which { EARLY, PREV };

static void unmap_all(struct mover *mv, enum which w)
{
	size_t kept = 0;
	for (size_t i = 0; i < mv->n; i++) {
		const struct mapped *m = &mv->m[i];
		if ((w == EARLY && m->early) || (w == PREV && m->prev))
			unmap(mv, &mv->m[i]);
		else
			mv->m[kept++] = mv->m[i];
	}
	mv->n = kept;
}

static int open_device(struct mover *mv, const char *uuid, char *why, size_t whylen)
{
	struct cu_api *cu = &mv->cu;
	if (cu_load(cu, why, whylen))
		return -1;
	int count = 0;
	CUresult r = cu->cuInit(0);
	if (!r)
		r = cu->cuDeviceGetCount(&count);
	for (int i = 0; !r && i < count; i++) {
		CUuuid u;
		char text[64];
		const unsigned char *b = (const unsigned char *)u.bytes;
		if (cu->cuDeviceGet(&mv->dev, i) || cu->cuDeviceGetUuid(&u, mv->dev))
			continue;
		snprintf(text, sizeof text,
			 "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1], b[2],
			 b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
		if (strcmp(text, uuid))
			continue;
		CUcontext ctx;
		if ((r = cu->cuDevicePrimaryCtxRetain(&ctx, mv->dev)) || (r = cu->cuCtxSetCurrent(ctx)) ||
		    (r = cu->cuStreamCreate(&mv->stream[0], CU_STREAM_NON_BLOCKING)) ||
		    (r = cu->cuStreamCreate(&mv->stream[1], CU_STREAM_NON_BLOCKING)))
			break;
		return 0;
	}
	snprintf(why, whylen, "%s: %s", uuid, r ? cu_name(cu, r) : "no such CUDA device");
	return -1;
}

static double now_us(void)
{
	return (double)clock_mono_ns() / 1e3;
}

/* One batch: copies until the one marked last; then the answer. */
static int batch(struct mover *mv, int sock)
{
	struct mover_reply rep = {0};
	double t_recv = 0, t_map = 0, t0;
	size_t copies = 0, bytes = 0;
	for (;;) {
		struct mover_copy c;
		int fds[2] = { -1, -1 };
		struct fdpass_info info;
		ssize_t n = fdpass_recv(sock, &c, sizeof c, fds, 2, &info);
		if (n <= 0)
			return -1; /* the daemon went: so do we */
		if (!rep.error && (n != sizeof c || info.nfds != 2 || c.magic != MOVER_MAGIC || !c.size ||
				   (c.flags & ~MOVER_SOURCE_STAYS) || c.reserved)) {
			rep.error = EPROTO;
			snprintf(rep.why, sizeof rep.why, "a bad copy request");
		}
		if (!copies++)
			t_recv = now_us();
		bytes += c.size;
		CUdeviceptr src, dst;
		t0 = now_us();
		if (!rep.error && (map_fd(mv, fds[0], c.size, !(c.flags & MOVER_SOURCE_STAYS), &src, rep.why, sizeof rep.why) ||
				   map_fd(mv, fds[1], c.size, false, &dst, rep.why, sizeof rep.why)))
			rep.error = EIO;
		t_map += now_us() - t0;
		CUresult r;
		CUstream s = mv->stream[(c.flags & MOVER_SOURCE_STAYS) != 0];
		if (!rep.error && (r = mv->cu.cuMemcpyDtoDAsync(dst, src, c.size, s))) {
			rep.error = EIO;
			snprintf(rep.why, sizeof rep.why, "cuMemcpyDtoDAsync: %s", cu_name(&mv->cu, r));
		}
		for (size_t i = 0; i < info.nfds; i++)
			close(fds[i]);
		if (c.last == 1)
			break;
	}
	/* What the last batch left mapped (a request was waiting then): now, while the copies
	 * run, and before the answer (a destination of the last batch may be a source freed
	 * once this one is answered). */
	unmap_all(mv, PREV);
	double t_sync = now_us();
	CUresult r = mv->cu.cuStreamSynchronize(mv->stream[0]);
	CUresult r1 = mv->cu.cuStreamSynchronize(mv->stream[1]);
	r = r ? r : r1;
	double t_copied = now_us();
	if (r && !rep.error) {
		rep.error = EIO;
		snprintf(rep.why, sizeof rep.why, "cuStreamSynchronize: %s", cu_name(&mv->cu, r));
	}
	/* The sources the daemon frees once answered first (device memory: a mapping would
	 * keep it).  The rest live on (the destinations, the store's new memory; host memory
	 * kept for the next move out): unmapped after the answer, off the move's time. */
	unmap_all(mv, EARLY);
	double t_answer = now_us();
	int e = send(sock, &rep, sizeof rep, MSG_NOSIGNAL) == sizeof rep ? 0 : -1;
	/* The rest one by one; a request that comes meanwhile (a move out, then a move in: a
	 * model switch) goes first, and what is left is unmapped while its copies run. */
	while (mv->n) {
		struct pollfd next = { sock, POLLIN, 0 };
		if (!e && poll(&next, 1, 0) == 1) {
			for (size_t i = 0; i < mv->n; i++)
				mv->m[i].prev = true;
			break;
		}
		unmap(mv, &mv->m[--mv->n]);
	}
	if (mv->trace)
		fprintf(stderr, "gmsfs-mover: %zu copies, %zu bytes: import and map %.0f us, "
			"copies queued %.0f us, copy wait %.0f us, unmapped before the answer %.0f us, after it %.0f us\n",
			copies, bytes, t_map, t_sync - t_recv - t_map, t_copied - t_sync,
			t_answer - t_copied, now_us() - t_answer);
	return e;
}

int main(int argc, char **argv)
{
	struct mover mv = {0};
	struct mover_reply rep = {0};
	bool stay = argc == 3 && !strcmp(argv[2], "stay"); /* host_ahead: no end when idle */
	if (argc != 2 && !stay) {
		fprintf(stderr, "usage: gmsfs-mover DEVICE-UUID [stay] (started by gmsfs, socket on descriptor 3)\n");
		return 2;
	}
	int sock = MOVER_FD;
	mv.trace = getenv("GMSFS_MOVER_TRACE") != NULL;
	if (open_device(&mv, argv[1], rep.why, sizeof rep.why)) {
		/* Said once, to the first batch's request: the daemon names it in last_error. */
		rep.error = ENODEV;
		struct mover_copy c;
		int fds[2];
		struct fdpass_info info;
		while (fdpass_recv(sock, &c, sizeof c, fds, 2, &info) > 0) {
			for (size_t i = 0; i < info.nfds; i++)
				close(fds[i]);
			if (c.last == 1)
				break;
		}
		send(sock, &rep, sizeof rep, MSG_NOSIGNAL);
		return 1;
	}
	for (;;) {
		struct pollfd p = { sock, POLLIN, 0 };
		if (poll(&p, 1, stay ? -1 : MOVER_IDLE_S * 1000) <= 0)
			return 0; /* idle: the context's memory goes back */
		if (batch(&mv, sock))
			return 0;
	}
}
