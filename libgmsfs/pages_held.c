/* pages_held: pages within the store's minimum, held in this process when the engine
 * unmaps them (libgmsfs(3), PAGES).  A held page stays mapped where it was, the
 * engine's no more, until a map needs it there again (no driver call at all) or
 * elsewhere (off its place, then mapped there: the driver's map and access), or it goes
 * back to the daemon (pages.c).  Pages made at reserve are held placed nowhere. */
#include "pages_held.h"

#include <assert.h>
#include <errno.h>
#include <string.h>

#include "grow.h"

int pg_held_add(gmsfs_pages *p, uint64_t name, uint64_t mem, uint64_t at)
{
	if (ROOM(p->held, p->nheld + 1, p->held_cap, 16))
		return -ENOMEM;
	p->held[p->nheld] = (struct held_page){ .name = name, .mem = mem, .at = at };
	if (at)
		p->slot[at - 1] = (uint32_t)++p->nheld;
	else
		p->nnowhere++, p->nheld++;
	return 0;
}

/* Slot k off the list; the last slot takes its place. */
static void take_out(gmsfs_pages *p, size_t k)
{
	if (p->held[k].at)
		p->slot[p->held[k].at - 1] = 0;
	else
		p->nnowhere--;
	p->held[k] = p->held[--p->nheld];
	if (k < p->nheld && p->held[k].at)
		p->slot[p->held[k].at - 1] = (uint32_t)k + 1;
}

uint64_t pg_let_go_last(gmsfs_pages *p)
{
	struct held_page h = p->held[p->nheld - 1];
	take_out(p, p->nheld - 1);
	if (!h.at) {
		p->g->be->drop(p->g, h.mem, p->page);
	} else {
		p->g->be->unmap(p->g, (char *)p->base + (h.at - 1) * p->page, p->page);
		p->mapped[h.at - 1] &= (uint8_t)~PG_STAYS;
	}
	return h.name;
}

/* Held pages that stay mapped: drained before any of them is unmapped (a kernel the
 * engine queued before its unmap may still use one). */
void pg_drain_staying(gmsfs_pages *p)
{
	if (p->nheld > p->nnowhere && p->g->be->drain)
		p->g->be->drain(p->g);
}

/* The page mapped at i, held here: it stays mapped at i, the engine's no more. */
int pg_hold(gmsfs_pages *p, uint64_t i)
{
	int e = pg_held_add(p, p->name[i], 0, i + 1);
	if (e)
		return e;
	p->mapped[i] = PG_STAYS;
	p->nmapped--;
	return 0;
}

/* Held slot k the engine's again at idx: where it stayed, as it is; else moved there
 * (its access not set yet). */
static int take_held(gmsfs_pages *p, size_t k, uint64_t idx)
{
	gmsfs *g = p->g;
	struct held_page *h = &p->held[k];
	uint64_t name = h->name;
	if (h->at && h->at != idx + 1) { /* off its place first: then placed nowhere */
		uint64_t at = h->at - 1;
		int e = g->be->hold(g, (char *)p->base + at * p->page, p->page, &h->mem);
		if (e)
			return e;
		p->mapped[at] &= (uint8_t)~PG_STAYS;
		p->slot[at] = 0;
		h->at = 0;
		p->nnowhere++;
	}
	if (!h->at) {
		int e = g->be->place(g, h->mem, (char *)p->base + idx * p->page, p->page);
		if (e)
			return e;
	}
	take_out(p, k);
	p->mapped[idx] = PG_MAPPED;
	p->name[idx] = name;
	p->nmapped++;
	return 0;
}

/* Held pages the engine's again at idx[0..n): first those that stayed mapped at a place
 * asked for (nothing to do), then the rest moved there (first those placed nowhere).
 * idx is reordered so that the first *stayed are the former (their access still set) and
 * the first return value the placed ones; fewer than n when the held run out or on a
 * failure. */
size_t pg_place_held(gmsfs_pages *p, uint64_t *idx, size_t n, size_t *stayed)
{
	size_t k = 0;
	for (size_t i = 0; i < n; i++) /* those that stayed where they are asked for */
		if (p->mapped[idx[i]] & PG_STAYS) {
			uint64_t t = idx[i];
			memmove(idx + k + 1, idx + k, (i - k) * sizeof *idx); /* the rest keep their order */
			idx[k++] = t;
		}
	for (size_t i = 0; i < k; i++) {
		assert(p->slot[idx[i]]); /* PG_STAYS: a held page stays there */
		take_held(p, p->slot[idx[i]] - 1, idx[i]); /* nothing to fail: no driver call */
	}
	*stayed = k;
	bool drained = false;
	for (; k < n && p->nheld; k++) {
		size_t h = p->nheld - 1;
		for (size_t j = p->nheld; p->nnowhere && j-- > 0;) /* placed nowhere first: no unmap */
			if (!p->held[j].at) {
				h = j;
				break;
			}
		if (p->held[h].at && !drained)
			drained = true, pg_drain_staying(p);
		if (take_held(p, h, idx[k]))
			break;
	}
	return k;
}

/* The page mapped at i held here placed nowhere (its access may not be set). */
int pg_hold_off(gmsfs_pages *p, uint64_t i)
{
	uint64_t mem;
	int e = ROOM(p->held, p->nheld + 1, p->held_cap, 16) ? -ENOMEM
							  : p->g->be->hold(p->g, (char *)p->base + i * p->page, p->page, &mem);
	if (e)
		return e;
	pg_held_add(p, p->name[i], mem, 0); /* its room is there */
	p->mapped[i] = 0;
	p->nmapped--;
	return 0;
}
