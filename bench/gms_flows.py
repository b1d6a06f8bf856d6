#!/usr/bin/env python3
"""GMS's client flows, timed in fresh processes, three ways in one run (issue 28):

  - GMS:       NVIDIA Dynamo's GPU Memory Service itself (its server, python3 -m
               gpu_memory_service, and its client), from a source tree (UPSTREAM, a
               folder holding gpu_memory_service; never committed here);
  - gmsfs.gms: the same client code's calls through gmsfs's GMS client API, on MOUNT;
  - gmsfs:     gmsfs's own Python API (gmsfs.connect) doing the same work, the baseline
               for the shim's overhead (goal: <= 10%).

    python3 bench/gms_flows.py MOUNT [UPSTREAM] [RUNS]

Per layout (1000 x 2 MiB, 128 x 64 MiB, 16 x 1 GiB; a layout larger than a third of the
device is skipped), RUNS times for GMS (default 3; three times as many for 16 allocations,
whose phases take milliseconds and move with the machine; the median is printed) and PAIRS
(5) times as many for gmsfs.gms and gmsfs, the two taking turns, so that the shim's overhead
is the median of its ratios run by run (a pair of runs side by side sees the same
machine; fresh processes move by 10-30% from run to run, more than the goal, so the
median needs many pairs to be closer than that): a writer process
(connect RW; allocate + map each allocation; a metadata entry per allocation; commit,
which unmaps the writer in GMS's semantics: gmsfs's own path commits with unmap=True),
then a reader process (connect RO, every entry read and its allocation mapped: an
import; then a remap cycle: unmap everything, give the lock back, take it, remap at the
same addresses).  Each process makes its CUDA context before the clock starts, as an
engine has one.  Without UPSTREAM, or where GMS cannot run (no CUDA), the GMS column is
left out.  Where msgspec is not installed (the GPU machine has no package index), GMS
runs with bench/msgspec_standin: its cost per request and reply is measured in the same
run, and a column "less stand-in" takes it off each request GMS's client made (counted),
as if msgspec (a few us per message) had run: the ratio to gmsfs.gms is taken from it."""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PY = os.path.join(ROOT, "python")
sys.path.insert(0, PY)
os.environ.setdefault("GMSFS_LIBRARY", os.path.join(ROOT, "build", "libgmsfs.so.0"))
from gmsfs.ctl import read_fields  # noqa: E402

MiB = 1 << 20
LAYOUTS = [(1000, 2 * MiB), (128, 64 * MiB), (16, 1024 * MiB)]
PAIRS = 5  # runs of gmsfs.gms and of gmsfs for each of GMS's

# One process, one role.  argv: system role where n size device cuda
FLOW = r"""
import ctypes, json, sys, time
system, role, where, n, size, device, cuda = sys.argv[1:8]
n, size, device, cuda = int(n), int(size), int(device), cuda == "1"
if cuda:  # the engine's context, before the clock
    cu = ctypes.CDLL("libcuda.so.1")
    ctx, dev = ctypes.c_void_p(), ctypes.c_int()
    assert cu.cuInit(0) == 0 and cu.cuDeviceGet(ctypes.byref(dev), device) == 0
    assert cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0 and cu.cuCtxSetCurrent(ctx) == 0
value = b"v" * 64
out = {}
if system == "gmsfs":
    import gmsfs
    t0 = time.perf_counter()
    if role == "writer":
        c = gmsfs.connect(where, "rw", timeout=60)
        t1 = time.perf_counter()
        names = ["a%04d" % i for i in range(n)]
        for name in names:
            c.create(name, size, "weights")  # the same work as GMS's flow, which tags each allocation
        t2 = time.perf_counter()
        for name in names:
            c.meta_put("k/" + name, name, 0, value)
        t3 = time.perf_counter()
        c.commit(unmap=True)  # as GMS's commit, which unmaps its writer
        t4 = time.perf_counter()
        out.update(connect=t1 - t0, alloc=t2 - t1, meta=t3 - t2, commit=t4 - t3, count=len(c.mappings))
    else:
        c = gmsfs.connect(where, "ro", timeout=60)
        c.import_all()
        got = [c.meta_get(k) for k in c.meta_list()]
        assert all(e.ptr for e in got)
        t1 = time.perf_counter()
        c.unmap_all()
        c.remap_all(60)
        t2 = time.perf_counter()
        out.update(imp=t1 - t0, remap=t2 - t1, count=len(c.mappings))
else:  # GMS's client: GMS itself, or gmsfs.gms on PYTHONPATH as gpu_memory_service
    from gpu_memory_service.client.memory_manager import GMSClientMemoryManager
    from gpu_memory_service.common.locks import RequestedLockType
    import gpu_memory_service.client.memory_manager as mm_module
    out["client"] = mm_module.__file__
    rpcs = [0]
    if system == "gms":  # count the requests: what each costs through the msgspec stand-in is taken off
        import gpu_memory_service.common.protocol.messages as messages

        class Counting:
            def __init__(self, encoder):
                self.encoder = encoder

            def encode(self, msg):
                rpcs[0] += 1
                return self.encoder.encode(msg)
        messages._encoder = Counting(messages._encoder)
    mm = GMSClientMemoryManager(where, device=device)
    t0 = time.perf_counter()
    if role == "writer":
        mm.connect(RequestedLockType.RW, timeout_ms=60000)
        t1, r1 = time.perf_counter(), rpcs[0]
        vas = [mm.create_mapping(size=size, tag="weights") for _ in range(n)]
        t2, r2 = time.perf_counter(), rpcs[0]
        for va in vas:
            aid = mm.mappings[va].allocation_id
            mm.metadata_put("k/" + aid, aid, 0, value)
        t3, r3 = time.perf_counter(), rpcs[0]
        count = len(mm.mappings)
        mm.commit()
        t4 = time.perf_counter()
        out.update(connect=t1 - t0, alloc=t2 - t1, meta=t3 - t2, commit=t4 - t3, count=count,
                   rpcs=dict(connect=r1, alloc=r2 - r1, meta=r3 - r2, commit=rpcs[0] - r3))
    else:
        mm.connect(RequestedLockType.RO, timeout_ms=60000)
        for key in mm.metadata_list():
            aid, offset, got = mm.metadata_get(key)
            mm.create_mapping(allocation_id=aid)
        t1, r1 = time.perf_counter(), rpcs[0]
        mm.unmap_all_vas()
        mm.abort()
        mm.connect(RequestedLockType.RO, timeout_ms=60000)
        mm.remap_all_vas()
        t2 = time.perf_counter()
        out.update(imp=t1 - t0, remap=t2 - t1, count=len(mm.mappings), rpcs=dict(imp=r1, remap=rpcs[0] - r1))
    mm.close()
print(json.dumps(out), flush=True)
"""

# What a message costs through msgspec (or its stand-in): encode + decode, both ways.
CODEC = r"""
import time
from gpu_memory_service.common.protocol.messages import (MetadataGetRequest, MetadataGetResponse,
                                                         encode_message, decode_message)
import msgspec
req, resp = MetadataGetRequest(key="k/a0001"), MetadataGetResponse(found=True, allocation_id="x" * 36,
                                                                   offset_bytes=0, value=b"v" * 64)
t = time.perf_counter()
for _ in range(5000):
    decode_message(encode_message(req)); decode_message(encode_message(resp))
print("%.1f %s" % ((time.perf_counter() - t) / 5000 * 1e6, msgspec.__file__))
"""


def run(env, *args):
    """One flow process; one that does not end in 120 s (a phase takes seconds) is named
    with what it printed, and ended."""
    try:
        r = subprocess.run([sys.executable, "-c", FLOW] + [str(a) for a in args], capture_output=True, text=True,
                           env=env, timeout=120)
    except subprocess.TimeoutExpired as e:
        err = e.stderr or b""
        err = err.decode(errors="replace") if isinstance(err, bytes) else err
        raise RuntimeError("%s %s (%s x %s bytes) did not end in 120 s:\n%s"
                           % (args[0], args[1], args[3], args[4], err[-4000:])) from None
    if r.returncode:
        raise RuntimeError("%s %s failed:\n%s" % (args[0], args[1], r.stderr[-4000:]))
    return json.loads(r.stdout.strip().splitlines()[-1])


def gms_env(upstream):
    """GMS's own package, and the msgspec stand-in where msgspec is missing."""
    path = [upstream, PY]
    if subprocess.run([sys.executable, "-c", "import msgspec"], capture_output=True).returncode:
        path.append(os.path.join(HERE, "msgspec_standin"))
    return dict(os.environ, PYTHONPATH=os.pathsep.join(path))


class GMSServer:
    """python3 -m gpu_memory_service, as a deployment starts it (its CLI, uvloop)."""

    def __init__(self, env, device):
        self.dir = tempfile.mkdtemp(prefix="gms-bench.")
        self.sock = os.path.join(self.dir, "gms.sock")
        self.log = open(os.path.join(self.dir, "log"), "w")
        self.p = subprocess.Popen([sys.executable, "-m", "gpu_memory_service", "--device", str(device),
                                   "--socket-path", self.sock], env=env, stdout=self.log, stderr=self.log)
        for _ in range(600):
            if os.path.exists(self.sock):
                return
            if self.p.poll() is not None:
                break
            time.sleep(0.05)
        self.close()
        raise RuntimeError("GMS's server did not start:\n" + open(os.path.join(self.dir, "log")).read()[-3000:])

    def close(self):
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGINT)
            try:
                self.p.wait(20)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2]


def one_layout(systems, mount, n, size, device, cuda, runs, pairs, standin_s):
    """{system: {phase: median seconds}} for this layout, and under "pairs" {phase: [the
    shim's time over gmsfs's own, run by run]}.  The systems take turns, run by run (not
    each its runs in a block), their order rotated each run: what drifts on the machine
    meanwhile, and what a process leaves behind for the next (a CUDA context's teardown,
    memory another one holds), falls on all of them alike.  GMS runs runs times, the
    others pairs times."""
    rows = {system: [] for system in systems}
    servers = {}
    try:
        for system, env in systems.items():
            if system == "gms":
                servers[system] = GMSServer(env, device)
        for r in range(pairs):
            names = [s for s in systems if r < runs or s != "gms"]
            for system in names[r % len(names):] + names[:r % len(names)]:  # each follows each in turn
                rows[system].append(one_run(system, systems[system], servers.get(system), mount, r, n, size,
                                            device, cuda))
    finally:
        for server in servers.values():
            server.close()
    res = {}
    for system in systems:
        res[system] = {k: median(r[k] for r in rows[system]) for k in KEYS}
        if system == "gms" and standin_s:  # what msgspec itself would have spared: the stand-in's cost per request
            res["gms-"] = {k: v - median(r["rpcs"][k] for r in rows[system]) * standin_s
                           for k, v in res[system].items()}
    res["pairs"] = {k: [a[k] / b[k] for a, b in zip(rows["gms.shim"], rows["gmsfs"])] for k in KEYS}
    return res


KEYS = ("connect", "alloc", "meta", "commit", "imp", "remap")


def one_run(system, env, server, mount, r, n, size, device, cuda):
    """A writer process then a reader process of system: their phases' seconds."""
    if server:
        where = server.sock
    else:
        where = os.path.join(mount, "bench-%s-%d" % (system.replace(".", "-"), r))
        os.mkdir(where)
    w = run(env, system, "writer", where, n, size, device, int(cuda))
    rd = run(env, system, "reader", where, n, size, device, int(cuda))
    assert w["count"] == n and rd["count"] == n, (system, w, rd)
    if system == "gms.shim":
        assert w["client"].startswith(PY), w["client"]  # gmsfs.gms answered, not GMS
    if not server:
        os.rmdir(where)
    out = dict(w, **rd)
    out["rpcs"] = dict(w.get("rpcs", {}), **rd.get("rpcs", {}))
    return out


PHASES = [("writer: allocate + map", "alloc", True), ("metadata put", "meta", True), ("commit, writer unmapped", "commit", False),
          ("reader: connect + import", "imp", True), ("remap cycle", "remap", True), ("writer connect", "connect", False)]


def report(res, n, size, runs, pairs):
    names = [s for s in ("gms", "gms-", "gms.shim", "gmsfs") if s in res]
    label = {"gms": "GMS 0.9.0", "gms-": "less stand-in", "gms.shim": "gmsfs.gms", "gmsfs": "gmsfs (own)"}
    gms = "gms-" if "gms-" in res else "gms"  # the ratio against GMS as msgspec would run it
    print("# %d x %d MiB, medians of fresh writer and reader processes (%sgmsfs.gms and gmsfs %d each, by "
          "turns); us per allocation (ms where marked); gmsfs.gms / own: the median of its ratios run by run "
          "[the middle half of them]" % (n, size // MiB, "GMS %d, " % runs if "gms" in res else "", pairs))
    print("#   %-26s" % "" + "".join("%14s" % label[s] for s in names) + "%16s%24s" % ("GMS / gmsfs.gms",
                                                                                    "gmsfs.gms / own"))
    for title, key, per in PHASES:
        cells = [res[s][key] * (1e6 / n if per else 1e3) for s in names]
        line = "#   %-26s" % (title + ("" if per else " (ms)")) + "".join("%14.1f" % c for c in cells)
        line += "%16s" % ("%.2fx" % (res[gms][key] / res["gms.shim"][key]) if gms in res else "-")
        q = sorted(res["pairs"][key])
        line += "%24s" % ("%.2fx [%.2f-%.2f]" % (median(q), q[len(q) // 4], q[(3 * len(q)) // 4]))
        print(line)
    sys.stdout.flush()


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    mount = sys.argv[1]
    upstream = sys.argv[2] if len(sys.argv) > 2 and sys.argv[2] != "-" else None
    runs = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    dev = read_fields(os.path.join(mount, "device"))
    cuda, device, total = dev["backend"] == "cuda", int(dev.get("index", 0)), int(dev["total_bytes"])
    import gmsfs.gms
    systems = {"gms.shim": dict(os.environ, PYTHONPATH=os.pathsep.join([gmsfs.gms.alias_path(), PY])),
               "gmsfs": dict(os.environ, PYTHONPATH=PY)}
    standin_s = 0.0
    if upstream and cuda:
        env = gms_env(os.path.abspath(upstream))
        systems = dict(gms=env, **systems)
        r = subprocess.run([sys.executable, "-c", CODEC], capture_output=True, text=True, env=env)
        if r.returncode:
            raise RuntimeError(r.stderr[-3000:])
        us, where = r.stdout.split()
        standin_s = float(us) * 1e-6 if "standin" in where else 0.0
        print("# GMS from %s; its messages through %s: %s us per request and reply, encoded and decoded"
              % (upstream, "msgspec" if "standin" not in where else "bench/msgspec_standin (no msgspec here)", us))
    elif upstream:
        print("# GMS left out: it needs CUDA, and %s is on the %s backend" % (mount, dev["backend"]))
    print("# %s backend, %s" % (dev["backend"], dev.get("name", "")))
    for n, size in LAYOUTS:
        if n * size > total // 3:
            print("# %d x %d MiB: skipped (more than a third of the device's %d bytes)" % (n, size // MiB, total))
            continue
        k = runs * 3 if n < 100 else runs  # a few allocations: a phase of milliseconds, noisy; more runs
        report(one_layout(systems, mount, n, size, device, cuda, k, PAIRS * k, standin_s), n, size, k, PAIRS * k)


if __name__ == "__main__":
    main()
