/* memory: the one door through which a store's memory is made (memory.h). */
#include "memory.h"
#include "store.h"
#include "tier.h"

#include "clock.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* No room even with idle stores moved out: what only elastic stores' pages hold is asked
 * back of them (tier_ask_back), and the caller is told to try again (-EAGAIN) while
 * their engines give pages back; -ENOSPC stands when nobody may give.  fs->mu held. */
static int ask_back(struct fs *fs, struct store *self, uint64_t bytes, char *why, size_t whylen)
{
	uint64_t asked = tier_ask_back(fs, self, bytes);
	if (!asked)
		return -ENOSPC;
	snprintf(why, whylen, "%llu bytes asked back of elastic stores, which have %d ms to give them: try again",
		 (unsigned long long)asked, TIER_RECLAIM_MS);
	return -EAGAIN;
}

/* Room for bytes more of st: idle stores move to the host tier (fs->mu let go while they
 * copy), then elastic stores are asked to give pages back (-EAGAIN: try again). */
static int room_for(struct fs *fs, struct store *st, uint64_t bytes, const struct memory_check *check, char *why,
		    size_t whylen)
{
	pthread_mutex_lock(&fs->mu);
	int e = st->removed ? -ENOENT : check ? check->may(fs, check->arg, why, whylen) : 0;
	if (e == -ENOENT && st->removed)
		snprintf(why, whylen, "the store was removed");
	if (!e && (e = tier_make_room(fs, st, bytes, why, whylen)) == -ENOSPC && !st->removed)
		e = ask_back(fs, st, bytes, why, whylen);
	pthread_mutex_unlock(&fs->mu);
	return e;
}

static bool is_page(const char *path)
{
	return !strncmp(path, GMSFS_PAGES_PREFIX, strlen(GMSFS_PAGES_PREFIX));
}

/* One buffer, as asked: of another's shape, an elastic store's page, or a plain one. */
static int make_one(struct vmm_pool *pool, const struct memory_ask *ask, struct vmm_buf **out)
{
	if (ask->like)
		return vmm_alloc_like(pool, ask->like, out);
	return is_page(ask->path) ? vmm_alloc_page(pool, ask->size, out) : vmm_alloc(pool, ask->size, out);
}

/* The first asked past the room the store has now: the one a failure names. */
static size_t first_past(struct vmm *v, const struct vmm_pool *pool, const struct memory_ask *ask, size_t n)
{
	uint64_t room = vmm_room_for(v, pool), sum = 0;
	size_t i = 0;
	while (i + 1 < n && (sum += vmm_align(v, ask[i].size)) <= room)
		i++;
	return i;
}

int memory_make(struct fs *fs, struct store *st, const struct memory_ask *ask, size_t n, struct vmm_buf **out,
		const struct memory_check *check, char *why, size_t whylen)
{
	struct vmm *v = fs->vmm;
	struct vmm_pool *pool = st->pool;
	char reason[400] = "";
	uint64_t total = 0;
	for (size_t k = 0; k < n; k++)
		total += vmm_align(v, ask[k].size);
	/* Room first for the whole request where it lacks (a request that cannot fit does not
	 * make and free most of itself); past the quota no room is made: EDQUOT below. */
	size_t i = 0, made = 0; /* i: the one a failure names */
	int e = 0;
	uint64_t quota = atomic_load(&pool->quota);
	if (n && vmm_room_for(v, pool) < total && (!quota || atomic_load(&pool->used) + total <= quota) &&
	    (e = room_for(fs, st, total, check, reason, sizeof reason)))
		i = first_past(v, pool, ask, n);
	for (; made < n && !e; made++) {
		i = made;
		if ((e = make_one(pool, &ask[i], &out[i])) == -ENOSPC) {
			uint64_t rest = 0;
			for (size_t k = i; k < n; k++)
				rest += vmm_align(v, ask[k].size);
			if (!(e = room_for(fs, st, rest, check, reason, sizeof reason)))
				e = make_one(pool, &ask[i], &out[i]);
		}
		if (e)
			break;
	}
	if (!e)
		return 0;
	for (size_t k = 0; k < made; k++) /* all or none */
		vmm_buf_put(out[k]);
	if (!reason[0])
		vmm_pool_why(pool, e, ask[i].size, reason, sizeof reason);
	snprintf(why, whylen, "allocs/%.200s: %llu bytes: %s", ask[i].path, (unsigned long long)ask[i].size, reason);
	return e == -EDQUOT ? -ENOSPC : e;
}

int memory_make_waiting(struct fs *fs, struct store *st, const struct memory_ask *ask, size_t n,
			struct vmm_buf **out, char *why, size_t whylen)
{
	uint64_t until = clock_mono_ns() + (uint64_t)TIER_RECLAIM_MS * 1000000;
	int e;
	while ((e = memory_make(fs, st, ask, n, out, NULL, why, whylen)) == -EAGAIN && clock_mono_ns() < until)
		usleep(5000);
	return e == -EAGAIN ? -ENOSPC : e; /* nobody gave in time: why says who was asked */
}
