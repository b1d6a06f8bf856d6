"""Where a group refit's time goes, shared by group_gpu.py (a thread a rank) and tp_gpu.py
(a trainer process a rank): GMSFS_BENCH_TRACE=1's phases of gmsfs.torch.refit, timed where
they run; and when each rank's commit is seen as an engine that waits for it sees it."""
import threading
import time


def trace_refit(record, clock=time.perf_counter, more=()):
    """Wrap them, and each (owner, name) of more, for the rest of the process."""
    import gmsfs
    import gmsfs._torch_refit as tr

    def wrap(owner, name):
        f = getattr(owner, name)

        def timed(*a, **kw):
            t = clock()
            try:
                return f(*a, **kw)
            finally:
                record(name, t, clock())
        setattr(owner, name, timed)
    for n in ("_sources", "_check", "_plan", "_copy", "_ready"):
        wrap(tr, n)
    for n in ("commit_soon", "commit", "close", "protect", "unmap"):
        wrap(gmsfs.Connection, n)
    for owner, n in more:
        wrap(owner, n)


def watch_versions(stores, name, clock=time.perf_counter, limit=120):
    """A thread that watches every store's commits as an engine waiting for a version does
    (gmsfs.Group's own watch: poll(2) on STORE/version, opened now), until each says name:
    returns it (join it) and the list of when each did (clock, read as the commit woke
    it), None for one that did not within limit seconds."""
    from gmsfs import committed_version
    from gmsfs.group import _Commits
    commits, seen = _Commits(stores), [None] * len(stores)

    def run():
        end = time.monotonic() + limit
        with commits:
            while None in seen and commits.wait(end):
                now = clock()
                for r, s in enumerate(stores):
                    if seen[r] is None and committed_version(s) == name:
                        seen[r] = now
    th = threading.Thread(target=run)
    th.start()
    return th, seen
