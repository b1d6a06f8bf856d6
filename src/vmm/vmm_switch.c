/* vmm_switch: a store going out and one coming in, both ways at once (vmm.h).  PCIe is
 * full duplex and the GPU copies each direction on its own engine: a switch that copies
 * the two halves together takes the time of the slower one, not of their sum. */
#include "vmm.h"
#include "clock.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

/* Bytes each way per round (at least one buffer, at most a sixteenth of the larger
 * side): what goes out makes the room the ins of the round after next come into.  Small
 * against a model (the first rounds may have only outs to copy, the last only ins), large
 * against the cost of a copy (a descriptor passed, a mapping made: the helper makes the
 * next round's while this round's copies run). */
#define SWITCH_PIECE (512ull << 20)
#define SWITCH_ROUNDS 16

/* A round: outs [out, out_end) and ins [in, in_end), copied together. */
struct round {
	size_t out, out_end, in, in_end;
	int e; /* a copy done at once (no copy_send): its result */
};

struct run {
	struct vmm *v;
	struct vmm_buf *const *outs, *const *ins;
	size_t nout, nin;
	struct vmm_buf **ot, **it;   /* their twins */
	struct vmm_buf **src, **dst; /* a round's copies */
	struct vmm_switch_ops *o;
	char *err;
	size_t errlen;
};

static size_t copies(struct run *r, const struct round *q)
{
	size_t n = 0;
	for (size_t k = q->out; k < q->out_end; k++)
		r->src[n] = r->outs[k], r->dst[n++] = r->ot[k];
	for (size_t k = q->in; k < q->in_end; k++)
		r->src[n] = r->ins[k], r->dst[n++] = r->it[k];
	return n;
}

/* The next round from *out and *in: a piece of the outs, and a piece of the ins that fit
 * now (the room rounds answered gave back).  A piece each way, not all that fits: a
 * round is answered when both its directions are copied, so ins of many pieces (a budget
 * with room to spare) would leave the out engine idle behind them.  0 when there is one;
 * -ENOSPC when nothing can go. */
static int plan(struct run *r, size_t out, size_t in, uint64_t piece, struct round *q)
{
	*q = (struct round){ out, out, in, in, 0 };
	for (uint64_t bytes = 0; q->out_end < r->nout && (q->out_end == out || bytes < piece); q->out_end++)
		bytes += r->outs[q->out_end]->size;
	int e = 0;
	for (uint64_t bytes = 0; q->in_end < r->nin && (q->in_end == in || bytes < piece); q->in_end++) {
		if ((e = vmm_twin(r->ins[q->in_end], false, &r->it[q->in_end])))
			break;
		bytes += r->ins[q->in_end]->size;
	}
	if (e && (e != -ENOSPC || (q->out_end == out && q->in_end == in))) {
		vmm_twin_why(r->ins[q->in_end], false, e, r->err, r->errlen);
		return e;
	}
	return 0;
}

/* A round started: sent to the backend, or copied at once (sync, or no copy_send). */
static void start(struct run *r, struct round *q, bool sync)
{
	size_t n = copies(r, q);
	const struct vmm_ops *ops = r->v->ops;
	q->e = sync ? ops->copy(r->v, r->src, r->dst, n, r->err, r->errlen)
		    : ops->copy_send(r->v, r->src, r->dst, n, r->err, r->errlen);
	r->o->rounds++;
}

/* The oldest round in flight waited for: its result.  A failure while two were in flight
 * (the helper gone, say): the other one waited for too, then both copied again at once,
 * which starts a new helper (*sync from then on). */
static int wait_oldest(struct run *r, struct round *q, size_t nq, size_t *sent, bool *sync)
{
	const struct vmm_ops *ops = r->v->ops;
	int e = q[0].e;
	if (*sync)
		return e;
	int got = ops->copy_recv(r->v, r->err, r->errlen);
	--*sent;
	if (!(e = e ? e : got))
		return 0;
	for (; *sent; --*sent)
		ops->copy_recv(r->v, r->err, r->errlen);
	*sync = true;
	for (size_t i = 0; i < nq; i++)
		start(r, &q[i], true);
	return q[0].e;
}

int vmm_switch(struct vmm_buf *const *outs, size_t nout, struct vmm_buf *const *ins, size_t nin,
	       struct vmm_switch_ops *o, struct vmm_buf ***in_twins, char *err, size_t errlen)
{
	*in_twins = NULL;
	struct vmm *v = nout ? outs[0]->vmm : nin ? ins[0]->vmm : NULL;
	if (!v)
		return 0;
	if (!v->ops->create_host || !v->ops->copy || !v->ops->swap) {
		snprintf(err, errlen, "the %s backend has no host tier", v->dev.backend);
		return -EOPNOTSUPP;
	}
	uint64_t t = clock_mono_ns(), total = 0;
	struct run r = { v, outs, ins, nout, nin, calloc(nout + 1, sizeof *r.ot), calloc(nin + 1, sizeof *r.it),
			 calloc(nout + nin + 1, sizeof *r.src), calloc(nout + nin + 1, sizeof *r.dst), o, err, errlen };
	int e = r.ot && r.it && r.src && r.dst ? 0 : -ENOMEM;
	if (e)
		snprintf(err, errlen, "out of memory");
	for (size_t k = 0; !e && k < nout; k++) { /* host memory for every out first: all or none */
		if ((e = vmm_twin(outs[k], true, &r.ot[k])))
			vmm_twin_why(outs[k], true, e, err, errlen);
		total += outs[k]->size;
	}
	o->ns_memory += clock_mono_ns() - t;
	uint64_t total_in = 0; /* a piece: a sixteenth of the larger side, at most SWITCH_PIECE */
	for (size_t k = 0; k < nin; k++)
		total_in += ins[k]->size;
	total = total > total_in ? total : total_in;
	uint64_t piece = total / SWITCH_ROUNDS < SWITCH_PIECE ? total / SWITCH_ROUNDS : SWITCH_PIECE;
	bool sync = !v->ops->copy_send || !v->ops->copy_recv;
	struct round q[2];
	size_t nq = 0, sent = 0; /* rounds planned, and of them sent and not yet waited for */
	size_t out = 0, in = 0, done = 0; /* done: the outs given to out_done */
	while (!e) {
		/* Two rounds in flight: the backend makes one ready while the other copies. */
		while (!e && nq < (sync ? 1u : 2u) && (out < nout || in < nin)) {
			uint64_t t1 = clock_mono_ns();
			struct round next;
			e = plan(&r, out, in, piece, &next);
			o->ns_memory += clock_mono_ns() - t1;
			if (e == -ENOSPC && nq)
				e = 0; /* room comes when the round in flight is answered */
			if (e || (next.out_end == out && next.in_end == in))
				break;
			start(&r, &next, sync);
			sent += !sync;
			q[nq++] = next;
			out = next.out_end, in = next.in_end;
		}
		if (e || !nq)
			break;
		uint64_t t2 = clock_mono_ns();
		e = wait_oldest(&r, q, nq, &sent, &sync);
		o->ns_copy += clock_mono_ns() - t2;
		if (e)
			break;
		if (q[0].out_end > q[0].out) {
			uint64_t t3 = clock_mono_ns();
			o->out_done(o->arg, outs + q[0].out, r.ot + q[0].out, q[0].out_end - q[0].out);
			done = q[0].out_end;
			o->ns_done += clock_mono_ns() - t3;
		}
		q[0] = q[1];
		nq--;
	}
	for (char ignored[256]; sent; sent--) /* in flight still: waited for before anything is released */
		v->ops->copy_recv(v, ignored, sizeof ignored);
	if (e) {
		vmm_release_all(r.it, nin); /* the ins stay as they were */
		r.it = NULL;
	}
	for (size_t k = done; r.ot && k < nout; k++) /* host memory no out took (a failure) */
		vmm_buf_put(r.ot[k]);
	free(r.ot);
	free(r.src);
	free(r.dst);
	*in_twins = r.it;
	return e;
}
