#!/usr/bin/env python3
"""tests/gpu/gate.py BUILD [OUTDIR]: the GPU gate (gmsfs(8), SPEC 22).  Every headline figure
beside its floor, each measured in the same run by the program that prints it, and a miss
fails: exit 1.  Run by `bash tests/gpu/run.sh gate`, on one GPU, in about 8 minutes.

Each part is a program of the tree that prints, besides what it says for people, lines

    gate: ID VALUE FLOOR LIMIT WHAT

which pass when VALUE <= LIMIT x FLOOR (FLOOR measured in the same run: the driver's own
loop, the copy engines, loading again, the largest shape alone).  A part that fails, ends
past its time or prints no gate line fails the gate too.  The results go to
OUTDIR/gate.json (default: BUILD), which tests/gpu/gate_tables.py turns into
docs/benchmarks.md's tables, with the machine and the date.

  imports    bench-gpu: a reader's import_all and its remap cycle, in fresh processes, for
             1000 x 2 MiB, 128 x 64 MiB, 16 x 1 GiB and Llama-3-8B's 291 tensors (1.1x, 1.2x):
             16 runs (48 for 16 x 1 GiB, 32 for 128 x 64 MiB and Llama-3-8B), the floor first in every other one; the median
             of the ratios of pairs of runs by turns (a floor that moves between runs moves
             the import with it); and a writer's gmsfs_create one at a time and
             gmsfs_create_many, against the same driver calls split over two processes
             as the daemon and its writer make them (1.2x), the median of 5 rounds' ratios,
             each round starting at another of the four timings, each after the same pause
             (the driver's work behind the release before done)
  switch     bench/switch.py: two models served by engines of their own, one allocation
             each and 16 each: warm switches against the copy engines both ways at once
             into device memory made just before (as a switch's ins are, as the tier's
             move back is measured), the first against the warm ones, a publish on a full budget right after the
             first model against a later one (1.2x each)
  tier       tests/gpu/tier_gpu.py ahead: moves to the host tier and back (0.9x pinned: out,
             the first, against pinned D2H; back against the driver loop of a move back,
             pinned H2D into memory made right after as much was released, as a move's is)
  restart    bench/restart.py: takeover, restart and crash against loading again (20x),
             medians of 3 each
  pages      bench-pages: pages within a store's minimum (0.9x the raw driver loop)
  graphs     tests/gpu/graph_gpu.py: 8 CUDA graphs in a GraphPool (the largest shape alone)
  engines    tests/gpu/engines_gpu.py gate: 8 engines at once (the publisher + 1 s)
  digest     tests/gpu/digest_gpu.py: a reader's content hash of a model, hashed on the GPU,
             against the device-to-device copy of its bytes (1.2x), by turns; and the GPU's
             hash the host backend's for the same bytes

Models are 16 GiB, or a fifth of a smaller device."""
import datetime
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
BUILD = os.path.abspath(sys.argv[1]) if len(sys.argv) > 1 else os.path.join(ROOT, "build")
OUTDIR = sys.argv[2] if len(sys.argv) > 2 else BUILD
PY = sys.executable
T0 = time.time()


def smi(query):
    try:
        r = subprocess.run(["nvidia-smi", "--query-gpu=" + query, "--format=csv,noheader,nounits", "-i", "0"],
                           capture_output=True, text=True)
    except OSError:
        return ""
    return r.stdout.strip() if r.returncode == 0 else ""


def device_gib():
    total = smi("memory.total")
    return int(total.split()[0]) // 1024 if total else 80


def machine():
    return smi("name,driver_version").replace(", ", ", driver ") or "no GPU (the host backend)"


class Mount:
    """A daemon of the build tree on a fresh directory (default options), ended after."""

    def __init__(self, *options):
        self.dir = tempfile.mkdtemp(prefix="gmsfs-gate.")
        self.log = open(self.dir + ".log", "w")
        argv = [os.path.join(BUILD, "gmsfs"), "-f"] + (["-o", ",".join(options)] if options else []) + [self.dir]
        self.p = subprocess.Popen(argv, stdout=self.log, stderr=self.log)
        for _ in range(1000):
            if " %s fuse.gmsfs " % self.dir in open("/proc/mounts").read():
                return
            if self.p.poll() is not None:
                break
            time.sleep(0.01)
        raise RuntimeError("no mount: " + open(self.dir + ".log").read()[-2000:])

    def close(self):
        subprocess.run(["umount", self.dir], capture_output=True)
        try:
            self.p.wait(30)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()
        subprocess.run(["umount", "-l", self.dir], capture_output=True)
        os.rmdir(self.dir)
        self.log.close()
        os.unlink(self.dir + ".log")


def run(name, argv, limit, mount=None, before=None):
    """One part: its output shown (indented), its gate lines and its failure kept."""
    m = Mount() if mount else None
    t = time.time()
    lines, failed = [], []
    try:
        if before:
            before(m)
        argv = [a.replace("MOUNT", m.dir) if m else a for a in argv]
        print("# ---- %s: %s (at %.0f s)" % (name, " ".join(os.path.relpath(a, ROOT) if a.startswith(ROOT) else a
                                                       for a in argv), t - T0), flush=True)
        env = dict(os.environ, PYTHONUNBUFFERED="1", GMSFS_LIBRARY=os.path.join(BUILD, "libgmsfs.so.0"))
        p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=ROOT,
                             start_new_session=True)
        late = threading.Timer(limit, lambda: os.killpg(p.pid, signal.SIGKILL))  # its children too
        late.start()
        for line in p.stdout:
            line = line.rstrip("\n")
            print("#   " + line if not line.startswith("gate:") else line, flush=True)
            if line.startswith("gate:"):
                lines.append(line)
            elif line.startswith("not ok"):
                failed.append(line)
        rc = p.wait()
        late.cancel()
        if time.time() - t >= limit:
            failed.append("killed after %d s, its limit" % limit)
        elif rc and not failed:
            failed.append("exit %d" % rc)
    except Exception as e:  # noqa: BLE001 (a part that cannot run fails the gate, said)
        failed.append("%s: %s" % (type(e).__name__, e))
    finally:
        if m:
            m.close()
    if not lines and not failed:
        failed.append("no gate line")
    return lines, failed, time.time() - t


def parse(part, line):
    _, gid, value, floor, limit, what = line.split(None, 5)
    value, floor, limit = float(value), float(floor), float(limit)
    ratio = value / floor if floor else float("inf")
    return {"part": part, "id": gid, "value": value, "floor": floor, "limit": limit, "ratio": ratio,
            "pass": ratio <= limit, "what": what}


def main():
    gib = float(os.environ.get("GMSFS_GATE_GIB", 0)) or min(16, max(1, device_gib() // 5))
    b = lambda p: os.path.join(BUILD, p)  # noqa: E731
    parts = [
        ("imports", [b("bench-gpu"), "MOUNT", "16"], 240, True, None),
        ("switch-one", [PY, "bench/switch.py", BUILD, "%g" % gib, "one"], 150, False, None),
        ("switch-many", [PY, "bench/switch.py", BUILD, "%g" % gib, "many"], 150, False, None),
        ("tier", [PY, "tests/gpu/tier_gpu.py", "MOUNT", "ahead"], 150, True, None),
        ("restart", [PY, "bench/restart.py", BUILD, "%g" % gib, "cuda", "big"], 200, False, None),
        ("pages", [b("bench-pages"), "MOUNT/kv", "256"], 90, True, lambda m: os.mkdir(os.path.join(m.dir, "kv"))),
        ("graphs", [PY, "tests/gpu/graph_gpu.py", "MOUNT"], 150, True, None),
        ("engines", [PY, "tests/gpu/engines_gpu.py", "MOUNT", "gate"], 240, True, None),
        ("digest", [PY, "tests/gpu/digest_gpu.py", BUILD], 120, False, None),
    ]
    only = os.environ.get("GMSFS_GATE_ONLY")  # a comma list of parts, to look at one again
    results, broken, took = [], [], {}
    for name, argv, limit, mount, before in parts:
        if only and name not in only.split(","):
            continue
        lines, failed, secs = run(name, argv, limit, mount, before)
        took[name] = secs
        results += [parse(name, l) for l in lines]
        broken += ["%s: %s" % (name, f) for f in failed]
    n = 0
    print("# ---- the gate, %s, %.0f s" % (machine(), time.time() - T0))
    for r in results:
        n += 1
        # How far from its limit: a figure near it is seen before it fails.
        print("%s %d - %s: %s %.4g, floor %.4g: %.3fx (at most %gx: %s)" % (
            "ok" if r["pass"] else "not ok", n, r["id"], r["what"], r["value"], r["floor"], r["ratio"], r["limit"],
            "%.1f%% to spare" % (100 * (1 - r["ratio"] / r["limit"])) if r["pass"] else
            "%.1f%% over" % (100 * (r["ratio"] / r["limit"] - 1))))
    for f in broken:
        n += 1
        print("not ok %d - %s" % (n, f))
    bad = sum(not r["pass"] for r in results) + len(broken)
    print("1..%d" % n)
    print("%d passed, %d failed" % (n - bad, bad))
    out = {"machine": machine(), "date": datetime.date.today().isoformat(), "model_gib": gib,
           "seconds": round(time.time() - T0), "parts": {k: round(v, 1) for k, v in took.items()},
           "results": results, "broken": broken}
    os.makedirs(OUTDIR, exist_ok=True)
    with open(os.path.join(OUTDIR, "gate.json"), "w") as f:
        json.dump(out, f, indent=1)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
