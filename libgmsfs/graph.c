/* graph: a memory pool for CUDA graphs that costs the largest capture, not the sum
 * (xLLM's multi-shape graph memory).  Graphs captured for different shapes never run at
 * the same time, so their memory can be the same: each capture gets a range space
 * (space.c) over the same chunks, allocations of the store gmsfs_graph_use names, and
 * its tensors at addresses of their own, kept for the graph's life.  Within a capture
 * PyTorch's allocator asks for segments, handed out one after another from the start of
 * the capture's space; chunks are mapped into it, and made, as the segments need them.
 * So N captures hold the chunks of the largest one, in any order.
 *
 * Like torch.c's, this is global state: a pluggable allocator's entry points carry no
 * context.  One pool per process. */
#include "internal.h"
#include "grow.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GRAPH_ALIGN 512                 /* as PyTorch's allocator aligns */
#define GRAPH_CHUNK (64ull << 20)
#define GRAPH_SPAN (256ull << 30)      /* addresses only: a capture's range costs no memory */
#define GRAPH_PREFIX "graph/chunk"

static struct {
	pthread_mutex_t mu;
	gmsfs *g;
	uint64_t chunk, span;
	char **chunks;          /* the store's allocations, in the order spaces map them */
	size_t nchunks, cap;
	unsigned next;          /* the next chunk's number */
	gmsfs_space *space;     /* the capture's, or NULL before the first begin */
	char *base;             /* where its first chunk is mapped (NULL: none yet) */
	size_t mapped;          /* chunks mapped in it */
	uint64_t used;          /* bytes handed out from base */
} gr = { .mu = PTHREAD_MUTEX_INITIALIZER };

static void forget(void)
{
	for (size_t i = 0; i < gr.nchunks; i++)
		free(gr.chunks[i]);
	free(gr.chunks);
	gr.chunks = NULL;
	gr.nchunks = gr.cap = 0;
	gr.space = NULL; /* its handle frees it */
	gr.base = NULL;
	gr.mapped = 0;
	gr.used = 0;
}

int gmsfs_graph_use(gmsfs *g, uint64_t chunk_bytes, uint64_t span_bytes)
{
	if (g && gmsfs_lock_mode(g) != GMSFS_RW)
		return gm_error(g, -EPERM, "graph pool: the handle must hold the write lock");
	uint64_t gran = g ? g->info.granularity : 1, chunk = chunk_bytes ? chunk_bytes : GRAPH_CHUNK;
	chunk = (chunk + gran - 1) / gran * gran;
	uint64_t span = span_bytes ? span_bytes : GRAPH_SPAN;
	if (g && span < chunk)
		return gm_error(g, -EINVAL, "graph pool: a capture's span (%llu bytes) is less than a chunk (%llu)",
				(unsigned long long)span, (unsigned long long)chunk);
	pthread_mutex_lock(&gr.mu);
	forget();
	gr.g = g;
	gr.chunk = chunk;
	gr.span = (span + chunk - 1) / chunk * chunk;
	pthread_mutex_unlock(&gr.mu);
	return 0;
}

int gmsfs_graph_begin(void)
{
	pthread_mutex_lock(&gr.mu);
	int e = gr.g ? gmsfs_space_new_range(gr.g, gr.span, &gr.space) : -EINVAL;
	if (!e) {
		gr.base = NULL;
		gr.mapped = 0;
		gr.used = 0;
	}
	pthread_mutex_unlock(&gr.mu);
	return e;
}

/* The next chunk mapped into the capture's space, made first if no capture had as many. */
static int map_next(void)
{
	int e = 0;
	if (gr.mapped == gr.nchunks) {
		if (GROW(gr.chunks, gr.nchunks, gr.cap, 16))
			return -ENOMEM;
		char name[48];
		void *p;
		do { /* the store may hold chunks of an earlier pool */
			snprintf(name, sizeof name, GRAPH_PREFIX "%05u", gr.next++);
			e = gmsfs_create(gr.g, name, gr.chunk, "graph", &p);
		} while (e == -EEXIST);
		if (e || !(gr.chunks[gr.nchunks] = strdup(name)))
			return e ? e : -ENOMEM;
		gr.nchunks++;
	}
	void *at;
	if ((e = gmsfs_space_map(gr.space, gr.chunks[gr.mapped], &at)))
		return e;
	if (!gr.base)
		gr.base = at;
	gr.mapped++;
	return 0;
}

#ifdef GMSFS_HAVE_CUDA
/* Driver calls while a stream captures: PyTorch captures in the global mode, which
 * refuses calls it deems unsafe (it does the same around its own cudaMalloc). */
static CUstreamCaptureMode relaxed(gmsfs *g, CUstreamCaptureMode mode)
{
	if (g->cu.cuThreadExchangeStreamCaptureMode)
		g->cu.cuThreadExchangeStreamCaptureMode(&mode);
	return mode;
}
#endif

void *gmsfs_graph_alloc(ssize_t size, int device, void *stream)
{
	(void)stream;
	if (size < 0)
		return NULL;
	pthread_mutex_lock(&gr.mu);
	void *p = NULL;
	if (gr.g && gr.space && gm_device_ok(gr.g, device)) {
		uint64_t off = (gr.used + GRAPH_ALIGN - 1) / GRAPH_ALIGN * GRAPH_ALIGN, end = off + (uint64_t)size;
#ifdef GMSFS_HAVE_CUDA
		bool cuda = gmsfs_backend(gr.g) == GMSFS_BACKEND_CUDA;
		CUstreamCaptureMode was = cuda ? relaxed(gr.g, CU_STREAM_CAPTURE_MODE_RELAXED) : 0;
#endif
		int e = end > gr.span ? -ENOSPC : 0;
		while (!e && gr.mapped * gr.chunk < end)
			e = map_next();
#ifdef GMSFS_HAVE_CUDA
		if (cuda)
			relaxed(gr.g, was);
#endif
		if (!e) {
			p = gr.base + off;
			gr.used = end;
		}
	}
	pthread_mutex_unlock(&gr.mu);
	return p; /* NULL: PyTorch reports out of memory */
}

void gmsfs_graph_free(void *ptr, ssize_t size, int device, void *stream)
{
	/* The pool's memory is its own until the next gmsfs_graph_use: a graph's tensors
	 * live as long as the graph, and the space keeps their addresses. */
	(void)ptr, (void)size, (void)device, (void)stream;
}

uint64_t gmsfs_graph_bytes(void)
{
	pthread_mutex_lock(&gr.mu);
	uint64_t n = gr.nchunks * gr.chunk;
	pthread_mutex_unlock(&gr.mu);
	return n;
}
