#!/usr/bin/env python3
"""A metadata put through gmsfs.gms against gmsfs's own, in one process (issue 28).

    python3 bench/gms_put.py MOUNT [N]

A writer of N allocations (default 1000, 2 MiB each: the GPU's granularity; on the host
backend, pages) puts a 64-byte entry for each, GMS's way (mm.mappings[va].allocation_id,
then GMSClientMemoryManager.metadata_put) and gmsfs's own way (Connection.meta_put), 21
times each by turns, order swapped each time, in one process and one session: the same
round trips to the same daemon, so what differs is the shim's Python and what it touches
between round trips.  Then the same with the library call replaced by a Python function
that returns 0: the Python alone.  bench/gms_flows.py times the flows in fresh processes
(what users meet); there a put's ratio moves by 10-30% from run to run, more than the
shim's goal (<= 10%) - this is the put's cost in isolation."""
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))
os.environ.setdefault("GMSFS_LIBRARY", os.path.join(os.path.dirname(HERE), "build", "libgmsfs.so.0"))
import gmsfs  # noqa: E402
from gmsfs.gms import GMSClientMemoryManager, RequestedLockType  # noqa: E402

ROUNDS = 21


def timed(flows, n):
    """{name: median us per put} over ROUNDS rounds, the flows by turns."""
    got = {name: [] for name, _ in flows}
    for r in range(ROUNDS):
        for name, f in (flows if r % 2 else flows[::-1]):
            t = time.perf_counter()
            f()
            got[name].append((time.perf_counter() - t) / n * 1e6)
    return {name: sorted(v)[ROUNDS // 2] for name, v in got.items()}


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    store = os.path.join(sys.argv[1], "bench-gms-put-%d" % os.getpid())
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 1000
    os.mkdir(store)
    mm = GMSClientMemoryManager(store, device=0)
    try:
        mm.connect(RequestedLockType.RW, timeout_ms=60000)
        vas = [mm.create_mapping(size=2 << 20, tag="weights") for _ in range(n)]
        aids = [mm.mappings[va].allocation_id for va in vas]
        c, value = mm._client._c, b"v" * 64

        def own():
            for aid in aids:
                c.meta_put("k/" + aid, aid, 0, value)

        def shim():
            for va in vas:
                aid = mm.mappings[va].allocation_id
                mm.metadata_put("k/" + aid, aid, 0, value)
        flows = [("own", own), ("shim", shim)]
        real = timed(flows, n)
        put, gmsfs._lib.lib.gmsfs_meta_put_many = gmsfs._lib.lib.gmsfs_meta_put_many, lambda *a: 0
        try:
            python = timed(flows, n)
        finally:
            gmsfs._lib.lib.gmsfs_meta_put_many = put
        print("# %d puts, medians of %d by turns, one process: us per put" % (n, ROUNDS))
        print("#   %-28s %10s %10s %10s %10s" % ("", "own", "gmsfs.gms", "more", "ratio"))
        for label, t in (("put", real), ("its Python (call stubbed)", python)):
            print("#   %-28s %10.2f %10.2f %10.2f %9.3fx" % (label, t["own"], t["shim"], t["shim"] - t["own"],
                                                           t["shim"] / t["own"]))
    finally:
        mm.abort()  # nothing committed
        mm.close()
        os.rmdir(store)  # a store nobody holds goes (one still held: as soon as it is let go)


if __name__ == "__main__":
    main()
