"""A committed store copied into an empty one on another mount (gmsfs.copy, gmsfs-snapshot
copy, gmsfsctl copy; issue 60), on the host backend: two daemons, as two GPUs' mounts."""
import ctypes
import errno
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import BUILD, ROOT, mounted
import gmsfs
from gmsfs.ctl import read_fields

MiB = 1 << 20
SNAP = os.path.join(BUILD, "gmsfs-snapshot")
CTL = os.path.join(ROOT, "tools", "gmsfsctl")


@pytest.fixture(scope="module")
def second():
    yield from mounted()


@pytest.fixture
def pair(mount, second):
    """A committed source on the first mount (two allocations, entries), an empty target on
    the second; removed after."""
    src, dst = os.path.join(mount, "copy-src"), os.path.join(second, "copy-dst")
    os.mkdir(src)
    os.mkdir(dst)
    with gmsfs.connect(src, "rw") as c:
        a = c.create("layers/0/w", 3 * MiB + 5, tag="weights")
        b = c.create("kv", 4096, tag="kv_cache")
        ctypes.memmove(a.ptr, bytes(range(256)) * (3 * 4096) + b"tail!", a.size)
        ctypes.memset(b.ptr, 0x42, 4096)
        c.meta_put_many([("cfg/json", "layers/0/w", 16, '{"dtype": "f16"}', 64), ("plain", "kv")])
        c.commit()
    yield src, dst
    for p in (src, dst):
        if os.path.exists(p):
            os.rmdir(p)


def state(store):
    return read_fields(os.path.join(store, "state"))


def same(src, dst):
    with gmsfs.connect(src, "ro") as a, gmsfs.connect(dst, "ro") as b:
        a.import_all()
        b.import_all()
        names = sorted(m.name for m in a.mappings)
        assert names == sorted(m.name for m in b.mappings)
        for n in names:
            x, y = a.find(n), b.find(n)
            assert (x.tag, x.size) == (y.tag, y.size) and bytes(a.buffer(x.ptr, x.size)) == bytes(b.buffer(y.ptr, y.size))
        assert a.meta_get("cfg/json").value == b.meta_get("cfg/json").value
        return a.layout_hash == b.layout_hash


def test_gmsfs_copy_fills_an_empty_store_with_the_same_layout(pair):
    src, dst = pair
    how = gmsfs.copy(src, dst, timeout=10)
    assert "host memory" in how and state(dst)["state"] == "COMMITTED" and same(src, dst)


def test_a_copy_carries_the_content_hash_its_source_knows(pair, mount, second):
    """A source whose daemon knows its content hash: the target is known by it after the
    copy (the same bytes), the value gmsfs_digest computes from the target's own bytes; a
    source whose hash is not known leaves the target's unknown, never guessed."""
    src, dst = pair
    h = gmsfs.digest(src)
    gmsfs.copy(src, dst, timeout=10)
    assert gmsfs.content_hash(dst) == h == gmsfs.digest(dst, record=False)
    other = os.path.join(second, "copy-dst2")
    os.mkdir(other)
    try:
        os.removexattr(src, "user.gms.content_hash")
        gmsfs.copy(src, other, timeout=10)
        assert gmsfs.content_hash(other) is None and gmsfs.digest(other, record=False) == h
    finally:
        os.rmdir(other)


def test_gmsfs_copy_reports_what_it_did_and_checks_its_options(pair):
    """The C call as a C program makes it: an options struct and a report, each with its
    size; a wrong size, a flag or a reserved field is EINVAL with words in
    gmsfs_errmsg(NULL), and nothing is copied."""
    from gmsfs import _lib
    lib, src, dst = _lib.load_lib(), pair[0], pair[1]

    def copy(report=None, **fields):
        opt = _lib.sized(_lib.CopyOptions, timeout_ms=10000)
        for k, v in fields.items():
            setattr(opt, k, v)
        e = lib.gmsfs_copy(src.encode(), dst.encode(), ctypes.byref(opt), report and ctypes.byref(report))
        return errno.errorcode.get(-e, e), _lib.side_errmsg(lib)

    assert copy(size=12) == ("EINVAL", "gmsfs_copy: options of 12 bytes: this libgmsfs-load knows %d (set .size, "
                             "or start from GMSFS_COPY_OPTIONS)" % ctypes.sizeof(_lib.CopyOptions))
    assert copy(flags=1) == ("EINVAL", "gmsfs_copy: flags 0x1, reserved 0x0: none is known yet, both 0")
    assert copy(reserved=7)[0] == "EINVAL"
    small = _lib.sized(_lib.Report)
    small.size = 100
    assert copy(small)[0] == "EINVAL" and "a report of 100 bytes" in copy(small)[1]
    assert state(dst)["state"] == "EMPTY"
    report = _lib.sized(_lib.Report)
    assert copy(report) == (0, "")
    with gmsfs.connect(src, "ro") as c:
        c.import_all()
        assert report.layout_hash.decode() == c.layout_hash and report.allocations == len(c.mappings) == 2
        assert report.bytes == sum(m.size for m in c.mappings) and report.seconds >= report.bytes_seconds > 0
    assert report.how.decode().startswith("host memory to host memory; %d bytes in " % report.bytes)
    assert copy()[0] == "EEXIST" and "holds allocations already" in _lib.side_errmsg(lib)


def test_a_target_with_allocations_is_refused_and_left_as_it_was(pair):
    src, dst = pair
    with gmsfs.connect(dst, "rw") as c:
        c.create("mine", 4096)
        c.commit()
        h = c.layout_hash
    with pytest.raises(gmsfs.GmsfsError) as e:
        gmsfs.copy(src, dst)
    assert e.value.errno == errno.EEXIST and "holds allocations already" in str(e.value)
    assert state(dst)["layout_hash"] == h and state(dst)["writer"] == "0"


def test_source_and_target_swapped_is_refused_at_once(pair):
    """The committed store given as the target and the empty one as the source: refused at
    once (EEXIST), not left waiting for the empty source's first commit; nothing changes."""
    src, dst = pair
    h = state(src)["layout_hash"]
    t = time.monotonic()
    r = subprocess.run([CTL, "copy", dst, src], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "holds allocations already" in r.stderr, r.stderr
    assert time.monotonic() - t < 5
    assert state(src)["layout_hash"] == h and state(dst)["state"] == "EMPTY"


def test_the_commands_say_how_the_bytes_went(pair):
    src, dst = pair
    r = subprocess.run([CTL, "copy", src, dst], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "host memory to host memory" in r.stdout, r.stderr
    assert same(src, dst)
    os.rmdir(dst)
    os.mkdir(dst)
    r = subprocess.run([SNAP, "copy", src, dst], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "%s -> %s: host memory to host memory" % (src, dst) in r.stdout, r.stderr
    assert same(src, dst)
    r = subprocess.run([CTL, "copy", os.path.join(os.path.dirname(src), "nothing-here"), dst], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 1 and "gmsfsctl: copy" in r.stderr


def test_a_source_with_nothing_committed_times_out_and_changes_nothing(mount, second):
    src, dst = os.path.join(mount, "copy-empty"), os.path.join(second, "copy-dst2")
    os.mkdir(src)
    os.mkdir(dst)
    try:
        t = time.monotonic()
        with pytest.raises(gmsfs.GmsfsError) as e:
            gmsfs.copy(src, dst, timeout=0.3)
        assert e.value.errno == errno.ETIMEDOUT and time.monotonic() - t < 5
        assert state(dst)["state"] == "EMPTY" and state(src)["state"] == "EMPTY"
    finally:
        os.rmdir(src)
        os.rmdir(dst)


def test_a_copier_killed_midway_leaves_the_target_uncommitted_and_the_source_whole(mount, second):
    """SIGKILL while the bytes go: the target's session rolls back (nothing committed,
    nothing held), the source keeps its layout and its readers' lock is back."""
    src, dst = os.path.join(mount, "copy-big"), os.path.join(second, "copy-big-dst")
    os.mkdir(src)
    os.mkdir(dst)
    try:
        with gmsfs.connect(src, "rw") as c:
            for i in range(8):
                m = c.create("w%d" % i, 128 * MiB)
                ctypes.memset(m.ptr, i + 1, m.size)
            c.commit()
            h = c.layout_hash
        killed = 0
        for delay in (0.05, 0.1, 0.2, 0.4):
            p = subprocess.Popen([SNAP, "copy", src, dst, "-q"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(delay)
            p.send_signal(signal.SIGKILL)
            p.wait()
            if p.returncode == -signal.SIGKILL:
                killed += 1
                for _ in range(100):  # the daemons see the copier's end
                    if state(dst)["writer"] == "0" and state(src)["readers"] == "0":
                        break
                    time.sleep(0.05)
                assert state(dst)["state"] == "EMPTY" and state(dst)["allocations"] == "0", state(dst)
                assert state(src)["state"] == "COMMITTED" and state(src)["layout_hash"] == h
            elif state(dst)["state"] == "COMMITTED":
                os.rmdir(dst)  # done before the kill: again, into a fresh target
                os.mkdir(dst)
        assert killed, "the copy always finished before its kill"
        gmsfs.copy(src, dst)  # and whole afterwards
        assert state(dst)["layout_hash"] == h
    finally:
        os.rmdir(src)
        os.rmdir(dst)


@pytest.fixture(scope="module")
def gpu_a():
    yield from mounted("backend=host", "device=host-snap-a")


@pytest.fixture(scope="module")
def gpu_b():
    yield from mounted("backend=host", "device=host-snap-b")


def committed(path, fill):
    os.mkdir(path)
    with gmsfs.connect(path, "rw") as c:
        m = c.create("w", 2 * MiB + 7, tag="weights")
        ctypes.memset(m.ptr, fill, m.size)
        c.meta_put("k", "w", 1, b"v%d" % fill)
        c.commit()
        return c.layout_hash


def test_several_stores_at_once_in_one_process(gpu_a, gpu_b, tmp_path):
    """save and restore of several STORE DIR pairs: every pair at once in one process (a
    group's ranks), each said; a restore that fails is named and the others commit, each
    with --version's name; an even count of paths, or pairs with --gms, is a usage error."""
    src = [os.path.join(gpu_a, "p"), os.path.join(gpu_b, "q")]
    hashes = [committed(s, 10 + k) for k, s in enumerate(src)]
    dirs = [str(tmp_path / "p"), str(tmp_path / "q")]
    r = subprocess.run([SNAP, "save", src[0], dirs[0], src[1], dirs[1]], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.count(" -> ") == 2, (r.stdout, r.stderr)
    dst = [os.path.join(gpu_a, "p2"), os.path.join(gpu_b, "q2")]
    for d in dst:
        os.mkdir(d)
    r = subprocess.run([SNAP, "restore", dst[0], dirs[0], dst[1], dirs[1], "--version", "v7", "-q"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout == "", (r.stdout, r.stderr)
    for d, h in zip(dst, hashes):
        assert state(d)["layout_hash"] == h and gmsfs.committed_version(d) == "v7", d
    # Into p2 again (it holds allocations now) and an empty q3: p2 named, q3 restored.
    os.mkdir(os.path.join(gpu_b, "q3"))
    r = subprocess.run([SNAP, "restore", dst[0], dirs[0], os.path.join(gpu_b, "q3"), dirs[1]], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 1 and "%s: " % dst[0] in r.stderr and "holds allocations already" in r.stderr, r.stderr
    assert "q3 <- " in r.stdout and state(os.path.join(gpu_b, "q3"))["layout_hash"] == hashes[1]
    for bad in ([SNAP, "restore", dst[0], dirs[0], dst[1]], [SNAP, "save", "--gms", src[0], dirs[0], src[1], dirs[1]]):
        r = subprocess.run(bad, capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 and "usage" in r.stderr, bad
    # One snapshot written by two threads, or one store restored twice: refused, nothing done.
    q4 = os.path.join(gpu_b, "q4")
    os.mkdir(q4)
    for bad, what in (([SNAP, "save", src[0], dirs[0], src[1], dirs[0] + "/."], "DIR"),
                      ([SNAP, "restore", q4, dirs[0], q4, dirs[1]], "STORE")):
        r = subprocess.run(bad, capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 and "one %s named twice" % what in r.stderr, (bad, r.stderr)
    assert state(q4)["state"] == "EMPTY" and json.load(open(os.path.join(dirs[0], "manifest.json")))["layout_hash"] == \
        hashes[0]
    os.rmdir(q4)
    for d in src + dst + [os.path.join(gpu_b, "q3")]:
        os.rmdir(d)


def test_every_store_of_every_gpu_in_one_command(gpu_a, gpu_b, tmp_path):
    """save --all: each mount's committed stores into DIR/<its uuid>/<store>, the GPUs at
    once; restore --all: back into the mounts of those uuids, every byte checked; a store
    that holds allocations already is named and the others restore."""
    hashes = {os.path.join(gpu_a, "x"): committed(os.path.join(gpu_a, "x"), 1),
              os.path.join(gpu_a, "y"): committed(os.path.join(gpu_a, "y"), 2),
              os.path.join(gpu_b, "z"): committed(os.path.join(gpu_b, "z"), 3)}
    os.mkdir(os.path.join(gpu_a, "empty"))
    snap = tmp_path / "all"
    r = subprocess.run([SNAP, "save", "--all", str(snap), gpu_a, gpu_b], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert sorted(os.listdir(snap)) == ["host-snap-a", "host-snap-b"]
    assert sorted(os.listdir(snap / "host-snap-a")) == ["x", "y"] and os.listdir(snap / "host-snap-b") == ["z"]
    assert r.stdout.count(" -> ") == 3
    for s in hashes:
        os.rmdir(s)
    os.mkdir(os.path.join(gpu_a, "y"))
    with gmsfs.connect(os.path.join(gpu_a, "y"), "rw") as c:  # y holds something else now
        c.create("other", 4096)
        c.commit()
    r = subprocess.run([SNAP, "restore", "--all", str(snap), gpu_a, gpu_b], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "/y: " in r.stderr and "holds allocations already" in r.stderr, r.stderr
    for s, h in hashes.items():
        if not s.endswith("/y"):
            assert state(s)["layout_hash"] == h, s
    # Only gpu_a's mount named: gpu_b's stores in the snapshot are skipped, said, exit 1.
    for s in hashes:
        if not s.endswith("/y"):
            os.rmdir(s)
    r = subprocess.run([SNAP, "restore", "--all", str(snap), gpu_a], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "no mount here serves GPU host-snap-b: its stores were not restored" in r.stderr, \
        r.stderr
    assert "/x <- " in r.stdout and state(os.path.join(gpu_a, "x"))["layout_hash"] == hashes[os.path.join(gpu_a, "x")]
    # A mount the snapshot has nothing of is said on stdout, and is no failure.
    os.rmdir(os.path.join(gpu_a, "x"))
    os.rmdir(os.path.join(gpu_a, "y"))
    os.mkdir(os.path.join(gpu_a, "y"))
    r = subprocess.run([SNAP, "restore", "--all", str(snap / "host-snap-a" / ".."), gpu_b], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 1 and "GPU host-snap-a" in r.stderr and "/z <- " in r.stdout, (r.stdout, r.stderr)
    empty = tmp_path / "none"
    (empty / "host-other").mkdir(parents=True)
    r = subprocess.run([SNAP, "restore", "--all", str(empty), gpu_b], capture_output=True, text=True, timeout=60)
    assert "%s (GPU host-snap-b): nothing of it in %s" % (gpu_b, empty) in r.stdout, r.stdout
    r = subprocess.run([SNAP, "save", "--all"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "usage" in r.stderr
    os.rmdir(os.path.join(gpu_a, "y"))
    for s in hashes:
        if os.path.isdir(s):
            os.rmdir(s)
    os.rmdir(os.path.join(gpu_a, "empty"))
