#!/usr/bin/python3
"""bench/restart.py BUILD [GIB [BACKEND [big,many]]]: how long a daemon restart keeps a new reader
waiting, against loading the same model again.  Not a test.

Two models, each alone on a fresh mount: one of GIB GiB (default 2) in 16 tensors, loaded
by gmsfs-load (slabs), and one of 1000 allocations of 2 MiB made by create_many.  For each,
the time from the restart command until a fresh reader's connect + import_all succeeds (its
Python start included, its check of the bytes not):
  - takeover:   gmsfs -o takeover MOUNT (the old daemon hands its stores over);
  - restart:    SIGTERM, then a new daemon under a service manager (state=: systemctl
                restart), the memory's descriptors from the manager's store;
  - crash:      SIGKILL, then the same;
against the baseline measured in the same run: gmsfs-load of the same bytes (a checkpoint of
16 or 1000 tensors) from the page cache into an empty store, until the same reader can
import (the model loaded again).  Each is timed GMSFS_BENCH_REPEAT times (3): medians.
Every import checks that the bytes are the model's.  BACKEND: host (default) or cuda."""
import ctypes
import faulthandler
import glob
import os
import select
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
sys.path.insert(0, os.path.join(HERE, "..", "python", "tests"))
build = os.path.abspath(sys.argv[1])
os.environ["GMSFS_BUILD"] = os.path.relpath(build, os.path.join(HERE, ".."))
os.environ.setdefault("GMSFS_LIBRARY", os.path.join(build, "libgmsfs.so.0"))
gib = float(sys.argv[2]) if len(sys.argv) > 2 else 2.0
backend = sys.argv[3] if len(sys.argv) > 3 else "host"
kinds = sys.argv[4].split(",") if len(sys.argv) > 4 else ["big", "many"]
# GMSFS_BENCH_OPTIONS: more -o options for every daemon the run starts (no_host_ahead, say).
EXTRA = tuple(o for o in os.environ.get("GMSFS_BENCH_OPTIONS", "").split(",") if o)
from manager import Manager  # noqa: E402
import synth  # noqa: E402
import gmsfs  # noqa: E402

T = time.perf_counter
MiB = 1 << 20
START = T()


TRACE = os.environ.get("GMSFS_BENCH_TRACE")
TRACE_T0 = [None]


def trace(what, at=None):
    """GMSFS_BENCH_TRACE=1: each restart's steps, in ms since its signal (or its command)."""
    at = time.time() if at is None else at
    if what.startswith("start: "):
        TRACE_T0[0] = at
    if TRACE and TRACE_T0[0] is not None:
        print("#       trace %8.1f ms  %s" % ((at - TRACE_T0[0]) * 1e3, what), flush=True)


def step(what):
    """Where the run is, and since when: a run that outlasts its limit shows its last step."""
    print("#     %6.1f s  %s" % (T() - START, what), flush=True)


if os.environ.get("GMSFS_BENCH_DUMP"):  # seconds: then every thread's stack, and again
    faulthandler.dump_traceback_later(int(os.environ["GMSFS_BENCH_DUMP"]), repeat=True)

# An engine, started (imports, a CUDA context on cuda): on "go" it imports the store as
# soon as it can and says when; then the first MiB of every allocation, checksummed
# (copied out by the driver: no PyTorch to import, ~10 s a process on the GPU machine).
READER = r"""
import ctypes, gmsfs, gmsfs._cuda, os, sys, time, zlib
store, cuda = sys.argv[1], sys.argv[2] == "cuda"
if cuda:
    gmsfs._cuda.make_current(store)  # the context before the clock, as an engine has one
    cu = gmsfs._cuda._driver()
# What its connect uses, imported before the clock too, as an engine that waits has done at
# its first try (the package imports a name at its first use: 10-15 ms of modules).
gmsfs.connect, gmsfs.GmsfsError
def head(m, n):
    if not cuda:
        return bytes(c.buffer(m.ptr, n))
    b = ctypes.create_string_buffer(n)
    assert cu.cuMemcpyDtoH_v2(b, ctypes.c_uint64(m.ptr), ctypes.c_size_t(n)) == 0
    return b.raw
if os.environ.get("GMSFS_BENCH_DUMP"):
    import faulthandler
    faulthandler.dump_traceback_later(int(os.environ["GMSFS_BENCH_DUMP"]), repeat=True)
print("ready", flush=True)
sys.stdin.readline()
said, since = None, time.time()
while True:
    try:
        c = gmsfs.connect(store, "ro", timeout=60)
        connected = time.time()
        c.import_all()
        break
    except (gmsfs.GmsfsError, OSError) as e:  # the mount or the store is not back yet
        if time.time() - since > 10 and str(e) != said:  # or it will not be: say why
            said = str(e)
            print("reader: still failing after %.0f s: %s" % (time.time() - since, e), file=sys.stderr, flush=True)
        time.sleep(0.0005)
done = time.time()
sums = 0
for m in sorted(c.mappings, key=lambda m: m.name):
    sums = zlib.crc32(head(m, min(m.size, 1 << 20)), sums)
print(done, len(c.mappings), sums, connected, flush=True)
"""


def checkpoint(path, n, each):
    """synth.checkpoint, then read once: loads start from the page cache."""
    synth.checkpoint(path, n, each)
    with open(path, "rb") as f:
        while f.read(64 * MiB):
            pass


DAEMONS = []  # every daemon and reader this run started, ended at its end whatever happens


def start(mnt, *opts):
    log = open(mnt + ".log", "a")
    p = subprocess.Popen([os.path.join(build, "gmsfs"), "-f", "-o", ",".join(("backend=" + backend,) + EXTRA + opts), mnt],
                         stdout=log, stderr=log)
    DAEMONS.append(p)
    for _ in range(600):
        with open("/proc/mounts") as f:
            if " %s fuse.gmsfs " % mnt in f.read():
                return p
        time.sleep(0.01)
    raise RuntimeError(open(mnt + ".log").read())


class Reader:
    """An engine waiting for the store (a process of its own, started ahead)."""

    def __init__(self, store):
        self.p = subprocess.Popen([sys.executable, "-c", READER, store, backend], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True,
                                  env=dict(os.environ, PYTHONPATH=os.path.join(HERE, "..", "python")))
        DAEMONS.append(self.p)  # a failed run must not leave it retrying forever
        assert self.p.stdout.readline().strip() == "ready"

    def go(self):
        self.p.stdin.write("go\n")
        self.p.stdin.flush()

    def result(self, since, limit=120):
        """From since (time.time()) until it had imported; what it read.  A reader not done
        within limit seconds fails the run, with the daemon's log."""
        poll = select.poll()  # not select(): the manager holds a thousand descriptors in this process
        poll.register(self.p.stdout, select.POLLIN)
        if not poll.poll(limit * 1000):
            log = glob.glob("/tmp/gmsfs-bench-restart.*.log")
            raise RuntimeError("the reader did not import within %d s; the daemon's log:\n%s" % (
                limit, "".join(open(f).read()[-4000:] for f in log)))
        out = self.p.stdout.readline().split()
        self.p.wait()
        trace("reader connected", float(out[3]))
        trace("reader imported", float(out[0]))
        return float(out[0]) - since, int(out[1]), int(out[2])


def reader(store, since):
    r = Reader(store)
    r.go()
    return r.result(since)


def make(store, kind, path):
    """The model into store: gmsfs-load of path (big), or 1000 allocations by create_many."""
    if kind == "big":
        subprocess.run([os.path.join(build, "gmsfs-load"), "-q", store, path], check=True)
        return
    with gmsfs.connect(store, "rw") as c:  # on cuda it makes the GPU's context current
        maps = c.create_many([("a%04d" % i, 2 * MiB) for i in range(1000)])
        if c.backend == "host":
            for i, m in enumerate(maps):  # memmove: a ctypes array's slice assignment is per byte
                ctypes.memmove(m.ptr, bytes([i % 251]) * (2 * MiB), 2 * MiB)
        c.commit()


def unmount(mnt):
    subprocess.run(["umount", mnt], capture_output=True)
    subprocess.run(["umount", "-l", mnt], capture_output=True)


def scenario(kind, path, nbytes):
    mnt = tempfile.mkdtemp(prefix="gmsfs-bench-restart.")
    store = os.path.join(mnt, "model")
    rows = {}
    # Baseline: the same bytes loaded again (gmsfs-load, page cache), until a reader imports.
    step("%s: the baseline's daemon" % kind)
    d = start(mnt)
    loads = []
    for i in range(REPEAT):
        if i:
            subprocess.run(["rmdir", store], check=True)
        os.mkdir(store)
        r = Reader(store)
        t = time.time()
        load = subprocess.Popen([os.path.join(build, "gmsfs-load"), "-q", store, path])
        r.go()  # it waits for the commit
        loads.append(r.result(t)[0])
        assert load.wait() == 0
    rows["loaded again (gmsfs-load from the page cache)"] = loads
    print("#   (%s: loaded again in %s s; now the restarts)" % (kind, " ".join("%.3f" % v for v in loads)), flush=True)
    if kind == "many":
        subprocess.run(["rmdir", store], check=True)
        os.mkdir(store)
        step("many: create_many of 1000 allocations, commit")
        make(store, kind, path)
    step("%s: a reader imports the model once (what every later reader must see)" % kind)
    want = reader(store, 0)[1:]
    rows["gmsfs -o takeover"] = []
    for _ in range(REPEAT):
        step("%s: takeover (after %.1f s for a steady state)" % (kind, settle(mnt, nbytes)))
        r = Reader(store)
        t = time.time()
        trace("start: gmsfs -o takeover", t)
        log = open(mnt + ".log", "a")
        new = subprocess.Popen([os.path.join(build, "gmsfs"), "-f", "-o", "takeover", mnt], stdout=log, stderr=log)
        DAEMONS.append(new)
        ended(d, "the old daemon ended")
        took, n, sums = reader_after(r, store, d.pid, t)
        rows["gmsfs -o takeover"].append(took)
        assert (n, sums) == want, ((n, sums), want)
        d.wait(30)
        d = new
    unmount(mnt)
    d.wait(30)
    # restart and crash under a service manager
    step("%s: under a service manager: the model made again" % kind)
    m = Manager()
    MANAGERS.append(m)
    state = mnt + ".state"
    m.start(mnt, "backend=" + backend, "state=" + state, *EXTRA)
    os.mkdir(store)
    make(store, kind, path)
    # As systemd restarts a service: the signal, its end, the start; nothing unmounts in
    # between (a SIGTERMed daemon unmounts itself, and a start lifts a killed one's mount).
    cases = (("restart (SIGTERM, start under the manager)", signal.SIGTERM),
             ("crash (SIGKILL, start under the manager)", signal.SIGKILL))
    for label, sig in cases * REPEAT:
        step("%s: %s (after %.1f s for a steady state)" % (kind, label, settle(mnt, nbytes)))
        r = Reader(store)
        t = time.time()
        trace("start: " + label, t)
        m.kill(sig)
        trace("the daemon ended")
        r.go()  # from now on it tries
        m.start(mnt, "backend=" + backend, "state=" + state, *EXTRA)
        trace("the new daemon said READY=1")
        took, n, sums = r.result(t)
        rows.setdefault(label, []).append(took)
        assert (n, sums) == want, ((n, sums), want)
    m.kill(signal.SIGTERM)
    unmount(mnt)
    m.close()
    subprocess.run(["rm", "-rf", state])
    os.rmdir(mnt)
    if TRACE:  # the daemons' own account: their starts, host memory made ahead, the mover
        with open(mnt + ".log") as f:
            for line in f:
                if line.startswith("gmsfs"):
                    print("#       daemon: " + line.rstrip()[:300])
    os.unlink(mnt + ".log")
    # Each the median of its REPEAT runs (the runs beside it, sorted).
    runs = rows
    rows = {k: median(v) for k, v in runs.items()}
    base = next(v for k, v in rows.items() if k.startswith("loaded again"))
    print("# %s: %.2f GB in %d allocations (%s backend), medians of %d" % (kind, nbytes / 1e9, want[0], backend,
                                                                          REPEAT))
    for k, v in rows.items():
        print("#   %-48s %8.3f s  %-32s (%s)" % (k, v, "baseline" if k.startswith("loaded again") else
                                                "%.1fx faster than loading again" % (base / v),
                                                " ".join("%.3f" % x for x in sorted(runs[k]))))
    # For tests/gpu/gate.py: at least 20x faster than loading again (value / floor at most 0.05).
    for key, label in (("takeover", "gmsfs -o takeover"), ("restart", "restart (SIGTERM"), ("crash", "crash (SIGKILL")):
        v = next(v for k, v in rows.items() if k.startswith(label))
        print("gate: %s-%s %.4f %.4f 0.05 %s of %.1f GB until a new reader has imported it, against loading it "
              "again (s)" % (key, kind, v, base, key, nbytes / 1e9))
    sys.stdout.flush()


def settle(mnt, nbytes, limit=120):
    """Until the daemon is in its steady state: where it makes host memory ahead (the
    default), it has made the store's (pinning gigabytes takes seconds, and a stop
    meanwhile would time that, not the restart), and its copier has used what a takeover
    or restart handed over (copying 16 GiB onto itself, beside the next restart's reader,
    made that restart's import 1.5-2x slower).  The seconds waited."""
    t0 = time.time()
    while time.time() - t0 < limit:
        try:
            dev = dict(line.split(": ", 1) for line in open(os.path.join(mnt, "device")).read().splitlines()
                       if ": " in line)
        except OSError:
            time.sleep(0.05)
            continue
        if "no_host_ahead" in dev.get("options", "") or (
                int(dev.get("host_standby_bytes", 0)) >= nbytes and dev.get("host_standby_unused_bytes", "0") == "0"):
            break  # made, and used once by this daemon's copier (a takeover's after a quiet second)
        time.sleep(0.05)
    time.sleep(1.5)  # and quiet
    return time.time() - t0


def ended(p, what):
    """GMSFS_BENCH_TRACE: when p ends, said (in a thread)."""
    if TRACE:
        import threading
        threading.Thread(target=lambda: (p.wait(), trace(what)), daemon=True).start()


def reader_after(r, store, old_pid, since):
    """The reader, once the new daemon serves (the device file names another pid): the old
    one serves until then, and would answer it at once."""
    dev = os.path.join(os.path.dirname(store), "device")
    while True:
        try:
            with open(dev) as f:
                if "pid: %d\n" % old_pid not in f.read():
                    trace("the new daemon serves")
                    break
        except OSError:
            pass
        time.sleep(0.0005)
    r.go()
    return r.result(since)


MANAGERS = []
# GMSFS_BENCH_REPEAT: how many times each is timed (the baseline too); medians are said.
REPEAT = int(os.environ.get("GMSFS_BENCH_REPEAT", "3"))


def median(v):
    v = sorted(v)
    return v[len(v) // 2] if len(v) % 2 else (v[len(v) // 2 - 1] + v[len(v) // 2]) / 2


def main():
    tmp = tempfile.mkdtemp(prefix="gmsfs-bench-ckpt.", dir="/var/tmp")
    try:
        if "big" in kinds:
            big = os.path.join(tmp, "big.safetensors")
            each = int(gib * 1024 * MiB) // 16
            checkpoint(big, 16, each)
            scenario("big", big, 16 * each)
            os.unlink(big)
        if "many" in kinds:
            many = os.path.join(tmp, "many.safetensors")
            checkpoint(many, 1000, 2 * MiB)
            scenario("many", many, 1000 * 2 * MiB)
            os.unlink(many)
    finally:  # nothing of this run lives on (a daemon would hold the caller's pipes)
        for m in MANAGERS:
            if m.daemon and m.daemon.poll() is None:
                m.daemon.kill()
        for p in DAEMONS:
            if p.poll() is None:
                p.kill()
        subprocess.run(["rm", "-rf", tmp])


if __name__ == "__main__":
    main()
