#!/bin/bash
# probe/flip_layout_probe.sh GIB ROUNDS: a reader's flip of GIB GiB (a store with versions)
# laid out as one allocation of GIB GiB (1 GiB pieces) against GIB allocations of 1 GiB,
# by turns: a writer makes the next version of every allocation (import_overwrite, commit),
# then the reader flips to it, timed.  Prints each layout's median and range (ms).  Run
# from the repository root after tests/gpu/run.sh built it.
set -u
gib=${1:-6}
rounds=${2:-12}
mnt=$(mktemp -d /tmp/gmsfs-flip.XXXXXX)
build/gmsfs -f "$mnt" 2>"$mnt.log" &
pid=$!
for _ in $(seq 200); do grep -q " $mnt fuse.gmsfs " /proc/mounts && break; sleep 0.05; done
PYTHONPATH=python GMSFS_LIBRARY=build/libgmsfs.so.0 python3 - "$mnt" "$gib" "$rounds" <<'PY'
import os, statistics, subprocess, sys, time
import torch
import gmsfs
mnt, gib, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
torch.zeros(1, device="cuda")
layouts = {"one": [("a", gib << 30)], "slabs": [("s%02d" % i, 1 << 30) for i in range(gib)]}
readers = {}
for name, allocs in layouts.items():
    store = os.path.join(mnt, name)
    os.mkdir(store)
    os.setxattr(store, "user.gms.versions", b"2")
    with gmsfs.connect(store, "rw") as w:
        w.create_many(allocs)
        w.commit()
    readers[name] = gmsfs.connect(store, "ro")
    readers[name].import_all()
# The next version of every allocation, made by a writer of its own (a process holds a
# store's read lock or its write lock, not both).
WRITER = "import gmsfs, sys\nwith gmsfs.connect(sys.argv[1], 'data', timeout=10) as w:\n" \
         "    w.import_overwrite()\n    w.commit(unmap=True)\n"
took = {name: [] for name in layouts}
for _ in range(rounds):
    for name in layouts:
        subprocess.run([sys.executable, "-c", WRITER, os.path.join(mnt, name)], check=True)
        time.sleep(0.2)  # the old version's memory let go, the next made ahead
        torch.cuda.synchronize()
        t = time.perf_counter()
        n = readers[name].flip()
        took[name].append((time.perf_counter() - t) * 1e3)
        assert n == len(layouts[name]), (name, n)
for name, v in took.items():
    print("# probe: flip of %d GiB as %-5s (%d allocations): median %.2f ms (%.2f-%.2f)"
          % (gib, name, len(layouts[name]), statistics.median(v), min(v), max(v)))
for r in readers.values():
    r.close()
PY
kill "$pid"; wait "$pid" 2>/dev/null
fusermount3 -u "$mnt" 2>/dev/null; rmdir "$mnt"; rm -f "$mnt.log"
