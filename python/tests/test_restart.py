"""A daemon restart loses nothing (gmsfs(5), RESTART), host backend.

  - gmsfs -o takeover: a new daemon takes every store over from the running one, with no
    copy, while a reader keeps its mapping and a writer is mid-session; 100 times.
  - -o state=DIR under a service manager's descriptor store (manager.py stands in for
    systemd): committed stores come back after SIGKILL or a restart, checked by their
    layout hash; a storm of SIGKILLs under writers and readers loses no commit and shows
    nothing uncommitted; bad and foreign images are refused and named."""
import errno
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time

import pytest

from conftest import BUILD, ROOT, let_go_of_mount, until
from manager import Manager, wait_mounted
import gmsfs
from gmsfs.ctl import read_fields

KiB = 1 << 10


def status(mnt):
    with open(os.path.join(mnt, "status.json")) as f:
        return json.load(f)


def publish(store, seed, sizes=(64 * KiB, 8 * KiB)):
    """A committed store: allocation a<i> of bytes from seed, entry w<i> naming it."""
    if not os.path.isdir(store):
        os.mkdir(store)
    rng = random.Random(seed)
    data = {}
    with gmsfs.connect(store, "rw", timeout=10) as c:
        for i, n in enumerate(sizes):
            m = c.create("a%d" % i, n)
            data["a%d" % i] = rng.randbytes(n)
            c.buffer(m.ptr, n, writable=True)[:] = data["a%d" % i]
            c.meta_put("w%d" % i, "a%d" % i, 0, b"value %d" % seed)
        c.commit()
        return data, c.layout_hash


def read_all(store):
    with gmsfs.connect(store, "ro", timeout=10) as c:
        c.import_all()
        return ({m.name: bytes(c.buffer(m.ptr, m.size)) for m in c.mappings}, c.layout_hash,
                {k: c.meta_get(k).value for k in c.meta_list()})


def start(mnt, *options):
    """A daemon of its own (not the fixture's): its process, once the mount is live."""
    log = open(mnt + ".log", "a")
    p = subprocess.Popen([os.path.join(BUILD, "gmsfs"), "-f", "-o", ",".join(("backend=host",) + options), mnt],
                         stderr=log)
    return p


def pid_of(mnt):
    return int(read_fields(os.path.join(mnt, "device"))["pid"])


@pytest.fixture
def mnt(request):
    d = tempfile.mkdtemp(prefix="gmsfs-restart.")
    yield d
    let_go_of_mount(d, request)


# ---- handover ----

READER = r"""
import gmsfs, sys, time
store, want_hash = sys.argv[1], sys.argv[2]
c = gmsfs.connect(store, "ro", timeout=10)
c.import_all()
want = {m.name: bytes(c.buffer(m.ptr, m.size)) for m in c.mappings}
ptrs = {m.name: m.ptr for m in c.mappings}
print("mapped", flush=True)
checks = 0
for line in sys.stdin:
    if line.strip() == "remap":  # after a handover: asleep, then awake at the same addresses
        c.unmap_all()
        c.remap_all(10)
        assert c.layout_hash == want_hash, c.layout_hash
        assert {m.name: m.ptr for m in c.mappings} == ptrs
    for m in c.mappings:  # the mapping reads the same bytes throughout
        assert bytes(c.buffer(m.ptr, m.size)) == want[m.name], m.name
    checks += 1
    print("ok %d" % checks, flush=True)
"""


def test_takeover_100_times_with_a_reader_mapped_and_a_writer_mid_session(mnt):
    daemon = start(mnt)
    assert wait_mounted(mnt)
    store = os.path.join(mnt, "model")
    data, h = publish(store, 1)
    os.setxattr(store, "user.gms.priority", b"7")
    other = os.path.join(mnt, "other")  # a writer is mid-session here while the reader holds model
    odata, oh = publish(other, 2)
    os.mkdir(os.path.join(mnt, "empty"))
    os.setxattr(os.path.join(mnt, "empty"), "user.gms.quota", b"1M")
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
    reader = subprocess.Popen([sys.executable, "-c", READER, store, h], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True, env=env)
    assert reader.stdout.readline().strip() == "mapped"
    for i in range(100):
        # A writer in the middle of a session: an allocation made, not committed.
        writer = subprocess.Popen(["sh", "-c", 'exec 9>"$1/lock"; truncate -s 4096 "$1/allocs/tmp"; echo held; '
                                   'read x; echo > "$1/commit" 2>/dev/null && echo committed || echo refused', "sh",
                                   other], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert writer.stdout.readline().strip() == "held"
        new = start(mnt, "takeover")
        daemon.wait(20)  # the old one ends once the new one serves
        assert daemon.returncode == 0
        daemon = new
        assert pid_of(mnt) == new.pid
        writer.stdin.write("go\n")
        writer.stdin.flush()
        # Its session stayed with the old daemon: the new one never saw it.
        assert writer.stdout.readline().strip() == "refused"
        writer.wait()
        assert not os.path.exists(os.path.join(other, "allocs", "tmp"))
        reader.stdin.write("remap\n" if i % 10 == 9 else "check\n")
        reader.stdin.flush()
        assert reader.stdout.readline().strip() == "ok %d" % (i + 1)
    got, h2, meta = read_all(store)
    assert got == data and h2 == h and meta == {"w0": b"value 1", "w1": b"value 1"}
    assert read_all(other)[:2] == (odata, oh)
    assert os.getxattr(store, "user.gms.priority") == b"7"
    assert os.getxattr(os.path.join(mnt, "empty"), "user.gms.quota") == str(1 << 20).encode()
    st = read_fields(os.path.join(store, "state"))
    assert st["generation"] == "1" and st["state"] == "RO" and st["readers"] == "1"  # the reader, remapped
    reader.stdin.close()
    assert reader.wait(10) == 0
    with open("/proc/mounts") as f:
        assert sum((" %s fuse.gmsfs " % mnt) in line for line in f) == 1  # one mount: the old ones are lifted
    subprocess.run(["umount", mnt])
    daemon.wait(10)


def test_a_waiting_open_goes_on_with_the_new_daemon(mnt):
    daemon = start(mnt)
    assert wait_mounted(mnt)
    store = os.path.join(mnt, "s")
    publish(store, 2)
    holder = subprocess.Popen(["sh", "-c", 'exec 9>"$1/lock"; echo held; sleep 30', "sh", store],
                              stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    t = time.monotonic()
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
    waiter = subprocess.Popen([sys.executable, "-c", "import gmsfs, sys; c = gmsfs.connect(sys.argv[1], 'ro', timeout=20);"
                               "print(c.lock_mode)", store], stdout=subprocess.PIPE, text=True, env=env)
    time.sleep(0.5)  # it waits for the writer
    new = start(mnt, "takeover")
    daemon.wait(20)
    # The writer's session stayed behind: the waiter's lock comes from the new daemon.
    assert waiter.communicate(timeout=20)[0].strip() == "ro"
    assert time.monotonic() - t < 10
    holder.kill()
    holder.wait()
    subprocess.run(["umount", mnt])
    new.wait(10)


def test_takeover_refusals(mnt):
    r = subprocess.run([os.path.join(BUILD, "gmsfs"), "-f", "-o", "takeover", mnt], capture_output=True, text=True,
                       timeout=10)
    assert r.returncode == 1 and "is a gmsfs daemon serving" in r.stderr, r.stderr
    daemon = start(mnt)
    assert wait_mounted(mnt)
    r = subprocess.run([os.path.join(BUILD, "gmsfs"), "-f", "-o", "takeover,state=/tmp/x", mnt], capture_output=True,
                       text=True, timeout=10)
    assert r.returncode == 1 and "do not go together" in r.stderr, r.stderr
    publish(os.path.join(mnt, "s"), 11)
    r = subprocess.run([os.path.join(BUILD, "gmsfs"), "-f", "-o", "takeover,backend=host,device=host-other", mnt],
                       capture_output=True, text=True, timeout=10)
    assert r.returncode == 1 and "made on host-" in r.stderr, r.stderr
    assert pid_of(mnt) == daemon.pid and daemon.poll() is None  # refused: the old one serves on
    publish(os.path.join(mnt, "t"), 12)  # and takes commits again
    subprocess.run(["umount", mnt])
    daemon.wait(10)


# ---- restart under a service manager ----

@pytest.fixture
def manager():
    m = Manager()
    yield m
    m.close()


def kept(manager):
    """The stores' descriptors in the manager's store (its mark of the service aside)."""
    names = manager.names()
    assert names.count("gmsfs-service") <= 1, names
    return [n for n in names if n != "gmsfs-service"]


def move_to_host(store):
    """Ask for a move to the host tier and wait until the store is there."""
    with open(os.path.join(store, "tier"), "w") as f:
        f.write("host\n")
    for _ in range(500):
        if open(os.path.join(store, "tier")).read().strip() == "host":
            break
        time.sleep(0.01)


def restart(manager, mnt, state, sig=signal.SIGKILL, *options):
    manager.kill(sig)
    subprocess.run(["umount", "-l", mnt], capture_output=True)  # a crash leaves a dead mount
    manager.start(mnt, "backend=host", "state=" + state, *options)


def test_committed_stores_come_back_after_sigkill_and_after_a_restart(mnt, manager, tmp_path):
    state = str(tmp_path / "state")
    manager.start(mnt, "backend=host", "state=" + state)
    a, ha = publish(os.path.join(mnt, "a"), 3)
    b, hb = publish(os.path.join(mnt, "b"), 4, sizes=(4 * KiB,))
    os.setxattr(os.path.join(mnt, "a"), "user.gms.priority", b"-3")
    os.mkdir(os.path.join(mnt, "empty"))
    # A writer mid-session on b when the daemon dies: rolled back, as a writer's crash.
    w = subprocess.Popen(["sh", "-c", 'exec 9>"$1/lock"; truncate -s 4096 "$1/allocs/tmp"; echo held; sleep 30', "sh",
                          os.path.join(mnt, "b")], stdout=subprocess.PIPE, text=True)
    assert w.stdout.readline().strip() == "held"
    for sig in (signal.SIGKILL, signal.SIGTERM):  # a crash, then systemctl restart's stop
        restart(manager, mnt, state, sig)
        assert read_all(os.path.join(mnt, "a"))[:2] == (a, ha)
        assert read_all(os.path.join(mnt, "b"))[:2] == (b, hb)
        assert os.getxattr(os.path.join(mnt, "a"), "user.gms.priority") == b"-3"
        s = status(mnt)
        assert sorted(x["name"] for x in s["stores"]) == ["a", "b", "empty"]
        assert s["keep"]["restored"] == 3 and s["keep"]["failed"] == []
        assert not os.path.exists(os.path.join(mnt, "b", "allocs", "tmp"))
    w.kill()
    w.wait()
    # The descriptors the manager holds are those the stores need: one memory file each here.
    assert len(kept(manager)) == status(mnt)["keep"]["descriptors"] == 2
    # rmdir: the image goes, and with its memory freed its descriptor leaves the manager.
    os.rmdir(os.path.join(mnt, "b"))
    assert sorted(os.listdir(state)) == ["a.image", "empty.image"]
    def forgotten():  # the kernel's forgets (the last hold on b), asked for until they come
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("2\n")
        return len(kept(manager)) == 1
    assert until(forgotten, 20, 0.05), kept(manager)
    # A commit that replaces allocations: the old memory leaves the manager too.
    a2, ha2 = publish(os.path.join(mnt, "c"), 5)
    with gmsfs.connect(os.path.join(mnt, "c"), "rw", timeout=10) as c:
        c.import_all()
        c.free("a0")  # and w0, which names it
        c.create("z", 12 * KiB)
        c.commit()
        hc = c.layout_hash
    restart(manager, mnt, state)
    assert read_all(os.path.join(mnt, "c"))[1] == hc
    assert len(kept(manager)) == status(mnt)["keep"]["descriptors"] == 2
    manager.kill(signal.SIGTERM)


def test_a_content_hash_comes_back_with_its_store_and_stays_through_moves(mnt, manager, tmp_path):
    """gmsfs(5), CONTENT HASH: kept with the store's image (a SIGKILL and a takeover-free
    restart keep it), and a move to the host tier and back changes no byte: it stays."""
    state = str(tmp_path / "state")
    manager.start(mnt, "backend=host", "state=" + state)
    store = os.path.join(mnt, "h")
    publish(store, 7)
    h = gmsfs.digest(store)
    other = os.path.join(mnt, "o")
    publish(other, 8)  # not computed: unknown after the restart too
    restart(manager, mnt, state)
    assert gmsfs.content_hash(store) == h and gmsfs.content_hash(other) is None
    move_to_host(store)
    assert gmsfs.content_hash(store) == h
    restart(manager, mnt, state)
    assert gmsfs.content_hash(store) == h == gmsfs.digest(store, record=False)  # brought back: the same bytes
    manager.kill(signal.SIGTERM)


def name_commits(store):
    """Commits named step-1, none, step-3 after a first: what a store's image must keep."""
    for name in ("step-1", None, "step-3"):
        with gmsfs.connect(store, "rw", timeout=5) as c:
            c.commit(version=name)
    want = [(2, "step-1", "gone"), (4, "step-3", "serving")]
    assert gmsfs.versions(store) == want
    return want


def still_the_stores_once(store):
    with gmsfs.connect(store, "rw", timeout=5) as c:
        with pytest.raises(gmsfs.GmsfsError) as e:
            c.commit(version="step-1")
        assert e.value.errno == errno.EEXIST
        c.commit(version="step-5")
    assert gmsfs.committed_version(store) == "step-5"


def test_named_versions_come_back_with_their_store_after_a_crash(mnt, manager, tmp_path):
    """gmsfs(5), NAMED VERSIONS: the names a store keeps are in its image: a SIGKILL and a
    restart keep them, and a name stays the store's once."""
    state = str(tmp_path / "state")
    manager.start(mnt, "backend=host", "state=" + state)
    store = os.path.join(mnt, "n")
    publish(store, 5)
    want = name_commits(store)
    restart(manager, mnt, state)
    assert gmsfs.versions(store) == want and gmsfs.committed_version(store) == "step-3"
    still_the_stores_once(store)
    manager.kill(signal.SIGTERM)


def test_named_versions_stay_through_a_takeover(mnt):
    daemon = start(mnt)
    assert wait_mounted(mnt)
    store = os.path.join(mnt, "n")
    publish(store, 5)
    want = name_commits(store)
    new = start(mnt, "takeover")
    daemon.wait(20)  # the old one ends once the new one serves
    assert pid_of(mnt) == new.pid and gmsfs.versions(store) == want
    still_the_stores_once(store)
    new.terminate()
    new.wait(20)


def device_bytes(mnt, field):
    return int(read_fields(os.path.join(mnt, "device"))[field])


def test_host_memory_made_ahead_comes_with_a_takeover(mnt):
    """gmsfs(8), no_host_ahead: the host memory made ahead of a store's first move out is
    handed to the next daemon with the store, not made again (pinning 16 GB took 3-5 s of
    driver time on an H200); its first move out copies into it, and comes back whole."""
    daemon = start(mnt, "host_bytes=16M")
    assert wait_mounted(mnt)
    store = os.path.join(mnt, "h")
    data, h = publish(store, 7)
    size = 64 * KiB + 8 * KiB
    t = time.time()
    while device_bytes(mnt, "host_standby_bytes") != size:  # made after a quiet second
        assert time.time() - t < 10, read_fields(os.path.join(mnt, "device"))
        time.sleep(0.05)
    new = start(mnt, "takeover")
    daemon.wait(20)
    assert pid_of(mnt) == new.pid
    assert device_bytes(mnt, "host_standby_bytes") == size  # at once: the old daemon's, adopted
    assert device_bytes(mnt, "host_used_bytes") == size
    time.sleep(2.5)  # the tier thread looks every second, after a quiet one: nothing to make
    with open(mnt + ".log") as f:
        made = f.read().count("bytes of host memory made ahead of its first move out")
    assert made == 1, "made again after the takeover"
    move_to_host(store)
    assert open(os.path.join(store, "tier")).read().strip() == "host"
    assert device_bytes(mnt, "host_standby_bytes") == 0 and device_bytes(mnt, "host_used_bytes") == size
    assert read_all(store)[:2] == (data, h)
    with open(os.path.join(store, "tier"), "w") as f:
        f.write("device\n")
    t = time.time()
    while open(os.path.join(store, "tier")).read().strip() != "device":
        assert time.time() - t < 10
        time.sleep(0.01)
    assert read_all(store)[:2] == (data, h)
    new.terminate()
    new.wait(20)


def wait_standby(mnt, n):
    t = time.time()
    while device_bytes(mnt, "host_standby_bytes") != n:  # made after a quiet second
        assert time.time() - t < 10, read_fields(os.path.join(mnt, "device"))
        time.sleep(0.05)


def test_host_memory_made_ahead_comes_back_after_a_restart_and_goes_when_given_up(mnt, manager, tmp_path):
    """Under state=, a store's image names the host memory made ahead for it: a SIGKILL and
    a restart keep it (not made again); given up for another store's move out, the image
    is written again without it, and a restart after that brings the store back whole."""
    state = str(tmp_path / "state")
    manager.start(mnt, "backend=host", "state=" + state, "host_bytes=128K")
    h, hh = publish(os.path.join(mnt, "h"), 8)  # 72 KiB
    wait_standby(mnt, 72 * KiB)
    restart(manager, mnt, state, signal.SIGKILL, "host_bytes=128K")
    assert device_bytes(mnt, "host_standby_bytes") == 72 * KiB  # at once: the image's
    time.sleep(2.5)  # the tier thread looks every second, after a quiet one: nothing to make
    with open(mnt + ".log") as f:
        assert f.read().count("gmsfs: h: 73728 bytes of host memory made ahead") == 1, "made again"
    g, hg = publish(os.path.join(mnt, "g"), 9, sizes=(64 * KiB,))  # no room for its own ahead
    move_to_host(os.path.join(mnt, "g"))  # the room: h's standby, given up
    assert open(os.path.join(mnt, "g", "tier")).read().strip() == "host"
    assert device_bytes(mnt, "host_standby_bytes") == 0
    assert device_bytes(mnt, "host_used_bytes") == 64 * KiB
    restart(manager, mnt, state, signal.SIGKILL, "host_bytes=128K")
    assert device_bytes(mnt, "host_standby_bytes") == 0  # the image said so before the restart
    assert read_all(os.path.join(mnt, "h"))[:2] == (h, hh)
    assert read_all(os.path.join(mnt, "g"))[:2] == (g, hg)
    assert status(mnt)["keep"]["failed"] == []
    manager.kill(signal.SIGTERM)


def test_many_descriptors_come_back_from_3_on(mnt, manager, tmp_path):
    """More kept descriptors than 3-9 (a store each here; an allocation each on cuda): each
    reaches the new daemon at its place.  bash's exec, which placed them, makes 10 and up
    close-on-exec: a 1000-allocation store on the GPU came back without its memory."""
    state = str(tmp_path / "state")
    manager.start(mnt, "backend=host", "state=" + state)
    want = {}
    for i in range(24):
        want["s%02d" % i] = publish(os.path.join(mnt, "s%02d" % i), 100 + i, sizes=(4 * KiB,))
    restart(manager, mnt, state)
    s = status(mnt)
    assert s["keep"]["failed"] == [] and s["keep"]["restored"] == 24, s["keep"]
    for name, (data, h) in want.items():
        assert read_all(os.path.join(mnt, name))[:2] == (data, h), name
    manager.kill(signal.SIGTERM)


def test_a_store_on_the_host_tier_comes_back_there(mnt, manager, tmp_path):
    state = str(tmp_path / "state")
    manager.start(mnt, "backend=host", "state=" + state)
    store = os.path.join(mnt, "t")
    data, h = publish(store, 6)
    move_to_host(store)
    restart(manager, mnt, state)
    assert open(os.path.join(store, "tier")).read().strip() == "host"
    assert read_all(store)[:2] == (data, h)  # an open brings it back to the device
    assert open(os.path.join(store, "tier")).read().strip() == "device"
    manager.kill(signal.SIGTERM)


def test_a_stores_minimum_comes_back_or_says_why(mnt, manager, tmp_path):
    """user.gms.min is kept with the store; a restart whose max_bytes no longer holds
    every minimum brings the store back without its own and says so in last_error (its
    bytes matter more than its minimum).  user.gms.reserved is not: it is the address
    space an engine's session set aside, and the restart rolls the session back."""
    state = str(tmp_path / "state")
    manager.start(mnt, "backend=host", "state=" + state, "max_bytes=64M")
    kv, big = os.path.join(mnt, "kv"), os.path.join(mnt, "big")
    data, h = publish(kv, 10)
    os.mkdir(big)
    os.setxattr(kv, "user.gms.min", b"8M")
    os.setxattr(kv, "user.gms.reserved", b"32M")
    os.setxattr(big, "user.gms.min", b"40M")
    restart(manager, mnt, state)
    assert os.getxattr(kv, "user.gms.min") == str(8 << 20).encode()
    with pytest.raises(OSError) as e:
        os.getxattr(kv, "user.gms.reserved")
    assert e.value.errno == errno.ENODATA
    assert os.getxattr(big, "user.gms.min") == str(40 << 20).encode()
    assert read_all(kv)[:2] == (data, h)
    # The mount's budget shrank below the two minimums: one comes back without its own.
    restart(manager, mnt, state, signal.SIGKILL, "max_bytes=44M")
    s = {x["name"]: x for x in status(mnt)["stores"]}
    assert s["kv"]["min"] + s["big"]["min"] in (8 << 20, 40 << 20), s
    lost = "kv" if s["kv"]["min"] == 0 else "big"
    assert "user.gms.min" in s[lost]["last_error"] and "not held after the restart" in s[lost]["last_error"]
    with pytest.raises(OSError) as e:
        os.getxattr(os.path.join(mnt, lost), "user.gms.min")
    assert e.value.errno == errno.ENODATA
    assert read_all(kv)[:2] == (data, h)
    assert status(mnt)["keep"]["failed"] == []
    manager.kill(signal.SIGTERM)


def test_bad_and_foreign_images_are_refused_and_named(mnt, manager, tmp_path):
    state = str(tmp_path / "state")
    manager.start(mnt, "backend=host", "state=" + state)
    good, hg = publish(os.path.join(mnt, "good"), 7)
    publish(os.path.join(mnt, "changed"), 8)
    publish(os.path.join(mnt, "cut"), 9)
    manager.kill()
    subprocess.run(["umount", "-l", mnt], capture_output=True)
    # A metadata value changed on disk: the rebuilt layout's hash is not the image's.
    p = os.path.join(state, "changed.image")
    blob = open(p, "rb").read()
    assert blob.count(b"value 8") == 2
    open(p, "wb").write(blob.replace(b"value 8", b"value X", 1))
    p = os.path.join(state, "cut.image")
    blob = open(p, "rb").read()
    open(p, "wb").write(blob[:-20])
    open(os.path.join(state, "junk.image"), "wb").write(b"\x05\x00\x00\x00hello")
    # A reader still listed when the daemon died (its close not yet seen): a refused
    # image's readers file goes with it.
    open(os.path.join(state, "cut.readers"), "w").write("%d 1 1\n" % os.getpid())
    manager.start(mnt, "backend=host", "state=" + state)
    s = status(mnt)
    assert [x["name"] for x in s["stores"]] == ["good"]
    failed = {f["store"]: f["error"] for f in s["keep"]["failed"]}
    assert "layout hash" in failed["changed"] and "refused" in failed["changed"], failed
    assert "a bad record" in failed["cut"], failed
    assert "image head" in failed["junk"], failed
    assert read_all(os.path.join(mnt, "good"))[:2] == (good, hg)
    assert sorted(os.listdir(state)) == ["changed.image.failed", "cut.image.failed", "good.image", "junk.image.failed"]
    # Their memory is not kept for them: only good's descriptor stays with the manager.
    assert len(kept(manager)) == 1
    # Another device's images: every one refused, with where it was made.
    manager.kill()
    subprocess.run(["umount", "-l", mnt], capture_output=True)
    manager.start(mnt, "backend=host", "device=host-elsewhere", "state=" + state)
    s = status(mnt)
    assert s["stores"] == [] and "made on host-" in s["keep"]["failed"][0]["error"], s["keep"]
    manager.kill(signal.SIGTERM)


def test_a_crash_while_no_store_holds_memory_keeps_the_stores(mnt, manager, tmp_path):
    """Stores made ahead of their models (a quota and a priority set, nothing loaded):
    after a crash and a restart they are there, settings and all.  The daemon's mark in
    the manager's store says the service was not stopped, though no store holds memory
    (without it, no descriptor passed back read as a stop, and the stores went)."""
    state = str(tmp_path / "state")
    manager.start(mnt, "backend=host", "state=" + state)
    for name in ("llama", "kv"):
        os.mkdir(os.path.join(mnt, name))
    os.setxattr(os.path.join(mnt, "llama"), "user.gms.quota", b"1G")
    os.setxattr(os.path.join(mnt, "kv"), "user.gms.priority", b"5")
    assert manager.names() == ["gmsfs-service"]
    for sig in (signal.SIGKILL, signal.SIGTERM, signal.SIGKILL):
        restart(manager, mnt, state, sig)
        assert sorted(x["name"] for x in status(mnt)["stores"]) == ["kv", "llama"]
        assert os.getxattr(os.path.join(mnt, "llama"), "user.gms.quota") == b"1073741824"
        assert os.getxattr(os.path.join(mnt, "kv"), "user.gms.priority") == b"5"
        assert manager.names() == ["gmsfs-service"]  # one mark, whatever the restarts
    manager.kill(signal.SIGTERM)
    manager.stop_service()  # systemctl stop: the mark goes with the rest
    manager.start(mnt, "backend=host", "state=" + state)
    assert status(mnt)["stores"] == [] and os.listdir(state) == []
    manager.kill(signal.SIGTERM)


def test_after_the_service_is_stopped_its_images_go(mnt, manager, tmp_path):
    state = str(tmp_path / "state")
    manager.start(mnt, "backend=host", "state=" + state)
    publish(os.path.join(mnt, "s"), 10)
    manager.kill(signal.SIGTERM)
    manager.stop_service()  # systemctl stop: the manager lets the descriptors go
    manager.start(mnt, "backend=host", "state=" + state)
    assert status(mnt)["stores"] == [] and os.listdir(state) == []
    manager.kill(signal.SIGTERM)


def test_state_needs_a_service_manager(tmp_path):
    d = str(tmp_path / "m")
    os.mkdir(d)
    env = dict(os.environ)
    env.pop("NOTIFY_SOCKET", None)
    r = subprocess.run([os.path.join(BUILD, "gmsfs"), "-f", "-o", "backend=host,state=%s" % (tmp_path / "s"), d],
                       capture_output=True, text=True, timeout=10, env=env)
    assert r.returncode == 1 and "no service manager" in r.stderr, r.stderr


HOLDER = r"""
import gmsfs, sys
store, how = sys.argv[1], sys.argv[2]
def step(word):  # said to the test, then wait for its word to go on
    print(word, flush=True)
    sys.stdin.readline()
if how == "reader":
    c = gmsfs.connect(store, "ro", timeout=10)
    c.import_all()
elif how == "two readers":  # one let go before the restart: the daemon must say so
    c, other = (gmsfs.connect(store, "ro", timeout=10) for _ in range(2))
    step("holding 2")
    other.close()
else:  # a writer that committed: its session is two read holds now (the store, its lock)
    c = gmsfs.connect(store, "rw", timeout=10)
    c.buffer(c.create("w", 4096).ptr, 4096, writable=True)[:] = b"w" * 4096
    c.commit()
step("holding")
c.close()
step("closed")
try:
    with gmsfs.connect(store, "rw", timeout=10) as w:
        w.commit()
    print("wrote", flush=True)
except gmsfs.GmsfsError as e:
    print("refused: %s" % e, flush=True)
"""


@pytest.mark.parametrize("how", ["reader", "two readers", "committed writer"])
@pytest.mark.parametrize("when", ["after", "before"])
def test_what_a_process_held_before_a_restart_is_let_go_and_it_writes_again(mnt, manager, tmp_path, how, when):
    """Its holds kept by the next daemon are given back when its handle goes: after the
    restart (said at once), or while no daemon serves (said at its next lock)."""
    state = str(tmp_path / "state")
    manager.start(mnt, "backend=host", "state=" + state)
    store = os.path.join(mnt, "s")
    publish(store, 1)
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
    p = subprocess.Popen([sys.executable, "-c", HOLDER, store, how], env=env, stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)

    def holds():  # the daemon's word for a successor: "PID START COUNT", written before each reply
        with open(os.path.join(state, "s.readers")) as f:
            pid, _, count = f.read().split()
        assert pid == str(p.pid)
        return int(count)

    try:
        if how == "two readers":
            assert p.stdout.readline().strip() == "holding 2"
            assert holds() == 2
            p.stdin.write("go\n")
            p.stdin.flush()
        assert p.stdout.readline().strip() == "holding"
        assert holds() == (2 if how == "committed writer" else 1)
        manager.kill()
        subprocess.run(["umount", "-l", mnt], capture_output=True)  # a crash leaves a dead mount
        if when == "after":
            manager.start(mnt, "backend=host", "state=" + state)
        p.stdin.write("go\n")
        p.stdin.flush()
        assert p.stdout.readline().strip() == "closed"
        if when == "before":
            manager.start(mnt, "backend=host", "state=" + state)
        p.stdin.write("go\n")
        p.stdin.flush()
        assert p.stdout.readline().strip() == "wrote"
        assert status(mnt)["stores"][0]["readers"] == 0
    finally:
        p.kill()
        p.wait()
    manager.kill(signal.SIGTERM)


WRITER = r"""
import gmsfs, sys, time
store, log = sys.argv[1], sys.argv[2]
while True:
    try:
        with gmsfs.connect(store, "rw", timeout=5) as c:
            # The last commit's entries, whichever survived (the next version follows it);
            # its allocations are not mapped: nothing written in place, nothing TORN.
            try:
                k = int(c.meta_get("gen").value) + 1
            except KeyError:
                k = 1
            m = c.create("v%d" % k, 16384)
            c.buffer(m.ptr, 16384, writable=True)[:] = bytes([k % 251]) * 16384
            c.meta_put("gen", "v%d" % k, 0, str(k).encode())
            c.commit()
        with open(log, "a") as f:  # acknowledged: this commit returned
            f.write("%d\n" % k)
    except (gmsfs.GmsfsError, OSError):
        time.sleep(0.02)
"""

READER_STORM = r"""
import gmsfs, sys, time
store = sys.argv[1]
bad = 0
while True:
    try:
        with gmsfs.connect(store, "ro", timeout=5) as c:
            c.import_all()
            g = int(c.meta_get("gen").value)
            m = c.find("v%d" % g)
            if bytes(c.buffer(m.ptr, m.size)) != bytes([g % 251]) * 16384:
                print("bad bytes for", g, flush=True)
    except (gmsfs.GmsfsError, OSError, KeyError):
        time.sleep(0.02)
"""


def check_versions(store, acked):
    """Every committed version is there and whole; none past the store's own generation."""
    with gmsfs.connect(store, "ro", timeout=10) as c:
        c.import_all()
        g = int(c.meta_get("gen").value)
        names = sorted(int(m.name[1:]) for m in c.mappings)
        for m in c.mappings:
            k = int(m.name[1:])
            assert bytes(c.buffer(m.ptr, m.size)) == bytes([k % 251]) * 16384, k
    assert g >= acked, "commit %d returned, the store holds %d" % (acked, g)
    assert names == list(range(1, g + 1)), "uncommitted or missing versions: %s (gen %d)" % (names, g)
    return g


def test_sigkill_storm_under_writers_and_readers_loses_no_commit(mnt, manager, tmp_path):
    state = str(tmp_path / "state")
    manager.start(mnt, "backend=host", "state=" + state)
    store = os.path.join(mnt, "storm")
    os.mkdir(store)
    log = str(tmp_path / "acked")
    open(log, "w").close()
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
    writer = subprocess.Popen([sys.executable, "-c", WRITER, store, log], env=env)
    readers = [subprocess.Popen([sys.executable, "-c", READER_STORM, store], env=env, stdout=subprocess.PIPE,
                                text=True) for _ in range(2)]
    rng = random.Random(os.getpid())
    kills = 0

    def acked_now():
        return [int(x) for x in open(log).read().split()]

    try:
        # Each kill waits for one more acknowledged commit than the last (the writer got
        # through the restart), then lands at a random point of the writer's next cycle:
        # the storm ends at a count of kills and commits, not at a clock (a loaded machine
        # only makes it longer).
        while kills < 30:
            seen = len(acked_now())
            assert until(lambda: len(acked_now()) > seen, 60), \
                "no commit acknowledged in 60 s after %d kills" % kills
            time.sleep(rng.uniform(0, 0.3))
            manager.kill()
            kills += 1
            subprocess.run(["umount", "-l", mnt], capture_output=True)
            acked = acked_now()
            manager.start(mnt, "backend=host", "state=" + state)
            check_versions(store, acked[-1])
    finally:
        writer.kill()
        writer.wait()
        for r in readers:
            r.kill()
    outs = [r.communicate()[0] for r in readers]
    acked = acked_now()
    g = check_versions(store, acked[-1])
    assert kills == 30 and len(acked) >= 30, (kills, len(acked))
    assert not any("bad" in o for o in outs), outs
    assert status(mnt)["keep"]["failed"] == []
    print("%d kills, %d commits acknowledged, generation %d" % (kills, len(acked), g))
    manager.kill(signal.SIGTERM)
