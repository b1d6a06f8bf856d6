/* Pages: an address range set aside once, filled with device memory page by page as a KV
 * cache grows and emptied as it shrinks (libgmsfs(3), PAGES).  Each page is an allocation
 * of the writer's session, pages/<range>/<index>, made and freed by the daemon in batches;
 * this file maps each at its fixed place in the range.  The session never commits them:
 * a writer that dies gives them all back (its session rolls back). */
#include "internal.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>

struct gmsfs_pages {
	gmsfs *g;
	struct gmsfs_pages *next;  /* the handle's ranges, freed ones too (as spaces) */
	char prefix[48];           /* pages/<pid>.<serial> */
	void *base;
	uint64_t page, count;      /* page size, pages in the range */
	uint64_t nmapped;
	uint8_t *mapped;           /* one byte per page: mapped now */
	bool freed;
};

static int pg_check(gmsfs_pages *p)
{
	if (!p)
		return -EINVAL;
	if (p->freed)
		return gm_error(p->g, -EINVAL, "pages: the range was freed");
	return gm_need_lock(p->g, GMSFS_RW);
}

/* user.gms.reserved: what the engine set aside, for state and the metrics. */
static void tell_reserved(gmsfs *g)
{
	uint64_t span = 0;
	for (gmsfs_pages *p = g->pages; p; p = p->next)
		if (!p->freed)
			span += p->page * p->count;
	char text[32];
	snprintf(text, sizeof text, "%" PRIu64, span);
	if (g->dirfd >= 0)
		(void)(span ? fsetxattr(g->dirfd, GMSFS_XATTR_RESERVED, text, strlen(text), 0)
			    : fremovexattr(g->dirfd, GMSFS_XATTR_RESERVED));
}

int gmsfs_pages_reserve(gmsfs *g, uint64_t span, uint64_t page_size, gmsfs_pages **out)
{
	if (!g || !out)
		return g ? gm_error(g, -EINVAL, "pages_reserve: no place for the range") : -EINVAL;
	*out = NULL;
	int e = gm_need_lock(g, GMSFS_RW);
	if (e)
		return e;
	uint64_t gran = g->info.granularity ? g->info.granularity : 4096;
	if (!page_size)
		page_size = gran;
	if (page_size % gran || !span || span > UINT64_MAX - page_size)
		return gm_error(g, -EINVAL, "pages_reserve: page size %" PRIu64 " (a multiple of the granularity, %" PRIu64
					    ") and a span of more than 0 bytes", page_size, gran);
	uint64_t count = (span + page_size - 1) / page_size;
	static unsigned serial;
	gmsfs_pages *p = calloc(1, sizeof *p);
	if (!p || !(p->mapped = calloc(count, 1))) {
		free(p);
		return gm_error(g, -ENOMEM, "out of memory");
	}
	if ((e = g->be->reserve(g, count * page_size, &p->base))) {
		free(p->mapped);
		free(p);
		return gm_error(g, e, "pages_reserve: %" PRIu64 " bytes of address space: %s", count * page_size,
				strerror(-e));
	}
	p->g = g;
	p->page = page_size;
	p->count = count;
	snprintf(p->prefix, sizeof p->prefix, "pages/%d.%u", (int)getpid(), __atomic_add_fetch(&serial, 1, __ATOMIC_RELAXED));
	p->next = g->pages;
	g->pages = p;
	tell_reserved(g);
	*out = p;
	return 0;
}

void *gmsfs_pages_base(const gmsfs_pages *p)
{
	return p ? p->base : NULL;
}

uint64_t gmsfs_pages_size(const gmsfs_pages *p)
{
	return p ? p->page : 0;
}

uint64_t gmsfs_pages_count(const gmsfs_pages *p)
{
	return p ? p->count : 0;
}

uint64_t gmsfs_pages_mapped(const gmsfs_pages *p)
{
	return p ? p->nmapped : 0;
}

/* idx[0..n): each in the range, none twice, each mapped (want) or not. */
static int check_idx(gmsfs_pages *p, const uint64_t *idx, size_t n, bool want)
{
	size_t i = 0;
	int e = 0;
	for (; i < n && !e; i++) {
		if (idx[i] >= p->count)
			e = gm_error(p->g, -EINVAL, "pages: index %" PRIu64 " is past the range's %" PRIu64 " pages", idx[i],
				     p->count);
		else if (p->mapped[idx[i]] & 2)
			e = gm_error(p->g, -EINVAL, "pages: index %" PRIu64 " twice in one call", idx[i]);
		else if (!(p->mapped[idx[i]] & 1) != !want)
			e = gm_error(p->g, want ? -ENOENT : -EEXIST, "pages: page %" PRIu64 " is %s", idx[i],
				     want ? "not mapped" : "mapped already");
		else
			p->mapped[idx[i]] |= 2;
	}
	for (size_t k = 0; k < i; k++)
		p->mapped[idx[k]] &= 1;
	return e;
}

static char **page_names(gmsfs_pages *p, const uint64_t *idx, size_t n)
{
	char **names = calloc(n ? n : 1, sizeof *names);
	for (size_t i = 0; names && i < n; i++)
		if (asprintf(&names[i], "%s/%" PRIu64, p->prefix, idx[i]) < 0) {
			while (i--)
				free(names[i]);
			free(names);
			return NULL;
		}
	return names;
}

static void free_names(char **names, size_t n)
{
	for (size_t i = 0; names && i < n; i++)
		free(names[i]);
	free(names);
}

/* A map's or unmap's checks (want: the pages mapped now), then the pages' names. */
static int begin(gmsfs_pages *p, const uint64_t *idx, size_t n, bool want, const char *what, char ***names)
{
	*names = NULL;
	int e = pg_check(p);
	if (e || !n)
		return e;
	if (!idx)
		return gm_error(p->g, -EINVAL, "%s: no indices", what);
	if ((e = check_idx(p, idx, n, want)))
		return e;
	return (*names = page_names(p, idx, n)) ? 0 : gm_error(p->g, -ENOMEM, "out of memory");
}

/* The daemon frees pages' allocations (their memory goes once unmapped here too). */
static int give_back(gmsfs_pages *p, char **names, size_t n)
{
	msgpack_sbuffer sb;
	msgpack_sbuffer_init(&sb);
	int e = wire_pack_names(&sb, GMSFS_K_PATHS, (const char *const *)names, n);
	e = e ? gm_error(p->g, e, "out of memory") : gm_call(p->g, GMSFS_OP_FREE, sb.data, sb.size, NULL);
	msgpack_sbuffer_destroy(&sb);
	return e;
}

struct placing {
	gmsfs_pages *p;
	bool made;
};

/* The create's manifest, message by message: each page at its place, its access set. */
static int place(void *ctx, struct ch_manifest *m, size_t from, size_t to)
{
	struct placing *c = ctx;
	gmsfs_pages *p = c->p;
	gmsfs *g = p->g;
	c->made = true;
	for (size_t k = from; k < to; k++) {
		const char *slash = strrchr(m->allocs[k].path, '/');
		char *end;
		uint64_t i = slash ? strtoull(slash + 1, &end, 10) : UINT64_MAX;
		if (i >= p->count || *end || m->allocs[k].aligned != p->page || m->fd[k] < 0)
			return gm_error(g, -EPROTO, "%s: not a page of this range", m->allocs[k].path);
		char *va = (char *)p->base + i * p->page, why[200] = "";
		int e = g->be->map(g, va, p->page, m->fd[k], m->allocs[k].fd_offset, true, why, sizeof why);
		if (!e && (e = g->be->allow(g, va, p->page, true)))
			g->be->unmap(g, va, p->page);
		if (e)
			return gm_error(g, e, "%s: %s", m->allocs[k].path, why[0] ? why : strerror(-e));
		p->mapped[i] = 1;
		p->nmapped++;
	}
	return 0;
}

/* One try: one CREATE of n pages. */
static int map_once(gmsfs_pages *p, const uint64_t *idx, size_t n, char **names)
{
	struct wire_alloc *a = calloc(n, sizeof *a);
	if (!a)
		return gm_error(p->g, -ENOMEM, "out of memory");
	for (size_t i = 0; i < n; i++)
		a[i] = (struct wire_alloc){ .path = names[i], .tag = "kv_cache", .size = p->page };
	msgpack_sbuffer sb;
	msgpack_sbuffer_init(&sb);
	struct placing c = { .p = p };
	struct ch_manifest m = { .consume = place, .ctx = &c };
	int e = wire_pack_create(&sb, a, n);
	if (e)
		e = gm_error(p->g, e, "out of memory");
	else if (!(e = gm_call(p->g, GMSFS_OP_CREATE, sb.data, sb.size, &m)))
		ch_manifest_free(&m);
	msgpack_sbuffer_destroy(&sb);
	free(a);
	if (e && c.made) { /* all or nothing: what was placed is unmapped, what was made freed */
		char keep[sizeof p->g->err];
		memcpy(keep, p->g->err, sizeof keep);
		for (size_t i = 0; i < n; i++)
			if (p->mapped[idx[i]]) {
				p->g->be->unmap(p->g, (char *)p->base + idx[i] * p->page, p->page);
				p->mapped[idx[i]] = 0;
				p->nmapped--;
			}
		give_back(p, names, n);
		memcpy(p->g->err, keep, sizeof keep);
	}
	return e;
}

static uint64_t now_ms(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (uint64_t)t.tv_sec * 1000 + (uint64_t)t.tv_nsec / 1000000;
}

int gmsfs_pages_map(gmsfs_pages *p, const uint64_t *idx, size_t n, int timeout_ms)
{
	char **names;
	int e = begin(p, idx, n, false, "pages_map", &names);
	if (e || !names)
		return e;
	/* -EAGAIN: elastic stores were asked to give pages back; their engines have a while. */
	uint64_t until = now_ms() + (timeout_ms > 0 ? (uint64_t)timeout_ms : 0);
	for (unsigned wait_us = 500;; wait_us = wait_us < 16000 ? wait_us * 2 : wait_us) {
		e = map_once(p, idx, n, names);
		if (e != -EAGAIN)
			break;
		if (now_ms() >= until) {
			char why[sizeof p->g->err];
			memcpy(why, p->g->err, sizeof why); /* not formatted into itself */
			e = gm_error(p->g, -ENOSPC, "%s (waited %d ms)", why, timeout_ms > 0 ? timeout_ms : 0);
			break;
		}
		usleep(wait_us);
	}
	free_names(names, n);
	return e;
}

int gmsfs_pages_unmap(gmsfs_pages *p, const uint64_t *idx, size_t n)
{
	char **names;
	int e = begin(p, idx, n, true, "pages_unmap", &names);
	if (e || !names)
		return e;
	if (p->g->be->drain && (e = p->g->be->drain(p->g))) { /* kernels queued on the pages first */
		free_names(names, n);
		return gm_error(p->g, e, "pages_unmap: the context's queued work failed: %s", strerror(-e));
	}
	for (size_t i = 0; i < n; i++) { /* no access here first: the memory goes next */
		p->g->be->unmap(p->g, (char *)p->base + idx[i] * p->page, p->page);
		p->mapped[idx[i]] = 0;
		p->nmapped--;
	}
	e = give_back(p, names, n);
	free_names(names, n);
	return e;
}

int gmsfs_pages_reclaim(gmsfs_pages *p, uint64_t *bytes)
{
	if (!p || !bytes)
		return p ? gm_error(p->g, -EINVAL, "pages_reclaim: no place for the answer") : -EINVAL;
	*bytes = 0;
	int e = pg_check(p);
	if (e)
		return e;
	int fd = openat(p->g->dirfd, "state", O_RDONLY | O_CLOEXEC);
	char buf[4096];
	ssize_t r = fd < 0 ? -1 : read(fd, buf, sizeof buf - 1);
	e = r < 0 ? -errno : 0;
	if (fd >= 0)
		close(fd);
	if (e)
		return gm_error(p->g, e, "%s/state: %s", p->g->dir, strerror(-e));
	buf[r] = '\0';
	const char *at = strstr(buf, "\nreclaim: ");
	if (at)
		*bytes = strtoull(at + 10, NULL, 10);
	return 0;
}

/* Every mapped page unmapped and given back, the range too; the record stays (as a
 * space's) so that a second free is -EINVAL. */
static int release(gmsfs_pages *p, bool tell)
{
	int e = 0;
	uint64_t *idx = p->nmapped ? malloc(p->nmapped * sizeof *idx) : NULL;
	size_t n = 0;
	for (uint64_t i = 0; idx && i < p->count; i++)
		if (p->mapped[i])
			idx[n++] = i;
	if (n && tell && p->g->lock == GMSFS_RW)
		e = gmsfs_pages_unmap(p, idx, n);
	if (p->nmapped && p->g->be->drain)
		p->g->be->drain(p->g);
	for (uint64_t i = 0; i < p->count; i++) /* what is left (no lock, no memory): unmapped here */
		if (p->mapped[i]) {
			p->g->be->unmap(p->g, (char *)p->base + i * p->page, p->page);
			p->mapped[i] = 0;
		}
	free(idx);
	p->nmapped = 0;
	p->g->be->unreserve(p->g, p->base, p->count * p->page);
	free(p->mapped);
	p->mapped = NULL;
	p->freed = true;
	return e;
}

int gmsfs_pages_free(gmsfs_pages *p)
{
	if (!p)
		return -EINVAL;
	if (p->freed)
		return gm_error(p->g, -EINVAL, "pages_free: freed already");
	int e = release(p, true);
	tell_reserved(p->g);
	return e;
}

bool pg_live(const gmsfs *g)
{
	for (const gmsfs_pages *p = g->pages; p; p = p->next)
		if (!p->freed)
			return true;
	return false;
}

void pg_release_all(gmsfs *g)
{
	while (g->pages) {
		gmsfs_pages *p = g->pages;
		g->pages = p->next;
		if (!p->freed)
			release(p, false); /* disconnect: the session's end gives the memory back */
		free(p);
	}
}
