/* The cuda backend: CUDA VMM on one device.  -ENODEV from open: no usable GPU
 * here (the default then falls back to host); -EINVAL: no such device.  The daemon calls cuInit and
 * nothing that needs a context: cuMemCreate (pinned device memory, POSIX-fd
 * handle type) and cuMemExportToShareableHandle work without one.  Each
 * allocation is exported once; its descriptor is kept and sent to every client
 * (one fd imports in any number of processes).  The daemon never maps. */
#include "vmm.h"

#ifdef GMSFS_HAVE_CUDA
#include "cuda_api.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct cuda_priv {
	struct cu_api cu;
	CUdevice dev;
	CUmemAllocationProp prop;
};

struct cuda_buf {
	struct vmm_buf b; /* first: the daemon sees a vmm_buf */
	CUmemGenericAllocationHandle h;
};

static void uuid_text(const CUuuid *u, char *out, size_t size)
{
	const unsigned char *b = (const unsigned char *)u->bytes;
	snprintf(out, size, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1],
		 b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
}

static int cuda_open(struct vmm *v, const char *device, char *err, size_t errlen)
{
	struct cuda_priv *p = calloc(1, sizeof *p);
	if (!p)
		return -ENOMEM;
	if (cu_load(&p->cu, err, errlen)) {
		free(p);
		return -ENODEV;
	}
	struct cu_api *cu = &p->cu;
	CUresult r = cu->cuInit(0);
	int count = 0;
	if (r == CUDA_SUCCESS)
		r = cu->cuDeviceGetCount(&count);
	if (r != CUDA_SUCCESS || count == 0) {
		snprintf(err, errlen, "cuInit: %s", r != CUDA_SUCCESS ? cu_name(cu, r) : "no CUDA device");
		goto fail;
	}
	/* device=INDEX or device=GPU-uuid (as nvidia-smi -L prints it). */
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
			snprintf(v->dev.uuid, sizeof v->dev.uuid, "%s", text);
		}
	}
	if (index < 0) {
		snprintf(err, errlen, "device=%s: no such CUDA device (%d present; an index or a GPU-uuid)", device, count);
		cu_unload(&p->cu);
		free(p);
		return -EINVAL; /* a GPU is here, the name is wrong: no quiet fallback to host */
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
	cu->cuDeviceGetName(v->dev.name, (int)sizeof v->dev.name, p->dev);
	v->dev.index = index;
	v->dev.backend = "cuda";
	v->dev.granularity = gran;
	v->dev.total_bytes = total;
	v->priv = p;
	return 0;
fail:
	cu_unload(&p->cu);
	free(p);
	return -ENODEV;
}

static int cuda_create(struct vmm_pool *pool, uint64_t aligned, struct vmm_buf **out)
{
	struct vmm *v = pool->vmm;
	struct cuda_priv *p = v->priv;
	struct cu_api *cu = &p->cu;
	struct cuda_buf *cb = calloc(1, sizeof *cb);
	if (!cb)
		return -ENOMEM;
	CUresult r = cu->cuMemCreate(&cb->h, aligned, &p->prop, 0);
	if (r != CUDA_SUCCESS) {
		free(cb);
		fprintf(stderr, "gmsfs: cuMemCreate of %llu bytes: %s\n", (unsigned long long)aligned, cu_name(cu, r));
		return r == CUDA_ERROR_OUT_OF_MEMORY ? -ENOSPC : -EIO;
	}
	int fd = -1;
	errno = 0;
	r = cu->cuMemExportToShareableHandle(&fd, cb->h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
	if (r != CUDA_SUCCESS) {
		/* Out of descriptors (one is kept per allocation): the driver's dup saw EMFILE. */
		int e = errno == EMFILE || errno == ENFILE ? -errno : r == CUDA_ERROR_OUT_OF_MEMORY ? -ENOSPC : -EIO;
		cu->cuMemRelease(cb->h);
		free(cb);
		fprintf(stderr, "gmsfs: cuMemExportToShareableHandle: %s\n", cu_name(cu, r));
		return e;
	}
	cb->b.fd = fd;
	*out = &cb->b;
	return 0;
}

static void cuda_release(struct vmm_buf *b)
{
	struct cuda_buf *cb = (struct cuda_buf *)b;
	struct cuda_priv *p = b->vmm->priv;
	/* Memory a client still maps lives on (its imported handle); the rest is freed. */
	close(b->fd);
	p->cu.cuMemRelease(cb->h);
	free(cb);
}

/* The same kept descriptor for everyone; readers get read-only mappings (the client
 * sets the access), since a CUDA fd carries no access mode. */
static int cuda_export(struct vmm_buf *b, bool read_only)
{
	return b->fd;
}

/* No context, no copies: the bytes are reached by mapping them (libgmsfs). */
static ssize_t cuda_no_io(struct vmm_buf *b, void *buf, size_t len, uint64_t off)
{
	return -EOPNOTSUPP;
}

static ssize_t cuda_no_write(struct vmm_buf *b, const void *buf, size_t len, uint64_t off)
{
	return -EOPNOTSUPP;
}

static void cuda_close(struct vmm *v)
{
	struct cuda_priv *p = v->priv;
	if (p) {
		cu_unload(&p->cu);
		free(p);
	}
}

const struct vmm_ops vmm_cuda_ops = {
	.name = "cuda",
	.open = cuda_open,
	.create = cuda_create,
	.release = cuda_release,
	.export_fd = cuda_export,
	.pread = cuda_no_io,
	.pwrite = cuda_no_write,
	.close = cuda_close,
};
#endif
