/* The host backend: each allocation is a memfd whose size is sealed.
 * Readers get the same memory through a read-only reopen, which mmap
 * can only map PROT_READ. */
#include "vmm.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

static int host_open(struct vmm *v, const char *device, char *err, size_t errlen)
{
	if (device && strcmp(device, "0") != 0 && strncmp(device, "host-", 5) != 0) {
		snprintf(err, errlen, "device=%s: the host backend has one device, 0", device);
		return -ENODEV;
	}
	long page = sysconf(_SC_PAGESIZE), pages = sysconf(_SC_PHYS_PAGES);
	v->dev.index = 0;
	v->dev.backend = "host";
	v->dev.granularity = page > 0 ? (uint64_t)page : 4096;
	v->dev.total_bytes = (uint64_t)pages * v->dev.granularity;
	char host[64] = "localhost";
	gethostname(host, sizeof host - 1);
	snprintf(v->dev.name, sizeof v->dev.name, "host memory (%s)", host);
	/* A stable id for this machine's memory: the machine-id where there is one. */
	char id[33] = "0";
	FILE *f = fopen("/etc/machine-id", "re");
	if (f) {
		if (fscanf(f, "%32s", id) != 1)
			strcpy(id, "0");
		fclose(f);
	}
	snprintf(v->dev.uuid, sizeof v->dev.uuid, "host-%s", id);
	return 0;
}

static int host_create(struct vmm *v, uint64_t aligned, struct vmm_buf **out)
{
	(void)v;
	struct vmm_buf *b = calloc(1, sizeof *b);
	if (!b)
		return -ENOMEM;
	int fd = memfd_create("gmsfs", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0 || ftruncate(fd, (off_t)aligned) < 0 ||
	    fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0 ||
	    fchmod(fd, 0600) < 0) { /* a memfd is 0777: keep other users from reopening it writable */
		int e = errno == EFBIG || errno == EINVAL ? ENOSPC : errno;
		if (fd >= 0)
			close(fd);
		free(b);
		return -e;
	}
	b->fd = fd;
	*out = b;
	return 0;
}

static void host_release(struct vmm_buf *b)
{
	int ro = atomic_load(&b->ro_fd);
	if (ro >= 0)
		close(ro);
	close(b->fd);
	free(b);
}

static int reopen(const struct vmm_buf *b, int flags)
{
	char path[64];
	snprintf(path, sizeof path, "/proc/self/fd/%d", b->fd);
	int fd = open(path, flags | O_CLOEXEC);
	return fd < 0 ? -errno : fd;
}

/* Writers get the memfd itself.  Readers share one read-only reopen, made once and
 * kept: it cannot be mapped PROT_WRITE, and every later export costs no open. */
static int host_export(struct vmm_buf *b, bool read_only)
{
	if (!read_only)
		return b->fd;
	int fd = atomic_load(&b->ro_fd);
	if (fd >= 0)
		return fd;
	if ((fd = reopen(b, O_RDONLY)) < 0)
		return fd;
	int none = -1;
	if (!atomic_compare_exchange_strong(&b->ro_fd, &none, fd)) {
		close(fd); /* another export made it first */
		fd = none;
	}
	return fd;
}

static ssize_t host_pread(struct vmm_buf *b, void *dst, size_t len, uint64_t off)
{
	ssize_t n = pread(b->fd, dst, len, (off_t)off);
	return n < 0 ? -errno : n;
}

static ssize_t host_pwrite(struct vmm_buf *b, const void *src, size_t len, uint64_t off)
{
	ssize_t n = pwrite(b->fd, src, len, (off_t)off);
	return n < 0 ? -errno : n;
}

const struct vmm_ops vmm_host_ops = {
	.name = "host",
	.open = host_open,
	.create = host_create,
	.release = host_release,
	.export_fd = host_export,
	.pread = host_pread,
	.pwrite = host_pwrite,
};
