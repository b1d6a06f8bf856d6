"""Where a group refit's time goes, shared by group_gpu.py (a thread a rank) and tp_gpu.py
(a trainer process a rank): GMSFS_BENCH_TRACE=1's phases of gmsfs.torch.refit, timed where
they run; and when each rank's commit is seen as an engine that waits for it sees it."""
import os
import select
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
    """A thread that polls (poll(2)) every store's STORE/version, as an engine waiting for a
    version does, until each says name: returns it (join it) and the list of when each did
    (clock), None for one that did not within limit seconds."""
    fds = [os.open(os.path.join(s, "version"), os.O_RDONLY) for s in stores]
    seen, p = [None] * len(stores), select.poll()
    for fd in fds:
        os.pread(fd, 128, 0)  # read: readable again at the next commit
        p.register(fd, select.POLLIN)

    def run():
        end = time.monotonic() + limit
        while None in seen and time.monotonic() < end:
            for fd, _ in p.poll(1000):
                r = fds.index(fd)
                if os.pread(fd, 128, 0).decode().strip() == name and seen[r] is None:
                    seen[r] = clock()
        for fd in fds:
            os.close(fd)
    th = threading.Thread(target=run)
    th.start()
    return th, seen
