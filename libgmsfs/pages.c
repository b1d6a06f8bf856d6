/* Pages: an address range set aside once, filled with device memory page by page as a KV
 * cache grows and emptied as it shrinks (libgmsfs(3), PAGES).  Each page is an allocation
 * of the writer's session, pages/<range>/<number>, made and freed by the daemon in
 * batches; this file maps each at its place in the range.  The session never commits
 * them: a writer that dies gives them all back (its session rolls back).
 *
 * Pages within the store's minimum (user.gms.min) stay in this process when unmapped,
 * held, and the range's first pages up to it are made at reserve: the device keeps that
 * room for the store anyway, and a held page maps again with no request, no import (an
 * H100: 20 of the 46 us a page costs beyond the raw driver loop's map and access).  A
 * page unmapped within the minimum stays where it was, mapped, until a map needs it
 * elsewhere or it goes back: a cache that grows again over the places it shrank from
 * costs no driver call at all (the driver's map and access of a page, 25-30 us on an
 * H100, are most of what the raw loop costs).  Above the minimum, an unmap gives the
 * memory back to the daemon. */
#include "pages_held.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>

#include "grow.h"

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

/* The memory of the handle's pages in this process: mapped, or held. */
static uint64_t pages_bytes(const gmsfs *g)
{
	uint64_t b = 0;
	for (const gmsfs_pages *p = g->pages; p; p = p->next)
		if (!p->freed)
			b += (p->nmapped + p->nheld) * p->page;
	return b;
}

static char **names_of(gmsfs_pages *p, const uint64_t *num, size_t n)
{
	char **names = calloc(n ? n : 1, sizeof *names);
	for (size_t i = 0; names && i < n; i++)
		if (asprintf(&names[i], "%s/%" PRIu64, p->prefix, num[i]) < 0) {
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

/* The daemon frees the allocations numbered num[0..n) (their memory goes once unmapped
 * here too). */
int pg_give_back(gmsfs_pages *p, const uint64_t *num, size_t n)
{
	char **names = names_of(p, num, n);
	if (!names)
		return gm_error(p->g, -ENOMEM, "out of memory");
	msgpack_sbuffer sb;
	msgpack_sbuffer_init(&sb);
	int e = wire_pack_names(&sb, GMSFS_K_PATHS, (const char *const *)names, n);
	e = e ? gm_error(p->g, e, "out of memory") : gm_call(p->g, GMSFS_OP_FREE, sb.data, sb.size, NULL);
	msgpack_sbuffer_destroy(&sb);
	free_names(names, n);
	return e;
}

int pg_give_back_held(gmsfs *g, uint64_t keep)
{
	int e = 0;
	for (gmsfs_pages *p = g->pages; p; p = p->next) {
		uint64_t bytes = pages_bytes(g);
		if (p->freed || !p->nheld || bytes <= keep)
			continue;
		size_t n = 0;
		uint64_t *num = malloc(p->nheld * sizeof *num);
		pg_drain_staying(p);
		while (num && p->nheld && bytes > keep) {
			num[n++] = pg_let_go_last(p);
			bytes -= p->page;
		}
		int r = num ? pg_give_back(p, num, n) : gm_error(g, -ENOMEM, "out of memory");
		e = e ? e : r;
		free(num);
	}
	return e;
}

struct making {
	gmsfs_pages *p;
	const uint64_t *idx; /* where each goes; NULL: held (made at reserve) */
	uint64_t first;      /* the first one's number; the rest follow */
	size_t n, held;      /* pages asked for; of them held so far */
	bool answered;       /* the daemon made them */
};

/* A create's manifest, message by message: each page at its place (its access is set
 * by the map, for runs of pages at once), or held. */
static int made(void *ctx, struct ch_manifest *m, size_t from, size_t to)
{
	struct making *c = ctx;
	gmsfs_pages *p = c->p;
	gmsfs *g = p->g;
	c->answered = true;
	for (size_t k = from; k < to; k++) {
		const char *slash = strrchr(m->allocs[k].path, '/');
		char *end = NULL;
		uint64_t num = slash ? strtoull(slash + 1, &end, 10) : 0, j = num - c->first;
		if (!slash || *end || num < c->first || j >= c->n || m->allocs[k].aligned != p->page || m->fd[k] < 0 ||
		    m->allocs[k].npieces || /* a page is one piece of memory */
		    (c->idx ? p->mapped[c->idx[j]] != 0 : c->held >= c->n)) /* one twice */
			return gm_error(g, -EPROTO, "%s: not a page of this range", m->allocs[k].path);
		char why[200] = "";
		int e;
		if (!c->idx) {
			uint64_t mem;
			if ((e = g->be->hold_fd(g, m->fd[k], m->allocs[k].fd_offset, p->page, &mem)))
				return gm_error(g, e, "%s: %s", m->allocs[k].path, strerror(-e));
			if ((e = pg_held_add(p, num, mem, 0))) {
				g->be->drop(g, mem, p->page);
				return gm_error(g, e, "out of memory");
			}
			c->held++;
			continue;
		}
		char *va = (char *)p->base + c->idx[j] * p->page;
		e = g->be->map(g, va, p->page, m->fd[k], m->allocs[k].fd_offset, true, why, sizeof why);
		if (e)
			return gm_error(g, e, "%s: %s", m->allocs[k].path, why[0] ? why : strerror(-e));
		p->mapped[c->idx[j]] = PG_MAPPED;
		p->name[c->idx[j]] = num;
		p->nmapped++;
	}
	return 0;
}

/* One CREATE of n new pages, mapped at idx[0..n) (or held, idx NULL): all or nothing. */
static int make(gmsfs_pages *p, const uint64_t *idx, size_t n)
{
	uint64_t *num = malloc(n * sizeof *num);
	char **names = NULL;
	struct wire_alloc *a = calloc(n, sizeof *a);
	for (size_t i = 0; num && i < n; i++)
		num[i] = p->next_name + i;
	if (!num || !a || !(names = names_of(p, num, n))) {
		free(num);
		free(a);
		return gm_error(p->g, -ENOMEM, "out of memory");
	}
	for (size_t i = 0; i < n; i++)
		a[i] = (struct wire_alloc){ .path = names[i], .tag = "kv_cache", .size = p->page };
	struct making c = { .p = p, .idx = idx, .first = p->next_name, .n = n };
	p->next_name += n;
	size_t held_before = p->nheld;
	msgpack_sbuffer sb;
	msgpack_sbuffer_init(&sb);
	struct ch_manifest m = { .consume = made, .ctx = &c };
	int e = wire_pack_create(&sb, a, n);
	if (e)
		e = gm_error(p->g, e, "out of memory");
	else if (!(e = gm_call(p->g, GMSFS_OP_CREATE, sb.data, sb.size, &m)))
		ch_manifest_free(&m);
	msgpack_sbuffer_destroy(&sb);
	free_names(names, n);
	free(a);
	if (e && c.answered) { /* what was placed is unmapped (or let go), what was made freed */
		char keep[sizeof p->g->err];
		memcpy(keep, p->g->err, sizeof keep);
		for (size_t i = 0; idx && i < n; i++)
			if (p->mapped[idx[i]] & PG_MAPPED) {
				p->g->be->unmap(p->g, (char *)p->base + idx[i] * p->page, p->page);
				p->mapped[idx[i]] = 0;
				p->nmapped--;
			}
		while (p->nheld > held_before)
			pg_let_go_last(p);
		pg_give_back(p, num, n);
		memcpy(p->g->err, keep, sizeof keep);
	}
	free(num);
	return e;
}

/* The range's first pages up to the store's minimum, made and held now (best effort:
 * the room is kept for the store, so a failure only leaves them to the first maps). */
static void make_to_min(gmsfs_pages *p)
{
	gmsfs *g = p->g;
	char text[32];
	ssize_t len = fgetxattr(g->dirfd, GMSFS_XATTR_MIN, text, sizeof text - 1);
	g->pages_min = len > 0 ? (text[len] = '\0', strtoull(text, NULL, 10)) : 0;
	uint64_t bytes = pages_bytes(g), n = bytes < g->pages_min ? (g->pages_min - bytes) / p->page : 0;
	if (n > p->count)
		n = p->count;
	if (!n || ROOM(p->held, n, p->held_cap, 16))
		return;
	char keep[sizeof g->err];
	memcpy(keep, g->err, sizeof keep);
	make(p, NULL, (size_t)n);
	memcpy(g->err, keep, sizeof keep);
}

int pg_new(gmsfs *g, uint64_t span, uint64_t page_size, const char *prefix, gmsfs_pages **out)
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
	if (count >= UINT32_MAX) /* held pages are found by a 32-bit slot */
		return gm_error(g, -EINVAL, "pages_reserve: %" PRIu64 " pages; at most %u", count, UINT32_MAX - 1);
	gmsfs_pages *p = calloc(1, sizeof *p);
	if (!p || !(p->mapped = calloc(count, 1)) || !(p->name = calloc(count, sizeof *p->name)) ||
	    !(p->slot = calloc(count, sizeof *p->slot))) {
		if (p)
			free(p->mapped), free(p->name);
		free(p);
		return gm_error(g, -ENOMEM, "out of memory");
	}
	if ((e = g->be->reserve(g, count * page_size, 0, &p->base))) {
		free(p->slot);
		free(p->name);
		free(p->mapped);
		free(p);
		return gm_error(g, e, "pages_reserve: %" PRIu64 " bytes of address space: %s", count * page_size,
				strerror(-e));
	}
	p->g = g;
	p->page = page_size;
	p->count = count;
	uint32_t salt = 0; /* a kept range outlives its engine: a later one of the same pid (pid 1
	                    * in a container) must not take its name */
	if (getrandom(&salt, sizeof salt, GRND_NONBLOCK) != sizeof salt)
		salt = (uint32_t)gm_now_ms() ^ (uint32_t)(uintptr_t)p;
	if (prefix)
		snprintf(p->prefix, sizeof p->prefix, "%s", prefix);
	else
		snprintf(p->prefix, sizeof p->prefix, GMSFS_PAGES_PREFIX "%d.%u.%08x", (int)getpid(),
			 __atomic_add_fetch(&serial, 1, __ATOMIC_RELAXED), salt);
	p->next = g->pages;
	g->pages = p;
	tell_reserved(g);
	*out = p;
	return 0;
}

int gmsfs_pages_reserve(gmsfs *g, uint64_t span, uint64_t page_size, gmsfs_pages **out)
{
	int e = pg_new(g, span, page_size, NULL, out);
	if (!e)
		make_to_min(*out);
	return e;
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
		else if (p->mapped[idx[i]] & PG_ASKED)
			e = gm_error(p->g, -EINVAL, "pages: index %" PRIu64 " twice in one call", idx[i]);
		else if (!(p->mapped[idx[i]] & PG_MAPPED) != !want)
			e = gm_error(p->g, want ? -ENOENT : -EEXIST, "pages: page %" PRIu64 " is %s", idx[i],
				     want ? "not mapped" : "mapped already");
		else
			p->mapped[idx[i]] |= PG_ASKED;
	}
	for (size_t k = 0; k < i; k++)
		p->mapped[idx[k]] &= (uint8_t)~PG_ASKED;
	return e;
}

/* A map's or unmap's checks (want: the pages mapped now). */
static int begin(gmsfs_pages *p, const uint64_t *idx, size_t n, bool want, const char *what)
{
	int e = pg_check(p);
	if (e || !n)
		return e;
	if (!idx)
		return gm_error(p->g, -EINVAL, "%s: no indices", what);
	return check_idx(p, idx, n, want);
}

/* The access of idx[0..n), mapped by this call: set once for each run of neighbours (the
 * driver's cost is a call's, not a page's: 24 us for one page or 64 on an H100). */
int pg_allow_runs(gmsfs_pages *p, const uint64_t *idx, size_t n)
{
	for (size_t i = 0, j; i < n; i = j) {
		for (j = i + 1; j < n && idx[j] == idx[j - 1] + 1; j++)
			;
		int e = p->g->be->allow(p->g, (char *)p->base + idx[i] * p->page, (j - i) * p->page, true);
		if (e)
			return gm_error(p->g, e, "pages_map: access: %s", strerror(-e));
	}
	return 0;
}

/* A map that failed after placing idx[0..n): the first k held again (the first stayed where
 * they are, their access set; the others off their place), the rest (made by it)
 * unmapped and given back. */
static void unmap_placed(gmsfs_pages *p, const uint64_t *idx, size_t n, size_t stayed, size_t k)
{
	char keep[sizeof p->g->err];
	memcpy(keep, p->g->err, sizeof keep);
	uint64_t *num = malloc((n + 1) * sizeof *num);
	size_t m = 0;
	for (size_t i = 0; i < n; i++) {
		if (i < k && !(i < stayed ? pg_hold(p, idx[i]) : pg_hold_off(p, idx[i])))
			continue;
		p->g->be->unmap(p->g, (char *)p->base + idx[i] * p->page, p->page);
		p->mapped[idx[i]] = 0;
		p->nmapped--;
		if (num)
			num[m++] = p->name[idx[i]];
	}
	if (m)
		pg_give_back(p, num, m);
	free(num);
	memcpy(p->g->err, keep, sizeof keep);
}


int gmsfs_pages_map(gmsfs_pages *p, const uint64_t *asked, size_t n, int timeout_ms)
{
	int e = begin(p, asked, n, false, "pages_map");
	if (e || !n)
		return e;
	uint64_t *idx = malloc(n * sizeof *idx); /* reordered: held pages that stayed first */
	if (!idx)
		return gm_error(p->g, -ENOMEM, "out of memory");
	memcpy(idx, asked, n * sizeof *idx);
	size_t stayed, k = pg_place_held(p, idx, n, &stayed);
	/* -EAGAIN: elastic stores were asked to give pages back; their engines have a while. */
	int64_t until = gm_now_ms() + (timeout_ms > 0 ? timeout_ms : 0);
	for (unsigned wait_us = 500; k < n; wait_us = wait_us < 16000 ? wait_us * 2 : wait_us) {
		e = make(p, idx + k, n - k);
		if (e != -EAGAIN)
			break;
		if (gm_now_ms() >= until) {
			char why[sizeof p->g->err];
			memcpy(why, p->g->err, sizeof why); /* not formatted into itself */
			e = gm_error(p->g, -ENOSPC, "%s (waited %d ms)", why, timeout_ms > 0 ? timeout_ms : 0);
			break;
		}
		usleep(wait_us);
	}
	if (!e && (e = pg_allow_runs(p, idx + stayed, n - stayed)))
		unmap_placed(p, idx, n, stayed, k); /* all or nothing */
	else if (e)
		unmap_placed(p, idx, k, stayed, k); /* make() undid its own */
	free(idx);
	return e;
}

int gmsfs_pages_unmap(gmsfs_pages *p, const uint64_t *idx, size_t n)
{
	int e = begin(p, idx, n, true, "pages_unmap");
	if (e || !n)
		return e;
	gmsfs *g = p->g;
	/* As many stay held, mapped where they are, as keep this process's pages within the
	 * minimum; only those that go need the kernels queued on them done first. */
	uint64_t bytes = pages_bytes(g), over = bytes > g->pages_min ? bytes - g->pages_min : 0;
	uint64_t give = (over + p->page - 1) / p->page;
	size_t keep = give >= n || p->kept ? 0 : n - (size_t)give, ngive = 0;
	if (keep < n && g->be->drain && (e = g->be->drain(g)))
		return gm_error(g, e, "pages_unmap: the context's queued work failed: %s", strerror(-e));
	uint64_t *num = malloc(n * sizeof *num);
	if (!num)
		return gm_error(g, -ENOMEM, "out of memory");
	for (size_t i = 0; i < n; i++) {
		if (i < keep && !pg_hold(p, idx[i]))
			continue;
		g->be->unmap(g, (char *)p->base + idx[i] * p->page, p->page); /* no access first: */
		p->mapped[idx[i]] = 0;                                         /* the memory goes next */
		p->nmapped--;
		pg_forget_record(p, idx[i]); /* the daemon drops its entry with the allocation */
		num[ngive++] = p->name[idx[i]];
	}
	e = ngive ? pg_give_back(p, num, ngive) : 0;
	free(num);
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
	const char *at = strstr(buf, "\nreclaim: "), *min = strstr(buf, "\nmin: ");
	if (at)
		*bytes = strtoull(at + 10, NULL, 10);
	if (min) /* a minimum lowered: what is held past it goes back now */
		p->g->pages_min = strtoull(min + 6, NULL, 10);
	return pg_give_back_held(p->g, p->g->pages_min); /* what is held past the minimum */
}

/* Every page unmapped or let go and given back, the range too; the record stays (as a
 * space's) so that a second free is -EINVAL.  tell: the daemon frees them now (else the
 * session's end does). */
int pg_release(gmsfs_pages *p, bool tell)
{
	gmsfs *g = p->g;
	if ((p->nmapped || p->nheld) && g->be->drain)
		g->be->drain(g); /* kernels queued on the pages first */
	uint64_t *num = malloc((p->nmapped + p->nheld + 1) * sizeof *num);
	size_t n = 0;
	for (uint64_t i = 0; i < p->count; i++)
		if (p->mapped[i] & PG_MAPPED) {
			g->be->unmap(g, (char *)p->base + i * p->page, p->page);
			p->mapped[i] = 0;
			if (num)
				num[n++] = p->name[i];
		}
	while (p->nheld) {
		uint64_t name = pg_let_go_last(p);
		if (num)
			num[n++] = name;
	}
	p->nmapped = 0;
	int e = !tell || !n || g->lock != GMSFS_RW ? 0 : num ? pg_give_back(p, num, n) : gm_error(g, -ENOMEM, "out of memory");
	free(num);
	g->be->unreserve(g, p->base, p->count * p->page);
	free(p->mapped);
	free(p->name);
	free(p->held);
	free(p->slot);
	for (uint64_t i = 0; p->rec && i < p->count; i++)
		free(p->rec[i].data);
	free(p->rec);
	p->rec = NULL;
	p->mapped = NULL;
	p->name = NULL;
	p->held = NULL;
	p->slot = NULL;
	p->freed = true;
	return e;
}

int gmsfs_pages_free(gmsfs_pages *p)
{
	if (!p)
		return -EINVAL;
	if (p->freed)
		return gm_error(p->g, -EINVAL, "pages_free: freed already");
	int e = pg_release(p, true);
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

void pg_allow_all(gmsfs *g, bool writable)
{
	for (gmsfs_pages *p = g->pages; p; p = p->next)
		for (uint64_t i = 0, j; !p->freed && i < p->count; i = j) {
			for (j = i; j < p->count && (p->mapped[j] & (PG_MAPPED | PG_STAYS)); j++)
				;
			if (j > i) /* a run of neighbours: one call */
				g->be->allow(g, (char *)p->base + i * p->page, (j - i) * p->page, writable);
			else
				j = i + 1;
		}
}

void pg_release_all(gmsfs *g)
{
	while (g->pages) {
		gmsfs_pages *p = g->pages;
		g->pages = p->next;
		if (!p->freed)
			pg_release(p, false); /* disconnect: the session's end gives the memory back */
		free(p);
	}
}
