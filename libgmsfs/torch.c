/* torch: an allocator that PyTorch's CUDAPluggableAllocator calls, in C: no Python
 * callback, no GIL.  Tensors (PyTorch asks for its segments) are carved out of slabs,
 * large allocations of the store the caller chose with gmsfs_torch_use, so that a
 * model of hundreds of tensors is a handful of allocations to import.  Each slab keeps
 * a list of free ranges, first fit, coalesced on free, 512-byte aligned as PyTorch's
 * own allocator aligns.
 *
 * The one piece of global state in libgmsfs: the pluggable allocator's entry points
 * carry no context, so the store they serve is set here, under a mutex. */
#include "internal.h"
#include "grow.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <gmsfs/torch.h>

#define TORCH_ALIGN GMSFS_TORCH_ALIGN

struct range {
	uint64_t off, len;
};

struct slab {
	char *name;
	uintptr_t base;
	uint64_t size;
	struct range *free; /* sorted by offset */
	size_t nfree, cap;
};

static struct {
	pthread_mutex_t mu;
	gmsfs *g;
	uint64_t slab_bytes;
	unsigned next;      /* the next slab's number */
	struct slab *slabs;
	size_t n, cap;
} ta = { .mu = PTHREAD_MUTEX_INITIALIZER };

static uint64_t align_up(uint64_t v, uint64_t a)
{
	return (v + a - 1) / a * a;
}

static void slabs_forget(void)
{
	for (size_t i = 0; i < ta.n; i++) {
		free(ta.slabs[i].name);
		free(ta.slabs[i].free);
	}
	free(ta.slabs);
	ta.slabs = NULL;
	ta.n = ta.cap = 0;
}

int gmsfs_torch_use(gmsfs *g, uint64_t slab_bytes)
{
	if (g && gmsfs_lock_mode(g) != GMSFS_RW)
		return gm_error(g, -EPERM, "torch allocator: the handle must hold the write lock");
	pthread_mutex_lock(&ta.mu);
	if (g != ta.g)
		slabs_forget(); /* slabs of another handle are not ours to carve */
	ta.g = g;
	ta.slab_bytes = slab_bytes ? slab_bytes : GMSFS_TORCH_SLAB_BYTES;
	pthread_mutex_unlock(&ta.mu);
	return 0;
}

/* First fit in s; UINTPTR_MAX when nothing fits. */
static uintptr_t carve(struct slab *s, uint64_t len)
{
	for (size_t i = 0; i < s->nfree; i++) {
		struct range *r = &s->free[i];
		if (r->len < len)
			continue;
		uint64_t off = r->off;
		r->off += len;
		r->len -= len;
		if (!r->len) {
			memmove(r, r + 1, (s->nfree - i - 1) * sizeof *r);
			s->nfree--;
		}
		return s->base + off;
	}
	return UINTPTR_MAX;
}

/* A new slab of at least len bytes (fs->mu not involved: ta.mu held). */
static struct slab *grow(uint64_t len)
{
	if (GROW(ta.slabs, ta.n, ta.cap, 8))
		return NULL;
	uint64_t size = len > ta.slab_bytes ? align_up(len, 2ull << 20) : ta.slab_bytes;
	char name[48];
	void *p = NULL;
	int e;
	/* The store may hold slabs already (a writer starts from the committed layout). */
	do {
		snprintf(name, sizeof name, GMSFS_TORCH_PREFIX "slab%05u", ta.next++);
		e = gmsfs_create(ta.g, name, size, GMSFS_TORCH_TAG, &p);
	} while (e == -EEXIST);
	if (e)
		return NULL;
	struct slab *s = &ta.slabs[ta.n];
	*s = (struct slab){ .name = strdup(name), .base = (uintptr_t)p, .size = size };
	if (!s->name || GROW(s->free, s->nfree, s->cap, 8)) {
		free(s->name);
		return NULL; /* the allocation stays in the store, unused: freed with the session */
	}
	s->free[s->nfree++] = (struct range){ 0, size };
	ta.n++;
	return s;
}

void *gmsfs_torch_alloc(ssize_t size, int device, void *stream)
{
	(void)stream; /* memory is the device's, for every stream */
	if (size < 0)
		return NULL;
	uint64_t len = align_up(size ? (uint64_t)size : 1, TORCH_ALIGN);
	pthread_mutex_lock(&ta.mu);
	uintptr_t p = UINTPTR_MAX;
	if (ta.g && gm_device_ok(ta.g, device)) {
		for (size_t i = 0; i < ta.n && p == UINTPTR_MAX; i++)
			p = carve(&ta.slabs[i], len);
		struct slab *s = p == UINTPTR_MAX ? grow(len) : NULL;
		if (s)
			p = carve(s, len);
	}
	pthread_mutex_unlock(&ta.mu);
	return p == UINTPTR_MAX ? NULL : (void *)p; /* NULL: PyTorch reports out of memory */
}

/* Give [off, off + len) back to s, merged with its neighbours. */
static void give_back(struct slab *s, uint64_t off, uint64_t len)
{
	size_t i = 0;
	while (i < s->nfree && s->free[i].off < off)
		i++;
	bool left = i > 0 && s->free[i - 1].off + s->free[i - 1].len == off;
	bool right = i < s->nfree && off + len == s->free[i].off;
	if (left && right) {
		s->free[i - 1].len += len + s->free[i].len;
		memmove(&s->free[i], &s->free[i + 1], (s->nfree - i - 1) * sizeof *s->free);
		s->nfree--;
	} else if (left) {
		s->free[i - 1].len += len;
	} else if (right) {
		s->free[i].off = off;
		s->free[i].len += len;
	} else if (!GROW(s->free, s->nfree, s->cap, 8)) {
		memmove(&s->free[i + 1], &s->free[i], (s->nfree - i) * sizeof *s->free);
		s->free[i] = (struct range){ off, len };
		s->nfree++;
	} /* else: out of memory for the list; the range stays used until the slab goes */
}

void gmsfs_torch_free(void *ptr, ssize_t size, int device, void *stream)
{
	(void)device, (void)stream;
	uintptr_t p = (uintptr_t)ptr;
	uint64_t len = align_up(size > 0 ? (uint64_t)size : 1, TORCH_ALIGN);
	pthread_mutex_lock(&ta.mu);
	for (size_t i = 0; i < ta.n; i++) {
		struct slab *s = &ta.slabs[i];
		if (p >= s->base && p - s->base < s->size) {
			give_back(s, p - s->base, len);
			break;
		}
	}
	/* Not in a slab of the current handle (it changed, or the tensor outlived it): a no-op. */
	pthread_mutex_unlock(&ta.mu);
}

size_t gmsfs_torch_slabs(void)
{
	pthread_mutex_lock(&ta.mu);
	size_t n = ta.n;
	pthread_mutex_unlock(&ta.mu);
	return n;
}
