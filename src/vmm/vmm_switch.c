/* vmm_switch: a store going out and one coming in, both ways at once (vmm.h).  PCIe is
 * full duplex and the GPU copies each direction on its own engine: a switch that copies
 * the two halves together takes the time of the slower one, not of their sum. */
#include "vmm.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

/* Bytes going out per round (at least one buffer, at most a sixteenth of the outs): the
 * room the next round's ins come into.  Small against a model (the first round has only
 * outs to copy, and a round waits for its slower direction), large against the cost of a
 * copy (a descriptor passed, a mapping made). */
#define SWITCH_PIECE (512ull << 20)
#define SWITCH_ROUNDS 16

int vmm_switch(struct vmm_buf *const *outs, size_t nout, struct vmm_buf *const *ins, size_t nin,
	       const struct vmm_switch_ops *o, struct vmm_buf ***in_twins, char *err, size_t errlen)
{
	*in_twins = NULL;
	struct vmm *v = nout ? outs[0]->vmm : nin ? ins[0]->vmm : NULL;
	if (!v)
		return 0;
	if (!v->ops->create_host || !v->ops->copy || !v->ops->swap) {
		snprintf(err, errlen, "the %s backend has no host tier", v->dev.backend);
		return -EOPNOTSUPP;
	}
	struct vmm_buf **ot = calloc(nout + 1, sizeof *ot), **it = calloc(nin + 1, sizeof *it);
	struct vmm_buf **src = calloc(nout + nin + 1, sizeof *src), **dst = calloc(nout + nin + 1, sizeof *dst);
	int e = ot && it && src && dst ? 0 : -ENOMEM;
	if (e)
		snprintf(err, errlen, "out of memory");
	size_t out = 0, in = 0; /* the next of each to copy */
	uint64_t total = 0;
	for (size_t k = 0; !e && k < nout; k++) { /* host memory for every out first: all or none */
		if ((e = vmm_twin(outs[k], true, &ot[k])))
			vmm_twin_why(outs[k], true, e, err, errlen);
		total += outs[k]->size;
	}
	uint64_t piece = total / SWITCH_ROUNDS < SWITCH_PIECE ? total / SWITCH_ROUNDS : SWITCH_PIECE;
	while (!e && (out < nout || in < nin)) {
		size_t out_end = out, in_end = in, n = 0;
		for (uint64_t bytes = 0; out_end < nout && (out_end == out || bytes < piece); out_end++)
			bytes += outs[out_end]->size;
		/* What fits now of the ins: the room the last round's outs gave back. */
		while (in_end < nin && !(e = vmm_twin(ins[in_end], false, &it[in_end])))
			in_end++;
		if (e && (e != -ENOSPC || (out_end == out && in_end == in))) {
			vmm_twin_why(ins[in_end], false, e, err, errlen);
			break;
		}
		e = 0;
		for (size_t k = out; k < out_end; k++)
			src[n] = outs[k], dst[n++] = ot[k];
		for (size_t k = in; k < in_end; k++)
			src[n] = ins[k], dst[n++] = it[k];
		if ((e = v->ops->copy(v, src, dst, n, err, errlen)))
			break;
		if (out_end > out)
			o->out_done(o->arg, outs + out, ot + out, out_end - out);
		out = out_end, in = in_end;
	}
	if (e) {
		vmm_release_all(it, nin); /* the ins stay as they were */
		it = NULL;
	}
	for (size_t k = out; ot && k < nout; k++) /* host memory no out took (a failure) */
		vmm_buf_put(ot[k]);
	free(ot);
	free(src);
	free(dst);
	*in_twins = it;
	return e;
}
