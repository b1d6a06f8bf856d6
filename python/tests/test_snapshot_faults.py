"""Snapshots and copies when a daemon dies under them, and who may read a snapshot (issue
60; gmsfs-load(1)), on the host backend.  A daemon SIGKILLed mid save, restore or copy:
the command ends (no wait on a dead mount); it fails and says why, or, where it held the
source's bytes mapped already (a save, a copy's source), it finishes with them whole; a
failed save leaves no manifest (nothing restores from it); the target's daemon, started
again from its state under a service manager, has the target uncommitted, never a part
of the bytes committed; the source's store comes back whole."""
import ctypes
import os
import shutil
import signal
import stat
import subprocess
import tempfile
import time

import pytest

from conftest import BUILD, let_go_of_mount, mounted
from manager import Manager
import gmsfs
from gmsfs._fields import read_fields

MiB = 1 << 20
SNAP = os.path.join(BUILD, "gmsfs-snapshot")
SIZES = [64 * MiB] * 12  # big enough that a kill lands mid-way, small enough for CI


def state(store):
    return read_fields(os.path.join(store, "state"))


def publish(store):
    os.mkdir(store)
    with gmsfs.connect(store, "rw") as c:
        for i, n in enumerate(SIZES):
            m = c.create("w%02d" % i, n)
            ctypes.memset(m.ptr, i + 1, n)
        c.meta_put("cfg", "w00", 0, b'{"v": 1}')
        c.commit()
        return c.layout_hash


class Served:
    """A mount whose daemon runs under a Manager with -o state=: killed and started again."""

    def __init__(self, request, tmp):
        self.mnt = tempfile.mkdtemp(prefix="gmsfs-snapfault.")
        self.state = os.path.join(tmp, os.path.basename(self.mnt) + ".state")
        self.m = Manager()
        self.request = request
        self.start()

    def start(self):
        self.m.start(self.mnt, "backend=host", "max_bytes=2G", "state=" + self.state)

    def kill(self):
        self.m.kill(signal.SIGKILL)
        subprocess.run(["umount", "-l", self.mnt], capture_output=True)  # a crash leaves a dead mount

    def close(self):
        self.m.close()
        let_go_of_mount(self.mnt, self.request)


@pytest.fixture
def served(request, tmp_path):
    made = []
    yield lambda: made.append(Served(request, str(tmp_path))) or made[-1]
    for s in made:
        s.close()


def killed_midway(argv, daemon, again=None, may_finish=False, delays=(0.02, 0.05, 0.1, 0.2, 0.4, 0.8),
                  before=None):
    """Run argv and SIGKILL daemon's daemon after each delay in turn until a kill lands while
    argv still runs; argv must then end within 30 s, failing (or, may_finish, as it will).
    The daemon is started again after each kill; again() undoes a run that finished first;
    before() is called before each run.  Returns (argv's exit status, its stderr), or None
    if every run finished before its kill."""
    for delay in delays:
        if before:
            before()
        p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        time.sleep(delay)
        running = p.poll() is None
        daemon.kill()
        try:
            _, err = p.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
            pytest.fail("%s waited on a dead daemon for 30 s" % " ".join(argv[:2]))
        daemon.start()
        if running:
            assert may_finish or p.returncode != 0, "%s succeeded though its daemon died mid-way" % " ".join(argv[:2])
            assert p.returncode == 0 or err.strip(), "%s failed and said nothing" % " ".join(argv[:2])
            return p.returncode, err
        assert p.returncode == 0, err
        if again:
            again()
    return None


def test_a_save_whose_daemon_dies_leaves_no_manifest_or_a_whole_snapshot(served, tmp_path):
    d = served()
    src = os.path.join(d.mnt, "src")
    h = publish(src)
    d2 = served()
    dst = os.path.join(d2.mnt, "dst")
    os.mkdir(dst)
    out = str(tmp_path / "snap")
    manifest = os.path.join(out, "manifest.json")
    runs = {0: 0, 1: 0}
    seen = {}

    def note_manifest():  # an earlier run's, if one finished: the save about to run finds it
        seen["before"] = os.stat(manifest) if os.path.exists(manifest) else None
    for _ in range(4):  # both ends, where the timing gives them
        got = killed_midway([SNAP, "save", "-q", src, out], d, may_finish=True, before=note_manifest)
        assert got is not None, "the save always finished before the kill"
        rc, err = got
        runs[rc != 0] += 1
        r = subprocess.run([SNAP, "restore", "-q", dst, out], capture_output=True, text=True, timeout=60)
        old = seen["before"]
        if rc and os.path.exists(manifest):  # failed before it touched the folder (the daemon died
            now = os.stat(manifest)          # under its connect): the earlier whole save, as it was
            assert old and (now.st_ino, now.st_mtime_ns) == (old.st_ino, old.st_mtime_ns), err
            assert r.returncode == 0 and state(dst)["layout_hash"] == h, r.stderr
            os.rmdir(dst)
            os.mkdir(dst)
        elif rc:  # failed: no manifest, nothing restores from it, the target untouched
            assert r.returncode != 0 and "manifest" in r.stderr, r.stderr
            assert state(dst)["state"] == "EMPTY"
        else:  # it had the bytes mapped: whole, checked by the restore
            assert r.returncode == 0 and state(dst)["layout_hash"] == h, r.stderr
            os.rmdir(dst)
            os.mkdir(dst)
    print("saves whose daemon died: %d failed, %d finished whole" % (runs[1], runs[0]))
    # The source came back whole with its daemon; a save now completes.
    assert state(src)["layout_hash"] == h and state(src)["state"] == "COMMITTED"
    subprocess.run([SNAP, "save", "-q", src, out], check=True, timeout=120)
    subprocess.run([SNAP, "restore", "-q", dst, out], check=True, timeout=120)
    assert state(dst)["layout_hash"] == h


@pytest.mark.parametrize("how", ["restore", "copy"])
def test_a_target_whose_daemon_dies_comes_back_uncommitted(served, tmp_path, how):
    a, b = served(), served()
    src, dst = os.path.join(a.mnt, "src"), os.path.join(b.mnt, "dst")
    h = publish(src)
    # Another model on the target's mount: a manager that hands the daemon no descriptor
    # at all is a stopped service, whose images go (gmsfs(5), A restart under systemd).
    other = os.path.join(b.mnt, "other")
    os.mkdir(other)
    with gmsfs.connect(other, "rw") as c:
        c.create("w", MiB)
        c.commit()
    snap = str(tmp_path / "snap")
    subprocess.run([SNAP, "save", "-q", src, snap], check=True, timeout=120)
    os.mkdir(dst)
    argv = [SNAP, "restore", "-q", dst, snap] if how == "restore" else [SNAP, "copy", "-q", src, dst]
    got = killed_midway(argv, b, again=lambda: (os.rmdir(dst), os.mkdir(dst)))
    assert got is not None, "the %s always finished before the kill" % how
    st = state(dst)  # the daemon started again from its state: the session rolled back
    assert (st["state"], st["allocations"], st["layout_hash"]) == ("EMPTY", "0", ""), st
    assert state(src)["layout_hash"] == h
    subprocess.run(argv, check=True, timeout=120)  # and whole afterwards
    assert state(dst)["layout_hash"] == h


def test_a_copy_whose_source_daemon_dies_commits_nothing_or_the_whole(served):
    a, b = served(), served()
    src, dst = os.path.join(a.mnt, "src"), os.path.join(b.mnt, "dst")
    h = publish(src)
    os.mkdir(dst)
    got = killed_midway([SNAP, "copy", "-q", src, dst], a, again=lambda: (os.rmdir(dst), os.mkdir(dst)),
                        may_finish=True)
    assert got is not None, "the copy always finished before the kill"
    for _ in range(100):  # the target's daemon sees the copier's end
        if state(dst)["writer"] == "0":
            break
        time.sleep(0.05)
    st = state(dst)
    if got[0]:
        assert (st["state"], st["allocations"]) == ("EMPTY", "0"), st
    else:  # it had the source mapped: the whole of it, committed with its hash
        assert (st["state"], st["layout_hash"]) == ("COMMITTED", h), st
    assert state(src)["layout_hash"] == h  # the source's daemon came back with it whole


def test_a_snapshot_is_readable_only_by_whom_its_folder_lets_in(tmp_path):
    """A snapshot holds a model's bytes: a folder save makes is its owner's alone (0700,
    its files 0600, whatever the umask), and another user reads nothing of it; in a folder
    made beforehand, its files take the folder's permissions (less execute): a group the
    folder lets in reads them."""
    gen = mounted("backend=host", "max_bytes=1G")
    mnt = next(gen)
    try:
        src = os.path.join(mnt, "src")
        os.mkdir(src)
        with gmsfs.connect(src, "rw") as c:
            m = c.create("w", MiB)
            ctypes.memset(m.ptr, 7, MiB)
            c.meta_put("k", "w", 0, b"v")
            c.commit()
        base = tempfile.mkdtemp(prefix="gmsfs-snapmode.")  # every folder above it open to all
        os.chmod(base, 0o755)
        new, shared, gms, open_ = (os.path.join(base, n) for n in ("new", "shared", "gms", "open"))
        for d, mode in ((shared, 0o750), (open_, 0o755)):
            os.mkdir(d)
            os.chmod(d, mode)
        old = os.umask(0)
        try:
            for argv in ([SNAP, "save", "-q", src, new], [SNAP, "save", "-q", src, shared],
                         [SNAP, "save", "--gms", "-q", src, gms], [SNAP, "save", "-q", src, open_]):
                subprocess.run(argv, check=True, timeout=60)
        finally:
            os.umask(old)

        def modes(top):
            out = {}
            for d, _, files in os.walk(top):
                out[d] = stat.S_IMODE(os.stat(d).st_mode)
                for f in files:
                    out[os.path.join(d, f)] = stat.S_IMODE(os.stat(os.path.join(d, f)).st_mode)
            return out
        for top in (new, gms):
            got = modes(top)
            assert len(got) > 2 and all(m == (0o700 if os.path.isdir(p) else 0o600) for p, m in got.items()), got
        got = modes(shared)
        assert all(m == (0o750 if os.path.isdir(p) else 0o640) for p, m in got.items()), got
        def read_as_nobody(top):
            shard = next(p for p in modes(top) if p.endswith(".bin"))
            return subprocess.run(["cat", shard], capture_output=True, preexec_fn=lambda: os.setuid(65534))
        r = read_as_nobody(new)
        assert r.returncode != 0 and b"Permission denied" in r.stderr, r
        assert read_as_nobody(open_).returncode == 0  # the folder lets everyone in: so do its files
        shutil.rmtree(base)
        os.rmdir(src)
    finally:
        next(gen, None)
