#!/usr/bin/python3
"""bench/switch.py BUILD GIB one|many [SWITCHES]: a warm switch of two models, each served by
an engine of its own (a fresh process with its CUDA context), on a mount whose budget holds
one (max_bytes = 1.25 x a model), against the copy engines both ways at once (bench-duplex,
a fresh process with the driver alone, the same bytes) measured in the same run, into device
memory made just before: a switch's ins go into new memory (a store's memory is never
reused for another's: its readers may keep its descriptors), and the driver's first use of
new memory is slower (~10% on an H200).  Not a
test: it prints, and says "gate:" lines for tests/gpu/gate.py.

A model is GIB GiB in one allocation (one: what gmsfs.torch.publish makes of a module built
outside the store, and what a GMS client often makes) or in 16 (many: what the store's
allocator makes).  Each region of 1 GiB holds its own byte, checked by the engine after
every wake at both ends of each region.

  - publish A; its engine imports it and sleeps; the mount is let settle (A's host memory
    made ahead, as it is while the next engine starts: its imports take seconds);
  - publish B on the full budget (A goes out: its first move, into that memory);
  - B's engine imports B and sleeps; the mount is let settle;
  - SWITCHES times (default 7): one engine sleeps, the other wakes (the daemon brings its
    model in while the other goes out): the time from the sleep's call to the woken
    engine's return; the first one apart;
  - B removed, and published again on the full budget (A goes out into the host memory it
    keeps): a later publish, against the first;
  - then both removed, and two models published one right after the other: the first
    one's host memory is made by its move out then (not gated: pinning runs at ~5 GB/s
    whatever the threads, 3.2 s for 16 GiB on an H200), said for what it is.
"""
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "python"))
build = os.path.abspath(sys.argv[1])
gib = float(sys.argv[2])
layout = sys.argv[3]
switches = int(sys.argv[4]) if len(sys.argv) > 4 else 7
os.environ.setdefault("GMSFS_LIBRARY", os.path.join(build, "libgmsfs.so.0"))
ENV = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
GiB = 1 << 30
NBYTES = int(gib * GiB)
REGIONS = max(1, NBYTES // GiB)

# Both roles' common part: the context (before any clock), the regions' bytes.
COMMON = r"""
import ctypes, gmsfs, gmsfs._cuda, sys, time
GiB = 1 << 30
cuda = open(sys.argv[2].rsplit("/", 1)[0] + "/device").read().find("backend: cuda") >= 0
if cuda:
    gmsfs._cuda.make_current(sys.argv[2])
    cu = gmsfs._cuda._driver()
def region_byte(seed, k):
    return (seed * 37 + k * 11 + 1) & 0xff
def at(c, off):
    # the mapping that holds byte off of the model, and where in it
    for m in sorted(c.mappings, key=lambda m: m.name):
        if off < m.size:
            return m, off
        off -= m.size
def put(c, off, n, v):
    m, o = at(c, off)
    if cuda:
        assert cu.cuMemsetD8_v2(ctypes.c_uint64(m.ptr + o), ctypes.c_ubyte(v), ctypes.c_size_t(n)) == 0
    else:
        c.buffer(m.ptr + o, n, writable=True)[:] = bytes([v]) * n
def get(c, off):
    m, o = at(c, off)
    if cuda:
        b = ctypes.create_string_buffer(1)
        assert cu.cuMemcpyDtoH_v2(b, ctypes.c_uint64(m.ptr + o), ctypes.c_size_t(1)) == 0
        return b.raw[0]
    return bytes(c.buffer(m.ptr + o, 1))[0]
"""

PUBLISH = COMMON + r"""
nbytes, store, seed, many = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4] == "many"
t = time.perf_counter()
with gmsfs.connect(store, "rw", timeout=120) as c:
    if many:
        c.create_many([("w%02d" % i, nbytes // 16) for i in range(16)])
    else:
        c.create("w", nbytes)
    for k in range(max(1, nbytes // GiB)):
        put(c, k * GiB, min(GiB, nbytes - k * GiB), region_byte(seed, k))
    if cuda:
        assert cu.cuCtxSynchronize() == 0
    c.commit()
print(time.perf_counter() - t, flush=True)
"""

ENGINE = COMMON + r"""
nbytes, store, seed = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
c = gmsfs.connect(store, "ro", timeout=120)
c.import_all()
def check():
    for k in range(max(1, nbytes // GiB)):
        end = min((k + 1) * GiB, nbytes) - 1
        want = region_byte(seed, k)
        got = (get(c, k * GiB), get(c, end))
        assert got == (want, want), "region %d: %r, not %d" % (k, got, want)
check()
print("ready", flush=True)
for line in sys.stdin:
    t = time.perf_counter()
    if line.strip() == "sleep":
        c.unmap_all()
    else:
        c.remap_all(120)
    done = time.perf_counter()
    if line.strip() != "sleep":
        check()
    print("%.6f %.6f" % (t, done), flush=True)
"""


class Engine:
    def __init__(self, store, seed):
        self.p = subprocess.Popen([sys.executable, "-c", ENGINE, str(NBYTES), store, str(seed)], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True, env=ENV)
        line = self.p.stdout.readline().strip()
        if line != "ready":
            raise RuntimeError("engine of %s: %r" % (store, line))

    def ask(self, what):
        self.p.stdin.write(what + "\n")
        self.p.stdin.flush()
        line = self.p.stdout.readline().split()
        if len(line) != 2:
            raise RuntimeError("engine: %s failed (%r)" % (what, line))
        return float(line[0]), float(line[1])

    def close(self):
        self.p.stdin.close()
        self.p.wait(60)


def publish(store, seed):
    os.mkdir(store)
    r = subprocess.run([sys.executable, "-c", PUBLISH, str(NBYTES), store, str(seed), layout], capture_output=True,
                       text=True, env=ENV, timeout=600)
    if r.returncode:
        raise RuntimeError("publish %s: %s" % (store, r.stderr[-2000:]))
    return float(r.stdout.split()[-1])


def fields(path):
    with open(path) as f:
        return dict(l.split(": ", 1) for l in f.read().splitlines() if ": " in l)


def settle(mnt, kept, limit=120):
    """Until the daemon keeps host memory for `kept` bytes, then a quiet second more."""
    t0 = time.time()
    while time.time() - t0 < limit and int(fields(os.path.join(mnt, "device")).get("host_standby_bytes", 0)) < kept:
        time.sleep(0.05)
    time.sleep(1.5)
    return time.time() - t0


def remove(store):
    for _ in range(400):  # let go of by its engine (the release comes after close), then removed
        try:
            os.rmdir(store)
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError("%s: not removed" % store)


def main():
    mnt = tempfile.mkdtemp(prefix="gmsfs-bench-switch.")
    log = open(mnt + ".log", "w")
    budget = int(NBYTES * 1.25)
    d = subprocess.Popen([os.path.join(build, "gmsfs"), "-f", "-o", "max_bytes=%d" % budget, mnt], stdout=log,
                         stderr=log)
    engines = []
    try:
        for _ in range(600):
            if " %s fuse.gmsfs " % mnt in open("/proc/mounts").read():
                break
            time.sleep(0.01)
        dev = fields(os.path.join(mnt, "device"))
        cuda = dev["backend"] == "cuda"
        floor = duplex = None
        if cuda:  # the copy engines both ways at once, into new device memory as a switch's ins
            r = subprocess.run([os.path.join(build, "bench-duplex"), str(NBYTES)], capture_output=True, text=True)
            if r.returncode == 0:
                duplex, floor = (float(x) for x in r.stdout.split()[2:4])
        a, b = os.path.join(mnt, "a"), os.path.join(mnt, "b")
        t_pub_a = publish(a, 1)
        ea = Engine(a, 1)
        engines.append(ea)
        ea.ask("sleep")
        settled_a = settle(mnt, NBYTES)
        t_pub_first = publish(b, 2)  # A goes out for it: its first move
        eb = Engine(b, 2)
        engines.append(eb)
        eb.ask("sleep")
        waited = settle(mnt, NBYTES)
        times = []
        awake, asleep = eb, ea  # both asleep now; a wakes first
        for i in range(switches):
            t0, _ = awake.ask("sleep") if i else (time.perf_counter(), 0)
            _, done = asleep.ask("wake")
            times.append(done - t0)
            awake, asleep = asleep, awake
        awake.ask("sleep")
        for e in engines:
            e.close()
        engines = []
        remove(b)
        with open(os.path.join(a, "tier"), "w") as f:  # a in, keeping host memory for its next move out
            f.write("device\n")
        for _ in range(1200):
            if open(os.path.join(a, "tier")).read().strip() == "device":
                break
            time.sleep(0.05)
        settle(mnt, NBYTES)
        t_pub_later = publish(b, 3)
        remove(a)
        remove(b)
        publish(a, 4)
        t_right_after = publish(b, 5)  # the first model's host memory not made yet
        first, warm = times[0], statistics.median(times[1:])
        rounds = [l for l in open(mnt + ".log").read().splitlines() if "switched in" in l]
        print("# switch, %s: %.2f GB in %s allocation%s, budget %.2f GB (%s, %s); settled %.1f s" % (
            layout, NBYTES / 1e9, "one" if layout == "one" else "16", "" if layout == "one" else "s", budget / 1e9,
            dev["backend"], dev["name"], waited))
        if floor:
            print("#   the copy engines both ways at once (bench-duplex, fresh process): %.3f s; into device memory "
                  "made just before, as a switch's ins: %.3f s (%.2fx)" % (duplex, floor, floor / duplex))
        print("#   warm switch, median of %d: %.3f s%s; the first %.3f s (%.2fx the median)" % (
            len(times) - 1, warm, " (%.2fx the copy engines into new memory, %.2fx into memory used before)" % (
                warm / floor, warm / duplex) if floor else "", first, first / warm))
        print("#   publish: the first model %.3f s; the second, on the full budget, %.3f s (the first's host memory "
              "made ahead in %.1f s); later %.3f s (%.2fx)" % (t_pub_a, t_pub_first, settled_a, t_pub_later,
                                                               t_pub_first / t_pub_later))
        print("#   a second model published right after the first, on the full budget: %.3f s (%.1fx: the first's "
              "%.1f GB of pinned host memory made by its move out then)" % (t_right_after, t_right_after / t_pub_later,
                                                                            NBYTES / 1e9))
        for l in rounds[-2:]:
            print("#   daemon: " + l.split("gmsfs: ", 1)[-1][:200])
        what = "in one allocation" if layout == "one" else "in 16 allocations"
        if floor:
            print("gate: switch-%s-warm %.4f %.4f 1.2 a warm switch, two models %s, against the copy engines both "
                  "ways at once into new device memory (s)" % (layout, warm, floor, what))
        print("gate: switch-%s-first %.4f %.4f 1.2 the first switch, models %s, against the warm ones (s)" % (
            layout, first, warm, what))
        print("gate: publish-%s-first %.4f %.4f 1.2 the first publish on a full budget, models %s, against a later "
              "one (s)" % (layout, t_pub_first, t_pub_later, what))
    finally:
        for e in engines:
            e.p.kill()
        subprocess.run(["umount", mnt], capture_output=True)
        try:
            d.wait(30)
        except subprocess.TimeoutExpired:
            d.kill()
        subprocess.run(["umount", "-l", mnt], capture_output=True)
        os.rmdir(mnt)
        log.close()
        keep = os.environ.get("GMSFS_BENCH_KEEP_LOG")  # a folder: the daemon's whole log kept there
        if keep and os.path.isdir(keep):
            shutil.copy(mnt + ".log", os.path.join(keep, "switch-%s.log" % layout))
        elif keep:
            print(open(mnt + ".log").read()[-3000:])
        os.unlink(mnt + ".log")


if __name__ == "__main__":
    main()
