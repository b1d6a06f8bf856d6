/* Mapping on the host backend: descriptors are sealed memfds, mapped
 * MAP_SHARED.  A reservation is an inaccessible anonymous range; mapping and
 * unmapping replace parts of it in place (MAP_FIXED), so addresses never move; a
 * space's mapping is the same pages again (mremap). */
#include "internal.h"

#include <errno.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>

#define RESERVE_FLAGS (MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE)

static int host_attach(gmsfs *g, char *err, size_t errlen)
{
	return 0;
}

static int host_reserve(gmsfs *g, uint64_t len, uint64_t align, void **va)
{
	(void)align; /* pages are pages */
	void *p = mmap(NULL, len, PROT_NONE, RESERVE_FLAGS, -1, 0);
	if (p == MAP_FAILED)
		return -errno;
	*va = p;
	return 0;
}

static void host_unreserve(gmsfs *g, void *va, uint64_t len)
{
	munmap(va, len);
}

static int host_map(gmsfs *g, void *va, uint64_t aligned, int fd, uint64_t off, bool writable, char *err,
		    size_t errlen)
{
	struct stat s;
	if (fstat(fd, &s) < 0)
		return -errno;
	if (off > (uint64_t)s.st_size || aligned > (uint64_t)s.st_size - off) {
		snprintf(err, errlen, "descriptor holds %lld bytes, the manifest says %llu at %llu", (long long)s.st_size,
			 (unsigned long long)aligned, (unsigned long long)off);
		return -EPROTO;
	}
	void *p = mmap(va, aligned, PROT_READ | (writable ? PROT_WRITE : 0), MAP_SHARED | MAP_FIXED, fd, (off_t)off);
	if (p == MAP_FAILED) {
		int e = errno;
		snprintf(err, errlen, "mmap: %s", strerror(e));
		return -e;
	}
	return 0;
}

static int host_unmap(gmsfs *g, void *va, uint64_t aligned)
{
	return mmap(va, aligned, PROT_NONE, RESERVE_FLAGS | MAP_FIXED, -1, 0) == MAP_FAILED ? -errno : 0;
}

/* The same pages at dst: mremap with old_size 0 makes a new mapping of a shared
 * mapping's pages (the memfd's), replacing the reservation there. */
static int host_alias(gmsfs *g, void *src, void *dst, uint64_t aligned, bool writable, char *err, size_t errlen)
{
	if (mremap(src, 0, aligned, MREMAP_MAYMOVE | MREMAP_FIXED, dst) == MAP_FAILED ||
	    mprotect(dst, aligned, PROT_READ | (writable ? PROT_WRITE : 0))) {
		int e = errno;
		snprintf(err, errlen, "mremap: %s", strerror(e));
		return -e;
	}
	return 0;
}

/* A held page is a mapping of its own of the page's memory, outside any reservation:
 * mremap moves it in and out of its place. */
static int host_hold(gmsfs *g, void *va, uint64_t aligned, uint64_t *held)
{
	void *p = mremap(va, 0, aligned, MREMAP_MAYMOVE); /* the same pages, elsewhere */
	if (p == MAP_FAILED)
		return -errno;
	int e = host_unmap(g, va, aligned);
	if (e) {
		munmap(p, aligned);
		return e;
	}
	*held = (uint64_t)(uintptr_t)p;
	return 0;
}

static int host_hold_fd(gmsfs *g, int fd, uint64_t off, uint64_t aligned, uint64_t *held)
{
	void *p = mmap(NULL, aligned, PROT_READ | PROT_WRITE, MAP_SHARED, fd, (off_t)off);
	if (p == MAP_FAILED)
		return -errno;
	*held = (uint64_t)(uintptr_t)p;
	return 0;
}

static int host_place(gmsfs *g, uint64_t held, void *va, uint64_t aligned)
{
	void *p = mremap((void *)(uintptr_t)held, aligned, aligned, MREMAP_MAYMOVE | MREMAP_FIXED, va);
	return p == MAP_FAILED ? -errno : 0;
}

static void host_drop(gmsfs *g, uint64_t held, uint64_t aligned)
{
	munmap((void *)(uintptr_t)held, aligned);
}

/* map gave the protection already; this is for a writer's commit. */
static int host_allow(gmsfs *g, void *va, uint64_t len, bool writable)
{
	return mprotect(va, len, PROT_READ | (writable ? PROT_WRITE : 0)) ? -errno : 0;
}

/* Private copies: plain heap memory, aligned as PyTorch aligns tensors. */
static int host_private_alloc(gmsfs *g, uint64_t size, void **p)
{
	return posix_memalign(p, 512, size) ? -ENOMEM : 0;
}

static void host_private_free(gmsfs *g, void *p)
{
	free(p);
}

static int host_copy(gmsfs *g, void *dst, const void *src, uint64_t size)
{
	memcpy(dst, src, size);
	return 0;
}

const struct gm_backend gm_host_backend = {
	.name = "host",
	.fd_has_access = true,
	.attach = host_attach,
	.reserve = host_reserve,
	.unreserve = host_unreserve,
	.map = host_map,
	.allow = host_allow,
	.unmap = host_unmap,
	.alias = host_alias,
	.hold = host_hold,
	.hold_fd = host_hold_fd,
	.place = host_place,
	.drop = host_drop,
	.private_alloc = host_private_alloc,
	.private_free = host_private_free,
	.copy = host_copy,
};
