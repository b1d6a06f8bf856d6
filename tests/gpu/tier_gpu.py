#!/usr/bin/env python3
"""The host tier on the GPU (TAP, then benchmark lines).

    tier_gpu.py MOUNT [ahead]
                          a store of min(16 GiB, a sixth of the device) in 1 GiB
                          allocations of random bytes: moved to the host tier and back
                          through STORE/tier, checked by a fresh reader (checksums, layout
                          hash) and by a sleeping reader's remap_all (same addresses);
                          the daemon listed by nvidia-smi never; the move times against
                          pinned device-to-host and host-to-device copies of the same
                          bytes, measured in the same run (a move back: into device
                          memory made right after as much was freed, as the move's
                          is).  ahead: MOUNT has -o host_ahead, so the store's host
                          memory is made before its first move out, which must then
                          copy as fast as the later ones."""
import ctypes
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
from tap import check, done  # noqa: E402

import torch  # noqa: E402
import gmsfs  # noqa: E402
from gmsfs._torch_layout import _bytes_at  # noqa: E402
from tier_gpu_reader import pinned_floor, sums  # noqa: E402

GiB = 1 << 30
mount = sys.argv[1]
ahead = sys.argv[2:] == ["ahead"]
dev = dict(line.rstrip("\n").split(": ", 1) for line in open(os.path.join(mount, "device")))
size = max(1, min(16, int(dev["total_bytes"]) // 6 // GiB)) * GiB
store = os.path.join(mount, "tier")
cuda = torch.device("cuda", 0)


def tier():
    with open(os.path.join(store, "tier")) as f:
        return f.read().strip()


def move(where):
    t = time.perf_counter()
    with open(os.path.join(store, "tier"), "w") as f:
        f.write(where + "\n")
    while tier() != where:
        if time.perf_counter() - t > 120:
            raise RuntimeError("still %s: %s" % (tier(), open(os.path.join(store, "state")).read()))
        time.sleep(0.0005)
    return time.perf_counter() - t


READER = """
import json, sys
sys.path.insert(0, sys.argv[2]); sys.path.insert(0, sys.argv[3])
import torch, gmsfs
from tier_gpu_reader import sums
torch.zeros(1, device="cuda")
with gmsfs.connect(sys.argv[1], "ro", timeout=120) as c:
    c.import_all()
    print(json.dumps({"sums": sums(c), "hash": c.layout_hash}))
"""


def fresh_reader():
    r = subprocess.run([sys.executable, "-c", READER, store, os.path.join(HERE, "..", "..", "python"), HERE],
                       capture_output=True, text=True, timeout=300)
    if r.returncode:
        raise RuntimeError(r.stderr[-2000:])
    return json.loads(r.stdout)


def daemon_has_no_context():
    pids = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,process_name", "--format=csv,noheader"],
                          capture_output=True, text=True).stdout
    daemons = subprocess.run(["pgrep", "-x", "gmsfs"], capture_output=True, text=True).stdout.split()
    return not any(line.split(",")[0].strip() in daemons for line in pids.splitlines()), pids


class _Prop(ctypes.Structure):  # CUmemAllocationProp
    _fields_ = [("type", ctypes.c_int), ("handle_types", ctypes.c_int), ("loc_type", ctypes.c_int),
                ("loc_id", ctypes.c_int), ("win32", ctypes.c_void_p), ("compression", ctypes.c_ubyte),
                ("rdma", ctypes.c_ubyte), ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 4)]


class _Access(ctypes.Structure):  # CUmemAccessDesc
    _fields_ = [("loc_type", ctypes.c_int), ("loc_id", ctypes.c_int), ("flags", ctypes.c_int)]


def driver_move_in(host, n):
    """The raw driver loop of a move back, in this process: n GiB of device memory made
    (cuMemCreate, as the daemon makes it) right after as much was released, mapped, and
    pinned H2D copies of host into it; the best of 3, the release not timed (a move out's
    is not).  A move back meets that state: the driver clears freed memory on the copy
    engines meanwhile (an H100, 13 GiB: 253 ms into memory made 0.5 s after the release,
    276 ms into memory made at once), which pinned copies into memory made long before
    never meet."""
    cu = ctypes.CDLL("libcuda.so.1")
    u64, size_t = ctypes.c_uint64, ctypes.c_size_t
    cu.cuMemCreate.argtypes = [ctypes.POINTER(u64), size_t, ctypes.POINTER(_Prop), u64]
    cu.cuMemAddressReserve.argtypes = [ctypes.POINTER(u64), size_t, size_t, u64, u64]
    cu.cuMemMap.argtypes = [u64, size_t, size_t, u64, u64]
    cu.cuMemSetAccess.argtypes = [u64, size_t, ctypes.POINTER(_Access), size_t]
    cu.cuMemUnmap.argtypes = [u64, size_t]
    cu.cuMemRelease.argtypes = [u64]
    cu.cuMemAddressFree.argtypes = [u64, size_t]
    dev = ctypes.c_int()
    assert cu.cuCtxGetDevice(ctypes.byref(dev)) == 0
    # pinned, POSIX-descriptor handles, on this device; read-write access from it
    prop, access = _Prop(type=1, handle_types=1, loc_type=1, loc_id=dev.value), _Access(1, dev.value, 3)
    va, handles = u64(), []

    def ok(r, what):
        if r:
            raise RuntimeError("%s: CUDA error %d" % (what, r))

    def make():
        for i in range(n):
            h = u64()
            ok(cu.cuMemCreate(ctypes.byref(h), GiB, ctypes.byref(prop), 0), "cuMemCreate")
            handles.append(h.value)
            ok(cu.cuMemMap(va.value + i * GiB, GiB, 0, h.value, 0), "cuMemMap")
        ok(cu.cuMemSetAccess(va.value, n * GiB, ctypes.byref(access), 1), "cuMemSetAccess")

    def release():
        torch.cuda.synchronize()
        for i, h in enumerate(handles):
            cu.cuMemUnmap(va.value + i * GiB, GiB)
            cu.cuMemRelease(h)
        handles.clear()

    ok(cu.cuMemAddressReserve(ctypes.byref(va), n * GiB, 0, 0, 0), "cuMemAddressReserve")
    best = 1e9
    try:
        make()
        for _ in range(3):
            release()
            t = time.perf_counter()
            make()
            for i in range(n):
                _bytes_at(va.value + i * GiB, GiB, cuda).copy_(host[i * GiB:(i + 1) * GiB], non_blocking=True)
            torch.cuda.synchronize()
            best = min(best, time.perf_counter() - t)
    finally:
        release()
        cu.cuMemAddressFree(va.value, n * GiB)
    return best


def main():
    torch.zeros(1, device=cuda)  # a current context: libgmsfs maps in it
    os.mkdir(store)
    n = size // GiB
    with gmsfs.connect(store, "rw") as c:
        g = torch.Generator(device=cuda).manual_seed(7)
        for i in range(n):
            m = c.create("a%02d" % i, GiB)
            _bytes_at(m.ptr, GiB, cuda).view(torch.int64).random_(generator=g)
        torch.cuda.synchronize()
        want = sums(c)
        c.meta_put("w", "a00", 0, b"v")
        c.commit()
        h = c.layout_hash
    used = int(dict(line.rstrip("\n").split(": ", 1) for line in open(os.path.join(mount, "device")))["used_bytes"])
    if ahead:  # the daemon makes the store's host memory while nobody asks anything of the tier
        t, most = time.perf_counter(), 0
        while int(dict(line.rstrip("\n").split(": ", 1) for line in open(os.path.join(mount, "device")))
                  ["host_standby_bytes"]) != size:
            if time.perf_counter() - t > 120:
                break
            most = max(most, int(dict(line.rstrip("\n").split(": ", 1) for line in open(os.path.join(store, "state")))
                                 ["used"]))
            time.sleep(0.05)
        made = time.perf_counter() - t
        check(made <= 120, "-o host_ahead: the store's host memory made ahead of its first move out (%.1f s after "
              "its commit)" % made)
        check(most <= size, "while it is made, the store's used stays its size (%d, at most %d)" % (size, most))

    # The floor, in this run: pinned copies of the same bytes, in this process's context.
    src = torch.empty(size, dtype=torch.uint8, device=cuda)
    host = torch.empty(size, dtype=torch.uint8, pin_memory=True)
    floor = pinned_floor(src, host)
    floor["h2d_fresh"] = driver_move_in(host, n)
    del src, host
    torch.cuda.empty_cache()

    times = {"out": [], "in": []}
    for _ in range(3):
        times["out"].append(move("host"))
        d = dict(line.rstrip("\n").split(": ", 1) for line in open(os.path.join(mount, "device")))
        check(int(d["used_bytes"]) == used - size and int(d["host_used_bytes"]) == size and
              int(d["host_standby_bytes"]) == 0,
              "moved out: device used %s -> %s, host tier %s" % (used, d["used_bytes"], d["host_used_bytes"]))
        times["in"].append(move("device"))
    ok, smi = daemon_has_no_context()
    check(ok, "the daemon holds no CUDA context (nvidia-smi lists only clients and the mover)", smi)
    r = fresh_reader()
    check(r["sums"] == want and r["hash"] == h, "a fresh reader after three round trips: every checksum and the layout hash")

    with gmsfs.connect(store, "ro") as c:
        c.import_all()
        ptrs = [m.ptr for m in c.mappings]
        c.unmap_all()
        move("host")
        t = time.perf_counter()
        c.remap_all(timeout=120)
        wake = time.perf_counter() - t
        check([m.ptr for m in c.mappings] == ptrs and sums(c) == want and tier() == "device",
              "a sleeping reader's remap_all brings it back at the same addresses with the same bytes")
    gb = size / 1e9
    best_in = min(times["in"])
    print("bench: tier %.1f GB in %d allocations: pinned D2H %.3f s (%.1f GB/s), H2D %.3f s (%.1f GB/s)"
          % (gb, n, floor["d2h"], gb / floor["d2h"], floor["h2d"], gb / floor["h2d"]))
    best_out = min(times["out"][1:])  # the host memory kept from the move in before
    print("bench: move to host: first %.3f s (%.2fx pinned D2H: %s), then best %.3f s (%.1f GB/s) into the host "
          "memory kept: %.2fx pinned D2H"
          % (times["out"][0], floor["d2h"] / times["out"][0],
             "its host memory made ahead, the mover running" if ahead else
             "the mover starts and the pinned host memory is made", best_out, gb / best_out, floor["d2h"] / best_out))
    print("bench: the driver loop of a move back (memory made right after as much was released, pinned H2D) "
          "%.3f s (%.1f GB/s)" % (floor["h2d_fresh"], gb / floor["h2d_fresh"]))
    print("bench: move to device best %.3f s (%.1f GB/s): %.2fx pinned H2D, %.2fx the driver loop; a sleeping "
          "reader's remap_all from the host tier %.3f s"
          % (best_in, gb / best_in, floor["h2d"] / best_in, floor["h2d_fresh"] / best_in, wake))
    # For tests/gpu/gate.py: at 0.9x pinned each way (a move at most 1/0.9 the copy's time;
    # back: the copy into memory made as the move's is, by the driver loop above).
    print("gate: tier-out%s %.4f %.4f 1.111 a move to the host tier%s, against pinned D2H (s)" % (
        "-first" if ahead else "", times["out"][0] if ahead else best_out, floor["d2h"],
        ", the first (host memory made ahead)" if ahead else " into kept host memory"))
    print("gate: tier-in%s %.4f %.4f 1.111 a move back to the device, against the driver loop (memory made "
          "right after as much was released, pinned H2D) (s)"
          % ("-ahead" if ahead else "", best_in, floor["h2d_fresh"]))
    check(floor["d2h"] / best_out >= 0.8, "move out (into kept host memory) >= 0.8x pinned D2H")
    if ahead:
        check(floor["d2h"] / times["out"][0] >= 0.8, "-o host_ahead: the first move out >= 0.8x pinned D2H")
    check(floor["h2d"] / best_in >= 0.8, "move in >= 0.8x pinned H2D")
    os.rmdir(store)
    return done()


if __name__ == "__main__":
    sys.exit(main())
