#!/usr/bin/python3
"""bench/group_restore.py BUILD [RUNS]: what `gmsfsctl group restore` adds to its ranks'
restores, on the host backend.  Not a test.

Two mounts (two "GPUs"), a group of one store on each (8 allocations of 4 MiB, named
v1), saved once by `gmsfsctl group snapshot`.  Then, in fresh processes by turns, RUNS
times each (default 9), into empty stores:
  - the command:  gmsfsctl group restore GROUP SNAP (Python's start, its imports, the
                  group's manifest, both ranks' gmsfs-snapshot at once, their checks);
  - both apart:   the two ranks' gmsfs-snapshot restore started at once, a process each
                  (the baseline: what the command runs, with nothing around it);
  - both in one:  one gmsfs-snapshot restore of both ranks, a thread each (the other way);
  - one alone:    one rank's gmsfs-snapshot restore (the rate of one "GPU").
Medians, the command's over both by hand, and the group's rate in ranks of one alone
(2.00x: N times one's rate; on a GPU the CUDA contexts bound it: docs/benchmarks.md)."""
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
build = os.path.abspath(sys.argv[1])
runs = int(sys.argv[2]) if len(sys.argv) > 2 else 9
sys.path.insert(0, os.path.join(HERE, "..", "python"))
os.environ.setdefault("GMSFS_LIBRARY", os.path.join(build, "libgmsfs.so.0"))
import gmsfs  # noqa: E402

SNAPSHOT = os.path.join(build, "gmsfs-snapshot")
CTL = [sys.executable, os.path.join(HERE, "..", "tools", "gmsfsctl"), "group"]
ENV = dict(os.environ, PATH=build + os.pathsep + os.environ["PATH"])  # the build's gmsfs-snapshot
SIZE = 4 << 20


def mount(top, name):
    m = os.path.join(top, name)
    os.mkdir(m)
    p = subprocess.Popen([os.path.join(build, "gmsfs"), "-f", "-o", "backend=host,socket=%s.sock" % m, m],
                         stderr=subprocess.DEVNULL)
    end = time.monotonic() + 10
    while not any(line.split()[1] == m for line in open("/proc/mounts")):
        if p.poll() is not None or time.monotonic() > end:
            raise SystemExit("bench: the daemon for %s did not mount" % m)
        time.sleep(0.02)
    return m, p


def main():
    top = tempfile.mkdtemp(prefix="gmsfs-bench-group.")
    daemons = []
    try:
        mounts = []
        for i in range(2):
            m, p = mount(top, "gpu%d" % i)
            mounts.append(m)
            daemons.append((m, p))
        src = [os.path.join(m, "src") for m in mounts]
        for r, s in enumerate(src):
            os.mkdir(s)
            with gmsfs.connect(s, "rw", timeout=5) as c:
                for i in range(8):
                    a = c.create("w%d" % i, SIZE)
                    c.buffer(a.ptr, SIZE, writable=True)[:] = bytes([16 * r + i + 1]) * SIZE
                c.commit(version="v1")
        group, snap = os.path.join(top, "src.group"), os.path.join(top, "snap")
        with open(group, "w") as f:
            f.write("\n".join(src) + "\n")
        subprocess.run(CTL + ["snapshot", group, snap], env=ENV, check=True, capture_output=True)
        dst = [os.path.join(m, "re") for m in mounts]
        other = os.path.join(top, "re.group")
        with open(other, "w") as f:
            f.write("\n".join(dst) + "\n")

        def one(s, r):
            return [SNAPSHOT, "restore", s, os.path.join(snap, "rank-%d" % r), "--version", "v1", "-q"]
        ways = {
            "gmsfsctl group restore": lambda: subprocess.run(CTL + ["restore", other, snap], env=ENV, check=True,
                                                             stdout=subprocess.DEVNULL),
            "both in one gmsfs-snapshot restore": lambda: subprocess.run(
                [SNAPSHOT, "restore"] + [x for r, s in enumerate(dst) for x in (s, os.path.join(snap, "rank-%d" % r))]
                + ["--version", "v1", "-q"], check=True),
            "both gmsfs-snapshot restore at once": lambda: [
                p.wait() == 0 or sys.exit("bench: a restore failed")
                for p in [subprocess.Popen(one(s, r)) for r, s in enumerate(dst)]],
            "one alone": lambda: subprocess.run(one(dst[0], 0), check=True),
        }
        took = {k: [] for k in ways}
        for _ in range(runs):
            for name, run in ways.items():
                for s in dst:
                    if os.path.exists(s):
                        os.rmdir(s)  # its memory goes with it (nobody reads it)
                    os.mkdir(s)
                t = time.perf_counter()
                run()
                took[name].append(time.perf_counter() - t)
        with gmsfs.connect(dst[0], "ro", timeout=5) as c:  # the last restore's bytes (rank 0 alone)
            a = c.import_one("w7")
            if set(bytes(c.buffer(a.ptr, SIZE))) != {8}:
                sys.exit("bench: the restored bytes are not the saved ones")
        med = {k: statistics.median(v) for k, v in took.items()}
        print("group restore, 2 ranks of %d MiB on the host backend, %d runs each by turns (ms, sorted):"
              % (8 * SIZE >> 20, runs))
        for k, v in took.items():
            print("  %-38s median %7.1f   %s" % (k, med[k] * 1e3, " ".join("%.1f" % (x * 1e3) for x in sorted(v))))
        both, cmd = med["both gmsfs-snapshot restore at once"], med["gmsfsctl group restore"]
        one = med["both in one gmsfs-snapshot restore"]
        print("  the command over what it runs, by hand: %.2fx (+%.1f ms); the group's rate: %.2fx one rank's "
              "(a process a rank by hand %.2fx, both in one process %.2fx)"
              % (cmd / both, (cmd - both) * 1e3, 2 * med["one alone"] / cmd, 2 * med["one alone"] / both,
                 2 * med["one alone"] / one))
    finally:
        for m, p in daemons:
            subprocess.run(["umount", m], stderr=subprocess.DEVNULL)
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        shutil.rmtree(top, ignore_errors=True)


if __name__ == "__main__":
    main()
