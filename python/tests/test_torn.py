"""Torn stores (gmsfs(5), Abort; SPEC section 4), host backend: a writer's session that
wrote into the last commit's bytes in place (through a file, or a writable mapping of a
committed allocation) and ended without commit cannot give those bytes back.  The store
is then TORN: every read open and import is refused (EUCLEAN) with the reason in
last_error, and state, status.json and the metrics say so, until a writer commits.

  - killed mid-write, through a file and through the library: nobody reads half-written
    bytes as the last commit, and a reader that waited behind the writer is refused, not
    left waiting; a session that wrote nothing in place rolls back whole;
  - abort after writing in place: the session stays, the store is torn until it commits;
  - the daemon killed under its service manager, or replaced by a takeover, mid-session
    or after: the next daemon serves the store TORN (the in-place mark is written ahead)."""
import errno
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import ROOT, let_go_of_mount
from test_nothing_lost import manager, restart, start, state, takeover, until  # noqa: F401 (a fixture)
import gmsfs

MiB = 1 << 20
ENV = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))


@pytest.fixture
def mnt(request):
    d = os.path.realpath(__import__("tempfile").mkdtemp(prefix="gmsfs-torn."))
    yield d
    let_go_of_mount(d, request)


def serve(mnt):
    """A daemon of its own on mnt (the host backend), once its mount answers."""
    daemon = subprocess.Popen([os.path.join(ROOT, "build", "gmsfs"), "-f", "-o", "backend=host", mnt],
                              stderr=open(mnt + ".log", "a"))
    assert until(lambda: os.path.exists(os.path.join(mnt, "device")))
    return daemon


def unmount(mnt, daemon):
    subprocess.run(["umount", mnt], check=True)
    try:
        daemon.wait(10)
    except subprocess.TimeoutExpired:  # seen once in CI (2026-11-29): say where its threads wait
        said = []
        for tid in sorted(os.listdir("/proc/%d/task" % daemon.pid)):
            try:
                with open("/proc/%d/task/%s/comm" % (daemon.pid, tid)) as f:
                    name = f.read().strip()
                with open("/proc/%d/task/%s/stack" % (daemon.pid, tid)) as f:
                    said.append("%s %s:\n%s" % (tid, name, f.read()))
            except OSError as e:
                said.append("%s: %s" % (tid, e))
        daemon.kill()
        daemon.wait()
        raise AssertionError("the daemon did not end within 10 s of its unmount; its threads:\n" + "\n".join(said))


def commit_zeros(store, size=MiB):
    """A committed store of one allocation w of zeros, through the mount."""
    os.mkdir(store)
    subprocess.run(["bash", "-ec", 'exec 9>"$0/lock"; truncate -s %d "$0/allocs/w"; echo > "$0/commit"' % size, store],
                   check=True)


def refused(store):
    """A read open of the lock, and a library reader: both EUCLEAN, the reason said."""
    with pytest.raises(OSError) as e:
        os.close(os.open(os.path.join(store, "lock"), os.O_RDONLY))
    assert e.value.errno == errno.EUCLEAN, e.value
    with pytest.raises(gmsfs.GmsfsError) as e:
        gmsfs.connect(store, "ro", timeout=2)
    assert e.value.errno == errno.EUCLEAN and "torn" in str(e.value), e.value
    st = state(store)
    assert st["state"] == "TORN" and st["torn"] == "1" and "TORN" in st["last_error"], st
    return st


def status_of(mnt, name):
    with open(os.path.join(mnt, "status.json")) as f:
        return {s["name"]: s for s in json.load(f)["stores"]}[name]


# A writer that writes 0xff over the first half of allocs/w in 64 KiB steps, says "half"
# when it is there, and waits to be killed.
FILE_WRITER = r"""
import os, sys
store = sys.argv[1]
lock = os.open(store + "/lock", os.O_WRONLY)
fd = os.open(store + "/allocs/w", os.O_WRONLY)
for off in range(0, 1 << 19, 1 << 16):
    os.pwrite(fd, b"\xff" * (1 << 16), off)
print("half", flush=True)
sys.stdin.readline()
"""

LIB_WRITER = r"""
import sys, gmsfs
c = gmsfs.connect(sys.argv[1], "rw", timeout=10)
c.import_all()  # the committed allocation, read-only to its writer ...
c.protect("w", True)  # ... until it says it writes it in place: what a refit does
m = c.find("w")
c.buffer(m.ptr, m.size // 2, writable=True)[:] = b"\xff" * (m.size // 2)
print("half", flush=True)
sys.stdin.readline()
"""


@pytest.mark.parametrize("how", ["file", "library"])
def test_a_writer_killed_mid_in_place_write_leaves_the_store_torn_until_a_commit(mnt, how):
    daemon = serve(mnt)
    s = os.path.join(mnt, "s")
    commit_zeros(s)
    w = subprocess.Popen([sys.executable, "-c", FILE_WRITER if how == "file" else LIB_WRITER, s],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=ENV)
    assert w.stdout.readline().strip() == "half"
    # A reader that comes meanwhile waits behind the writer ...
    waiter = subprocess.Popen([sys.executable, "-c", "import os, sys\ntry:\n"
                               "    os.open(sys.argv[1] + '/allocs/w', os.O_RDONLY)\n    print('granted')\n"
                               "except OSError as e:\n    print(e.errno)", s], stdout=subprocess.PIPE, text=True)
    assert until(lambda: state(s)["waiting_readers"] == "1")
    w.send_signal(signal.SIGKILL)
    w.wait()
    # ... and is refused when the writer dies, not left waiting, nor given its bytes.
    assert waiter.communicate(timeout=10)[0].strip() == str(errno.EUCLEAN)
    assert until(lambda: state(s)["writer"] == "0")
    st = refused(s)
    assert st["generation"] == "1" and "generation 1's bytes" in st["last_error"], st
    js = status_of(mnt, "s")
    assert js["state"] == "TORN" and js["torn"] == 1, js
    with open(os.path.join(mnt, "metrics")) as f:
        assert 'gmsfs_store_state{' in (m := f.read()) and [l for l in m.splitlines() if
               l.startswith("gmsfs_store_state{") and 'state="TORN"' in l and l.endswith(" 1")], m[:2000]
    # gmsfsctl wait waits for a layout readers may read: not this one.
    ctl = [sys.executable, os.path.join(ROOT, "tools", "gmsfsctl"), "wait", s]
    r = subprocess.run(ctl + ["--timeout", "0.5"], capture_output=True, text=True, env=ENV)
    assert r.returncode == 1 and "state TORN" in r.stderr, (r.returncode, r.stderr)
    # A writer that leaves without commit leaves it torn; one that commits heals it.
    subprocess.run(["bash", "-ec", 'exec 9>"$0/lock"; true', s], check=True)
    assert until(lambda: state(s)["writer"] == "0")
    refused(s)
    subprocess.run(["bash", "-ec", 'exec 9>"$0/lock"; head -c %d /dev/zero | tr "\\0" "\\7" | '
                    'dd of="$0/allocs/w" conv=notrunc status=none; echo > "$0/commit"' % MiB, s], check=True)
    st = state(s)
    assert (st["state"], st["torn"], st["generation"], st["last_error"]) == ("COMMITTED", "0", "2", ""), st
    r = subprocess.run(ctl + ["--timeout", "5"], capture_output=True, text=True, env=ENV)
    assert r.returncode == 0 and r.stdout.strip() == st["layout_hash"], (r.returncode, r.stdout, r.stderr)
    with gmsfs.connect(s, "ro", timeout=5) as c:
        c.import_all()
        assert bytes(c.buffer(c.find("w").ptr, MiB)) == b"\7" * MiB
    unmount(mnt, daemon)


def test_a_writer_that_writes_nothing_in_place_rolls_back_whole(mnt):
    daemon = serve(mnt)
    s = os.path.join(mnt, "s")
    commit_zeros(s)
    # New allocations, the committed one freed by name (never mapped), the writer killed.
    w = subprocess.Popen([sys.executable, "-c", r"""
import sys, gmsfs
c = gmsfs.connect(sys.argv[1], "rw", timeout=10)
c.free("w")
m = c.create("x", 65536)
c.buffer(m.ptr, 65536, writable=True)[:] = b"\xff" * 65536
print("made", flush=True)
sys.stdin.readline()
""", s], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=ENV)
    assert w.stdout.readline().strip() == "made"
    w.send_signal(signal.SIGKILL)
    w.wait()
    assert until(lambda: state(s)["state"] == "COMMITTED")
    assert state(s)["torn"] == "0"
    with gmsfs.connect(s, "ro", timeout=5) as c:
        c.import_all()
        assert [m.name for m in c.mappings] == ["w"]
        assert bytes(c.buffer(c.mappings[0].ptr, MiB)) == bytes(MiB)
    unmount(mnt, daemon)


# Writers that never wrote the last commit's bytes: killed, the store stays COMMITTED
# (gmsfs(5), TORN: only a write in place tears it).
IMPORTER = {
    # GMS's and a publisher's flow: the old model read first, then a new allocation.
    "library": r"""
import sys, gmsfs
c = gmsfs.connect(sys.argv[1], "rw", timeout=10)
c.import_all()
m = c.find("w")
assert not m.writable and bytes(c.buffer(m.ptr, 16)) == bytes(16)
x = c.create("extra", 4096)
c.buffer(x.ptr, 4096, writable=True)[:] = b"\xee" * 4096
print("ready", flush=True)
sys.stdin.readline()
""",
    # gmsfs.torch.publish into a connection that imported the last commit.
    "torch": r"""
import sys, torch, gmsfs, gmsfs.torch as gt
c = gmsfs.connect(sys.argv[1], "rw", timeout=10)
c.import_all()
gt.publish(torch.nn.Linear(4, 4), c, commit=False)
print("ready", flush=True)
sys.stdin.readline()
""",
    # The file system: an O_RDWR open of the committed allocation, posix_fallocate (which
    # the mount refuses: glibc then writes a zero into each block, zeros over zeros) and a
    # write of the bytes that are there already.
    "file": r"""
import os, sys
s = sys.argv[1]
lock = os.open(s + "/lock", os.O_WRONLY)
fd = os.open(s + "/allocs/w", os.O_RDWR)
try:
    os.posix_fallocate(fd, 0, 1 << 20)
except OSError:
    pass
os.pwrite(fd, bytes(65536), 4096)
print("ready", flush=True)
sys.stdin.readline()
""",
}


@pytest.mark.parametrize("how", sorted(IMPORTER))
def test_a_writer_that_only_read_the_last_commit_dies_leaving_it_committed(mnt, how):
    daemon = serve(mnt)
    s = os.path.join(mnt, "s")
    commit_zeros(s)
    w = subprocess.Popen([sys.executable, "-c", IMPORTER[how], s], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         text=True, env=ENV)
    assert w.stdout.readline().strip() == "ready"
    assert state(s)["torn"] == "0"
    waiter = subprocess.Popen([sys.executable, "-c", "import os, sys\ntry:\n"
                               "    os.close(os.open(sys.argv[1] + '/allocs/w', os.O_RDONLY))\n    print('granted')\n"
                               "except OSError as e:\n    print(e.errno)", s], stdout=subprocess.PIPE, text=True)
    assert until(lambda: state(s)["waiting_readers"] == "1")
    w.send_signal(signal.SIGKILL)
    w.wait()
    assert waiter.communicate(timeout=10)[0].strip() == "granted"  # the last commit, not EUCLEAN
    assert until(lambda: state(s)["writer"] == "0")
    st = state(s)
    assert (st["state"], st["torn"], st["generation"]) == ("COMMITTED", "0", "1"), st
    assert "TORN" not in st["last_error"], st
    with gmsfs.connect(s, "ro", timeout=5) as c:
        c.import_all()
        assert [m.name for m in c.mappings] == ["w"]
        assert bytes(c.buffer(c.mappings[0].ptr, MiB)) == bytes(MiB)
    unmount(mnt, daemon)


def test_a_write_that_changes_a_byte_still_tears(mnt):
    """The rule above is about bytes: one changed byte through a file, or a mapping made
    writable by protect (the daemon told first), and the session's end tears the store."""
    daemon = serve(mnt)
    s = os.path.join(mnt, "s")
    commit_zeros(s)
    for script in ['exec 9>"$0/lock"; printf "\\0\\0\\1" | dd of="$0/allocs/w" conv=notrunc status=none',
                   None]:
        if script:
            subprocess.run(["bash", "-ec", script, s], check=True)
        else:
            subprocess.run([sys.executable, "-c", "import sys, gmsfs\nc = gmsfs.connect(sys.argv[1], 'rw', timeout=5)\n"
                            "c.import_all()\nc.protect('w', True)\nassert c.find('w').writable\n"
                            "import os; os._exit(0)", s], check=True, env=ENV)
        assert until(lambda: state(s)["writer"] == "0")
        refused(s)
        subprocess.run(["bash", "-ec", 'exec 9>"$0/lock"; dd if=/dev/zero of="$0/allocs/w" bs=64k count=16 '
                        'conv=notrunc status=none; echo > "$0/commit"', s], check=True)
        assert state(s)["state"] == "COMMITTED"
    unmount(mnt, daemon)


def test_a_paused_reader_resumes_as_the_data_writer_on_the_host_backend(mnt):
    """An engine's own connection becomes the trainer of an in-place refit (gmsfs(5),
    Pause), mappings writable at once or one by one (keep_read_only + protect)."""
    daemon = serve(mnt)
    s = os.path.join(mnt, "s")
    commit_zeros(s)
    c = gmsfs.connect(s, "ro", timeout=5)
    c.import_all()
    w = c.find("w")
    for round_, keep in enumerate([False, True]):
        c.pause()
        assert c.paused and state(s)["paused"] == "1"
        c.resume("data", timeout=5, keep_read_only=keep)
        assert not c.paused and c.lock_mode == "rw"
        assert state(s)["torn"] == "0"  # granted: nothing written in place yet
        if keep:
            assert not c.find("w").writable
            c.protect("w", True)
        assert c.find("w").writable and c.find("w").ptr == w.ptr  # the same address
        c.buffer(w.ptr, MiB, writable=True)[:] = bytes([round_ + 1]) * MiB
        c.commit()
        with gmsfs.connect(s, "ro", timeout=5) as r:
            r.import_all()
            assert bytes(r.buffer(r.find("w").ptr, MiB)) == bytes([round_ + 1]) * MiB
    c.close()
    unmount(mnt, daemon)


def test_a_resume_whose_grant_came_and_whose_next_step_failed_changes_nothing(mnt, manager, tmp_path):
    """The daemon keeps its stores' images on a disk that is full when a paused reader
    resumes as the data writer: granted, then the daemon cannot write ahead that the
    session writes in place, so it refuses (EIO), and the resume gives the lock back
    untouched: the handle unmapped (remap_all maps it again), the store COMMITTED at its
    generation, never TORN, its bytes the last commit's."""
    disk = tmp_path / "state"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(disk)], check=True)
    try:
        start(manager, mnt, str(disk))
        assert until(lambda: os.path.exists(os.path.join(mnt, "device")))
        s = os.path.join(mnt, "s")
        commit_zeros(s)
        with gmsfs.connect(s, "rw", timeout=5) as w:  # an image bigger than the page the
            w.meta_put("big", "w", 0, bytes(64 << 10))  # resume frees (its readers file)
            w.commit()
        c = gmsfs.connect(s, "ro", timeout=5)
        c.import_all()
        c.pause()
        gen = state(s)["generation"]
        fd = os.open(disk / "filler", os.O_WRONLY | os.O_CREAT)  # the disk full
        try:
            while os.write(fd, bytes(4096)):
                pass
        except OSError as e:
            assert e.errno == errno.ENOSPC
        os.close(fd)
        with pytest.raises(gmsfs.GmsfsError) as e:
            c.resume("data", timeout=5)
        assert e.value.errno == errno.EIO, e.value
        assert not c.paused and c.lock_mode is None
        st = state(s)
        assert (st["state"], st["torn"], st["generation"], st["writer"]) == ("COMMITTED", "0", gen, "0"), st
        os.unlink(disk / "filler")
        c.remap_all(timeout=5)
        assert c.lock_mode == "ro" and bytes(c.buffer(c.find("w").ptr, MiB)) == bytes(MiB)
        c.close()
        manager.kill(signal.SIGTERM)
    finally:
        subprocess.run(["umount", "-l", str(disk)])


def test_abort_after_an_in_place_write_keeps_the_session_and_says_torn(mnt):
    daemon = serve(mnt)
    s = os.path.join(mnt, "s")
    commit_zeros(s)
    out = subprocess.run(["bash", "-ec", '''exec 9>"$0/lock"
printf XY | dd of="$0/allocs/w" conv=notrunc status=none
echo > "$0/abort"
sed -n 's/^\\(state\\|torn\\): //p' "$0/state" | tr "\\n" " "
echo > "$0/commit"''', s], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.split() == ["RW", "1"], out  # the abort could not put XY back
    st = state(s)
    assert (st["state"], st["torn"], st["generation"]) == ("COMMITTED", "0", "2"), st
    with open(os.path.join(s, "allocs", "w"), "rb") as f:
        assert f.read(2) == b"XY"
    # Abort, then the session's end: torn.
    out = subprocess.run(["bash", "-ec", 'exec 9>"$0/lock"; printf Z | dd of="$0/allocs/w" conv=notrunc status=none; '
                          'echo > "$0/abort"; sed -n "s/^last_error: //p" "$0/state"', s],
                         capture_output=True, text=True, check=True)
    assert out.stdout.startswith("aborted: TORN: it wrote into generation 2's bytes in place"), out.stdout
    assert until(lambda: state(s)["writer"] == "0")
    assert refused(s)["last_error"].startswith("writer left without commit: TORN")
    unmount(mnt, daemon)


@pytest.mark.parametrize("when", ["mid-session", "after"])
@pytest.mark.parametrize("how", ["sigkill", "takeover"])
def test_a_restart_keeps_a_store_torn(mnt, manager, tmp_path, how, when):
    sd = str(tmp_path / "state")
    if how == "sigkill":
        start(manager, mnt, sd)
    else:
        serve(mnt)
    assert until(lambda: os.path.exists(os.path.join(mnt, "device")))
    s, other = os.path.join(mnt, "s"), os.path.join(mnt, "other")
    commit_zeros(s)
    commit_zeros(other, 4096)
    w = subprocess.Popen([sys.executable, "-c", FILE_WRITER, s], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         text=True, env=ENV)
    assert w.stdout.readline().strip() == "half"
    if when == "after":
        w.kill()
        w.wait()
        assert until(lambda: state(s)["state"] == "TORN")
    if how == "sigkill":
        restart(manager, mnt, sd)
    else:
        _, old = takeover(mnt)
        assert until(lambda: not os.path.exists("/proc/%d" % old) or
                     open("/proc/%d/stat" % old).read().rsplit(")", 1)[1].split()[0] == "Z")
    w.kill()
    w.wait()
    assert until(lambda: os.path.exists(os.path.join(s, "state")) and state(s)["writer"] == "0")
    refused(s)
    assert state(other)["state"] == "COMMITTED"  # the other store is whole
    subprocess.run(["bash", "-ec", 'exec 9>"$0/lock"; echo > "$0/commit"', s], check=True)
    assert state(s)["state"] == "COMMITTED" and state(s)["torn"] == "0"
    if how == "sigkill":  # healed, and the heal outlives a restart too
        restart(manager, mnt, sd)
        assert until(lambda: os.path.exists(os.path.join(s, "state")))
        assert state(s)["state"] == "COMMITTED" and state(s)["torn"] == "0"
        manager.kill(signal.SIGTERM)
    else:
        subprocess.run(["umount", mnt], check=True)
