/* lock_member: who is in a store's writer session (gmsfs(5), LOCKS), and whether a
 * reader already holds.  The kernel reports closes late, so a process's descriptors are
 * asked (/proc/PID/fdinfo); an open under way counts for its process until its
 * descriptor shows.  Under fs->mu, as all of lock. */
#include "lock.h"
#include "caller.h"
#include "grow.h"
#include "handle.h"
#include "node.h"
#include "store.h"

#include <errno.h>
#include <stdlib.h>

static uint64_t handle_ino(struct store *st, const struct fs_handle *h)
{
	return node_ino(st->fs, h->node ? (const void *)h->node : (const void *)h->fnode);
}

/* The inodes of the store's handles with this hold (and opened by tgid, if not 0), for
 * caller_holds; *n of them, the caller frees.  During a session every handle of lock or
 * of a layout file is the session's (readers cannot be there), so whoever has one open
 * holds the session.  A store directory counts only for the process that locked it (ls
 * has it open too).  NULL and *n 0: none, or out of memory (-ENOMEM in *e). */
static uint64_t *held_inodes(struct store *st, enum lock_hold hold, pid_t tgid, pid_t dir_owner, size_t *n, int *e)
{
	uint64_t *inos = NULL;
	size_t cap = 0;
	*n = 0;
	*e = 0;
	for (struct fs_handle *h = st->handles.next; h != &st->handles; h = h->next) {
		if (h->hold != hold || (tgid && h->tgid != tgid))
			continue;
		if (!h->node && h->fnode->kind == FS_STORE && h->tgid != dir_owner)
			continue;
		uint64_t ino = handle_ino(st, h);
		size_t i = 0;
		while (i < *n && inos[i] != ino)
			i++;
		if (i < *n)
			continue;
		if (GROW(inos, *n, cap, 16)) {
			*e = -ENOMEM;
			break;
		}
		inos[(*n)++] = ino;
	}
	return inos;
}

/* Does process p still hold a descriptor of the session?  A handle it closed does not
 * count: its release reaches us after close() returned.  p's handles whose open was under
 * way (lock_opened) and whose descriptor shows now are settled. */
static int holds_session(struct store *st, pid_t p)
{
	size_t n;
	int e;
	uint64_t *inos = held_inodes(st, HOLD_SESSION, 0, p, &n, &e);
	bool *seen = n ? calloc(n, sizeof *seen) : NULL;
	int r = e ? e : !n ? 0 : !seen ? -ENOMEM : caller_holds(p, inos, n, seen);
	for (struct fs_handle *h = st->handles.next; r > 0 && h != &st->handles; h = h->next)
		if (h->opening && h->tgid == p)
			for (size_t i = 0; i < n; i++)
				if (seen[i] && inos[i] == handle_ino(st, h))
					h->opening = false;
	free(seen);
	free(inos);
	return r;
}

int lock_holds_read(struct store *st, pid_t tgid)
{
	size_t n;
	int e;
	uint64_t *inos = held_inodes(st, HOLD_READ, tgid, tgid, &n, &e);
	int r = e ? e : n ? caller_holds(tgid, inos, n, NULL) : 0;
	free(inos);
	return r;
}

/* Is a session open of p's under way: granted, its descriptor not in p's table yet? */
static bool opening(struct store *st, pid_t p)
{
	for (struct fs_handle *h = st->handles.next; h != &st->handles; h = h->next)
		if (h->opening && h->hold == HOLD_SESSION && h->tgid == p)
			return true;
	return false;
}

/* A member of the session holds one of its descriptors (the leader, a child it left
 * behind), or is opening one (the kernel asks for the new file's attributes before the
 * descriptor is in the process's table), or descends from a leader that still holds
 * one (a program its shell runs). */
int lock_is_member(struct store *st, pid_t tgid)
{
	pid_t leader = st->lock.fsm.leader;
	if (!leader)
		return 0;
	int r = holds_session(st, tgid);
	if (!r && opening(st, tgid))
		r = 1;
	if (r || tgid == leader)
		return r;
	if ((r = caller_descends(tgid, leader, st->lock.leader_start)) <= 0)
		return r;
	return holds_session(st, leader);
}

void lock_opened(struct fs_handle *h)
{
	h->opening = h->flushes = h->hold == HOLD_SESSION;
}

void lock_closed(struct fs_handle *h)
{
	h->opening = false;
}

int lock_may_change(struct store *st, pid_t tgid)
{
	int r = lock_is_member(st, tgid);
	if (r)
		return r < 0 ? r : 0;
	return st->lock.fsm.leader || st->lock.fsm.readers ? -EBUSY : -EROFS;
}

int lock_layout_change(struct store *st)
{
	if (!st->lock.fsm.data || !store_in_session(st))
		return 0;
	store_error(st, "a data-only session (RW_DATA, or the lock opened with O_APPEND) writes the committed "
			"allocations' bytes: it makes, sizes, removes, tags or writes no allocation or entry");
	return -EPERM;
}

int lock_check_change(fuse_req_t req, struct store *st, const struct fs_handle *h)
{
	if (h && h->hold == HOLD_SESSION)
		return lock_layout_change(st);
	if (h && h->hold == HOLD_READ)
		return -EROFS;
	pid_t tgid;
	int e = caller_tgid(req, &tgid);
	if (e) {
		if (e == -EPERM)
			fuse_log(FUSE_LOG_WARNING, "gmsfs: refused a change from outside the daemon's pid namespace\n");
		return store_cannot_tell(st, e);
	}
	e = store_cannot_tell(st, lock_may_change(st, tgid));
	return e ? e : lock_layout_change(st);
}

bool lock_outside(fuse_req_t req, struct store *st)
{
	struct lock *l = &st->lock;
	if (!store_in_session(st))
		return false;
	pid_t tgid;
	if (caller_tgid(req, &tgid))
		return true;
	if (l->seen_tgid == tgid && l->seen_gen == l->gen)
		return l->seen_outside;
	int r = lock_is_member(st, tgid);
	if (r < 0)
		return true; /* out of descriptors: not cached, asked again next time */
	l->seen_tgid = tgid;
	l->seen_gen = l->gen;
	l->seen_outside = !r;
	return !r;
}
