#!/usr/bin/python3
"""tests/gpu/digest_gpu.py BUILD: the content hash on the GPU (gmsfs(5), CONTENT HASH).

  - the same layout and bytes published on a cuda mount and on a host mount have one
    content hash (the host backend's is checked against the recipe by 10-shell.bats), by
    Connection.digest and by `gmsfsctl digest` in a fresh process, recorded in
    STORE/content_hash; a byte changed in place on the GPU changes it, the same change on
    the host makes them one again;
  - its speed: a store of GIB GiB (16, or an eighth of the device) in 16 allocations,
    digested by a reader on the GPU (libgmsfs/digest_gpu.cu), against the device-to-device
    copy of the same bytes (the GPU reading and writing them), and read into host memory
    (GMSFS_DIGEST_GPU=0) against the pinned device-to-host copy, in the same process, by
    turns, the median of 3 rounds' ratios, every way one hash; and `gmsfsctl digest` as a
    fresh process for what a user meets, said to hash on the GPU.
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
import ctypes, gmsfs, gmsfs._cuda, os, statistics, sys, time
store = sys.argv[1]
c = gmsfs.connect(store, "ro")
c.import_all()
cu = gmsfs._cuda._driver()
total = sum(m.size for m in c.mappings)
host, dev = ctypes.c_void_p(), ctypes.c_uint64()
assert cu.cuMemHostAlloc(ctypes.byref(host), ctypes.c_size_t(total), 0) == 0
assert cu.cuMemAlloc_v2(ctypes.byref(dev), ctypes.c_size_t(total)) == 0
def copy(to_host):  # the same bytes copied, a call per allocation: to pinned host memory, or on the device
    t, at = time.perf_counter(), 0
    for m in c.mappings:
        if to_host:
            assert cu.cuMemcpyDtoH_v2(ctypes.c_void_p(host.value + at), ctypes.c_uint64(m.ptr), ctypes.c_size_t(m.size)) == 0
        else:
            assert cu.cuMemcpyDtoD_v2(ctypes.c_uint64(dev.value + at), ctypes.c_uint64(m.ptr), ctypes.c_size_t(m.size)) == 0
        at += m.size
    assert cu.cuCtxSynchronize() == 0
    return time.perf_counter() - t
def digest(on_gpu):
    os.environ["GMSFS_DIGEST_GPU"] = "1" if on_gpu else "0"
    t = time.perf_counter()
    h = c.digest()
    return time.perf_counter() - t, h
copy(True), copy(False), digest(True)
rows, hashes = [], set()
for _ in range(3):  # by turns: a floor that moves moves the digest with it
    pinned, d2d = copy(True), copy(False)
    gpu, h1 = digest(True)
    read, h2 = digest(False)
    hashes |= {h1, h2}
    rows.append((gpu, d2d, read, pinned))
assert len(hashes) == 1, hashes
med = lambda i: statistics.median(r[i] for r in rows)
print("%s %.5f %.5f %.5f %.5f %.4f %.4f %d" % (hashes.pop(), med(0), med(1), med(2), med(3),
      statistics.median(r[0] / r[1] for r in rows), statistics.median(r[2] / r[3] for r in rows), total))
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
        check(r.returncode == 0, "a reader digests %d GiB on the GPU and by reading it, beside the copies of its "
              "bytes: one hash" % gib, r.stderr[-2000:])
        for line in r.stderr.splitlines():  # GMSFS_TRACE_IMPORT set: where the digest's time went
            if "gmsfs: digest:" in line:
                print("# " + line)
        if r.returncode == 0:
            h, gpu, d2d, read, pinned, ratio, read_ratio, total = r.stdout.split()
            gpu, d2d, read, pinned, ratio, read_ratio = map(float, (gpu, d2d, read, pinned, ratio, read_ratio))
            total = int(total)
            rc, out, secs = ctl_digest(big)
            check(rc == 0 and out == h, "gmsfsctl digest of %d GiB in a fresh process: the same hash (%.2f s)" % (
                gib, secs), out)
            env = dict(ENV, GMSFS_TRACE_IMPORT="1")
            t = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "gmsfsctl"), "digest", big, "--no-record"],
                               capture_output=True, text=True, env=env, timeout=300)
            said = [l for l in t.stderr.splitlines() if "gmsfs: digest:" in l]
            check(t.returncode == 0 and any("hashed on the GPU" in l and "cannot" not in l for l in said),
                  "gmsfsctl digest hashes on the GPU", "\n".join(said) or t.stderr[-500:])
            for cache in ("1", "0"):  # the driver's compile of the kernel's PTX: without its cache, and with it
                t0 = time.perf_counter()
                t = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "gmsfsctl"), "digest", big,
                                    "--no-record"], capture_output=True, text=True, timeout=300,
                                   env=dict(env, CUDA_CACHE_DISABLE=cache))
                print("# gmsfsctl digest, CUDA_CACHE_DISABLE=%s: %.3f s; %s" % (cache, time.perf_counter() - t0, "; ".join(
                    l for l in t.stderr.splitlines() if "gmsfs: digest:" in l)))
            print("# digest of %.1f GB in 16 allocations: on the GPU %.4f s (%.0f GB/s), the device-to-device copy "
                  "of the same bytes %.4f s: %.2fx by turns; read into host memory %.3f s (%.1f GB/s), the pinned "
                  "copy %.3f s: %.2fx; on the GPU %.1fx faster than read; gmsfsctl digest (a fresh process, its "
                  "CUDA context and imports too) %.2f s" % (
                      total / 1e9, gpu, total / gpu / 1e9, d2d, ratio, read, total / read / 1e9, pinned, read_ratio,
                      read / gpu, secs))
            print("gate: digest-%dg %.5f %.5f 1.2 a reader's content hash of %d GiB on the GPU, against the "
                  "device-to-device copy of its bytes (s)" % (gib, gpu, gpu / ratio, gib))
    finally:
        unmount(cuda, cp)
        unmount(host, hp)
    return done()


if __name__ == "__main__":
    sys.exit(main())
