#!/usr/bin/python3
"""bench/scale.py MOUNT DAEMON_PID [ALLOCATIONS [ENTRIES]]: gmsfs at scale, host backend.
bench/scale.py MOUNT DAEMON_PID --cycles ENTRIES ROUNDS: only the create/rmdir cycles,
exiting 1 when the daemon's memory grows by 10 MB or more (tests/memory.sh).

Two stores on a live mount, made through the Python package's bulk calls (what an
engine uses): one of ALLOCATIONS allocations of 4 KiB (default 100,000), one of ENTRIES
metadata entries (default 1,000,000).  For each: the rate of creation, commit (with the
layout hash), `ls` of the directory, a reader's connect + import_all, a write-open of
the lock against the same on an empty store (O(1): no copy of the store per session),
and the daemon's own memory (RssAnon) against the metadata it stores, then after rmdir
(once the kernel's forgets have come: gmsfs_kernel_nodes in metrics).  The same memory
for 200,000 entries named and valued as gmsfs.torch.publish writes them.
`ls -lR` of every name is timed the first time and again: the listing gives the kernel
every entry's attributes (readdirplus), and the ACL and security label that `ls -l` asks
for answer ENOTSUP, which `ls` remembers for the whole mount.
Not a test."""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import gmsfs  # noqa: E402

mount, daemon = sys.argv[1], int(sys.argv[2])
only_cycles = sys.argv[3:4] == ["--cycles"]
n_allocs = int(sys.argv[3]) if len(sys.argv) > 3 and not only_cycles else 100000
n_entries = int(sys.argv[4]) if len(sys.argv) > 4 and not only_cycles else 1000000
T = time.perf_counter


def anon():
    with open("/proc/%d/status" % daemon) as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("RssAnon:"))


def run(*cmd):
    t = T()
    subprocess.run(cmd, stdout=subprocess.DEVNULL, check=True)
    return T() - t


def write_open(store):
    t = T()
    os.close(os.open(os.path.join(store, "lock"), os.O_WRONLY))
    return T() - t


def median_write_open(store):
    return sorted(write_open(store) for _ in range(7))[3]


def rmdir(store):
    """rmdir once the last close's release (sent after close returns) has been served."""
    for _ in range(100):
        try:
            return os.rmdir(store)
        except OSError as e:
            if e.errno != 16:
                raise
            time.sleep(0.01)
    rmdir(store)


READER = """
import sys, time
sys.path.insert(0, sys.argv[2])
import gmsfs
t = time.perf_counter()
with gmsfs.connect(sys.argv[1], "ro") as c:
    c.import_all()
    t = time.perf_counter() - t
    print(t, len(c.mappings), len(c.meta_list()))
"""


def reader(store):
    """A reader's connect + import_all, timed inside a freshly started process (what an engine meets)."""
    out = subprocess.run([sys.executable, "-c", READER, store, os.path.join(os.path.dirname(gmsfs.__file__), "..")],
                         stdout=subprocess.PIPE, text=True, check=True).stdout.split()
    return float(out[0]), int(out[1]), int(out[2])


def kernel_nodes():
    with open(os.path.join(mount, "metrics")) as f:
        return next(int(line.split()[1]) for line in f if line.startswith("gmsfs_kernel_nodes{"))


def forgets_settled():
    """The nodes a removed store's listings gave the kernel are freed at its forgets, and the
    rest at the forget of the store's directory; both follow rmdir asynchronously: wait (at
    most 5 s) until the count of nodes and the daemon's memory have stayed put for 1 s."""
    t, last, same = T(), None, 0
    while T() - t < 5 and same < 4:
        now = (kernel_nodes(), anon())
        same = same + 1 if now == last else 0
        last = now
        time.sleep(0.25)
    return T() - t


def tmpfs_ls_floor():
    """ls -lR per name, first time and again, of 100,000 empty files in 10 directories on tmpfs."""
    top = tempfile.mkdtemp(dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    try:
        for i in range(100000):
            d = os.path.join(top, str(i // 10000))
            if i % 10000 == 0:
                os.mkdir(d)
            os.close(os.open(os.path.join(d, "%06d" % i), os.O_CREAT | os.O_WRONLY, 0o644))
        return [run("ls", "-lR", top) / 100000 for _ in range(2)]
    finally:
        shutil.rmtree(top)


def report(store, what, meta_bytes, base):
    runs = sorted(reader(store) for _ in range(3))
    t, na, n = runs[1]
    print("  reader: connect + import_all (%d allocations, %d entries), fresh process, median of 3 %8.3f s "
          "(%.3f-%.3f)" % (na, n, t, runs[0][0], runs[2][0]))
    print("  ls -R %-45s %8.3f s" % (what + " (every name)", run("ls", "-R", os.path.join(store, what))))
    names = na if what == "allocs" else n
    for when, floor in zip(("", " again"), ls_floor):
        t_ls = run("ls", "-lR", os.path.join(store, what))
        print("  ls -lR %-44s %8.3f s   %.1f us per name: %.2fx tmpfs" % (
            what + " (every name)" + when, t_ls, t_ls / names * 1e6, t_ls / names / floor))
    empty = os.path.join(mount, "scale-empty")
    os.mkdir(empty)
    w_big, w_empty = median_write_open(store), median_write_open(empty)
    rmdir(empty)
    print("  write-open of the lock: %.3f ms, %.3f ms on an empty store: %.2fx" % (w_big * 1e3, w_empty * 1e3,
                                                                                  w_big / w_empty))
    held = anon() - base
    print("  daemon memory: %.1f MB for %.1f MB of metadata: %.1fx" % (held / 1e6, meta_bytes / 1e6,
                                                                       held / meta_bytes))
    rmdir(store)
    settled = forgets_settled()
    print("  after rmdir and the kernel's forgets (%.2f s): %.1f MB above where it started" % (
        settled, (anon() - base) / 1e6))


def allocations():
    store = os.path.join(mount, "scale-allocs")
    os.mkdir(store)
    base = anon()
    names = ["allocs/%d/%06d" % (i // 10000, i) for i in range(n_allocs)]
    t = T()
    with gmsfs.connect(store, "rw") as c:
        for i in range(0, n_allocs, 10000):
            c.create_many([(name[7:], 4096) for name in names[i:i + 10000]])
        made = T() - t
        t = T()
        c.commit()
        commit = T() - t
    print("scale: %d allocations of 4 KiB in one store" % n_allocs)
    print("  create_many, 10,000 a call                           %8.3f s   %.0f per second" % (made, n_allocs / made))
    print("  commit (validate, hash)                              %8.3f s" % commit)
    # What the daemon keeps per allocation: its name, tag ("default"), size and aligned size.
    report(store, "allocs", sum(len(n) - 7 + 7 + 16 for n in names), base)


def entries():
    store = os.path.join(mount, "scale-meta")
    os.mkdir(store)
    base = anon()
    keys = ["%d/%07d" % (i // 10000, i) for i in range(n_entries)]
    t = T()
    with gmsfs.connect(store, "rw") as c:
        c.create("w", 1 << 20)
        for i in range(0, n_entries, 50000):
            c.meta_put_many([(k, "w", (j % 256) * 4096, b"v%07d" % j, 64)
                             for j, k in enumerate(keys[i:i + 50000], i)])
        made = T() - t
        t = T()
        c.commit()
        commit = T() - t
    print("scale: %d metadata entries in one store" % n_entries)
    print("  meta_put_many, 50,000 a call                         %8.3f s   %.0f per second" % (made, n_entries / made))
    print("  commit (validate, hash)                              %8.3f s" % commit)
    # Per entry: key, allocation name, value, and offset, size, flags (8 + 8 + 4 bytes).
    report(store, "meta", sum(len(k) + 1 + 8 + 20 for k in keys), base)


def settled_anon():
    """RssAnon once it has stayed put for 0.3 s (at most 3 s): the daemon gives a big
    call's buffers back after its reply."""
    t, last, same = T(), None, 0
    while T() - t < 3 and same < 3:
        now = anon()
        same = same + 1 if now == last else 0
        last = now
        time.sleep(0.1)
    return last


def entries_as_torch_writes_them(n=200000):
    """The daemon's memory for entries whose values are what gmsfs.torch.publish writes (a
    tensor's dtype, shape, stride, offset as JSON, about 90 bytes), against the same count."""
    store = os.path.join(mount, "scale-torch")
    os.mkdir(store)
    base = anon()
    keys = ["torch/model.layers.%d.mlp.w%07d.weight" % (i // 10000, i) for i in range(n)]  # gmsfs.torch.PREFIX
    values = [json.dumps({"dtype": "bfloat16", "shape": [14336, 4096 + i % 64], "stride": [4096 + i % 64, 1],
                          "storage_offset": 0, "param": True}, separators=(",", ":")).encode() for i in range(n)]
    with gmsfs.connect(store, "rw") as c:
        c.create("slab0", 1 << 20)
        for i in range(0, n, 50000):
            c.meta_put_many([(k, "slab0", 512 * (j % 2048), values[j], 512) for j, k in enumerate(keys[i:i + 50000], i)])
        c.commit()
    held = settled_anon() - base
    meta_bytes = sum(len(k) + 5 + len(v) + 20 for k, v in zip(keys, values))
    print("scale: %d entries with values as gmsfs.torch writes them (%d-byte JSON, keys as gmsfs.torch names them)"
          % (n, len(values[0])))
    print("  daemon memory: %.1f MB for %.1f MB of metadata: %.1fx" % (held / 1e6, meta_bytes / 1e6, held / meta_bytes))
    rmdir(store)


def cycles(n=300000, rounds=5):
    """A store of n entries made, listed (ls -lR) and removed, rounds times: the daemon's
    memory after each rmdir (once the forgets have come) against after the first."""
    after = []
    for _ in range(rounds):
        store = os.path.join(mount, "scale-cycle")
        os.mkdir(store)
        with gmsfs.connect(store, "rw") as c:
            c.create("w", 4096)
            for i in range(0, n, 50000):
                c.meta_put_many([("%d/%d" % (j // 10000, j), "w", 0, b"12345678") for j in range(i, min(i + 50000, n))])
            c.commit()
        run("ls", "-lR", store)
        rmdir(store)
        forgets_settled()
        after.append(anon())
    print("scale: %d cycles of mkdir, %d entries, commit, ls -lR, rmdir" % (rounds, n))
    print("  daemon memory after each rmdir: %s MB; the last %+.1f MB from the first (goal: within 10 MB)"
          % (", ".join("%.1f" % (a / 1e6) for a in after), (after[-1] - after[0]) / 1e6))
    return after[-1] - after[0] < 10e6


if only_cycles:
    sys.exit(0 if cycles(int(sys.argv[4]), int(sys.argv[5])) else 1)


ls_floor = tmpfs_ls_floor()
print("floor: ls -lR of 100,000 empty files on tmpfs: %.1f us per name, %.1f again" % (ls_floor[0] * 1e6,
                                                                                      ls_floor[1] * 1e6))
allocations()
entries()
entries_as_torch_writes_them()
cycles()
