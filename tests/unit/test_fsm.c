/* Every state of the lock machine against every event, the illegal ones included. */
#include "../../src/fsm/fsm.h"
#include "tap.h"

#include <errno.h>

/* The reachable situations, each built from EMPTY by legal events only. */
enum sit { S_EMPTY, S_RW, S_COMMITTED, S_RO, S_RO_WAITW, S_RW_WAITW, S_RW_IN_PLACE, S_TORN, S_BESIDE, S_PREV, S_PAUSED,
	   S_DATA_PAUSED, S_KEPT, S_N };
static const char *sit_name[] = { "EMPTY", "RW", "COMMITTED", "RO", "RO+waiting writer", "RW(committed before)",
				  "RW(writing in place)", "TORN", "RW beside a reader", "RO(a reader on the version before)",
				  "COMMITTED(a reader paused)", "RW(data-only, a reader paused)",
				  "RW(kept: its layout committed, going on)" };

static struct fsm make(enum sit s)
{
	struct fsm f = {0};
	switch (s) {
	case S_EMPTY: break;
	case S_RW: fsm_open_write(&f, 100); break;
	case S_COMMITTED: fsm_open_write(&f, 100); fsm_commit(&f); fsm_release_read(&f); break;
	case S_RO: fsm_open_write(&f, 100); fsm_commit(&f); fsm_release_read(&f); fsm_open_read(&f); break;
	case S_RO_WAITW: f = make(S_RO); fsm_wait_begin(&f, true); break;
	case S_RW_WAITW: f = make(S_COMMITTED); fsm_open_write(&f, 200); break;
	case S_RW_IN_PLACE: f = make(S_RW_WAITW); fsm_write_in_place(&f); break;
	case S_TORN: f = make(S_RW_IN_PLACE); fsm_release_session(&f); break;
	case S_BESIDE: f = make(S_RO); fsm_open_beside(&f, 200); break;
	case S_PREV: f = make(S_BESIDE); fsm_commit(&f); break;
	case S_PAUSED: f = make(S_RO); fsm_pause(&f); break;
	case S_DATA_PAUSED: f = make(S_PAUSED); fsm_open_data(&f, 200); break;
	case S_KEPT: f = make(S_RW); fsm_keep(&f, true); break;
	default: break;
	}
	return f;
}

enum ev { E_READ, E_WRITE, E_JOIN, E_REL_READ, E_REL_SESSION, E_COMMIT, E_ABORT, E_REMOVE, E_REREAD, E_IN_PLACE,
	  E_BESIDE, E_PREV_GONE, E_PAUSE, E_UNPAUSE, E_DATA, E_KEEP, E_N };
static const char *ev_name[] = { "open_read", "open_write", "join", "release_read", "release_session", "commit", "abort",
				 "remove", "reopen_read", "write_in_place", "open_beside", "prev_gone", "pause", "unpause",
				 "open_data", "keep" };

static int apply(struct fsm *f, enum ev e)
{
	switch (e) {
	case E_READ: return fsm_open_read(f);
	case E_WRITE: return fsm_open_write(f, 300);
	case E_JOIN: return fsm_join(f);
	case E_REL_READ: return fsm_release_read(f);
	case E_REL_SESSION: return fsm_release_session(f);
	case E_COMMIT: return fsm_commit(f);
	case E_ABORT: return fsm_abort(f);
	case E_REMOVE: return fsm_can_remove(f);
	case E_REREAD: return fsm_reopen_read(f);
	case E_IN_PLACE: return fsm_write_in_place(f);
	case E_BESIDE: return fsm_open_beside(f, 300);
	case E_PREV_GONE: return fsm_prev_gone(f);
	case E_PAUSE: return fsm_pause(f);
	case E_UNPAUSE: return fsm_unpause(f);
	case E_DATA: return fsm_open_data(f, 300);
	case E_KEEP: return fsm_keep(f, true);
	default: return -999;
	}
}

/* Expected result and state after, for each situation and event. */
struct want { int ret; enum fsm_state after; };
static const struct want table[S_N][E_N] = {
	[S_EMPTY] = {
		[E_READ] = { -ENOENT, FSM_EMPTY }, [E_WRITE] = { 0, FSM_RW },
		[E_JOIN] = { -EINVAL, FSM_EMPTY }, [E_REL_READ] = { -EINVAL, FSM_EMPTY },
		[E_REL_SESSION] = { -EINVAL, FSM_EMPTY }, [E_COMMIT] = { -EINVAL, FSM_EMPTY },
		[E_ABORT] = { -EINVAL, FSM_EMPTY }, [E_REMOVE] = { 0, FSM_EMPTY },
		[E_REREAD] = { -EINVAL, FSM_EMPTY },
		[E_IN_PLACE] = { -EINVAL, FSM_EMPTY },
		[E_BESIDE] = { -ENOENT, FSM_EMPTY }, [E_PREV_GONE] = { -EINVAL, FSM_EMPTY },
		[E_PAUSE] = { -EINVAL, FSM_EMPTY }, [E_UNPAUSE] = { -EINVAL, FSM_EMPTY }, [E_DATA] = { -ENOENT, FSM_EMPTY },
		[E_KEEP] = { -EINVAL, FSM_EMPTY },
	},
	[S_RW] = {
		[E_READ] = { -EAGAIN, FSM_RW }, [E_WRITE] = { -EAGAIN, FSM_RW },
		[E_JOIN] = { 0, FSM_RW }, [E_REL_READ] = { -EINVAL, FSM_RW },
		[E_REL_SESSION] = { 1, FSM_EMPTY }, [E_COMMIT] = { 0, FSM_RO },
		[E_ABORT] = { 0, FSM_RW }, [E_REMOVE] = { -EBUSY, FSM_RW },
		[E_REREAD] = { -EINVAL, FSM_RW },
		[E_IN_PLACE] = { 0, FSM_RW }, /* nothing committed to tear */
		[E_BESIDE] = { -ENOENT, FSM_RW }, [E_PREV_GONE] = { -EINVAL, FSM_RW },
		[E_PAUSE] = { -EINVAL, FSM_RW }, [E_UNPAUSE] = { -EINVAL, FSM_RW }, [E_DATA] = { -ENOENT, FSM_RW },
		[E_KEEP] = { 0, FSM_RW },
	},
	[S_COMMITTED] = {
		[E_READ] = { 0, FSM_RO }, [E_WRITE] = { 0, FSM_RW },
		[E_JOIN] = { -EINVAL, FSM_COMMITTED }, [E_REL_READ] = { -EINVAL, FSM_COMMITTED },
		[E_REL_SESSION] = { -EINVAL, FSM_COMMITTED }, [E_COMMIT] = { -EINVAL, FSM_COMMITTED },
		[E_ABORT] = { -EINVAL, FSM_COMMITTED }, [E_REMOVE] = { 0, FSM_COMMITTED },
		[E_REREAD] = { -EINVAL, FSM_COMMITTED },
		[E_IN_PLACE] = { -EINVAL, FSM_COMMITTED },
		[E_BESIDE] = { 0, FSM_RW }, [E_PREV_GONE] = { -EINVAL, FSM_COMMITTED },
		[E_PAUSE] = { -EINVAL, FSM_COMMITTED }, [E_UNPAUSE] = { -EINVAL, FSM_COMMITTED }, [E_DATA] = { 0, FSM_RW },
		[E_KEEP] = { -EINVAL, FSM_COMMITTED },
	},
	[S_RO] = {
		[E_READ] = { 0, FSM_RO }, [E_WRITE] = { -EAGAIN, FSM_RO },
		[E_JOIN] = { -EINVAL, FSM_RO }, [E_REL_READ] = { 0, FSM_COMMITTED },
		[E_REL_SESSION] = { -EINVAL, FSM_RO }, [E_COMMIT] = { -EINVAL, FSM_RO },
		[E_ABORT] = { -EINVAL, FSM_RO }, [E_REMOVE] = { 0, FSM_RO },
		[E_REREAD] = { 0, FSM_RO },
		[E_IN_PLACE] = { -EINVAL, FSM_RO },
		[E_BESIDE] = { 0, FSM_RW }, [E_PREV_GONE] = { -EINVAL, FSM_RO },
		[E_PAUSE] = { 0, FSM_COMMITTED }, [E_UNPAUSE] = { -EINVAL, FSM_RO }, [E_DATA] = { -EAGAIN, FSM_RO },
		[E_KEEP] = { -EINVAL, FSM_RO },
	},
	[S_RO_WAITW] = {
		[E_READ] = { -EAGAIN, FSM_RO }, [E_WRITE] = { -EAGAIN, FSM_RO },
		[E_JOIN] = { -EINVAL, FSM_RO }, [E_REL_READ] = { 0, FSM_COMMITTED },
		[E_REL_SESSION] = { -EINVAL, FSM_RO }, [E_COMMIT] = { -EINVAL, FSM_RO },
		[E_ABORT] = { -EINVAL, FSM_RO }, [E_REMOVE] = { 0, FSM_RO },
		[E_REREAD] = { 0, FSM_RO },
		[E_IN_PLACE] = { -EINVAL, FSM_RO },
		[E_BESIDE] = { 0, FSM_RW }, [E_PREV_GONE] = { -EINVAL, FSM_RO },
		[E_PAUSE] = { 0, FSM_COMMITTED }, [E_UNPAUSE] = { -EINVAL, FSM_RO }, [E_DATA] = { -EAGAIN, FSM_RO },
		[E_KEEP] = { -EINVAL, FSM_RO },
	},
	[S_RW_WAITW] = {
		[E_READ] = { -EAGAIN, FSM_RW }, [E_WRITE] = { -EAGAIN, FSM_RW },
		[E_JOIN] = { 0, FSM_RW }, [E_REL_READ] = { -EINVAL, FSM_RW },
		[E_REL_SESSION] = { 1, FSM_COMMITTED }, [E_COMMIT] = { 0, FSM_RO },
		[E_ABORT] = { 0, FSM_RW }, [E_REMOVE] = { -EBUSY, FSM_RW },
		[E_REREAD] = { -EINVAL, FSM_RW },
		[E_IN_PLACE] = { 1, FSM_RW },
		[E_BESIDE] = { -EAGAIN, FSM_RW }, [E_PREV_GONE] = { -EINVAL, FSM_RW },
		[E_PAUSE] = { -EINVAL, FSM_RW }, [E_UNPAUSE] = { -EINVAL, FSM_RW }, [E_DATA] = { -EAGAIN, FSM_RW },
		[E_KEEP] = { 0, FSM_RW },
	},
	[S_RW_IN_PLACE] = {
		[E_READ] = { -EAGAIN, FSM_RW }, [E_WRITE] = { -EAGAIN, FSM_RW },
		[E_JOIN] = { 0, FSM_RW }, [E_REL_READ] = { -EINVAL, FSM_RW },
		[E_REL_SESSION] = { 1, FSM_TORN }, [E_COMMIT] = { 0, FSM_RO },
		[E_ABORT] = { 0, FSM_RW }, [E_REMOVE] = { -EBUSY, FSM_RW },
		[E_REREAD] = { -EINVAL, FSM_RW }, [E_IN_PLACE] = { 0, FSM_RW },
		[E_BESIDE] = { -EAGAIN, FSM_RW }, [E_PREV_GONE] = { -EINVAL, FSM_RW },
		[E_PAUSE] = { -EINVAL, FSM_RW }, [E_UNPAUSE] = { -EINVAL, FSM_RW }, [E_DATA] = { -EAGAIN, FSM_RW },
		[E_KEEP] = { 0, FSM_RW },
	},
	[S_TORN] = {
		[E_READ] = { -EUCLEAN, FSM_TORN }, [E_WRITE] = { 0, FSM_RW },
		[E_JOIN] = { -EINVAL, FSM_TORN }, [E_REL_READ] = { -EINVAL, FSM_TORN },
		[E_REL_SESSION] = { -EINVAL, FSM_TORN }, [E_COMMIT] = { -EINVAL, FSM_TORN },
		[E_ABORT] = { -EINVAL, FSM_TORN }, [E_REMOVE] = { 0, FSM_TORN },
		[E_REREAD] = { -EINVAL, FSM_TORN }, [E_IN_PLACE] = { -EINVAL, FSM_TORN },
		[E_BESIDE] = { 0, FSM_RW }, [E_PREV_GONE] = { -EINVAL, FSM_TORN },
		[E_PAUSE] = { -EINVAL, FSM_TORN }, [E_UNPAUSE] = { -EINVAL, FSM_TORN }, [E_DATA] = { 0, FSM_RW },
		[E_KEEP] = { -EINVAL, FSM_TORN },
	},
	[S_BESIDE] = {
		[E_READ] = { 0, FSM_RW }, [E_WRITE] = { -EAGAIN, FSM_RW },
		[E_JOIN] = { 0, FSM_RW }, [E_REL_READ] = { 0, FSM_RW },
		[E_REL_SESSION] = { 1, FSM_RO }, [E_COMMIT] = { 0, FSM_RO },
		[E_ABORT] = { 0, FSM_RW }, [E_REMOVE] = { -EBUSY, FSM_RW },
		[E_REREAD] = { -EINVAL, FSM_RW }, [E_IN_PLACE] = { 0, FSM_RW }, /* copies: never in place */
		[E_BESIDE] = { -EAGAIN, FSM_RW }, [E_PREV_GONE] = { -EINVAL, FSM_RW },
		[E_PAUSE] = { 0, FSM_RW }, [E_UNPAUSE] = { -EINVAL, FSM_RW }, [E_DATA] = { -EAGAIN, FSM_RW },
		[E_KEEP] = { -EINVAL, FSM_RW },
	},
	[S_PREV] = {
		[E_READ] = { 0, FSM_RO }, [E_WRITE] = { -EAGAIN, FSM_RO },
		[E_JOIN] = { -EINVAL, FSM_RO }, [E_REL_READ] = { 0, FSM_RO },
		[E_REL_SESSION] = { -EINVAL, FSM_RO }, [E_COMMIT] = { -EINVAL, FSM_RO },
		[E_ABORT] = { -EINVAL, FSM_RO }, [E_REMOVE] = { 0, FSM_RO },
		[E_REREAD] = { 0, FSM_RO }, [E_IN_PLACE] = { -EINVAL, FSM_RO },
		[E_BESIDE] = { -EAGAIN, FSM_RO }, [E_PREV_GONE] = { 0, FSM_RO },
		[E_PAUSE] = { 0, FSM_RO }, [E_UNPAUSE] = { -EINVAL, FSM_RO }, [E_DATA] = { -EAGAIN, FSM_RO },
		[E_KEEP] = { -EINVAL, FSM_RO },
	},
	[S_PAUSED] = {
		[E_READ] = { 0, FSM_RO }, [E_WRITE] = { -EAGAIN, FSM_COMMITTED }, /* paused: no writer that replaces */
		[E_JOIN] = { -EINVAL, FSM_COMMITTED }, [E_REL_READ] = { -EINVAL, FSM_COMMITTED },
		[E_REL_SESSION] = { -EINVAL, FSM_COMMITTED }, [E_COMMIT] = { -EINVAL, FSM_COMMITTED },
		[E_ABORT] = { -EINVAL, FSM_COMMITTED }, [E_REMOVE] = { 0, FSM_COMMITTED },
		[E_REREAD] = { -EINVAL, FSM_COMMITTED }, [E_IN_PLACE] = { -EINVAL, FSM_COMMITTED },
		[E_BESIDE] = { 0, FSM_RW }, [E_PREV_GONE] = { -EINVAL, FSM_COMMITTED },
		[E_PAUSE] = { -EINVAL, FSM_COMMITTED }, [E_UNPAUSE] = { 0, FSM_COMMITTED },
		[E_DATA] = { 0, FSM_RW }, /* in place, past the paused */
		[E_KEEP] = { -EINVAL, FSM_COMMITTED },
	},
	[S_DATA_PAUSED] = {
		[E_READ] = { -EAGAIN, FSM_RW }, [E_WRITE] = { -EAGAIN, FSM_RW },
		[E_JOIN] = { 0, FSM_RW }, [E_REL_READ] = { -EINVAL, FSM_RW },
		[E_REL_SESSION] = { 1, FSM_COMMITTED }, [E_COMMIT] = { 0, FSM_RO },
		[E_ABORT] = { 0, FSM_RW }, [E_REMOVE] = { -EBUSY, FSM_RW },
		[E_REREAD] = { -EINVAL, FSM_RW }, [E_IN_PLACE] = { 1, FSM_RW },
		[E_BESIDE] = { -EAGAIN, FSM_RW }, [E_PREV_GONE] = { -EINVAL, FSM_RW },
		[E_PAUSE] = { -EINVAL, FSM_RW }, [E_UNPAUSE] = { 0, FSM_RW },
		[E_DATA] = { -EAGAIN, FSM_RW },
		[E_KEEP] = { -EINVAL, FSM_RW },
	},
	[S_KEPT] = {
		[E_READ] = { -EAGAIN, FSM_RW }, [E_WRITE] = { -EAGAIN, FSM_RW },
		[E_JOIN] = { 0, FSM_RW }, [E_REL_READ] = { -EINVAL, FSM_RW },
		[E_REL_SESSION] = { 1, FSM_COMMITTED }, /* back to what it kept: never torn */
		[E_COMMIT] = { 0, FSM_RO },
		[E_ABORT] = { 0, FSM_RW }, [E_REMOVE] = { -EBUSY, FSM_RW },
		[E_REREAD] = { -EINVAL, FSM_RW }, [E_IN_PLACE] = { 0, FSM_RW }, /* its pages: the engine's marks */
		[E_BESIDE] = { -EAGAIN, FSM_RW }, [E_PREV_GONE] = { -EINVAL, FSM_RW },
		[E_PAUSE] = { -EINVAL, FSM_RW }, [E_UNPAUSE] = { -EINVAL, FSM_RW },
		[E_DATA] = { -EAGAIN, FSM_RW }, [E_KEEP] = { 0, FSM_RW },
	},
};
int main(void)
{
	for (int s = 0; s < S_N; s++) {
		for (int e = 0; e < E_N; e++) {
			struct fsm f = make(s), before = f;
			int r = apply(&f, e);
			is_int(r, table[s][e].ret, "%s: %s returns %d", sit_name[s], ev_name[e], table[s][e].ret);
			ok(fsm_state(&f) == table[s][e].after, "%s: %s leads to %s (got %s)", sit_name[s], ev_name[e],
			   fsm_state_name(table[s][e].after), fsm_state_name(fsm_state(&f)));
			ok(fsm_check(&f) == 0, "%s: %s keeps the invariants", sit_name[s], ev_name[e]);
			if (r < 0)
				ok(!memcmp(&f, &before, sizeof f), "%s: refused %s changes nothing", sit_name[s], ev_name[e]);
		}
	}

	/* Commit is a downgrade: every session handle becomes a read handle at once. */
	struct fsm f = {0};
	fsm_open_write(&f, 7); fsm_join(&f); fsm_join(&f);
	is_int(fsm_commit(&f), 0, "commit of a three-handle session");
	is_int(f.readers, 3, "three read handles after commit");
	is_int(fsm_can_write(&f), -EAGAIN, "no writer slips in after commit");
	is_int(f.generation, 1, "generation counts commits");
	fsm_release_read(&f); fsm_release_read(&f);
	is_int(fsm_state(&f), FSM_RO, "still RO with one handle left");
	fsm_release_read(&f);
	is_int(fsm_state(&f), FSM_COMMITTED, "COMMITTED when the last closes");

	/* A session that joined handles ends only with its last one. */
	f = (struct fsm){0};
	fsm_open_write(&f, 7); fsm_join(&f);
	is_int(fsm_release_session(&f), 0, "first of two session handles released: session goes on");
	is_int(fsm_state(&f), FSM_RW, "still RW");
	is_int(fsm_release_session(&f), 1, "last session handle: session ends, roll back");
	is_int(fsm_open_write(&f, 0), -EINVAL, "a leader must be a real thread group");

	/* Waiting counts. */
	is_int(fsm_wait_end(&f, true), -EINVAL, "no waiting writer to end");
	fsm_wait_begin(&f, false);
	is_int(fsm_can_remove(&f), 0, "a waiting reader does not keep the store (it learns ENOENT)");
	is_int(fsm_wait_end(&f, false), 0, "waiting reader leaves");
	is_int(fsm_can_remove(&f), 0, "free store can be removed");
	is_str(fsm_state_name(42), "?", "unknown state has a name");

	/* In place: a torn store is read by nobody until a writer commits; a writer at work
	 * on it is waited for (it may commit), and one that leaves again leaves it torn. */
	f = make(S_TORN);
	is_int(fsm_can_read(&f), -EUCLEAN, "torn: a read is refused, not waited for");
	is_int(fsm_open_write(&f, 9), 0, "torn: a writer may begin");
	is_int(fsm_can_read(&f), -EAGAIN, "torn with a writer at work: a read waits for it");
	is_int(fsm_release_session(&f), 1, "the writer leaves without commit");
	is_int(fsm_state(&f), FSM_TORN, "still torn");
	fsm_open_write(&f, 9);
	is_int(fsm_commit(&f), 0, "a writer commits");
	ok(!f.torn && !f.in_place && fsm_state(&f) == FSM_RO, "the commit heals it: RO (%s)", fsm_state_name(fsm_state(&f)));
	fsm_release_read(&f);
	/* An abort after writing in place cannot bring the bytes back: torn, session kept. */
	fsm_open_write(&f, 9);
	is_int(fsm_write_in_place(&f), 1, "the session's first write in place is said");
	is_int(fsm_write_in_place(&f), 0, "and only the first");
	is_int(fsm_abort(&f), 0, "abort");
	ok(f.torn && fsm_state(&f) == FSM_RW, "torn, the session still open");
	is_int(fsm_commit(&f), 0, "the session commits after its abort");
	ok(!f.torn && fsm_check(&f) == 0, "committed whole again");
	fsm_release_read(&f);
	/* A session that wrote nothing in place rolls back whole: not torn. */
	fsm_open_write(&f, 9);
	fsm_release_session(&f);
	is_int(fsm_state(&f), FSM_COMMITTED, "a session without in-place writes rolls back to COMMITTED");
	/* Kept: each keep is a commit the session stays in; its end goes back to the last. */
	f = (struct fsm){0};
	fsm_open_write(&f, 9);
	is_int(fsm_keep(&f, true), 0, "keep");
	ok(f.committed && f.kept && f.generation == 1 && fsm_state(&f) == FSM_RW, "kept: committed, generation 1, still RW");
	is_int(fsm_write_in_place(&f), 0, "a kept session's writes to its pages are not in place");
	is_int(fsm_keep(&f, true), 0, "keep again");
	is_int(f.generation, 2, "each keep a generation");
	is_int(fsm_release_session(&f), 1, "the engine dies");
	ok(!f.torn && !f.kept && fsm_state(&f) == FSM_COMMITTED, "the cache stays COMMITTED, not torn (%s)",
	   fsm_state_name(fsm_state(&f)));
	fsm_open_write(&f, 10);
	is_int(fsm_write_in_place(&f), 1, "a new writer is not kept until it keeps");
	is_int(fsm_keep(&f, true), 0, "the adopter keeps");
	ok(!f.in_place && fsm_check(&f) == 0, "keeping clears in place");
	fsm_release_session(&f);
	/* Unmarked (GMS's commit_layout of any layout): the layout stays, its bytes are torn. */
	fsm_open_write(&f, 11);
	is_int(fsm_keep(&f, false), 0, "an unmarked keep");
	ok(f.in_place && fsm_check(&f) == 0, "in place from the keep on");
	is_int(fsm_write_in_place(&f), 0, "said already");
	is_int(fsm_release_session(&f), 1, "its writer dies");
	ok(f.torn && f.committed && fsm_state(&f) == FSM_TORN, "TORN: the layout kept, its bytes untrusted (%s)",
	   fsm_state_name(fsm_state(&f)));
	is_int(fsm_open_data(&f, 12), 0, "a data-only writer attaches to the kept layout");
	is_int(fsm_commit(&f), 0, "and commits its bytes");
	ok(!f.torn && fsm_state(&f) == FSM_RO, "whole again");
	struct fsm bad = { .committed = true, .torn = true, .readers = 1 };
	is_int(fsm_check(&bad), -EPROTO, "invariant: nobody reads a torn store");
	return tap_done();
}
