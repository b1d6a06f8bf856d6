#!/usr/bin/env python3
"""A daemon restart on the GPU loses nothing (TAP).

    restart_gpu.py MOUNT BUILD    on the cuda mount run.sh made: a store loaded by
        gmsfs-load, a reader (torch) that keeps its mapping; then gmsfs -o takeover (the
        new daemon holds the memory by its descriptors alone: no context, no import), a
        move to the host tier and back through the mover with those descriptors, and a
        SIGKILL and a restart under a service manager (python/tests/manager.py); every
        step checked by the bytes on the device, the layout hash, the reader's addresses,
        and device memory that comes back when the store goes.
    restart_gpu.py keeper BUILD    stores outlive their daemon and its container's processes
        through gmsfs-keeper, as in the DaemonSet: gmsfs-node with GMSFS_KEEP over every
        GPU; a 2 GiB store on the first; a reader that keeps its mapping; the daemon
        SIGKILLed (gmsfs-node starts it again alone), then every process of the node and
        gmsfs-node started again; checked by the bytes on the device, the hash and the
        reader's read lock; the keeper's end gives the memory back."""
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python", "tests"))
from tap import check, done  # noqa: E402

mount, build = sys.argv[1], os.path.abspath(sys.argv[2])
os.environ.setdefault("GMSFS_LIBRARY", os.path.join(build, "libgmsfs.so.0"))
os.environ["GMSFS_BUILD"] = os.path.relpath(build, os.path.join(HERE, "..", ".."))
import torch  # noqa: E402
import gmsfs  # noqa: E402
import gmsfs.torch as gt  # noqa: E402
import gmsfs._torch_layout as _tl  # noqa: E402
from manager import Manager  # noqa: E402
from synth import checkpoint  # noqa: E402

MiB = 1 << 20


def sums(c):
    """Per allocation: the sum of its bytes, on the device."""
    return {m.name: int(_tl._bytes_at(m.ptr, m.size, torch.device("cuda")).sum(dtype=torch.int64))
            for m in c.mappings}


def device_used():
    torch.cuda.synchronize()
    torch.cuda.empty_cache()  # this process's own cached blocks (the sums' temporaries) are not the store's
    out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", "0"],
                         capture_output=True, text=True).stdout
    return int(out.split()[0]) * MiB


def pid_of(mnt):
    with open(os.path.join(mnt, "device")) as f:
        return int(dict(line.rstrip("\n").split(": ", 1) for line in f)["pid"])


def uuid_of(mnt):
    return next(l.split(": ", 1)[1] for l in open(os.path.join(mnt, "device")).read().splitlines()
                if l.startswith("uuid: "))


def made_after(mnt):
    """A store made on mnt, one allocation written, committed, read back, removed."""
    s = os.path.join(mnt, "after")
    os.mkdir(s)
    try:
        cuda = torch.device("cuda")
        with gmsfs.connect(s, "rw", timeout=30) as w:
            m = w.create("x", 2 * MiB)
            _tl._bytes_at(m.ptr, m.size, cuda).fill_(7)
            torch.cuda.synchronize()
            w.commit()
        with gmsfs.connect(s, "ro", timeout=30) as r:
            r.import_all()
            m = r.mappings[0]
            return int(_tl._bytes_at(m.ptr, m.size, cuda).sum(dtype=torch.int64)) == 7 * 2 * MiB
    finally:
        os.rmdir(s)


def tier_round_trip(store):
    for where in ("host", "device"):
        with open(os.path.join(store, "tier"), "w") as f:
            f.write(where + "\n")
        for _ in range(3000):
            if open(os.path.join(store, "tier")).read().strip() == where:
                break
            time.sleep(0.01)
    return open(os.path.join(store, "tier")).read().strip() == "device"


def main():
    torch.zeros(1, device="cuda")
    tmp = tempfile.mkdtemp(prefix="gmsfs-restart-gpu.", dir="/var/tmp")
    path = os.path.join(tmp, "m.safetensors")
    checkpoint(path, 8, 256 * MiB)
    base = device_used()
    store = os.path.join(mount, "model")
    os.mkdir(store)
    r = subprocess.run([os.path.join(build, "gmsfs-load"), "-q", store, path], capture_output=True, text=True)
    check(r.returncode == 0, "gmsfs-load of 2 GiB", r.stderr)
    c = gmsfs.connect(store, "ro", timeout=30)
    c.import_all()
    want, h, ptrs = sums(c), c.layout_hash, [m.ptr for m in c.mappings]
    old = pid_of(mount)
    log = open(mount + ".takeover.log", "w")
    new = subprocess.Popen([os.path.join(build, "gmsfs"), "-f", "-o", "takeover", mount], stdout=log, stderr=log)
    for _ in range(600):
        try:
            if pid_of(mount) == new.pid:
                break
        except OSError:
            pass
        time.sleep(0.05)
    check(pid_of(mount) == new.pid, "gmsfs -o takeover on cuda: the new daemon serves",
          open(mount + ".takeover.log").read()[-2000:])
    check(sums(c) == want, "the reader's mapping reads the same bytes throughout")
    c.unmap_all()
    c.remap_all(30)
    check([m.ptr for m in c.mappings] == ptrs and sums(c) == want and c.layout_hash == h,
          "after the handover: remap_all at the same addresses, the same bytes and hash")
    apps = subprocess.run(["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"], capture_output=True,
                          text=True).stdout.split()
    check(str(new.pid) not in apps and str(old) not in apps, "neither daemon holds a CUDA context", apps)
    check(made_after(mount), "the new daemon makes new memory on the device (a store made, committed, read, removed)")
    said = open(mount + ".takeover.log").read()  # the create waited for the driver, if the mount was not quiet first
    check("opened behind the start in" in said, "  having served first and opened the device behind the start, "
          "from the old daemon's facts", said[-2000:])
    c.close()
    check(tier_round_trip(store), "a move to the host tier and back, by the mover, of memory the new daemon "
                                  "holds by its descriptors alone")
    with gmsfs.connect(store, "ro", timeout=30) as c2:
        c2.import_all()
        check(sums(c2) == want and c2.layout_hash == h, "the same bytes and hash after the round trip")
    os.rmdir(store)
    # The mover's own context (~0.5 GiB) stays until it has been idle MOVER_IDLE_S (10 s).
    for _ in range(30):
        if device_used() < base + 256 * MiB:
            break
        time.sleep(1)
    check(device_used() < base + 256 * MiB, "rmdir gives the device memory back, and the idle mover its "
          "context (%d MiB over the start)" % ((device_used() - base) // MiB))
    subprocess.run(["umount", mount])
    new.wait(30)

    # Under a service manager: SIGKILL, then a restart, with the descriptors it kept.
    m = Manager()
    state = mount + ".state"
    m.start(mount, "state=" + state)
    os.mkdir(store)
    subprocess.run([os.path.join(build, "gmsfs-load"), "-q", store, path], check=True)
    kept = open(os.path.join(state, "device")).read()
    check("backend: cuda\n" in kept and "uuid: %s\n" % uuid_of(mount) in kept,
          "state= keeps the device's facts for the next start", kept)
    for sig in (signal.SIGKILL, signal.SIGTERM):
        m.kill(sig)
        subprocess.run(["umount", "-l", mount], capture_output=True)
        since = os.path.getsize(mount + ".log")
        m.start(mount, "state=" + state)
        with gmsfs.connect(store, "ro", timeout=30) as c3:
            c3.import_all()
            check(sums(c3) == want and c3.layout_hash == h,
                  "after %s and a start under the manager: the same bytes and hash" % signal.Signals(sig).name)
        check(made_after(mount), "  and new memory made on the device after")
        with open(mount + ".log") as f:
            f.seek(since)
            said = f.read()
        check("opened behind the start in" in said, "  the device opened behind the start, from the kept facts",
              said[-2000:])
    check(tier_round_trip(store), "and a move to the host tier and back")
    check(writes_again(m, state), "a writer that committed before a SIGKILL lets go of its read locks after the "
                                  "restart, and writes the store again")
    m.kill(signal.SIGTERM)
    subprocess.run(["umount", "-l", mount], capture_output=True)
    m.close()  # the manager lets the descriptors go: the memory is freed
    # The copier ends when its daemon's socket closes; its context (~0.5 GiB, with the
    # host memory it mapped) takes a moment to go: up to 5 s, half its idle time (10 s),
    # so a copier left idling after its daemon still fails.
    for _ in range(50):
        if device_used() < base + 512 * MiB:
            break
        time.sleep(0.1)
    check(device_used() < base + 512 * MiB, "the service stopped, the device memory comes back (%d MiB over the "
          "start)" % ((device_used() - base) // MiB))
    subprocess.run(["rm", "-rf", state, tmp])
    return done()


WRITER_AGAIN = r"""
import gmsfs, sys
c = gmsfs.connect(sys.argv[1], "rw", timeout=30)
c.create("a", 1 << 21)
c.commit()  # its session is two read locks now: the store's, its lock's
print("committed", flush=True)
sys.stdin.readline()
c.close()  # after the restart: the new daemon kept both for it
try:
    with gmsfs.connect(sys.argv[1], "rw", timeout=30) as w:
        w.create("b", 1 << 21)
        w.commit()
    print("wrote", flush=True)
except gmsfs.GmsfsError as e:
    print("refused: %s" % e, flush=True)
"""


def writes_again(m, state):
    store = os.path.join(mount, "w")
    os.mkdir(store)
    env = dict(os.environ, PYTHONPATH=os.path.join(HERE, "..", "..", "python"))
    p = subprocess.Popen([sys.executable, "-c", WRITER_AGAIN, store], env=env, stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)
    try:
        if p.stdout.readline().strip() != "committed":
            return False
        m.kill(signal.SIGKILL)
        subprocess.run(["umount", "-l", mount], capture_output=True)
        m.start(mount, "state=" + state)
        p.stdin.write("go\n")
        p.stdin.flush()
        said = p.stdout.readline().strip()
        print("#   %s" % said)
        return said == "wrote"
    finally:
        p.kill()
        p.wait()
        os.rmdir(store)


def wait(cond, s=60):
    for _ in range(int(s * 20)):
        try:
            if cond():
                return True
        except OSError:
            pass
        time.sleep(0.05)
    return False


def keeper_main():
    """restart_gpu.py keeper BUILD: through gmsfs-keeper, as in the DaemonSet."""
    tmp = tempfile.mkdtemp(prefix="gmsfs-keeper-gpu.", dir="/var/tmp")
    root, keep = os.path.join(tmp, "run"), os.path.join(tmp, "keep")
    path = os.path.join(tmp, "m.safetensors")
    checkpoint(path, 8, 256 * MiB)
    base = device_used()
    keeper = subprocess.Popen([os.path.join(build, "gmsfs-keeper"), keep], stderr=open(tmp + "/keeper.log", "w"))
    env = dict(os.environ, GMSFS=os.path.join(build, "gmsfs"), GMSFS_KEEPER=os.path.join(build, "gmsfs-keeper"),
               GMSFS_KEEP=keep, GMSFS_ROOT=root)
    node_log = open(tmp + "/node.log", "a")

    def node():
        return subprocess.Popen(["sh", os.path.join(HERE, "..", "..", "tools", "gmsfs-node")], env=env, stderr=node_log)

    n = node()
    uuid = subprocess.run(["nvidia-smi", "--query-gpu=uuid", "--format=csv,noheader", "-i", "0"],
                          capture_output=True, text=True).stdout.strip()
    mount = os.path.join(root, uuid)
    check(wait(lambda: "backend: cuda" in open(mount + "/device").read()), "gmsfs-node with a keeper: GPU 0 mounted")
    store = os.path.join(mount, "model")
    os.mkdir(store)
    r = subprocess.run([os.path.join(build, "gmsfs-load"), "-q", store, path], capture_output=True, text=True)
    check(r.returncode == 0, "gmsfs-load of 2 GiB", r.stderr)
    c = gmsfs.connect(store, "ro", timeout=30)
    c.import_all()
    want, h = sums(c), c.layout_hash

    def back(old, what):
        ok = wait(lambda: pid_of(mount) != old and open(store + "/layout_hash").read().strip() == h)
        readers = open(store + "/state").read()
        # A fresh import, in another process: this one's open again would take over its kept
        # lock (gmsfs(5), "Readers across a restart").
        r = subprocess.run([sys.executable, __file__, "fresh", build, store], capture_output=True, text=True)
        fresh = json.loads(r.stdout) if r.returncode == 0 else None
        check(ok and fresh == {"sums": want, "hash": h} and sums(c) == want, what + ": the store back, the same "
              "bytes and hash on the device in a fresh import; the reader's bytes kept", r.stderr[-2000:])
        check("readers: 1\n" in readers, what + ": the reader's read lock kept", readers)

    old = pid_of(mount)
    os.kill(old, signal.SIGKILL)
    back(old, "the daemon SIGKILLed, started again alone by gmsfs-node")
    old = pid_of(mount)
    os.kill(n.pid, signal.SIGKILL)
    os.kill(old, signal.SIGKILL)
    n.wait()
    for u in os.listdir(root):  # the other GPUs' daemons: the container's processes, all
        try:
            os.kill(pid_of(os.path.join(root, u)), signal.SIGKILL)
        except (OSError, KeyError, ValueError):
            pass
    n = node()
    back(old, "every process of the node SIGKILLed, gmsfs-node started again")
    c.close()
    n.send_signal(signal.SIGTERM)
    n.wait(60)
    keeper.send_signal(signal.SIGTERM)
    keeper.wait(30)
    # As in main(): the copier ends at its daemon's socket's close, and its context takes a
    # moment to go (1 s was 624 MiB over once on an H200): up to 5 s, half its idle time.
    for _ in range(50):
        if device_used() < base + 512 * MiB:
            break
        time.sleep(0.1)
    check(device_used() < base + 512 * MiB, "the keeper's end gives the device memory back (%d MiB over the start)"
          % ((device_used() - base) // MiB))
    subprocess.run(["rm", "-rf", tmp])
    return done()


def fresh_main():
    """restart_gpu.py fresh BUILD STORE: a store imported afresh; its sums and hash as JSON."""
    with gmsfs.connect(sys.argv[3], "ro", timeout=30) as c:
        c.import_all()
        print(json.dumps({"sums": sums(c), "hash": c.layout_hash}))
    return 0


if __name__ == "__main__":
    sys.exit({"keeper": keeper_main, "fresh": fresh_main}.get(sys.argv[1], main)())
