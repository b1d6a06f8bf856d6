"""Nothing lost, ever (gmsfs(5), RESTART and SHARING A GPU), host backend.

  - Write-ahead, then give back: the daemon killed exactly between a change's image and
    the memory it gives back (GMSFS_FAULT), for a commit, a move, an eviction, an rmdir and
    a rollback, restarts with every committed store's bytes, never zeros.
  - Readers across a restart (SIGKILL under the service manager, or a takeover) keep their
    stores: no move, eviction or freeing until they let go (unmap_all) or end.
  - A waiting open of a store on the host tier is tried again when room comes; a timed one
    says why it could not be.
  - Takeover only of a live gmsfs mount, keeping the old daemon's options; the rolled-back
    writer's mappings no longer reach what readers map.
  - A property test: random commits, moves, evictions, rmdirs and restarts, every store's
    bytes checked after each restart."""
import errno
import json
import os
import random
import signal
import subprocess
import sys
import time

import pytest

from conftest import BUILD, ROOT, let_go_of_mount, until
from manager import Manager, wait_mounted
import gmsfs
from gmsfs.ctl import read_fields

KiB = 1 << 10
ENV = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))


def status(mnt):
    with open(os.path.join(mnt, "status.json")) as f:
        return json.load(f)


def state(store):
    return read_fields(os.path.join(store, "state"))


def payload(seed, n):
    return random.Random(repr(seed)).randbytes(n)


def publish(store, seed, sizes=(64 * KiB, 8 * KiB), keep=()):
    """A commit of allocations a<seed>_<i> (bytes from seed); keep: allocations that stay,
    every other one is freed.  What the store holds after it: {name: bytes}."""
    if not os.path.isdir(store):
        os.mkdir(store)
    with gmsfs.connect(store, "rw", timeout=10) as c:
        # By name, unmapped: a writer that never maps the committed allocations writes
        # none of them in place, and its crash leaves the last commit whole (not TORN).
        for name in os.listdir(os.path.join(store, "allocs")):
            if name not in keep:
                c.free(name)
        for i, n in enumerate(sizes):
            name = "a%d_%d" % (seed, i)
            m = c.create(name, n)
            c.buffer(m.ptr, n, writable=True)[:] = payload((seed, i), n)
            c.meta_put("w%d_%d" % (seed, i), name, 0, b"seed %d" % seed)
        c.commit()
    return read_all(store)


def read_all(store, timeout=20):
    """{name: bytes} of the committed layout, and its hash."""
    with gmsfs.connect(store, "ro", timeout=timeout) as c:
        c.import_all()
        return {m.name: bytes(c.buffer(m.ptr, m.size)) for m in c.mappings}, c.layout_hash


def tier(store):
    with open(os.path.join(store, "tier")) as f:
        return f.read().strip()


def ended(pid):
    """pid has ended (gone, or a zombie nobody reaped yet)."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


LIVE = []  # processes a test started and may leave behind when it fails


@pytest.fixture
def mnt(request):
    d = os.path.realpath(__import__("tempfile").mkdtemp(prefix="gmsfs-lost."))
    yield d
    while LIVE:
        p = LIVE.pop()
        if p.poll() is None:
            p.kill()
            p.wait()
    let_go_of_mount(d, request, 60)


@pytest.fixture
def manager():
    m = Manager()
    yield m
    m.close()


def start(manager, mnt, state_dir, *options, fault=None):
    env = dict(os.environ)
    env.pop("GMSFS_FAULT", None)
    if fault:
        env["GMSFS_FAULT"] = fault
    manager.start(mnt, "backend=host", "state=" + state_dir, *options, env=env)


def restart(manager, mnt, state_dir, *options, sig=signal.SIGKILL, fault=None):
    """The daemon gone (killed now, or dead already), its mount lifted, a new one started."""
    if manager.daemon.poll() is None:
        manager.kill(sig)
    subprocess.run(["umount", "-l", mnt], capture_output=True)
    start(manager, mnt, state_dir, *options, fault=fault)


def died(manager, timeout=20):
    try:
        manager.daemon.wait(timeout)
    except subprocess.TimeoutExpired:
        return False
    return manager.daemon.returncode == -signal.SIGKILL


# ---- write-ahead, then give back ----

def expect(mnt, stores):
    """Every store named holds exactly these bytes (or is gone: None)."""
    for name, want in stores.items():
        path = os.path.join(mnt, name)
        if want is None:
            assert not os.path.exists(path), name
            continue
        got, _ = read_all(path)
        assert got.keys() == want.keys(), (name, sorted(got), sorted(want))
        for k in want:
            zeros = got[k] == bytes(len(got[k]))
            assert got[k] == want[k], "%s/%s: %s" % (name, k, "zeros" if zeros else "other bytes")


# A rollback frees only what its session made, which no image ever named: no image step.
CASES = [(op, step) for op in ("commit", "move", "evict", "rmdir") for step in ("image", "give")] + [("rollback", "give")]


@pytest.mark.parametrize("op,step", CASES, ids=["%s.%s" % c for c in CASES])
def test_a_crash_between_an_image_and_its_give_back_loses_nothing(mnt, manager, tmp_path, op, step):
    """The daemon dies at op's point step (GMSFS_FAULT): before its image is written
    ("image": the store comes back as it was, its memory all there) or after it, before the
    memory it no longer needs is given back ("give": the store comes back as changed)."""
    sd = str(tmp_path / "state")
    start(manager, mnt, sd, "max_bytes=256K")
    m = os.path.join(mnt, "m")
    v1, h1 = publish(m, 1)  # 64 KiB + 8 KiB
    other, _ = publish(os.path.join(mnt, "other"), 9, sizes=(8 * KiB,))
    before = {"m": v1, "other": other}
    restart(manager, mnt, sd, "max_bytes=256K", sig=signal.SIGTERM, fault="%s.%s" % (op, step))
    if op == "commit":  # frees a1_1, makes a2_0: the commit gives a1_1's memory back
        with pytest.raises((gmsfs.GmsfsError, OSError)):
            publish(m, 2, sizes=(16 * KiB,), keep=("a1_0",))
        after = {"m": {"a1_0": v1["a1_0"], "a2_0": payload((2, 0), 16 * KiB)}, "other": other}
    elif op == "move":
        try:  # the mover moves at once: the daemon may be gone before the close returns
            with open(os.path.join(m, "tier"), "w") as f:
                f.write("host\n")
        except OSError:
            pass
        after = before
    elif op == "evict":  # 200 KiB more: m (72 KiB, idle, lowest priority) gives way
        os.setxattr(os.path.join(mnt, "other"), "user.gms.priority", b"5")
        with pytest.raises((gmsfs.GmsfsError, OSError)):
            publish(os.path.join(mnt, "big"), 3, sizes=(200 * KiB,))
        after = before
    elif op == "rmdir":
        with pytest.raises(OSError):
            os.rmdir(m)
        after = {"m": None, "other": other}
    else:  # rollback: a session's own allocation freed by abort
        w = subprocess.Popen(["sh", "-c", 'exec 9>"$1/lock"; truncate -s 12288 "$1/allocs/tmp" && '
                              'echo x > "$1/allocs/tmp"; echo > "$1/abort"; echo done', "sh", m],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        w.communicate(timeout=20)
        after = before
    assert died(manager), "the daemon did not die at %s.%s" % (op, step)
    restart(manager, mnt, sd, "max_bytes=256K")
    expect(mnt, before if step == "image" and op not in ("move", "evict", "rollback") else after)
    s = status(mnt)
    assert s["keep"]["failed"] == [], s["keep"]
    if op in ("move", "evict"):  # where the image said, and its bytes either way
        assert tier(m) == "device"  # read_all brought it back
    # The daemon's accounting is the stores' own: nothing was counted twice or lost.
    dev = read_fields(os.path.join(mnt, "device"))
    held = sum(int(x["aligned_bytes"]) for x in s["stores"] if x.get("tier", "device") == "device")
    assert int(dev["used_bytes"]) == held, (dev["used_bytes"], held)
    manager.kill(signal.SIGTERM)


# ---- readers across a restart ----

READER = r"""
import gmsfs, sys
store = sys.argv[1]
c = gmsfs.connect(store, "ro", timeout=20)
c.import_all()
want = {m.name: bytes(c.buffer(m.ptr, m.size)) for m in c.mappings}
print("mapped", flush=True)
for line in sys.stdin:
    cmd = line.strip()
    if cmd == "check":
        bad = [m.name for m in c.mappings if bytes(c.buffer(m.ptr, m.size)) != want[m.name]]
        print("bad %s" % bad if bad else "ok", flush=True)
    elif cmd == "sleep":
        c.unmap_all()
        print("asleep", flush=True)
    elif cmd == "wake":
        c.remap_all(20)
        bad = [m.name for m in c.mappings if bytes(c.buffer(m.ptr, m.size)) != want[m.name]]
        print("bad %s" % bad if bad else "awake", flush=True)
"""


class Reader:
    def __init__(self, store):
        self.p = subprocess.Popen([sys.executable, "-c", READER, store], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True, env=ENV)
        LIVE.append(self.p)
        assert self.ask(None) == "mapped"

    def ask(self, cmd):
        if cmd:
            self.p.stdin.write(cmd + "\n")
            self.p.stdin.flush()
        return self.p.stdout.readline().strip()

    def end(self):
        self.p.stdin.close()
        self.p.wait(20)


def unmount(mnt, daemon):
    """mnt unmounted, then its daemon's end waited for.  umount answers EBUSY while the
    kernel still releases the files of a client that just ended: tried again until it
    takes (20 s at most)."""
    end = time.monotonic() + 20
    while subprocess.run(["umount", mnt], capture_output=True).returncode and time.monotonic() < end:
        time.sleep(0.05)
    daemon.wait(20)


def serve(mnt, options):
    """A daemon of the build on mnt (gmsfs -f -o OPTIONS), its log beside it; once mounted."""
    with open(mnt + ".log", "a") as log:
        daemon = subprocess.Popen([os.path.join(BUILD, "gmsfs"), "-f", "-o", options, mnt], stderr=log)
    LIVE.append(daemon)
    assert wait_mounted(mnt), open(mnt + ".log").read()[-2000:]
    return daemon


def takeover(mnt, *options):
    old = int(read_fields(os.path.join(mnt, "device"))["pid"])
    log = open(mnt + ".log", "a")
    new = subprocess.Popen([os.path.join(BUILD, "gmsfs"), "-f", "-o", ",".join(("takeover",) + options), mnt],
                           stderr=log)
    LIVE.append(new)
    def served_by_new():
        try:
            return read_fields(os.path.join(mnt, "device")).get("pid") == str(new.pid)
        except (ConnectionAbortedError, OSError) as e:
            # A read whose path was resolved on the old mount just before it was lifted
            # off meets the old daemon's end (ECONNABORTED, ENOTCONN): look again.
            if e.errno not in (errno.ECONNABORTED, errno.ENOTCONN):
                raise
            return False

    assert until(served_by_new), "no takeover"
    return new, old


@pytest.mark.parametrize("how", ["sigkill", "takeover"])
@pytest.mark.parametrize("action", ["move", "evict", "rmdir"])
def test_a_reader_mapped_across_a_restart_keeps_its_bytes(mnt, manager, tmp_path, how, action):
    sd = str(tmp_path / "state")
    if how == "sigkill":
        start(manager, mnt, sd, "max_bytes=256K")
    else:
        daemon = serve(mnt, "backend=host,max_bytes=256K")
    m = os.path.join(mnt, "m")
    v1, _ = publish(m, 1)
    r = Reader(m)
    if how == "sigkill":
        restart(manager, mnt, sd, "max_bytes=256K")
    else:
        daemon, old = takeover(mnt)
        assert until(lambda: ended(old))
    st = state(m)
    assert st["readers"] == "1" and st["state"] == "RO", st  # the new daemon knows of it
    if action == "move":
        with pytest.raises(OSError) as e:
            with open(os.path.join(m, "tier"), "w") as f:
                f.write("host\n")
        assert e.value.errno == 16  # EBUSY: in use
    elif action == "evict":  # 200 KiB more than the budget leaves: m may not give way
        with pytest.raises(gmsfs.GmsfsError) as e:
            publish(os.path.join(mnt, "big"), 2, sizes=(200 * KiB,))
        assert e.value.errno == 28 and "m holds" in str(e.value), e.value
    else:  # rmdir: the name goes now, the memory when the reader lets go
        os.rmdir(m)
        assert not os.path.exists(m)
    assert tier(m) == "device" if action != "rmdir" else True
    assert r.ask("check") == "ok"  # its bytes, not zeros
    # It lets go (its library unmaps): now the store may move, give way or go.
    assert r.ask("sleep") == "asleep"
    if action == "move":
        with open(os.path.join(m, "tier"), "w") as f:
            f.write("host\n")
        assert until(lambda: tier(m) == "host")
        assert r.ask("wake") == "awake"  # brought back, at the same addresses, the same bytes
    elif action == "evict":
        publish(os.path.join(mnt, "big"), 2, sizes=(200 * KiB,))
        assert tier(m) == "host"
    else:
        assert until(lambda: not any(x["name"] == "m" for x in status(mnt)["stores"]))
    r.end()
    if how == "sigkill":
        manager.kill(signal.SIGTERM)
    else:
        unmount(mnt, daemon)


def test_a_reader_that_ends_gives_its_kept_lock_back(mnt, manager, tmp_path):
    sd = str(tmp_path / "state")
    start(manager, mnt, sd)
    m = os.path.join(mnt, "m")
    publish(m, 1)
    r = Reader(m)
    restart(manager, mnt, sd)
    assert state(m)["readers"] == "1"
    # A writer waits for it, as it would have before the restart.
    w = subprocess.Popen([sys.executable, "-c", "import gmsfs, sys; c = gmsfs.connect(sys.argv[1], 'rw', timeout=20); "
                          "print('granted', flush=True)", m], stdout=subprocess.PIPE, text=True, env=ENV)
    assert until(lambda: state(m)["waiting_writers"] == "1")
    r.p.kill()  # gone without a word: the daemon finds out within a second or so
    r.p.wait()
    assert w.communicate(timeout=20)[0].strip() == "granted"
    manager.kill(signal.SIGTERM)


def test_readers_files_follow_the_readers(mnt, manager, tmp_path):
    sd = str(tmp_path / "state")
    start(manager, mnt, sd)
    m = os.path.join(mnt, "m")
    publish(m, 1)
    assert not os.path.exists(os.path.join(sd, "m.readers"))
    r = Reader(m)
    lines = open(os.path.join(sd, "m.readers")).read().split()
    assert lines[0] == str(r.p.pid) and lines[2] == "1", lines
    r.end()
    assert until(lambda: not os.path.exists(os.path.join(sd, "m.readers")))
    manager.kill(signal.SIGTERM)


def test_a_writer_that_committed_and_left_is_no_reader_once_its_disconnect_returns(mnt, manager, tmp_path):
    # Its lock file read since the commit: that hold goes with the disconnect, not with a
    # release the kernel sends later, which a daemon killed at once would never see (a
    # restart then kept a reader that had left, and the store could not move).
    sd = str(tmp_path / "state")
    start(manager, mnt, sd)
    m = os.path.join(mnt, "m")
    os.mkdir(m)
    for i in range(20):
        with gmsfs.connect(m, "rw", timeout=5) as c:
            c.create("a%d" % i, 4096)
            c.commit()
        assert not os.path.exists(os.path.join(sd, "m.readers")), (i, open(os.path.join(sd, "m.readers")).read())
    restart(manager, mnt, sd)  # SIGKILL right after the last disconnect
    assert state(m)["readers"] == "0"
    with open(os.path.join(m, "tier"), "w") as f:
        f.write("host\n")  # a store with no reader moves
    manager.kill(signal.SIGTERM)


# ---- a waiting open is tried again ----

def test_a_waiting_open_is_granted_once_room_comes(mnt):
    daemon = serve(mnt, "backend=host,max_bytes=256K")
    a = os.path.join(mnt, "a")
    va, _ = publish(a, 1, sizes=(128 * KiB,))
    with open(os.path.join(a, "tier"), "w") as f:
        f.write("host\n")
    assert until(lambda: tier(a) == "host")
    b = os.path.join(mnt, "b")
    publish(b, 2, sizes=(192 * KiB,))
    rb = Reader(b)  # in use: it may not give way for a
    t0 = time.monotonic()
    waiter = subprocess.Popen([sys.executable, "-c", "import gmsfs, sys\n"
                               "with gmsfs.connect(sys.argv[1], 'ro') as c:\n"  # no timeout: waits for good
                               "    c.import_all(); print(sum(m.size for m in c.mappings), flush=True)", a],
                              stdout=subprocess.PIPE, text=True, env=ENV)
    assert until(lambda: state(a)["waiting_readers"] == "1")
    assert until(lambda: "moving to the device tier" in state(a)["last_error"]), state(a)
    time.sleep(0.3)
    assert waiter.poll() is None  # waits on
    rb.end()
    os.rmdir(b)  # room: the move in is tried again, and the open granted
    assert waiter.communicate(timeout=20)[0].strip() == str(128 * KiB)
    assert time.monotonic() - t0 < 15
    assert read_all(a)[0] == va
    unmount(mnt, daemon)


def test_a_timed_wait_for_a_store_that_cannot_come_back_says_why(mnt):
    daemon = serve(mnt, "backend=host,max_bytes=256K")
    a = os.path.join(mnt, "a")
    publish(a, 1, sizes=(128 * KiB,))
    with open(os.path.join(a, "tier"), "w") as f:
        f.write("host\n")
    assert until(lambda: tier(a) == "host")
    b = os.path.join(mnt, "b")
    publish(b, 2, sizes=(192 * KiB,))
    rb = Reader(b)
    t0 = time.monotonic()
    with pytest.raises(gmsfs.GmsfsError) as e:
        gmsfs.connect(a, "ro", timeout=1.5)
    assert e.value.errno == 28, e.value  # ENOSPC, not a bare timeout
    assert "b holds" in str(e.value) and "in use" in str(e.value), str(e.value)
    assert 1.4 < time.monotonic() - t0 < 10
    rb.end()
    unmount(mnt, daemon)


# ---- takeover: a live gmsfs mount only, with its options ----

def test_takeover_of_a_copy_of_a_mount_is_refused(mnt, tmp_path):
    daemon = serve(mnt, "backend=host")
    v, h = publish(os.path.join(mnt, "s"), 1)
    fake = tmp_path / "fake"
    fake.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "none", str(fake)], check=True)
    try:
        open(fake / "device", "w").write(open(os.path.join(mnt, "device")).read())  # a backup of a mount
        r = subprocess.run([os.path.join(BUILD, "gmsfs"), "-f", "-o", "takeover", str(fake)], capture_output=True,
                           text=True, timeout=20)
        assert r.returncode == 1 and "is not a gmsfs mount" in r.stderr, r.stderr
        assert daemon.poll() is None and read_all(os.path.join(mnt, "s")) == (v, h)  # untouched
        with open("/proc/mounts") as f:
            assert (" %s tmpfs " % fake) in f.read()  # and the tmpfs stays where it was
    finally:
        subprocess.run(["umount", str(fake)])
    unmount(mnt, daemon)


def test_takeover_keeps_the_old_daemons_options(mnt, tmp_path):
    sock = str(tmp_path / "g.sock")
    daemon = serve(mnt, "backend=host,max_bytes=64M,host_bytes=32M,fsname=gpu-test-0,socket=" + sock)
    v, h = publish(os.path.join(mnt, "s"), 1)
    new, old = takeover(mnt)  # no options: the old daemon's are kept, its socket name too
    assert until(lambda: ended(old))
    assert daemon.wait(20) == 0
    dev = read_fields(os.path.join(mnt, "device"))
    assert dev["total_bytes"] == str(64 << 20) and dev["host_bytes"] == str(32 << 20), dev
    assert until(lambda: read_fields(os.path.join(mnt, "device"))["socket"] == sock)
    with open("/proc/self/mountinfo") as f:
        assert any((" %s " % mnt) in line and "gpu-test-0" in line for line in f)
    assert read_all(os.path.join(mnt, "s")) == (v, h)  # over the socket, at its old name
    # An option given wins over the old daemon's.
    new2, old2 = takeover(mnt, "max_bytes=128M")
    assert until(lambda: ended(old2))
    assert read_fields(os.path.join(mnt, "device"))["total_bytes"] == str(128 << 20)
    unmount(mnt, new2)


def test_a_takeover_that_rolls_back_a_writer_that_only_read_keeps_the_last_commit(mnt):
    """The writer imported the last commit (read-only to it) and made an allocation of its
    own; a takeover rolls its session back: COMMITTED, readers get the last commit."""
    daemon = serve(mnt, "backend=host")
    s = os.path.join(mnt, "s")
    v, h = publish(s, 1)
    writer = subprocess.Popen([sys.executable, "-c", r"""
import gmsfs, sys
c = gmsfs.connect(sys.argv[1], "rw", timeout=20)
c.import_all()
assert not any(m.writable for m in c.mappings)
c.create("mine", 4096)
print("mapped", flush=True)
sys.stdin.readline()
""", s], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=ENV)
    assert writer.stdout.readline().strip() == "mapped"
    new, old = takeover(mnt)
    assert until(lambda: ended(old))
    assert until(lambda: state(s)["writer"] == "0")
    st = state(s)
    assert (st["state"], st["torn"]) == ("COMMITTED", "0"), st
    assert read_all(s) == (v, h)
    writer.stdin.write("go\n")
    writer.stdin.flush()
    writer.wait(20)
    unmount(mnt, new)


def test_the_rolled_back_writer_cannot_change_what_readers_map(mnt):
    daemon = serve(mnt, "backend=host")
    s = os.path.join(mnt, "s")
    v, h = publish(s, 1)
    writer = subprocess.Popen([sys.executable, "-c", r"""
import gmsfs, sys
c = gmsfs.connect(sys.argv[1], "rw", timeout=20)
c.import_all()
for m in c.mappings:  # the committed allocations, made writable: an in-place update
    c.protect(m.name, True)
print("mapped", flush=True)
sys.stdin.readline()
for m in c.mappings:
    try:
        c.buffer(m.ptr, m.size, writable=True)[:] = b"\xee" * m.size
    except (TypeError, ValueError, gmsfs.GmsfsError):
        pass
try:
    c.commit()
    print("committed", flush=True)
except gmsfs.GmsfsError as e:
    print("refused %d %s" % (e.errno, e), flush=True)
""", s], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=ENV)
    assert writer.stdout.readline().strip() == "mapped"
    new, old = takeover(mnt)
    assert until(lambda: ended(old))
    writer.stdin.write("go\n")
    writer.stdin.flush()
    out = writer.stdout.readline().strip()
    assert out.startswith("refused 1 ") and "rolled back" in out, out  # EPERM, as gmsfs(8) says
    # It held the committed allocations writable when its session ended: the store is
    # TORN (it might have written them before the takeover), readers are refused ...
    assert state(s)["state"] == "TORN" and "TORN since before the restart" in state(s)["last_error"], state(s)
    with pytest.raises(gmsfs.GmsfsError) as e:
        read_all(s, timeout=2)
    assert e.value.errno == errno.EUCLEAN and "torn" in str(e.value), e.value
    # ... until a writer commits; none of its writes after the takeover reached them.
    subprocess.run(["bash", "-ec", 'exec 9>"$0/lock"; echo > "$0/commit"', s], check=True)
    assert read_all(s) == (v, h)
    writer.wait(20)
    unmount(mnt, new)


# ---- a removed store's reader, and the small ones ----

def test_a_reader_of_a_removed_store_can_sleep(mnt):
    daemon = serve(mnt, "backend=host")
    s = os.path.join(mnt, "s")
    publish(s, 1)
    r = Reader(s)
    os.rmdir(s)
    assert [x["name"] for x in status(mnt)["stores"]] == ["s"]  # removed, held: its memory stays
    assert r.ask("check") == "ok"
    assert r.ask("sleep") == "asleep"  # unmap_all works, and lets it go
    assert until(lambda: status(mnt)["stores"] == [])
    assert read_fields(os.path.join(mnt, "device"))["used_bytes"] == "0"
    r.end()
    unmount(mnt, daemon)


def test_small_inputs_are_refused_with_reasons(mnt):
    r = subprocess.run([os.path.join(BUILD, "gmsfs"), "-f", "-o", "backend=host,max_bytes=0", mnt],
                       capture_output=True, text=True, timeout=10)
    assert r.returncode == 2 and "more than 0" in r.stderr, r.stderr
    daemon = serve(mnt, "backend=host,max_bytes=64M")
    s = os.path.join(mnt, "s")
    os.mkdir(s)
    for bad in (b" 5", b"+5", b"5 ", b"", b"-", b"1001"):
        with pytest.raises(OSError) as e:
            os.setxattr(s, "user.gms.priority", bad)
        assert e.value.errno == 22, bad
    os.setxattr(s, "user.gms.priority", b"-5")
    assert os.getxattr(s, "user.gms.priority") == b"-5"
    # A quota past the budget shows the budget's free space, not the quota's.
    os.setxattr(s, "user.gms.quota", b"1T")
    st = os.statvfs(s)
    assert st.f_blocks * st.f_frsize == 64 << 20 and st.f_bfree * st.f_frsize <= 64 << 20
    with gmsfs.connect(s, "rw", timeout=10) as c:
        import ctypes
        sp = ctypes.c_void_p()
        assert gmsfs._lib.lib.gmsfs_space_new_range(c._handle(), 0, ctypes.byref(sp)) == -22
        assert b"span of 0" in gmsfs._lib.lib.gmsfs_errmsg(c._handle())
    # A refused size leaves no unsized allocation behind: the commit after it works.
    os.setxattr(s, "user.gms.quota", b"1M")
    w = subprocess.run(["sh", "-c", 'exec 9>"$1/lock"; truncate -s 4M "$1/allocs/x"; echo rc=$?; '
                        'truncate -s 4096 "$1/allocs/y" && echo > "$1/commit" && echo committed', "sh", s],
                       capture_output=True, text=True, timeout=20)
    assert "rc=1" in w.stdout and "committed" in w.stdout, (w.stdout, w.stderr)
    assert sorted(os.listdir(os.path.join(s, "allocs"))) == ["y"]
    # A size refused changes nothing: the same descriptor asks a smaller one, and it is made.
    os.removexattr(s, "user.gms.quota")
    w = subprocess.run([sys.executable, "-c", """
import errno, os, sys
s = sys.argv[1]
fd = os.open(s + "/lock", os.O_WRONLY)  # the session
x = os.open(s + "/allocs/x", os.O_CREAT | os.O_RDWR)
try:
    os.ftruncate(x, 128 << 20)
    print("made 128 MiB")
except OSError as e:
    print("refused", errno.errorcode[e.errno], "allocs/x: 134217728 bytes" in open(s + "/state").read())
os.ftruncate(x, 8192)
os.write(x, b"abc")
print("sized", os.fstat(x).st_size)
open(s + "/commit", "w").write("1")
""", s], capture_output=True, text=True, timeout=20)
    assert w.stdout.split("\n")[:2] == ["refused ENOSPC True", "sized 8192"], (w.stdout, w.stderr)
    assert sorted(os.listdir(os.path.join(s, "allocs"))) == ["x", "y"] and os.path.getsize(s + "/allocs/x") == 8192
    unmount(mnt, daemon)


# ---- the property test ----

def publish_quietly(path, seed, sizes, keep):
    """publish, for a thread the test's crash may cut: None where it did."""
    try:
        return publish(path, seed, sizes=sizes, keep=keep)[0]
    except (gmsfs.GmsfsError, OSError):
        return None


class Daemon:
    """The mount's daemon, restarted as a test asks: killed with SIGKILL under the service
    manager (state=), or replaced by a takeover."""

    def __init__(self, how, mnt, manager, sd, *opts):
        self.how, self.mnt, self.manager, self.sd, self.opts = how, mnt, manager, sd, opts
        if how == "sigkill":
            start(manager, mnt, sd, *opts)
        else:
            self.p = subprocess.Popen([os.path.join(BUILD, "gmsfs"), "-f", "-o", ",".join(("backend=host",) + opts),
                                       mnt], stderr=open(mnt + ".log", "a"))
            assert wait_mounted(mnt)

    def restart(self):
        if self.how == "sigkill":
            restart(self.manager, self.mnt, self.sd, *self.opts)
        else:
            self.p, old = takeover(self.mnt)
            assert until(lambda: ended(old))

    def stop(self):
        if self.how == "sigkill":
            self.manager.kill(signal.SIGTERM)
        else:
            subprocess.run(["umount", self.mnt])
            self.p.wait(20)


@pytest.mark.parametrize("how", ["sigkill", "takeover"])
def test_random_changes_and_restarts_never_bring_back_zeros(mnt, manager, tmp_path, how):
    """Random commits (new allocations, freed ones), moves, evictions, rmdirs and restarts
    (SIGKILL under the service manager, or takeovers), a reader mapped throughout: after
    each restart every committed store reads exactly its last committed bytes, the reader
    reads what it read, nothing uncommitted or removed is there.  GMSFS_STEPS, GMSFS_SEED."""
    seed0 = int(os.environ.get("GMSFS_SEED", os.getpid()))
    rng = random.Random(seed0)
    steps = int(os.environ.get("GMSFS_STEPS", "60"))
    d = Daemon(how, mnt, manager, str(tmp_path / "state"), "max_bytes=512K", "host_bytes=4M")
    names = ["s%d" % i for i in range(4)]
    want = {}  # store -> its committed bytes ({name: bytes})
    seed = 100
    want["pinned"] = publish(os.path.join(mnt, "pinned"), 1, sizes=(16 * KiB,))[0]
    reader = Reader(os.path.join(mnt, "pinned"))
    restarts = counts = 0
    for step in range(steps):
        op = rng.choice(["commit", "commit", "move", "back", "evict", "rmdir", "restart", "restart", "mid",
                         "pinned"])
        name = rng.choice(names)
        path = os.path.join(mnt, name)
        where = "seed %d, step %d (%s %s)" % (seed0, step, op, name)
        try:
            if op == "commit":
                seed += 1
                keep = [k for k in want.get(name, {}) if rng.random() < 0.5]
                sizes = tuple(rng.choice((4, 16, 48)) * KiB for _ in range(rng.randint(1, 2)))
                want[name] = publish(path, seed, sizes=sizes, keep=keep)[0]
            elif op == "move" and name in want:
                with open(os.path.join(path, "tier"), "w") as f:
                    f.write("host\n")
            elif op == "back" and name in want:
                with open(os.path.join(path, "prefetch"), "w") as f:
                    f.write("1\n")
            elif op == "evict":  # a store that needs room: idle ones give way
                seed += 1
                want["big"] = publish(os.path.join(mnt, "big"), seed, sizes=(rng.choice((96, 160)) * KiB,))[0]
            elif op == "rmdir" and name in want:
                os.rmdir(path)
                del want[name]
            elif op == "pinned":  # the reader's store stays where it is
                with pytest.raises(OSError) as e:
                    with open(os.path.join(mnt, "pinned", "tier"), "w") as f:
                        f.write("host\n")
                assert e.value.errno == 16, where
            elif op in ("restart", "mid"):
                # mid: the daemon goes while a commit of name is under way; the store comes
                # back as before it or as after it, whole either way.
                either = None
                if op == "mid" and how == "sigkill":
                    seed += 1
                    keep = [k for k in want.get(name, {}) if rng.random() < 0.5]
                    # A process of its own: locks are a process's (a thread of this one
                    # would be a member of its session).
                    t = subprocess.Popen([sys.executable, "-c", "import sys; sys.path.insert(0, %r)\n"
                                          "from test_nothing_lost import publish_quietly as p\n"
                                          "p(%r, %d, (%d, %d), %r)" % (os.path.dirname(__file__), path, seed,
                                                                       16 * KiB, 4 * KiB, keep)], env=ENV)
                    LIVE.append(t)
                    time.sleep(rng.uniform(0.05, 0.15))
                    either = want.get(name), {**{k: want[name][k] for k in keep},
                                              **{"a%d_%d" % (seed, i): payload((seed, i), n)
                                                 for i, n in enumerate((16 * KiB, 4 * KiB))}}
                restarts += 1
                d.restart()
                if either:
                    t.wait(30)  # it may have gone on with the new daemon
                    # Killed between its mkdir and its first commit: the store is there,
                    # EMPTY (nothing committed), as the publisher left it: "before" too.
                    if os.path.isdir(path) and either[0] is None and state(path)["state"] == "EMPTY":
                        os.rmdir(path)
                    got = read_all(path)[0] if os.path.isdir(path) else None
                    assert got in either, "%s: %s is neither version: %s" % (where, name, got and sorted(got))
                    if got is None:
                        want.pop(name, None)
                    else:
                        want[name] = got
                for n, v in want.items():
                    got, _ = read_all(os.path.join(mnt, n))
                    assert got == v, "%s: %s after the restart: %s" % (where, n, sorted(got))
                    counts += 1
                present = sorted(x for x in os.listdir(mnt) if os.path.isdir(os.path.join(mnt, x)))
                assert present == sorted(want), (where, present, sorted(want))
                assert reader.ask("check") == "ok", "%s: the reader's bytes" % where
        except (gmsfs.GmsfsError, OSError) as e:
            # Refused, changing nothing: a commit for want of room (or its store moving:
            # EAGAIN), an rmdir of a moving store (EBUSY).
            code = getattr(e, "errno", 0)
            if not (op in ("commit", "evict") and code in (28, 11, 16) or op == "rmdir" and code == 16):
                raise AssertionError("%s: %r" % (where, e))
        assert reader.ask("check") == "ok", "%s: the reader's bytes" % where
    assert restarts > 0
    print("%s: %d steps, %d restarts, %d store checks (seed %d)" % (how, steps, restarts, counts, seed0))
    reader.end()
    d.stop()


KEPT_ENGINE = r"""
import ctypes, sys, gmsfs
MiB = 1 << 20
c = gmsfs.connect(sys.argv[1], "rw")
p = gmsfs.Pages(c, 8 * MiB, MiB)
p.map([0, 1])
ctypes.memset(p.ptr(0), 0x30, MiB)
p.keep({0: b"zero"})
print("kept", flush=True)
sys.stdin.readline()  # the daemon restarts meanwhile: this session ends, the process lives
again = gmsfs.connect(sys.argv[1], "rw", timeout=10)
q = gmsfs.Pages.adopt(again, 8 * MiB)
print("adopted %d %r" % (q.adopted, q.records().get(0)), flush=True)
q.keep({0: b"zero again"})
sys.stdin.readline()
"""


@pytest.mark.parametrize("how", ["sigkill", "takeover"])
def test_a_kept_caches_engine_alive_across_a_restart_stays_its_only_writer(mnt, manager, tmp_path, how):
    """A restart ends a kept cache's session while its engine lives on (its kernels may
    still write the pages): no other writer gets the pages until that engine ends, and its
    own writer's connect takes them back first (gmsfs(5), Kept caches)."""
    sd = str(tmp_path / "state")
    if how == "sigkill":
        start(manager, mnt, sd)
    else:
        serve(mnt, "backend=host")
    kv = os.path.join(mnt, "kv")
    os.mkdir(kv)
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
    engine = subprocess.Popen([sys.executable, "-c", KEPT_ENGINE, kv], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True, env=env)
    LIVE.append(engine)
    assert engine.stdout.readline() == "kept\n"
    if how == "sigkill":
        restart(manager, mnt, sd)
    else:
        _, old = takeover(mnt)
        assert until(lambda: ended(old))
    with pytest.raises(gmsfs.GmsfsError) as e:
        gmsfs.connect(kv, "rw", timeout=0.3)  # another writer: it waits for the engine
    assert e.value.errno in (errno.ETIMEDOUT, errno.EAGAIN), e.value
    engine.stdin.write("\n")
    engine.stdin.flush()
    assert engine.stdout.readline() == "adopted 2 b'zero'\n"
    engine.stdin.write("\n")
    engine.stdin.flush()
    assert engine.wait(10) == 0
    with gmsfs.connect(kv, "rw", timeout=10) as c:  # the engine gone: the next adopts
        assert gmsfs.Pages.adopt(c, 8 << 20).records() == {0: b"zero again", 1: None}
