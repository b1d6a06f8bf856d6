/* vmm_cuda_open: the cuda backend's device opened: the driver loaded (dlopen), cuInit, the
 * device found by index or uuid, its facts read.  Where the daemon before kept them
 * (vmm_known), the daemon serves at once and this runs on a thread of its own: only a
 * create needs the driver, and the stores it kept need none (their descriptors hold their
 * memory, and the clients import them). */
#include "vmm.h"

#ifdef GMSFS_HAVE_CUDA
#include "vmm_cuda_open.h"
#include "clock.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static void uuid_text(const CUuuid *u, char *out, size_t size)
{
	const unsigned char *b = (const unsigned char *)u->bytes;
	snprintf(out, size, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1],
		 b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
}

/* The driver and the device (device=INDEX or GPU-uuid, as nvidia-smi -L prints it; NULL:
 * the first), its facts into dev: 0, -ENODEV (no usable GPU here), -EINVAL (no such
 * device; a GPU is here and the name is wrong: no quiet fallback to host). */
static int driver_open(struct cuda_priv *p, const char *device, struct vmm_device *dev, char *err, size_t errlen)
{
	if (cu_load(&p->cu, err, errlen))
		return -ENODEV;
	struct cu_api *cu = &p->cu;
	CUresult r = cu->cuInit(0);
	int count = 0, e = -ENODEV;
	if (r == CUDA_SUCCESS)
		r = cu->cuDeviceGetCount(&count);
	if (r != CUDA_SUCCESS || count == 0) {
		snprintf(err, errlen, "cuInit: %s", r != CUDA_SUCCESS ? cu_name(cu, r) : "no CUDA device");
		goto fail;
	}
	int index = -1;
	for (int i = 0; i < count && index < 0; i++) {
		CUdevice d;
		CUuuid u;
		char text[64];
		if (cu->cuDeviceGet(&d, i) != CUDA_SUCCESS || cu->cuDeviceGetUuid(&u, d) != CUDA_SUCCESS)
			continue;
		uuid_text(&u, text, sizeof text);
		if (device ? (!strcmp(device, text) || (strspn(device, "0123456789") == strlen(device) && atoi(device) == i))
			   : i == 0) {
			index = i;
			p->dev = d;
			snprintf(dev->uuid, sizeof dev->uuid, "%s", text);
		}
	}
	if (index < 0) {
		snprintf(err, errlen, "device=%s: no such CUDA device (%d present; an index or a GPU-uuid)", device, count);
		e = -EINVAL;
		goto fail;
	}
	int vmm = 0, posix = 0;
	cu->cuDeviceGetAttribute(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, p->dev);
	cu->cuDeviceGetAttribute(&posix, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, p->dev);
	if (!vmm || !posix) {
		snprintf(err, errlen, "device %d: no CUDA VMM with POSIX-fd handles", index);
		goto fail;
	}
	p->prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
	p->prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	p->prop.location.id = p->dev;
	p->prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
	size_t gran = 0, total = 0;
	if ((r = cu->cuMemGetAllocationGranularity(&gran, &p->prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM)) ||
	    (r = cu->cuDeviceTotalMem(&total, p->dev))) {
		snprintf(err, errlen, "device %d: %s", index, cu_name(cu, r));
		goto fail;
	}
	cu->cuDeviceGetName(dev->name, (int)sizeof dev->name, p->dev);
	/* Host memory near the GPU, for the host tier: created and exported without a context too. */
	int numa = 0;
	cu->cuDeviceGetAttribute(&numa, CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID, p->dev);
	p->host_prop = p->prop;
	p->host_prop.location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
	p->host_prop.location.id = numa > 0 ? numa : 0;
	dev->index = index;
	dev->granularity = gran;
	dev->total_bytes = total;
	return 0;
fail:
	cu_unload(&p->cu);
	return e;
}

static struct cuda_priv *priv_new(void)
{
	struct cuda_priv *p = calloc(1, sizeof *p);
	if (!p)
		return NULL;
	pthread_mutex_init(&p->mover_mu, NULL);
	pthread_mutex_init(&p->forget_mu, NULL);
	pthread_mutex_init(&p->ready_mu, NULL);
	pthread_condattr_t a;
	pthread_condattr_init(&a);
	pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
	pthread_cond_init(&p->ready_cv, &a);
	pthread_condattr_destroy(&a);
	p->mover_sock = -1;
	return p;
}

void cuda_priv_free(struct cuda_priv *p)
{
	pthread_mutex_lock(&p->ready_mu);
	p->ending = true; /* an opener still waiting for a quiet mount opens nothing */
	pthread_cond_broadcast(&p->ready_cv);
	pthread_mutex_unlock(&p->ready_mu);
	if (p->opening)
		pthread_join(p->opener, NULL);
	cu_unload(&p->cu);
	pthread_cond_destroy(&p->ready_cv);
	pthread_mutex_destroy(&p->ready_mu);
	free(p->forget);
	free(p);
}

int cuda_open(struct vmm *v, const char *device, char *err, size_t errlen)
{
	struct cuda_priv *p = priv_new();
	if (!p)
		return -ENOMEM;
	int e = driver_open(p, device, &v->dev, err, errlen);
	if (e) {
		cuda_priv_free(p);
		return e;
	}
	p->ready = 1;
	v->dev.gpu = v->dev.index;
	v->dev.backend = "cuda";
	v->priv = p;
	return 0;
}

/* The driver's open holds other processes' calls into the driver while it runs (an
 * H200 beside running engines: a restart's waiting reader imported in 9-10 ms beside it,
 * 2 ms without).  So it waits for what tier.c's host memory made ahead waits for: a
 * quiet mount (no request that maps, makes or commits for a second: the engines of the
 * daemon before came back and imported), or a create that needs it, or 10 s.  1: a create
 * asked for it; 0: quiet, or 10 s; -1: the daemon ends first. */
#define OPEN_QUIET_NS 1000000000ull
#define OPEN_WAIT_MAX_NS 10000000000ull

static int wait_quiet(struct cuda_priv *p, uint64_t start)
{
	pthread_mutex_lock(&p->ready_mu);
	while (!p->wanted && !p->ending) {
		uint64_t now = clock_mono_ns(), busy = p->known.busy_ns ? atomic_load(p->known.busy_ns) : 0;
		uint64_t until = busy + OPEN_QUIET_NS < start + OPEN_WAIT_MAX_NS ? busy + OPEN_QUIET_NS
										  : start + OPEN_WAIT_MAX_NS;
		if (now >= until)
			break;
		struct timespec t = { (time_t)(until / 1000000000u), (long)(until % 1000000000u) };
		pthread_cond_timedwait(&p->ready_cv, &p->ready_mu, &t);
	}
	int why = p->ending ? -1 : p->wanted;
	pthread_mutex_unlock(&p->ready_mu);
	return why;
}

/* The driver of a device opened from known facts, on its own thread: checked against
 * them; where it fails or differs, nothing new is made (the kept stores are served as
 * before: their memory needs no driver here), and the facts' file goes, so that the next
 * start opens the device before it serves. */
static void *open_behind(void *arg)
{
	struct vmm *v = arg;
	struct cuda_priv *p = v->priv;
	const struct vmm_device *k = &p->known.dev;
	struct vmm_device d = {0};
	char err[600] = "";
	uint64_t t0 = clock_mono_ns();
	int asked = wait_quiet(p, t0);
	if (asked < 0) {
		pthread_mutex_lock(&p->ready_mu);
		p->ready = -ENODEV;
		pthread_cond_broadcast(&p->ready_cv);
		pthread_mutex_unlock(&p->ready_mu);
		return NULL;
	}
	uint64_t t1 = clock_mono_ns();
	int e = driver_open(p, k->uuid, &d, err, sizeof err);
	if (!e && (d.index != k->index || d.granularity != k->granularity || d.total_bytes < k->total_bytes ||
		   strcmp(d.name, k->name))) {
		snprintf(err, sizeof err, "it is not as kept: index %d, %s, %llu bytes, granularity %llu (kept: %d, %s, "
					  "%llu, %llu)", d.index, d.name, (unsigned long long)d.total_bytes,
			 (unsigned long long)d.granularity, k->index, k->name, (unsigned long long)k->total_bytes,
			 (unsigned long long)k->granularity);
		e = -ESTALE;
	}
	if (e && p->known.path[0])
		unlink(p->known.path);
	if (e)
		fprintf(stderr, "gmsfs: %s: the device did not open behind the start: %s; nothing new is made on it "
				"until the daemon starts again%s%s%s\n", k->uuid, err, p->known.path[0] ? " (and " : "",
			p->known.path, p->known.path[0] ? " is removed)" : "");
	else
		fprintf(stderr, "gmsfs: %s opened behind the start in %.1f ms, after %.3f s for %s, as %s said\n", k->uuid,
			(double)(clock_mono_ns() - t1) / 1e6, (double)(t1 - t0) / 1e9,
			asked ? "an allocation" : "a quiet mount", p->known.path[0] ? p->known.path : "the daemon before");
	pthread_mutex_lock(&p->ready_mu);
	p->ready = e ? -ENODEV : 1;
	pthread_cond_broadcast(&p->ready_cv);
	pthread_mutex_unlock(&p->ready_mu);
	return NULL;
}

int cuda_open_known(struct vmm *v, const struct vmm_known *k, char *err, size_t errlen)
{
	struct cuda_priv *p = priv_new();
	if (!p)
		return -ENOMEM;
	p->known = *k;
	v->dev = k->dev;
	v->dev.gpu = v->dev.index;
	v->dev.backend = "cuda";
	v->priv = p;
	if (pthread_create(&p->opener, NULL, open_behind, v)) { /* no thread: opened now, as without facts */
		v->priv = NULL;
		cuda_priv_free(p);
		return cuda_open(v, k->dev.uuid, err, errlen);
	}
	p->opening = true;
	return 0;
}

/* The driver, once open_behind has opened it: 0, or -ENODEV where it did not. */
int cuda_driver_ready(struct cuda_priv *p)
{
	pthread_mutex_lock(&p->ready_mu);
	if (!p->ready && !p->wanted) {
		p->wanted = true; /* the opener waits no longer for a quiet mount */
		pthread_cond_broadcast(&p->ready_cv);
	}
	while (!p->ready)
		pthread_cond_wait(&p->ready_cv, &p->ready_mu);
	int e = p->ready < 0 ? p->ready : 0;
	pthread_mutex_unlock(&p->ready_mu);
	return e;
}

#endif
