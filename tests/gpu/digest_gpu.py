#!/usr/bin/python3
"""tests/gpu/digest_gpu.py BUILD: the content hash on the GPU (gmsfs(5), CONTENT HASH).

  - the same layout and bytes published on a cuda mount and on a host mount have one
    content hash (the host backend's is checked against the recipe by 10-shell.bats), by
    Connection.digest and by `gmsfsctl digest` in a fresh process, recorded in
    STORE/content_hash; a byte changed in place on the GPU changes it, the same change on
    the host makes them one again;
  - its speed: a store of GIB GiB (16, or an eighth of the device) in 16 allocations,
    digested by a reader, against the pinned device-to-host copy of the same bytes (the
    fastest read of them: the copy engine) in the same process, by turns, the median of 3
    pairs' ratios; and `gmsfsctl digest` as a fresh process for what a user meets.
Prints TAP and a "gate:" line (tests/gpu/gate.py)."""
import ctypes
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, HERE)
build = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "build"))
os.environ.setdefault("GMSFS_LIBRARY", os.path.join(build, "libgmsfs.so.0"))
import gmsfs  # noqa: E402
import gmsfs._cuda  # noqa: E402
from tap import check, done  # noqa: E402

MiB, GiB = 1 << 20, 1 << 30
SMALL = {"a": 100 * MiB + 5, "b/c": 70 * MiB, "d": 1, "e": 32 * MiB - 1}
ENV = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))


def mount(*opts):
    d = tempfile.mkdtemp(prefix="gmsfs-digest.")
    argv = [os.path.join(build, "gmsfs"), "-f"] + (["-o", ",".join(opts)] if opts else []) + [d]
    p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=open(d + ".log", "w"))
    for _ in range(600):
        if " %s fuse.gmsfs " % d in open("/proc/mounts").read():
            return d, p
        time.sleep(0.01)
    raise RuntimeError("no mount: " + open(d + ".log").read())


def unmount(d, p):
    subprocess.run(["umount", d], capture_output=True)
    try:
        p.wait(60)
    except subprocess.TimeoutExpired:
        p.kill()
    os.rmdir(d)
    os.unlink(d + ".log")


def fill(c, m, byte_at):
    """Each MiB of mapping m its own byte (byte_at(offset))."""
    cu = gmsfs._cuda._driver() if c.backend == "cuda" else None
    for off in range(0, m.size, MiB):
        n, v = min(MiB, m.size - off), byte_at(off)
        if cu:
            assert cu.cuMemsetD8_v2(ctypes.c_uint64(m.ptr + off), ctypes.c_ubyte(v), ctypes.c_size_t(n)) == 0
        else:
            ctypes.memset(m.ptr + off, v, n)
    if cu:
        assert cu.cuCtxSynchronize() == 0


def publish_small(store):
    os.mkdir(store)
    with gmsfs.connect(store, "rw") as c:
        for i, (name, size) in enumerate(sorted(SMALL.items())):
            fill(c, c.create(name, size), lambda off, i=i: (i * 7 + off // MiB) & 0xff)
        c.commit()


def change_byte(store):
    with gmsfs.connect(store, "data") as w:
        w.import_all()
        m = w.find("a")
        if w.backend == "cuda":
            cu = gmsfs._cuda._driver()
            assert cu.cuMemsetD8_v2(ctypes.c_uint64(m.ptr + SMALL["a"] - 1), ctypes.c_ubyte(0xee), ctypes.c_size_t(1)) == 0
            assert cu.cuCtxSynchronize() == 0
        else:
            ctypes.memset(m.ptr + SMALL["a"] - 1, 0xee, 1)
        w.commit()


def ctl_digest(store, *args):
    t = time.perf_counter()
    r = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "gmsfsctl"), "digest", store] + list(args),
                       capture_output=True, text=True, env=ENV, timeout=300)
    out = r.stdout.split()  # HASH  STORE (SECONDS ...)
    return r.returncode, out[0] if out else r.stderr.strip(), time.perf_counter() - t


SPEED = r"""
import ctypes, gmsfs, gmsfs._cuda, statistics, sys, time
store = sys.argv[1]
c = gmsfs.connect(store, "ro")
c.import_all()
cu = gmsfs._cuda._driver()
total = sum(m.size for m in c.mappings)
host = ctypes.c_void_p()
assert cu.cuMemHostAlloc(ctypes.byref(host), ctypes.c_size_t(total), 0) == 0
def copy():  # the pinned device-to-host copy of the same bytes, a call per allocation
    t, at = time.perf_counter(), 0
    for m in c.mappings:
        assert cu.cuMemcpyDtoH_v2(ctypes.c_void_p(host.value + at), ctypes.c_uint64(m.ptr), ctypes.c_size_t(m.size)) == 0
        at += m.size
    return time.perf_counter() - t
copy()
pairs, h = [], None
for _ in range(3):
    floor = copy()
    t = time.perf_counter()
    got = c.digest()
    took = time.perf_counter() - t
    assert h in (None, got), (h, got)
    h = got
    pairs.append((took, floor))
ratio = statistics.median(t / f for t, f in pairs)
took, floor = statistics.median(p[0] for p in pairs), statistics.median(p[1] for p in pairs)
print("%s %.4f %.4f %.4f %d" % (h, took, floor, ratio, total))
"""


def main():
    cuda, cp = mount()
    host, hp = mount("backend=host")
    try:
        dev = dict(l.split(": ", 1) for l in open(os.path.join(cuda, "device")).read().splitlines() if ": " in l)
        check(dev.get("backend") == "cuda", "the default backend is cuda here", dev.get("backend"))
        for m in (cuda, host):
            publish_small(os.path.join(m, "s"))
        hc = gmsfs.digest(os.path.join(cuda, "s"))
        hh = gmsfs.digest(os.path.join(host, "s"))
        check(hc == hh and len(hc) == 32, "the same bytes on the GPU and in host memory: one content hash",
              "%s %s" % (hc, hh))
        check(gmsfs.content_hash(os.path.join(cuda, "s")) == hc, "recorded: STORE/content_hash says it")
        rc, out, secs = ctl_digest(os.path.join(cuda, "s"), "--no-record")
        check(rc == 0 and out == hc, "gmsfsctl digest in a fresh process says it (%.2f s)" % secs, out)
        change_byte(os.path.join(cuda, "s"))
        check(gmsfs.content_hash(os.path.join(cuda, "s")) is None, "a commit of a byte changed in place: unknown")
        hc2 = gmsfs.digest(os.path.join(cuda, "s"))
        change_byte(os.path.join(host, "s"))
        hh2 = gmsfs.digest(os.path.join(host, "s"))
        check(hc2 != hc and hc2 == hh2, "the byte changed: another hash, the host's the same again", "%s %s" % (hc2, hh2))

        total_gib = int(dev["total_bytes"]) // GiB
        gib = min(16, max(1, total_gib // 8))
        big = os.path.join(cuda, "big")
        os.mkdir(big)
        with gmsfs.connect(big, "rw") as c:
            ms = c.create_many([("w%02d" % i, gib * GiB // 16) for i in range(16)])
            for i, m in enumerate(ms):
                fill(c, m, lambda off, i=i: (i * 13 + off // (64 * MiB)) & 0xff)
            c.commit()
        r = subprocess.run([sys.executable, "-c", SPEED, big], capture_output=True, text=True, env=ENV, timeout=300)
        check(r.returncode == 0, "a reader digests %d GiB beside the pinned copy of its bytes" % gib, r.stderr[-2000:])
        for line in r.stderr.splitlines():  # GMSFS_TRACE_IMPORT set: where the digest's time went
            if "gmsfs: digest:" in line:
                print("# " + line)
        if r.returncode == 0:
            h, took, floor, ratio, total = r.stdout.split()
            took, floor, ratio = float(took), float(floor), float(ratio)
            rc, out, secs = ctl_digest(big)
            check(rc == 0 and out == h, "gmsfsctl digest of %d GiB in a fresh process: the same hash (%.2f s)" % (
                gib, secs), out)
            print("# digest of %.1f GB in 16 allocations: %.3f s (%.1f GB/s), the pinned copy of the same bytes %.3f s "
                  "(%.1f GB/s): %.2fx by turns; gmsfsctl digest (a fresh process, its CUDA context and imports "
                  "too) %.2f s" % (int(total) / 1e9, took, int(total) / took / 1e9, floor, int(total) / floor / 1e9,
                                  ratio, secs))
            print("gate: digest-%dg %.4f %.4f 1.2 a reader's content hash of %d GiB, against the pinned copy of its "
                  "bytes (s)" % (gib, took, took / ratio, gib))
    finally:
        unmount(cuda, cp)
        unmount(host, hp)
    return done()


if __name__ == "__main__":
    sys.exit(main())
