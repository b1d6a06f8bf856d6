#!/usr/bin/env python3
"""gmsfs-snapshot on the GPU (TAP, then benchmark lines).

    snapshot_gpu.py MOUNT BUILD   a store of min(16 GiB, a sixth of the device) in 1 GiB
        allocations of random bytes, saved and restored with gmsfs-snapshot, each a fresh
        process, beside floors measured in the same run:
      - on tmpfs (RAM, standing in for an array of NVMe drives): save against pinned
        device-to-host copies of the same bytes, restore against pinned host-to-device,
        and both against what the tmpfs itself takes and gives (16 threads, from memory);
      - on the machine's disk (4 GiB of it, the page cache dropped before a restore):
        against dd with O_DIRECT writing and reading as many bytes (Debian's fio pulls in
        Ceph's and Gluster's libraries, which the GPU machine has not);
      each restore checked: every allocation's checksum and the layout hash.
    SNAP_THREADS="8 12 16": also each save and restore with GMSFS_COPY_THREADS at each count."""
import json
import os
import shutil
import subprocess
import sys
import tempfile
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
mount, build = sys.argv[1], sys.argv[2]
SNAP = os.path.join(build, "gmsfs-snapshot")
cuda = torch.device("cuda", 0)
dev = dict(line.rstrip("\n").split(": ", 1) for line in open(os.path.join(mount, "device")))
n = max(1, min(16, int(dev["total_bytes"]) // 6 // GiB))


def make_store(name, count):
    path = os.path.join(mount, name)
    os.mkdir(path)
    with gmsfs.connect(path, "rw") as c:
        g = torch.Generator(device=cuda).manual_seed(11)
        for i in range(count):
            m = c.create("w%02d" % i, GiB, tag="weights")
            _bytes_at(m.ptr, GiB, cuda).view(torch.int64).random_(generator=g)
        c.meta_put("cfg", "w00", 0, b'{"layers": %d}' % count)
        torch.cuda.synchronize()
        want = sums(c)
        c.commit()
        return path, want, c.layout_hash


def timed(*args, env=None):
    t = time.perf_counter()
    r = subprocess.run([SNAP] + list(args) + ["-q", "-v"], capture_output=True, text=True, env=env)
    if r.returncode == 0:  # its phases (-v), as comments
        print("".join("# %s %s\n" % (args[0], line) for line in r.stderr.splitlines()), end="")
    return time.perf_counter() - t, r


def restored_ok(path, want, h):
    with gmsfs.connect(path, "ro") as c:
        c.import_all()
        return sums(c) == want and c.layout_hash == h


def empty(path):
    if os.path.exists(path):
        os.rmdir(path)  # a store's rmdir: its layout and memory go with it
    os.mkdir(path)


def pinned_floor_of(nbytes):
    src = torch.empty(nbytes, dtype=torch.uint8, device=cuda)
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    out = pinned_floor(src, host)
    del src, host
    torch.cuda.empty_cache()
    return out


def tmpfs_floor(d, nbytes, threads=16, chunk=2 << 20):
    """What the tmpfs itself takes and gives back, best of 2: as many bytes written from
    memory by 16 threads, a file each, 2 MiB a pwrite (a thread a file: tmpfs lets one
    writer into a file at a time), into new files (their pages made as they are written,
    as a save into a new folder's are) and again over them (as a save in place writes),
    then read back so (pread into memory).  Seconds: new, over, read."""
    import threading
    per = nbytes // threads // chunk * chunk
    bufs = [bytearray(os.urandom(1) * chunk) for _ in range(threads)]
    best_w = best_o = best_r = 1e9
    for _ in range(2):
        paths = [os.path.join(d, "floor.%d" % i) for i in range(threads)]

        def write(i):
            fd = os.open(paths[i], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            for at in range(0, per, chunk):
                os.pwrite(fd, bufs[i], at)
            os.close(fd)

        def over(i):
            fd = os.open(paths[i], os.O_WRONLY)
            for at in range(0, per, chunk):
                os.pwrite(fd, bufs[i], at)
            os.close(fd)

        def read(i):
            fd = os.open(paths[i], os.O_RDONLY)
            for at in range(0, per, chunk):
                os.preadv(fd, [bufs[i]], at)
            os.close(fd)
        for fn in (write, over, read):
            ts = [threading.Thread(target=fn, args=(i,)) for i in range(threads)]
            t = time.perf_counter()
            for x in ts:
                x.start()
            for x in ts:
                x.join()
            took = (time.perf_counter() - t) * nbytes / (per * threads)
            if fn is write:
                best_w = min(best_w, took)
            elif fn is over:
                best_o = min(best_o, took)
            else:
                best_r = min(best_r, took)
        for x in paths:
            os.unlink(x)
    return best_w, best_o, best_r


def dd(args):
    t = time.perf_counter()
    subprocess.run(["dd", "status=none"] + args, check=True)
    return time.perf_counter() - t


def main():
    torch.zeros(1, device=cuda)
    store, want, h = make_store("snap-src", n)
    gb = n * GiB / 1e9
    floor = pinned_floor_of(n * GiB)

    ram = tempfile.mkdtemp(prefix="gmsfs-snap-ram.")
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=%dG" % (n + 2), "tmpfs", ram], check=True)
    target = os.path.join(mount, "snap-dst")
    try:
        fw, fo, fr = tmpfs_floor(ram, n * GiB)
        snap = os.path.join(ram, "snap")
        saves, restores, ok = [], [], True
        for _ in range(2):
            s, r = timed("save", store, snap)
            check(r.returncode == 0, "save to tmpfs", r.stderr)
            if not saves:  # cuInit sets up the store's GPU alone (CUDA_VISIBLE_DEVICES, where unset)
                check("CUDA_VISIBLE_DEVICES" in os.environ or "shown only %s (" % dev["uuid"] in r.stderr,
                      "the save's process is shown only its store's GPU", r.stderr)
            saves.append(s)
            empty(target)
            s, r = timed("restore", target, snap)
            check(r.returncode == 0, "restore from tmpfs", r.stderr)
            restores.append(s)
            ok &= restored_ok(target, want, h)
        # A save into a new folder again, the first one removed: best of 2 as the tmpfs's own
        # writes into new files are (the first pages a tmpfs gives may be the VM's first
        # touch of that memory, which its floor's second round no longer meets).
        shutil.rmtree(snap)
        s, r = timed("save", store, snap)
        check(r.returncode == 0, "save to tmpfs into a new folder again", r.stderr)
        saves.append(s)
        for k in os.environ.get("SNAP_THREADS", "").split():  # GMSFS_COPY_THREADS=k, best of 2 each
            env = dict(os.environ, GMSFS_COPY_THREADS=k)
            ks, kr = [], []
            for _ in range(2):
                for argv, times in ((("save", store, snap), ks), (("restore", target, snap), kr)):
                    if argv[0] == "restore":
                        empty(target)
                    took, r = timed(*argv, env=env)
                    times.append(took if r.returncode == 0 else float("nan"))
                    if r.returncode:
                        print("# %s with %s threads: %s" % (argv[0], k, r.stderr.strip()))
            print("bench: %s threads: save in place %.3f s, restore %.3f s" % (k, min(ks), min(kr)))
        man = json.load(open(os.path.join(snap, "manifest.json")))
        check(ok, "restored from tmpfs: every allocation's checksum and the layout hash (%d shards)"
              % len(man["shards"]))
        # A byte changed in the snapshot: refused, the store left empty.
        shard = os.path.join(snap, man["shards"][0]["file"])
        with open(shard, "r+b") as f:
            f.seek(12345)
            b = f.read(1)
            f.seek(12345)
            f.write(bytes([b[0] ^ 1]))
        empty(target)
        s, r = timed("restore", target, snap)
        st = dict(line.rstrip("\n").split(": ", 1) for line in open(os.path.join(target, "state")))
        check(r.returncode == 1 and "differ" in r.stderr and st["allocations"] == "0" and st["state"] == "EMPTY",
              "a changed byte on the GPU's restore: refused, the store as it was", r.stderr)
    finally:
        subprocess.run(["umount", ram], check=False)
        os.rmdir(ram)
    new_best = min(saves[0], saves[2])
    s_best, r_best = min(saves), min(restores)
    print("bench: snapshot of %.1f GB in %d allocations on tmpfs: save %.3f s (%.1f GB/s, %.2fx pinned D2H %.3f s), "
          "restore %.3f s (%.1f GB/s, %.2fx pinned H2D %.3f s)"
          % (gb, n, s_best, gb / s_best, floor["d2h"] / s_best, floor["d2h"], r_best, gb / r_best,
             floor["h2d"] / r_best, floor["h2d"]))
    print("bench: the saves: into a new folder %.3f s, again over the first (in place) %.3f s, into a new folder "
          "again %.3f s" % tuple(saves))
    print("bench: the tmpfs itself, as many bytes from memory by 16 threads (a file each): written into new files "
          "%.3f s (%.1f GB/s, %.2fx pinned D2H), over them %.3f s (%.1f GB/s), read %.3f s (%.1f GB/s, %.2fx pinned "
          "H2D); the save into a new folder (best of 2) at %.2fx of its writes into new files, the save in place at "
          "%.2fx of its "
          "writes over them, the restore at %.2fx of its reads"
          % (fw, gb / fw, floor["d2h"] / fw, fo, gb / fo, fr, gb / fr, floor["h2d"] / fr, fw / new_best,
             fo / saves[1], fr / r_best))

    # The machine's disk: 4 GiB of the same store's bytes, against dd O_DIRECT.
    small, want4, h4 = make_store("snap-4", 4)
    disk = tempfile.mkdtemp(prefix="gmsfs-snap-disk.", dir="/var/tmp")
    try:
        f = os.path.join(disk, "dd")
        w = dd(["if=/dev/zero", "of=" + f, "bs=64M", "count=64", "oflag=direct", "conv=fsync"])
        subprocess.run(["sh", "-c", "sync; echo 3 > /proc/sys/vm/drop_caches"], check=True)
        rd = dd(["if=" + f, "of=/dev/null", "bs=64M", "iflag=direct"])
        os.unlink(f)
        snap = os.path.join(disk, "snap")
        s, r = timed("save", small, snap)
        check(r.returncode == 0, "save to disk", r.stderr)
        subprocess.run(["sh", "-c", "sync; echo 3 > /proc/sys/vm/drop_caches"], check=True)
        target4 = os.path.join(mount, "snap-dst4")
        os.mkdir(target4)
        t, r2 = timed("restore", target4, snap)
        check(r2.returncode == 0 and restored_ok(target4, want4, h4),
              "restored from disk, the page cache dropped: every checksum and the layout hash", r2.stderr)
        gb4 = 4 * GiB / 1e9
        print("bench: snapshot of %.1f GB on the disk: save %.3f s (%.2f GB/s, %.2fx dd oflag=direct %.2f GB/s), "
              "restore cold %.3f s (%.2f GB/s, %.2fx dd iflag=direct %.2f GB/s)"
              % (gb4, s, gb4 / s, w / s, gb4 / w, t, gb4 / t, rd / t, gb4 / rd))
        os.rmdir(target4)
    finally:
        shutil.rmtree(disk, ignore_errors=True)
    for p in (target, store, small):
        os.rmdir(p)
    return done()


if __name__ == "__main__":
    sys.exit(main())
