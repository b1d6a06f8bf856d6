/* vmm_open: the backend chosen (cuda where a VMM-capable GPU is found, else host), and
 * the device's end: above the backends, which it names. */
#include "vmm.h"
#include "vmm_internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int open_with(struct vmm **out, const struct vmm_ops *ops, const char *device, const struct vmm_known *known,
		     uint64_t max_bytes, char *err, size_t errlen)
{
	struct vmm *v = calloc(1, sizeof *v);
	if (!v)
		return -ENOMEM;
	v->ops = ops;
	v->known = known != NULL;
	int e = known ? ops->open_known(v, known, err, errlen) : ops->open(v, device, err, errlen);
	if (e) {
		free(v);
		return e;
	}
	v->max_bytes = max_bytes && max_bytes < v->dev.total_bytes ? max_bytes : v->dev.total_bytes;
	if (vmm_mins_open(v) || vmm_spare_open(v) || vmm_release_open(v)) {
		vmm_mins_close(v);
		vmm_spare_close(v);
		ops->close(v);
		free(v);
		return -ENOMEM;
	}
	*out = v;
	return 0;
}

int vmm_open(struct vmm **out, const char *backend, const char *device, const struct vmm_known *known,
	     uint64_t max_bytes, char *err, size_t errlen)
{
	if (backend && strcmp(backend, "host") != 0 && strcmp(backend, "cuda") != 0) {
		snprintf(err, errlen, "backend=%s: unknown backend (cuda or host)", backend);
		return -EINVAL;
	}
	if (!backend || !strcmp(backend, "cuda")) {
#ifdef GMSFS_HAVE_CUDA
		/* Facts that fit: the device is the one a daemon here had a moment ago. */
		if (known && vmm_facts_fit(known, backend, device, max_bytes))
			return open_with(out, &vmm_cuda_ops, device, known, max_bytes, err, errlen);
		int e = open_with(out, &vmm_cuda_ops, device, NULL, max_bytes, err, errlen);
		if (!e || backend || e != -ENODEV)
			return e;
		/* The default: cuda where a VMM-capable GPU is found, else host. */
		fprintf(stderr, "gmsfs: %s: using the host backend\n", err);
		err[0] = '\0';
#else
		if (backend) {
			snprintf(err, errlen, "backend=cuda: this gmsfs was built without cuda.h (use backend=host)");
			return -ENOTSUP;
		}
#endif
	}
	return open_with(out, &vmm_host_ops, device, NULL, max_bytes, err, errlen);
}

void vmm_leave(struct vmm *v)
{
	if (v && v->ops->leave)
		v->ops->leave(v);
}

void vmm_close(struct vmm *v)
{
	if (v)
		vmm_release_close(v); /* what was given back goes before the backend */
	if (v && v->ops->close)
		v->ops->close(v);
	if (v)
		vmm_mins_close(v);
	if (v)
		vmm_spare_close(v);
	free(v);
}
