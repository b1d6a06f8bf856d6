#!/usr/bin/env python3
"""A store copied from one GPU's mount to another's (gmsfs-snapshot copy, gmsfs.copy) on a
machine with two GPUs (TAP, then benchmark lines).

    peer_gpu.py MOUNT0 MOUNT1 BUILD   a store of min(16 GiB, a sixth of GPU 0) in 1 GiB
        allocations of random bytes on MOUNT0 (GPU 0), copied into an empty store on MOUNT1
        (GPU 1) by gmsfs-snapshot copy in a fresh process, checked (every allocation's
        checksum on GPU 1, the layout hash), timed against the driver's own peer copy of
        the same bytes (PyTorch's copy between the GPUs, cudaMemcpyPeer) in this run."""
import os
import re
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
from tap import check, done  # noqa: E402

import torch  # noqa: E402
import gmsfs  # noqa: E402
from gmsfs._torch_layout import _bytes_at  # noqa: E402
from tier_gpu_reader import sums  # noqa: E402

GiB = 1 << 30
m0, m1, build = sys.argv[1:4]
FRESH = r"""
import sys, time, torch
n, G = int(sys.argv[1]), 1 << 30
a = torch.empty(n * G, dtype=torch.uint8, device="cuda:0")
b = torch.empty(n * G, dtype=torch.uint8, device="cuda:1")
torch.cuda.synchronize(0)
torch.cuda.synchronize(1)
ts = []
for _ in range(3):
    t = time.perf_counter()
    b.copy_(a, non_blocking=True)
    torch.cuda.synchronize(0)
    torch.cuda.synchronize(1)
    ts.append(time.perf_counter() - t)
print(ts[0], min(ts[1:]))
"""
SNAP = os.path.join(build, "gmsfs-snapshot")


def main():
    d0, d1 = torch.device("cuda", 0), torch.device("cuda", 1)
    dev = dict(line.rstrip("\n").split(": ", 1) for line in open(os.path.join(m0, "device")))
    n = max(1, min(16, int(dev["total_bytes"]) // 6 // GiB))
    src, dst = os.path.join(m0, "peer-src"), os.path.join(m1, "peer-dst")
    os.mkdir(src)
    os.mkdir(dst)
    torch.cuda.set_device(d0)  # libgmsfs maps in the thread's current context
    with gmsfs.connect(src, "rw") as c:
        g = torch.Generator(device=d0).manual_seed(5)
        for i in range(n):
            m = c.create("w%02d" % i, GiB, tag="weights")
            _bytes_at(m.ptr, GiB, d0).view(torch.int64).random_(generator=g)
        c.meta_put("cfg", "w00", 0, b'{"n": %d}' % n)
        torch.cuda.synchronize(d0)
        want = sums(c, d0)
        c.commit()
        h = c.layout_hash
    # The floor, in this run: the driver's peer copy of as many bytes, GPU 0 to GPU 1.
    a = torch.empty(n * GiB, dtype=torch.uint8, device=d0)
    b = torch.empty(n * GiB, dtype=torch.uint8, device=d1)
    floor = 1e9
    for _ in range(3):
        torch.cuda.synchronize(d0)
        torch.cuda.synchronize(d1)
        t = time.perf_counter()
        b.copy_(a, non_blocking=True)
        torch.cuda.synchronize(d0)
        torch.cuda.synchronize(d1)
        floor = min(floor, time.perf_counter() - t)
    del a, b
    torch.cuda.empty_cache()
    # And as a fresh process meets it (gmsfs-snapshot copy is one): its first peer copy,
    # which maps the memory for the other GPU (PyTorch enables peer access there), then later ones.
    r = subprocess.run([sys.executable, "-c", FRESH, str(n)], capture_output=True, text=True, timeout=120)
    fresh_first, fresh_warm = (float(x) for x in r.stdout.split()) if r.returncode == 0 else (0.0, 0.0)
    t = time.perf_counter()
    r = subprocess.run([SNAP, "copy", src, dst], capture_output=True, text=True, timeout=300)
    wall = time.perf_counter() - t
    print("# " + (r.stdout + r.stderr).strip().replace("\n", "\n# "))
    check(r.returncode == 0, "gmsfs-snapshot copy GPU 0 -> GPU 1", r.stderr)
    torch.cuda.set_device(d1)
    with gmsfs.connect(dst, "ro") as c:
        c.import_all()
        got = sums(c, d1)
        check(got == want and c.layout_hash == h, "every allocation's checksum on GPU 1 and the layout hash")
    m = re.search(r"(\d+) bytes in ([0-9.]+) s", r.stdout)
    how = r.stdout.split(": ", 1)[-1].split(";")[0]
    if m:
        secs = float(m.group(2))
        gb = int(m.group(1)) / 1e9
        print("bench: a store of %.1f GB in %d allocations copied GPU 0 -> GPU 1 (%s): the bytes %.4f s (%.0f GB/s), "
              "%.2fx the driver's peer copy %.4f s (%.0f GB/s); the command %.3f s in all (two GPUs' contexts, "
              "locks, the commit)" % (gb, n, how, secs, gb / secs, floor / secs, floor, gb / floor, wall))
        if fresh_first:
            print("bench: in a fresh process, as gmsfs-snapshot copy runs: the driver's first peer copy of as many "
                  "bytes %.4f s (later ones %.4f s): gmsfs-snapshot copy's bytes at %.2fx of it"
                  % (fresh_first, fresh_warm, fresh_first / secs))
        print("gate: peer-copy %.4f %.4f 1.111 a store copied GPU 0 -> GPU 1, against the driver's peer copy (s)"
              % (secs, floor))
    # A second copy into the same store is refused, and leaves it as it is.
    r = subprocess.run([SNAP, "copy", src, dst], capture_output=True, text=True, timeout=300)
    check(r.returncode == 1 and "holds allocations already" in r.stderr, "a second copy into it is refused", r.stderr)
    os.rmdir(src)
    os.rmdir(dst)
    return done()


if __name__ == "__main__":
    sys.exit(main())
