/* gmsfs-mover DEVICE-UUID [stay]: the daemon's copy helper for the host tier (cuda backend).
 *
 * The daemon makes no CUDA context, so it cannot copy device memory; this process, which
 * the daemon starts on its first move, has one.  On its socket (descriptor 3, SEQPACKET)
 * each message is one copy, struct mover_copy with two descriptors (source, destination:
 * exported CUDA VMM handles, device or host-located, of the same size); a message with
 * last set ends a batch, which is answered with struct mover_reply once every copy of it
 * is done (copies from host memory on a stream of their own: a batch with both
 * directions, a switch's, copies both ways at once).  Two batches may be in flight: the
 * next is mapped and queued while the copies of the one before run, and each is answered
 * once its own copies are done.  It maps nothing else; a batch's mappings go before its
 * answer (sources the daemon frees then) or after it, while it waits for copies or
 * requests, but host memory the daemon keeps across moves stays mapped under its key
 * until a MOVER_FORGET (mover.h); it ends when the socket closes, or after MOVER_IDLE_S
 * seconds without a batch (its context holds device memory: it is not kept for
 * nothing), unless started with "stay" or told MOVER_STAY (host memory made ahead), until
 * told MOVER_UNSTAY (no host memory left). */
#include "mover.h"
#include "clock.h"
#include "cuda_api.h"
#include "fdpass.h"

#include <limits.h>
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
	unsigned batch; /* whose it is; ANSWERED: that batch's answer is sent, unmapped when idle;
	                 * KEPT: host memory kept under key until a MOVER_FORGET */
	uint64_t key;
};

#define ANSWERED UINT_MAX
#define KEPT (UINT_MAX - 1)

/* A batch in flight: its copies queued, the events that mark their end on each stream. */
struct batch {
	unsigned id;
	CUevent done[2];
	struct mover_reply rep;
	size_t copies, bytes;
	double t_recv, t_map, t_queued;
};

struct mover {
	bool trace;                 /* GMSFS_MOVER_TRACE: each batch's times on stderr (the daemon's log) */
	bool stay;                  /* no end when idle: "stay", or MOVER_STAY since */
	struct cu_api cu;
	CUdevice dev;
	/* Out (a device source) and in (a host source: MOVER_SOURCE_STAYS): a switch's batch
	 * has both, and each direction has its own copy engine. */
	CUstream stream[2];
	struct mapped *m;
	size_t n, cap;
	unsigned next_id;
};

static int map_fd(struct mover *mv, unsigned batch, int fd, size_t size, bool early, uint64_t key, CUdeviceptr *va,
		  char *why, size_t whylen)
{
	struct cu_api *cu = &mv->cu;
	for (size_t i = 0; key && i < mv->n; i++)
		if (mv->m[i].key == key && mv->m[i].size == size) {
			*va = mv->m[i].va; /* mapped before: kept */
			return 0;
		}
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
		m->early = early && !key;
		m->batch = key ? KEPT : batch;
		m->key = key;
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

/* Unmap a batch's mappings: its early ones (before its answer), or all that are left. */
static void unmap_batch(struct mover *mv, unsigned batch, bool early_only)
{
	size_t kept = 0;
	for (size_t i = 0; i < mv->n; i++) {
		const struct mapped *m = &mv->m[i];
		if (m->batch == batch && (m->early || !early_only))
			unmap(mv, &mv->m[i]);
		else
			mv->m[kept++] = mv->m[i];
	}
	mv->n = kept;
}

/* A MOVER_FORGET: the mapping kept under key goes. */
static void forget(struct mover *mv, uint64_t key)
{
	for (size_t i = 0; i < mv->n; i++)
		if (mv->m[i].key == key) {
			unmap(mv, &mv->m[i]);
			mv->m[i] = mv->m[--mv->n];
			return;
		}
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

/* A batch begun: its copies received, mapped and queued (out on one stream, in on the
 * other), an event after them on each.  0; 1: a MOVER_FORGET came instead, done; -1: the
 * daemon went. */
static int batch_begin(struct mover *mv, int sock, struct batch *b)
{
	*b = (struct batch){ .id = mv->next_id++ };
	struct mover_reply *rep = &b->rep;
	for (;;) {
		struct mover_copy c;
		int fds[2] = { -1, -1 };
		struct fdpass_info info;
		ssize_t n = fdpass_recv(sock, &c, sizeof c, fds, 2, &info);
		if (n <= 0)
			return -1; /* the daemon went: so do we */
		if (n == sizeof c && c.magic == MOVER_MAGIC && !info.nfds && !c.last &&
		    ((c.flags == MOVER_FORGET && c.src_key) || c.flags == MOVER_STAY || c.flags == MOVER_UNSTAY)) {
			if (c.flags == MOVER_FORGET)
				forget(mv, c.src_key);
			else
				mv->stay = c.flags == MOVER_STAY;
			if (!b->copies)
				return 1;
			continue;
		}
		if (!rep->error && (n != sizeof c || info.nfds != 2 || c.magic != MOVER_MAGIC || !c.size ||
				    (c.flags & ~MOVER_SOURCE_STAYS) || c.reserved)) {
			rep->error = EPROTO;
			snprintf(rep->why, sizeof rep->why, "a bad copy request");
		}
		if (!b->copies++)
			b->t_recv = now_us();
		b->bytes += c.size;
		CUdeviceptr src, dst;
		double t0 = now_us();
		if (!rep->error &&
		    (map_fd(mv, b->id, fds[0], c.size, !(c.flags & MOVER_SOURCE_STAYS), c.src_key, &src, rep->why,
			    sizeof rep->why) ||
		     map_fd(mv, b->id, fds[1], c.size, false, c.dst_key, &dst, rep->why, sizeof rep->why)))
			rep->error = EIO;
		b->t_map += now_us() - t0;
		CUresult r;
		CUstream s = mv->stream[(c.flags & MOVER_SOURCE_STAYS) != 0];
		if (!rep->error && (r = mv->cu.cuMemcpyDtoDAsync(dst, src, c.size, s))) {
			rep->error = EIO;
			snprintf(rep->why, sizeof rep->why, "cuMemcpyDtoDAsync: %s", cu_name(&mv->cu, r));
		}
		for (size_t i = 0; i < info.nfds; i++)
			close(fds[i]);
		if (c.last == 1)
			break;
	}
	for (int i = 0; i < 2; i++) {
		CUresult r = mv->cu.cuEventCreate(&b->done[i], CU_EVENT_DISABLE_TIMING);
		if (!r)
			r = mv->cu.cuEventRecord(b->done[i], mv->stream[i]);
		if (r && !rep->error) {
			rep->error = EIO;
			snprintf(rep->why, sizeof rep->why, "cuEventRecord: %s", cu_name(&mv->cu, r));
		}
	}
	b->t_queued = now_us();
	return 0;
}

/* One mapping of an answered batch undone: false when none is left. */
static bool idle_unmap(struct mover *mv)
{
	for (size_t i = mv->n; i-- > 0;)
		if (mv->m[i].batch == ANSWERED) {
			unmap(mv, &mv->m[i]);
			mv->m[i] = mv->m[--mv->n];
			return true;
		}
	return false;
}

/* Whether a batch's copies are done, without waiting. */
static bool batch_copied(struct mover *mv, const struct batch *b)
{
	for (int i = 0; i < 2; i++)
		if (b->done[i] && mv->cu.cuEventQuery(b->done[i]) == CUDA_ERROR_NOT_READY)
			return false;
	return true;
}

/* A batch ended: its copies waited for, its early sources unmapped (the daemon frees them
 * once answered), the answer, then the rest of its mappings.  -1: the daemon went. */
static int batch_end(struct mover *mv, int sock, struct batch *b)
{
	struct mover_reply *rep = &b->rep;
	double t_sync = now_us();
	for (int i = 0; i < 2; i++) {
		CUresult r = b->done[i] ? mv->cu.cuEventSynchronize(b->done[i]) : CUDA_SUCCESS;
		if (r && !rep->error) {
			rep->error = EIO;
			snprintf(rep->why, sizeof rep->why, "cuEventSynchronize: %s", cu_name(&mv->cu, r));
		}
		if (b->done[i])
			mv->cu.cuEventDestroy(b->done[i]);
	}
	double t_copied = now_us();
	unmap_batch(mv, b->id, true);
	double t_answer = now_us();
	int e = send(sock, rep, sizeof *rep, MSG_NOSIGNAL) == sizeof *rep ? 0 : -1;
	for (size_t i = 0; i < mv->n; i++) /* the rest goes when nothing else waits (idle_unmap) */
		mv->m[i].batch = mv->m[i].batch == b->id ? ANSWERED : mv->m[i].batch;
	if (mv->trace)
		fprintf(stderr, "gmsfs-mover: %zu copies, %zu bytes: import and map %.0f us, "
			"copies queued %.0f us, then copied after %.0f us (waited %.0f us), unmapped before the answer "
			"%.0f us, after it %.0f us\n", b->copies, b->bytes, b->t_map, b->t_queued - b->t_recv - b->t_map,
			t_copied - b->t_queued, t_copied - t_sync, t_answer - t_copied, now_us() - t_answer);
	return e;
}

/* The daemon went (it ended, was replaced, or crashed): what this process maps and its
 * context go MOVER_LINGER_S later, not now, while the engines that come back to the next
 * daemon import and map (tearing down a context and gigabytes of mappings holds the
 * driver).  The memory is the next daemon's, or goes with the last of its holders. */
static int linger(void)
{
	sleep(MOVER_LINGER_S);
	return 0;
}

int main(int argc, char **argv)
{
	struct mover mv = {0};
	struct mover_reply rep = {0};
	mv.stay = argc == 3 && !strcmp(argv[2], "stay"); /* host_ahead: no end when idle */
	if (argc != 2 && !mv.stay) {
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
	/* Up to two batches in flight (a switch sends its next round before the last is
	 * answered): the next one is mapped and queued while the copies of the one before run. */
	struct batch q[2];
	size_t nq = 0;
	for (;;) {
		struct pollfd p = { sock, POLLIN, 0 };
		while (!nq && poll(&p, 1, 0) != 1 && idle_unmap(&mv))
			; /* what answered batches left, one at a time while no request waits */
		if (!nq && poll(&p, 1, mv.stay ? -1 : MOVER_IDLE_S * 1000) <= 0)
			return 0; /* idle: the context's memory goes back */
		if (nq < 2 && (!nq || poll(&p, 1, 0) == 1)) {
			int r = batch_begin(&mv, sock, &q[nq]);
			if (r < 0)
				return linger();
			nq += r == 0;
			continue;
		}
		/* One in flight: end it once copied, or begin the next one first if it comes. */
		while (nq == 1 && !batch_copied(&mv, &q[0]) && poll(&p, 1, 0) != 1)
			if (!idle_unmap(&mv))
				poll(&p, 1, 1);
		if (nq == 1 && poll(&p, 1, 0) == 1 && !batch_copied(&mv, &q[0]))
			continue;
		if (batch_end(&mv, sock, &q[0]))
			return linger();
		q[0] = q[1];
		nq--;
	}
}
