/* pages_held.h: an elastic store's pages range, shared by pages.c (the range, its requests)
 * and pages_held.c (pages held here within the store's minimum). */
#ifndef GMSFS_PAGES_HELD_H
#define GMSFS_PAGES_HELD_H

#include "internal.h"

struct held_page {
	uint64_t name; /* its allocation's number */
	uint64_t mem;  /* the backend's hold (at 0) */
	uint64_t at;   /* 1 + the page it stays mapped at, or 0: placed nowhere */
};

struct gmsfs_pages {
	gmsfs *g;
	struct gmsfs_pages *next;  /* the handle's ranges, freed ones too (as spaces) */
	char prefix[48];           /* pages/<pid>.<serial> */
	void *base;
	uint64_t page, count;      /* page size, pages in the range */
	uint64_t nmapped;
	uint8_t *mapped;           /* one byte per page: PG_MAPPED, PG_STAYS (PG_ASKED: a call's check) */
	uint64_t *name;            /* per page: the number of the allocation mapped there */
	uint64_t next_name;        /* the next new allocation's number */
	struct held_page *held;    /* unmapped, held here (within the minimum) */
	size_t nheld, held_cap;
	size_t nnowhere;           /* of held: placed nowhere (at 0) */
	uint32_t *slot;            /* per page: 1 + the slot in held of the page staying there */
	bool freed;
	/* Kept (kept.c, libgmsfs(3), KEPT): the layout committed with the engine's records; an
	 * unmap gives pages back then, never holds them (a held page reused elsewhere would
	 * carry the record of its old place). */
	bool kept;
	struct pg_record { void *data; size_t len; } *rec; /* per page, NULL until kept */
};

enum {
	PG_MAPPED = 1, /* mapped for the engine */
	PG_ASKED = 2,  /* named by the call being checked (check_idx) */
	PG_STAYS = 4,  /* a held page stays mapped here, the engine's no more */
	PG_ENTRY = 8,  /* kept: its entry names the allocation mapped here (kept.c) */
	PG_OLD = 16,   /* computed with the weights tied before the last tie (tie.c) */
};

/* The record of page i let go (it was unmapped). */
static inline void pg_forget_record(gmsfs_pages *p, uint64_t i)
{
	if (p->rec) {
		free(p->rec[i].data);
		p->rec[i] = (struct pg_record){ 0 };
	}
}

/* pages.c, for kept.c */
/* A new range as gmsfs_pages_reserve makes it, without pages; its allocations named below
 * prefix (NULL: a new name). */
int pg_new(gmsfs *g, uint64_t span, uint64_t page_size, const char *prefix, gmsfs_pages **out);
/* The daemon frees the range's allocations numbered num[0..n). */
int pg_give_back(gmsfs_pages *p, const uint64_t *num, size_t n);
/* Held pages go back to the daemon, the last held first, until the handle's pages hold
 * keep bytes or less (0: every held page: a keep names pages by index, and a held one has
 * none).  0, or the first -errno. */
int pg_give_back_held(gmsfs *g, uint64_t keep);
/* The access of pages idx[0..n), one call per run of neighbours. */
int pg_allow_runs(gmsfs_pages *p, const uint64_t *idx, size_t n);

/* Every page unmapped (or let go), the range given back; tell: the daemon frees the pages
 * (else they stay its: a session's end, or pages another process keeps). */
int pg_release(gmsfs_pages *p, bool tell);

/* pages_held.c */
/* One more held page, staying mapped at page at - 1 (at 0: placed nowhere, its hold mem);
 * -ENOMEM, nothing changed. */
int pg_held_add(gmsfs_pages *p, uint64_t name, uint64_t mem, uint64_t at);
/* The last held page, off the list, its memory let go here (unmapped where it stays, or
 * its hold dropped); its allocation's number. */
uint64_t pg_let_go_last(gmsfs_pages *p);
/* Drained before a held page that stays mapped leaves its place. */
void pg_drain_staying(gmsfs_pages *p);
/* The page mapped at i held here, staying mapped at i (pg_hold), or off its place
 * (pg_hold_off: its access may not be set); -ENOMEM, nothing changed. */
int pg_hold(gmsfs_pages *p, uint64_t i);
int pg_hold_off(gmsfs_pages *p, uint64_t i);
/* Held pages the engine's again at idx[0..n), idx reordered: the first *stayed stayed
 * there (their access set), then the ones moved there; returns how many were placed. */
size_t pg_place_held(gmsfs_pages *p, uint64_t *idx, size_t n, size_t *stayed);

#endif
