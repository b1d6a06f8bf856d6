#include "fsm.h"

#include <errno.h>

enum fsm_state fsm_state(const struct fsm *f)
{
	if (f->leader)
		return FSM_RW;
	if (f->readers)
		return FSM_RO;
	if (f->torn)
		return FSM_TORN;
	return f->committed ? FSM_COMMITTED : FSM_EMPTY;
}

const char *fsm_state_name(enum fsm_state s)
{
	static const char *const names[] = {
		[FSM_EMPTY] = "EMPTY", [FSM_RW] = "RW",
		[FSM_COMMITTED] = "COMMITTED", [FSM_RO] = "RO", [FSM_TORN] = "TORN",
	};
	return (unsigned)s < sizeof names / sizeof *names ? names[s] : "?";
}

int fsm_can_read(const struct fsm *f)
{
	/* Writers have priority: a waiting writer blocks new readers, as in GMS.  A session
	 * beside the readers does not: they read the last commit. */
	if ((f->leader && !f->beside) || f->waiting_writers)
		return -EAGAIN;
	if (!f->committed)
		return -ENOENT;
	return f->torn ? -EUCLEAN : 0;
}

int fsm_can_write(const struct fsm *f)
{
	return f->leader || f->readers || f->paused ? -EAGAIN : 0;
}

int fsm_open_read(struct fsm *f)
{
	int e = fsm_can_read(f);
	if (e)
		return e;
	f->readers++;
	return 0;
}

int fsm_reopen_read(struct fsm *f)
{
	if (!f->readers || f->leader)
		return -EINVAL;
	f->readers++;
	return 0;
}

/* A session's first handle, once the caller's rule allowed it (e: 0). */
static int begin(struct fsm *f, pid_t leader, int e, bool data, bool beside)
{
	if (leader <= 0)
		return -EINVAL;
	if (e)
		return e;
	f->leader = leader;
	f->session_handles = 1;
	f->data = data;
	f->beside = beside;
	return 0;
}

int fsm_open_write(struct fsm *f, pid_t leader)
{
	return begin(f, leader, fsm_can_write(f), false, false);
}

int fsm_open_data(struct fsm *f, pid_t leader)
{
	return begin(f, leader, !f->committed ? -ENOENT : f->leader || f->readers ? -EAGAIN : 0, true, false);
}

int fsm_pause(struct fsm *f)
{
	if (!f->readers)
		return -EINVAL;
	f->readers--;
	f->paused++;
	return 0;
}

int fsm_unpause(struct fsm *f)
{
	if (!f->paused)
		return -EINVAL;
	f->paused--;
	return 0;
}

int fsm_can_write_beside(const struct fsm *f)
{
	if (!f->committed)
		return -ENOENT;
	return f->leader || f->prev_held ? -EAGAIN : 0;
}

int fsm_open_beside(struct fsm *f, pid_t leader)
{
	return begin(f, leader, fsm_can_write_beside(f), true, true);
}

int fsm_prev_gone(struct fsm *f)
{
	if (!f->prev_held)
		return -EINVAL;
	f->prev_held = false;
	return 0;
}

int fsm_join(struct fsm *f)
{
	if (!f->leader)
		return -EINVAL;
	f->session_handles++;
	return 0;
}

bool fsm_would_write_in_place(const struct fsm *f)
{
	return f->leader && !f->in_place && f->committed && !f->beside && !f->kept;
}

int fsm_write_in_place(struct fsm *f)
{
	if (!f->leader)
		return -EINVAL;
	if (!fsm_would_write_in_place(f))
		return 0; /* a session beside readers writes copies, never the commit; a kept one's
		           * pages are its engine's to mark */
	f->in_place = true;
	return 1;
}

void fsm_write_in_place_undo(struct fsm *f)
{
	f->in_place = false;
}

int fsm_release_read(struct fsm *f)
{
	if (!f->readers)
		return -EINVAL;
	f->readers--;
	return 0;
}

int fsm_release_session(struct fsm *f)
{
	if (!f->leader || !f->session_handles)
		return -EINVAL;
	if (--f->session_handles)
		return 0;
	f->leader = 0;
	f->beside = f->data = f->kept = false;
	f->torn |= f->in_place;
	f->in_place = false;
	return 1;
}

int fsm_commit(struct fsm *f)
{
	if (!f->leader)
		return -EINVAL;
	f->prev_held = f->beside && (f->readers || f->paused);
	f->beside = f->data = f->kept = false;
	f->readers += f->session_handles;
	f->session_handles = 0;
	f->leader = 0;
	f->committed = true;
	f->generation++;
	f->in_place = f->torn = false;
	return 0;
}

int fsm_keep(struct fsm *f, bool marked)
{
	if (!f->leader || f->data || f->beside)
		return -EINVAL;
	f->committed = f->kept = true;
	f->generation++;
	f->torn = false;
	f->in_place = !marked; /* unmarked: its writes from here are in place, said at once */
	return 0;
}

int fsm_abort(struct fsm *f)
{
	if (!f->leader)
		return -EINVAL;
	f->torn |= f->in_place;
	return 0;
}

int fsm_wait_begin(struct fsm *f, bool writer)
{
	if (writer)
		f->waiting_writers++;
	else
		f->waiting_readers++;
	return 0;
}

int fsm_wait_end(struct fsm *f, bool writer)
{
	unsigned *n = writer ? &f->waiting_writers : &f->waiting_readers;
	if (!*n)
		return -EINVAL;
	(*n)--;
	return 0;
}

int fsm_can_remove(const struct fsm *f)
{
	return f->leader ? -EBUSY : 0;
}

int fsm_check(const struct fsm *f)
{
	if (f->leader && f->readers && !f->beside)
		return -EPROTO; /* a writer together with readers, but beside them */
	if (f->beside && (!f->leader || !f->committed || f->in_place || f->prev_held))
		return -EPROTO; /* beside: a session on a commit, writing copies, one version back at most */
	if (f->prev_held && (!f->committed || !(f->readers || f->paused)))
		return -EPROTO; /* a version before is held by readers of a commit */
	if (f->paused && (!f->committed || (f->leader && !f->data)))
		return -EPROTO; /* paused over a commit, and only a data-only session goes past them */
	if (f->data && !f->leader)
		return -EPROTO;
	if (f->kept && (!f->leader || !f->committed || f->data || f->beside))
		return -EPROTO; /* kept: a session over its own commit */
	if (!!f->leader != !!f->session_handles)
		return -EPROTO;
	if (f->in_place && (!f->leader || !f->committed))
		return -EPROTO; /* only a session writes in place, only into a commit */
	if (f->torn && (!f->committed || f->readers))
		return -EPROTO; /* torn is a commit's bytes, and nobody may read them */
	return 0;
}
