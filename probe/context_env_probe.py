#!/usr/bin/env python3
"""context_env_probe.py MOUNT BUILD: does the driver make a fresh process's context sooner
with fewer work queues (CUDA_DEVICE_MAX_CONNECTIONS; the default is 8), and do a
restore's copies keep their rate with them?  A store of min(16, a sixth of the device)
GiB saved to /dev/shm once, then gmsfs-snapshot restore into an empty store by turns
under each setting, 3 rounds, each with its phases (-v), and restore_open_probe's
context alone under each.  Temporary (#83 item 3, #85's group restore).
    bash tests/gpu/run.sh contexts"""
import os
import shutil
import subprocess
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "gpu"))
import gmsfs  # noqa: E402
from gmsfs._torch_layout import _bytes_at  # noqa: E402

GiB = 1 << 30
mount, build = sys.argv[1], sys.argv[2]
SNAP = os.path.join(build, "gmsfs-snapshot")
dev = dict(line.rstrip("\n").split(": ", 1) for line in open(os.path.join(mount, "device")))
n = max(1, min(16, int(dev["total_bytes"]) // 6 // GiB))
cuda = torch.device("cuda", 0)
SETTINGS = [None, "8", "2"]  # None: the commands' own (1, since cpc_one_queue); 8: the driver's


def env_of(k):
    e = dict(os.environ)
    e.pop("CUDA_DEVICE_MAX_CONNECTIONS", None)
    if k:
        e["CUDA_DEVICE_MAX_CONNECTIONS"] = k
    return e


def main():
    src = os.path.join(mount, "src")
    os.mkdir(src)
    with gmsfs.connect(src, "rw") as c:
        g = torch.Generator(device=cuda).manual_seed(3)
        for i in range(n):
            m = c.create("w%02d" % i, GiB)
            _bytes_at(m.ptr, GiB, cuda).view(torch.int64).random_(generator=g)
        torch.cuda.synchronize()
        c.commit()
    snap = "/dev/shm/gmsfs-ctx-probe"
    shutil.rmtree(snap, ignore_errors=True)
    subprocess.run([SNAP, "save", "-q", src, snap], check=True)
    dst = os.path.join(mount, "dst")
    took = {k: [] for k in SETTINGS}
    ctx = {k: [] for k in SETTINGS}
    for _ in range(3):
        for k in SETTINGS:
            if os.path.exists(dst):
                os.rmdir(dst)
            os.mkdir(dst)
            t = time.perf_counter()
            r = subprocess.run([SNAP, "restore", "-q", "-v", dst, snap], capture_output=True, text=True, env=env_of(k))
            took[k].append(time.perf_counter() - t)
            if r.returncode:
                print("restore with %s: %s" % (k, r.stderr))
            for line in r.stderr.splitlines():
                if "the device's context" in line:
                    ctx[k].append(float(line.split()[-2]))
    for k in SETTINGS:
        print("CUDA_DEVICE_MAX_CONNECTIONS=%s: restore of %d GiB %s s, its context %s s" % (
            k or "(unset: 1)", n, ", ".join("%.3f" % x for x in took[k]), ", ".join("%.3f" % x for x in ctx[k])))
    for _ in range(2):
        for k in SETTINGS:
            r = subprocess.run([os.path.join(build, "restore_open_probe"), "0", "hugethreads"], capture_output=True,
                               text=True, env=env_of(k))
            print("probe, CUDA_DEVICE_MAX_CONNECTIONS=%s: %s" % (k or "(unset)", r.stdout.strip()))
    shutil.rmtree(snap, ignore_errors=True)


main()
