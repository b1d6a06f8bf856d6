#!/usr/bin/env python3
"""probe/remap_trace_probe.py MOUNT [GIB] [CYCLES]: where a reader's remap cycle (unmap_all +
remap_all) spends its time above the driver's, #83 item 6.  A store of GIB allocations of 1
GiB (default 16, the gate's remap-16x1GiB), then a reader in a fresh process that imports it
and runs CYCLES cycles (default 20) under GMSFS_TRACE_IMPORT: libgmsfs's own lines (the lock:
granted, bind sent; remap_all: the lock, the first reply, mapping, access; unmap_all), and the
medians of each part.  After `bash tests/gpu/run.sh none` (the build), on a mount of it."""
import os
import re
import statistics
import subprocess
import sys

mnt = sys.argv[1]
gib = int(sys.argv[2]) if len(sys.argv) > 2 else 16
cycles = int(sys.argv[3]) if len(sys.argv) > 3 else 20
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import gmsfs  # noqa: E402

store = os.path.join(mnt, "remap")
os.mkdir(store)
with gmsfs.connect(store, "rw", timeout=60) as c:
    for i in range(gib):
        c.create("a%d" % i, 1 << 30)
    c.commit()

READER = r"""
import gmsfs, sys, time
c = gmsfs.connect(sys.argv[1], "ro", timeout=60)
c.import_all()
ts = []
for i in range(int(sys.argv[2])):
    t0 = time.perf_counter()
    c.unmap_all()
    c.remap_all(60)
    ts.append((time.perf_counter() - t0) * 1e3)
ts.sort()
print("cycle ms: median %.3f, fastest %.3f" % (ts[len(ts) // 2], ts[0]), flush=True)
c.close()
"""
env = dict(os.environ, GMSFS_TRACE_IMPORT="1", PYTHONPATH=os.path.join(os.path.dirname(gmsfs.__file__), ".."))
r = subprocess.run([sys.executable, "-c", READER, store, str(cycles)], env=env, capture_output=True, text=True)
print(r.stdout.strip())
parts = {}
for line in r.stderr.splitlines():
    m = re.match(r"(gmsfs[ _]\w+): (\d+) us: (.*) \(from", line)
    if not m:
        continue
    what = m.group(1)
    parts.setdefault(what + " total", []).append(int(m.group(2)))
    for name, v in re.findall(r"([a-z][a-z ]*?) (\d+) us", m.group(3)):
        parts.setdefault("%s: %s" % (what, name), []).append(int(v))
for k, v in parts.items():
    v = v[1:] if len(v) > 2 else v  # the first cycle's aside
    print("%-50s median %6.0f us  (%d..%d)" % (k, statistics.median(v), min(v), max(v)))
if r.returncode:
    print(r.stderr[-3000:])
os.rmdir(store)
