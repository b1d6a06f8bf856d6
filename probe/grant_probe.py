#!/usr/bin/env python3
"""Why a peer grant (cuMemSetAccess letting GPU 1 read GPU 0's memory) costs 0.65 ms a GiB
in gmsfs-snapshot copy's process and 0.04 in peer_probe.cu's: a diagnostic probe, each
way in a fresh process (the driver may set up a peer mapping of an allocation once).

    grant_probe.py MOUNT0            a store of 16 x 1 GiB on MOUNT0 (GPU 0), then the ways
    grant_probe.py MOUNT0 WAY        one way, in this process (the parent runs each)

Ways: lib-then-peer (libgmsfs's import grants GPU 0, then GPU 1 is granted: what
gmsfs-snapshot copy does), both-first (the imported allocations mapped again, both GPUs
in one cuMemSetAccess), peer-first (GPU 1 granted before GPU 0), own (memory this
process made, GPU 0 then GPU 1), peer-enabled (lib-then-peer after cuCtxEnablePeerAccess).
Run by: PEER_PROBE=1 bash tests/gpu/run.sh peer (the nvidia-h200-x2 kind)."""
import ctypes as C
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import torch  # noqa: E402
import gmsfs  # noqa: E402

GiB = 1 << 30
N = 16
cu = C.CDLL("libcuda.so.1")


class Loc(C.Structure):
    _fields_ = [("type", C.c_int), ("id", C.c_int)]


class Desc(C.Structure):
    _fields_ = [("location", Loc), ("flags", C.c_int)]


class Prop(C.Structure):
    _fields_ = [("type", C.c_int), ("handles", C.c_int), ("location", Loc), ("win32", C.c_void_p),
                ("flags", C.c_uint64)]


READ, RW, DEVICE = 1, 3, 1


def ck(r, what):
    if r:
        raise SystemExit("%s: CUDA error %d" % (what, r))


def desc(dev, flags=READ):
    return Desc(Loc(DEVICE, dev), flags)


def grant(ptrs, devs, flags=READ):
    """Each GiB granted to devs in one cuMemSetAccess; the seconds it took."""
    ds = (Desc * len(devs))(*[desc(d, flags) for d in devs])
    t = time.perf_counter()
    for p in ptrs:
        ck(cu.cuMemSetAccess(C.c_uint64(p), C.c_size_t(GiB), ds, C.c_size_t(len(devs))), "cuMemSetAccess")
    return time.perf_counter() - t


def again(ptrs):
    """The allocations mapped at ptrs mapped again at a fresh range (no access yet)."""
    base = C.c_uint64()
    ck(cu.cuMemAddressReserve(C.byref(base), C.c_size_t(len(ptrs) * GiB), C.c_size_t(0), C.c_uint64(0),
                              C.c_uint64(0)), "reserve")
    out = []
    for i, p in enumerate(ptrs):
        h = C.c_uint64()
        ck(cu.cuMemRetainAllocationHandle(C.byref(h), C.c_void_p(p)), "retain")
        ck(cu.cuMemMap(C.c_uint64(base.value + i * GiB), C.c_size_t(GiB), C.c_size_t(0), h, C.c_uint64(0)), "map")
        cu.cuMemRelease(h)
        out.append(base.value + i * GiB)
    return out


def own(dev=0):
    """N x 1 GiB of VMM memory this process makes on dev, mapped (no access yet)."""
    base = C.c_uint64()
    ck(cu.cuMemAddressReserve(C.byref(base), C.c_size_t(N * GiB), C.c_size_t(0), C.c_uint64(0), C.c_uint64(0)),
       "reserve")
    prop = Prop(1, 1, Loc(DEVICE, dev), None, 0)  # pinned, POSIX fd
    out = []
    for i in range(N):
        h = C.c_uint64()
        ck(cu.cuMemCreate(C.byref(h), C.c_size_t(GiB), C.byref(prop), C.c_uint64(0)), "create")
        ck(cu.cuMemMap(C.c_uint64(base.value + i * GiB), C.c_size_t(GiB), C.c_size_t(0), h, C.c_uint64(0)), "map")
        cu.cuMemRelease(h)
        out.append(base.value + i * GiB)
    return out


def way(mnt, name):
    d0, d1 = torch.device("cuda", 0), torch.device("cuda", 1)
    torch.zeros(1, device=d1)  # GPU 1's context, as the copier has the target's
    torch.cuda.set_device(d0)
    torch.zeros(1, device=d0)
    if name == "own":
        ptrs = own()
        a = grant(ptrs, [0], RW)
        b = grant(ptrs, [1])
        c = grant(again(ptrs), [0, 1])
        print("%-14s GPU 0 %.2f ms, then GPU 1 %.2f ms; mapped again, both in one call %.2f ms"
              % (name, a * 1e3, b * 1e3, c * 1e3))
        return
    c = gmsfs.connect(os.path.join(mnt, "grant"), "ro")
    t = time.perf_counter()
    c.import_all()
    imp = time.perf_counter() - t
    ptrs = [m.ptr for m in c.mappings]
    if name == "peer-enabled":
        torch.cuda.set_device(d1)
        ctx0 = C.c_void_p()
        ck(cu.cuDevicePrimaryCtxRetain(C.byref(ctx0), 0), "retain ctx")
        r = cu.cuCtxEnablePeerAccess(ctx0, 0)
        print("# cuCtxEnablePeerAccess: %d" % r)
    if name in ("lib-then-peer", "peer-enabled", "lib-then-peer-ctx0"):
        if name != "lib-then-peer-ctx0":
            torch.cuda.set_device(d1)
        b = grant(ptrs, [1])
        c2 = grant(again(ptrs), [0, 1])
        print("%-18s import_all %.2f ms, then GPU 1 %.2f ms; mapped again, both in one call %.2f ms"
              % (name, imp * 1e3, b * 1e3, c2 * 1e3))
    elif name == "both-first":
        torch.cuda.set_device(d1)
        c2 = grant(again(ptrs), [0, 1])
        b = grant(ptrs, [1])
        print("%-18s import_all %.2f ms; mapped again, both in one call %.2f ms; then GPU 1 on libgmsfs's %.2f ms"
              % (name, imp * 1e3, c2 * 1e3, b * 1e3))
    elif name == "peer-first":
        torch.cuda.set_device(d1)
        p2 = again(ptrs)
        b = grant(p2, [1])
        a = grant(p2, [0])
        print("%-18s import_all %.2f ms; mapped again, GPU 1 first %.2f ms, then GPU 0 %.2f ms"
              % (name, imp * 1e3, b * 1e3, a * 1e3))
    elif name in ("threads", "beside-create"):
        import threading
        torch.cuda.set_device(d1)
        k = 4 if name == "threads" else 1
        parts = [ptrs[i::k] for i in range(k)]
        took = [0.0] * k

        def work(i):
            took[i] = grant(parts[i], [1])
        t = time.perf_counter()
        ts = [threading.Thread(target=work, args=(i,)) for i in range(k)]
        for x in ts:
            x.start()
        made = 0.0
        if name == "beside-create":  # the target's memory made on GPU 1 meanwhile, as its daemon would
            prop = Prop(1, 1, Loc(DEVICE, 1), None, 0)
            t1 = time.perf_counter()
            for _ in range(N):
                h = C.c_uint64()
                ck(cu.cuMemCreate(C.byref(h), C.c_size_t(GiB), C.byref(prop), C.c_uint64(0)), "create")
            made = time.perf_counter() - t1
        for x in ts:
            x.join()
        alone = 0.0
        if name == "beside-create":
            t1 = time.perf_counter()
            for _ in range(N):
                h = C.c_uint64()
                ck(cu.cuMemCreate(C.byref(h), C.c_size_t(GiB), C.byref(prop), C.c_uint64(0)), "create")
            alone = time.perf_counter() - t1
        print("%-18s import_all %.2f ms; GPU 1 granted by %d threads: %.2f ms in all (each %s), 16 GiB made on GPU 1 "
              "meanwhile %.2f ms (alone, after: %.2f ms)" % (name, imp * 1e3, k, (time.perf_counter() - t) * 1e3,
                                     " ".join("%.2f" % (x * 1e3) for x in took), made * 1e3, alone * 1e3))
    elif name.startswith("copy-"):
        copies(name, ptrs, imp)
    c.close()


def ctx_of(dev):
    x = C.c_void_p()
    ck(cu.cuDevicePrimaryCtxRetain(C.byref(x), dev), "ctx")
    return x


def stream():
    s = C.c_void_p()
    ck(cu.cuStreamCreate(C.byref(s), 1), "stream")
    return s


def copies(name, src, imp):
    """The source's 16 GiB copied into memory this process makes on GPU 1: serial (GPU 1
    granted each, then every copy, pulled: what gmsfs-snapshot copy does), interleave
    (granted, copied, one by one on GPU 1), split (GPU 1 pulls the even ones and GPU 0
    pushes the odd ones, each GPU granting its own as it goes, in a thread each)."""
    import threading
    ctx0, ctx1 = ctx_of(0), ctx_of(1)
    cu.cuCtxSetCurrent(ctx1)
    dst = own(1)
    grant(dst, [1], RW)

    def run(ctx, pairs, dev, flags, mark):
        cu.cuCtxSetCurrent(ctx)
        st = stream()
        for s_, d_ in pairs:
            if dev is not None:
                grant([d_ if flags == RW else s_], [dev], flags)
            ck(cu.cuMemcpyDtoDAsync_v2(C.c_uint64(d_), C.c_uint64(s_), C.c_size_t(GiB), st), "copy")
        ck(cu.cuStreamSynchronize(st), "sync")
        mark.append(time.perf_counter())

    pairs = list(zip(src, dst))
    done = []
    t = time.perf_counter()
    if name == "copy-serial":
        cu.cuCtxSetCurrent(ctx1)
        g = grant(src, [1])
        run(ctx1, pairs, None, 0, done)
    elif name == "copy-interleave":
        g = 0
        run(ctx1, pairs, 1, READ, done)
    else:
        g = 0
        ts = [threading.Thread(target=run, args=(ctx1, pairs[0::2], 1, READ, done)),
              threading.Thread(target=run, args=(ctx0, pairs[1::2], 0, RW, done))]
        for x in ts:
            x.start()
        for x in ts:
            x.join()
    took = max(done) - t
    # the same copies again, every grant made: the copy engines alone
    warm = []
    cu.cuCtxSetCurrent(ctx1)
    grant(src, [1])
    t = time.perf_counter()
    run(ctx1, pairs, None, 0, warm)
    w = warm[0] - t
    print("%-18s import_all %.2f ms; 16 GiB granted and copied %.2f ms (grants first %.2f ms), %.0f GB/s; "
          "again, granted: %.2f ms, %.0f GB/s" % (name, imp * 1e3, took * 1e3, g * 1e3, N * GiB / took / 1e9,
                                                 w * 1e3, N * GiB / w / 1e9))


def main():
    mnt = sys.argv[1]
    if len(sys.argv) > 2 and sys.argv[2] != "--":
        return way(mnt, sys.argv[2])
    src = os.path.join(mnt, "grant")
    os.mkdir(src)
    torch.cuda.set_device(0)
    with gmsfs.connect(src, "rw") as c:
        for i in range(N):
            c.create("w%02d" % i, GiB, tag="weights")
        c.commit()
    ways = sys.argv[3:] or ("lib-then-peer", "both-first", "peer-first", "own", "peer-enabled",
                            "lib-then-peer-ctx0", "threads", "beside-create")
    for w in ways:
        subprocess.run([sys.executable, __file__, mnt, w], timeout=120)


if __name__ == "__main__":
    main()
