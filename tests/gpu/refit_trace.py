"""GMSFS_BENCH_TRACE=1: where a refit's time goes, timed where it runs: gmsfs.torch.refit's
steps and the connection's calls, each call's (name, start, end) handed to record.  Shared
by group_gpu.py (a thread a rank) and tp_gpu.py (a trainer process a rank)."""
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
