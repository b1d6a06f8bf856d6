"""Versions (user.gms.versions 2, gmsfs(5) VERSIONS) and pauses on the host backend: a
data-only writer builds the next version while readers keep reading the last commit,
untouched; only the allocations it writes are copied; its commit leaves each reader on
the version it maps until that reader flips (the changed allocations mapped again at the
same addresses); the version before goes with its last reader; a writer killed mid-way
leaves the last commit whole (never TORN); the copies count against the store's quota.
Paused readers and a trainer that pauses between in-place refits: a trainer killed
mid-refit leaves the store TORN, never a mix served.  Readers run in processes of their
own, as engines do."""
import errno
import json
import os
import random
import signal
import subprocess
import sys
import time

import pytest

import gmsfs
from conftest import ROOT, mounted, remove_stores, until

NAMES = ["a", "b", "c"]
SIZE = 1 << 20

# A reader: imports the store, then on each line of stdin: "read" (each allocation's
# distinct byte values and its address), "flip", "pause", "resume SECONDS"; it prints one
# JSON line each.
READER = r"""
import gmsfs, json, sys
c = gmsfs.connect(sys.argv[1], "ro", timeout=10)
c.import_all()
def read():
    out = {}
    for m in c.mappings:
        b = bytes(c.buffer(m.ptr, m.size))
        out[m.name] = {"values": sorted(set(b)), "ptr": m.ptr}
    return out
print(json.dumps({"ready": c.generation}), flush=True)
for line in sys.stdin:
    w = line.split()
    try:
        if w[0] == "read":
            print(json.dumps(read()), flush=True)
        elif w[0] == "flip":
            n = c.flip()
            print(json.dumps({"changed": n, "generation": c.generation}), flush=True)
        elif w[0] == "pause":
            c.pause()
            print(json.dumps({"paused": c.paused}), flush=True)
        elif w[0] == "resume":
            c.resume("ro", float(w[1]))
            print(json.dumps({"generation": c.generation}), flush=True)
    except gmsfs.GmsfsError as e:
        print(json.dumps({"errno": e.errno, "error": str(e)}), flush=True)
"""

# A writer of a data-only session in a process of its own (a process the test starts
# after it, a reader, is not of its session): "write NAME VALUE", "commit".
WRITER = r"""
import gmsfs, json, sys
c = gmsfs.connect(sys.argv[1], "data", timeout=0)
print(json.dumps({"ready": c.generation}), flush=True)
for line in sys.stdin:
    w = line.split()
    try:
        if w[0] == "write":
            m = c.import_one(w[1])
            c.buffer(m.ptr, m.size, writable=True)[:] = bytes([int(w[2])]) * m.size
        elif w[0] == "commit":
            c.commit()
        print(json.dumps({"generation": c.generation}), flush=True)
    except gmsfs.GmsfsError as e:
        print(json.dumps({"errno": e.errno, "error": str(e)}), flush=True)
"""


class Reader:
    def __init__(self, store, code=READER):
        env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
        self.p = subprocess.Popen([sys.executable, "-c", code, store], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True, env=env)
        self.generation = self._read()["ready"]

    def __del__(self):
        if self.p.poll() is None:
            self.p.kill()
            self.p.wait()

    def _read(self):
        line = self.p.stdout.readline()
        assert line, "the reader ended"
        return json.loads(line)

    def ask(self, what):
        self.p.stdin.write(what + "\n")
        self.p.stdin.flush()
        return self._read()

    def close(self):
        self.p.stdin.close()
        assert self.p.wait(20) == 0


def state(store):
    with open(os.path.join(store, "state")) as f:
        return dict(line.split(": ", 1) for line in f.read().splitlines() if ": " in line)


def publish(store, values=(1, 2, 3)):
    with gmsfs.connect(store, "rw", timeout=5) as c:
        for name, v in zip(NAMES, values):
            m = c.create(name, SIZE)
            c.buffer(m.ptr, SIZE, writable=True)[:] = bytes([v]) * SIZE
        c.commit()


def values(view):
    return {name: v["values"] for name, v in view.items()}


def versions(store, n):
    os.setxattr(store, "user.gms.versions", str(n).encode())


def rmdir_when_let_go(store, tries=100):
    """A store a test made beside its own, removed once its last process let it go."""
    for _ in range(tries):
        try:
            os.rmdir(store)
            return
        except OSError:
            time.sleep(0.05)


def write(c, name, value):
    """The writer's copy of allocation name, filled with value."""
    m = c.import_one(name)
    c.buffer(m.ptr, SIZE, writable=True)[:] = bytes([value]) * SIZE


def a_version_beside(store, name, value):
    """A published store with versions, a reader on it, and the next version committed
    beside it (name written with value): the reader, on the version before."""
    publish(store)
    versions(store, 2)
    r = Reader(store)
    with gmsfs.connect(store, "data", timeout=0) as w:
        write(w, name, value)
        w.commit()
    return r


def test_versions_is_off_by_default_and_takes_only_1_or_2(store):
    publish(store)
    assert os.getxattr(store, "user.gms.versions") == b"1"
    assert "user.gms.versions" in os.listxattr(store)
    r = Reader(store)
    # Off: a data-only writer waits for the readers, as every writer does.
    with pytest.raises(gmsfs.GmsfsError) as e:
        gmsfs.connect(store, "data", timeout=0.3)
    assert e.value.errno in (errno.EAGAIN, errno.ETIMEDOUT), e.value
    for bad in (b"0", b"3", b"two", b"", b"22"):
        with pytest.raises(OSError) as e:
            os.setxattr(store, "user.gms.versions", bad)
        assert e.value.errno == errno.EINVAL, bad
    assert os.getxattr(store, "user.gms.versions") == b"1" and "user.gms.versions" in state(store)["last_error"]
    versions(store, 2)
    assert state(store)["versions"] == "2"
    os.removexattr(store, "user.gms.versions")
    assert os.getxattr(store, "user.gms.versions") == b"1"
    r.close()


def test_a_next_version_is_built_beside_readers_who_flip_when_they_choose(store):
    publish(store)
    versions(store, 2)
    r = Reader(store)
    before = r.ask("read")
    used = int(state(store)["used"])
    w = Reader(store, WRITER)  # granted at once, the reader reading
    st = state(store)
    assert (st["state"], st["beside"], st["readers"]) == ("RW", "1", "1"), st
    assert w.ask("write b 68") == {"generation": 1}
    st = state(store)
    assert (st["version_copies"], st["version_copied_bytes"]) == ("1", str(SIZE)), st
    assert int(st["used"]) == used + SIZE  # the copy counts in the store's use
    assert r.ask("read") == before  # the reader reads the last commit, untouched
    # A reader that comes now is granted, and reads the last commit too.
    r2 = Reader(store)
    assert values(r2.ask("read")) == values(before)
    with open(os.path.join(store, "allocs", "b"), "rb") as f:  # and a cat of it
        assert set(f.read()) == {2}
    assert w.ask("commit") == {"generation": 2}
    w.close()
    st = state(store)
    assert (st["generation"], st["prev_handles"], st["prev_generation"]) == ("2", "2", "1"), st
    assert r.ask("read") == before  # not flipped: the version it maps, whole
    flip = r.ask("flip")
    assert flip == {"changed": 1, "generation": 2}, flip
    after = r.ask("read")
    assert after["b"] == {"values": [0x44], "ptr": before["b"]["ptr"]}  # the same address
    assert after["a"] == before["a"] and after["c"] == before["c"]
    assert r.ask("flip") == {"changed": 0, "generation": 2}  # on the last commit already
    assert state(store)["prev_handles"] == "1"
    r2.close()  # the last on the version before leaves: its memory goes
    st = state(store)
    assert (st["prev_handles"], st["flips"]) == ("0", "1") and int(st["used"]) == used, st
    # A reader that comes now reads the new version.
    r3 = Reader(store)
    assert r3.ask("read")["b"]["values"] == [0x44]
    r3.close()
    r.close()


def test_a_writer_that_overwrites_whole_gets_its_next_version_uncopied(store):
    """import_overwrite: the next version's memory of what the writer writes whole is made
    and not filled (no copy of the last commit's bytes); the readers read the last commit
    untouched, and see the writer's bytes once they flip."""
    publish(store)
    versions(store, 2)
    r = Reader(store)
    before = r.ask("read")
    with gmsfs.connect(store, "data", timeout=0) as w:
        with pytest.raises(gmsfs.GmsfsError) as e:
            w.import_overwrite(["a", "nope"])
        assert e.value.errno == errno.ENOENT and "nope" in str(e.value), e.value
        assert state(store)["version_copies"] == "0"  # refused whole: nothing made
        w.import_overwrite(["a", "b"])
        st = state(store)
        assert (st["version_copies"], st["version_overwrites"], st["version_copied_bytes"]) == ("2", "2", "0"), st
        m = w.find("a")
        assert set(bytes(w.buffer(m.ptr, SIZE))) == {0}  # new memory's (the host backend's zeros), not 1
        w.buffer(m.ptr, SIZE, writable=True)[:] = bytes([0x51]) * SIZE
        w.buffer(w.find("b").ptr, SIZE, writable=True)[:] = bytes([0x52]) * SIZE
        write(w, "c", 0x53)  # imported as before: a copy, then written
        st = state(store)
        assert (st["version_copies"], st["version_overwrites"], st["version_copied_bytes"]) == ("3", "2", str(SIZE)), st
        w.import_overwrite(["c"])  # mapped already: left as it is, nothing more made
        assert state(store)["version_copies"] == "3"
        assert r.ask("read") == before  # the last commit, untouched
        w.commit()
    assert r.ask("flip") == {"changed": 3, "generation": 2}
    assert values(r.ask("read")) == {"a": [0x51], "b": [0x52], "c": [0x53]}
    # A reader may not say it overwrites: refused, nothing made.
    with gmsfs.connect(store, "ro") as c:
        with pytest.raises(gmsfs.GmsfsError) as e:
            c.import_overwrite()
        assert e.value.errno == errno.EPERM, e.value
    r.close()


def test_the_next_versions_memory_is_made_between_refits_and_taken_by_the_next(store):
    """-o next_ahead (the default): once the version before is let go, memory for the same
    allocations' next version is made (state's pages_spare: in no store's use), and the next
    session's copies take it; that memory is anyone's room."""
    r = a_version_beside(store, "b", 0x61)
    used = len(NAMES) * SIZE  # the published allocations
    assert state(store)["pages_spare"] == "0"  # the reader is on the version before still
    assert r.ask("flip")["changed"] == 1  # the last on it: it goes, and b's next is made
    assert until(lambda: state(store)["pages_spare"] == str(SIZE)), state(store)
    assert int(state(store)["used"]) == used  # not the store's use
    copies = int(state(store)["version_copies"])
    with gmsfs.connect(store, "data", timeout=0) as w:
        write(w, "b", 0x62)  # its copy: the memory made ahead
        st = state(store)
        assert (st["pages_spare"], int(st["version_copies"]), int(st["used"])) == ("0", copies + 1, used + SIZE), st
        w.commit()
    assert r.ask("flip")["changed"] == 1 and values(r.ask("read"))["b"] == [0x62]
    assert until(lambda: state(store)["pages_spare"] == str(SIZE)), state(store)
    r.close()


def test_memory_made_ahead_is_given_up_to_another_stores_create_and_moves_no_store_out():
    for mnt in mounted("backend=host", "max_bytes=%d" % (8 * SIZE)):
        a, b = os.path.join(mnt, "a"), os.path.join(mnt, "b")
        os.mkdir(a)
        os.mkdir(b)
        r = a_version_beside(a, "c", 9)
        r.ask("flip")
        assert until(lambda: state(a)["pages_spare"] == str(SIZE)), state(a)
        with gmsfs.connect(b, "rw") as c:  # 5 of the 8: room only with what a has ahead
            c.create("x", 5 * SIZE)
            c.commit()
        st = state(a)
        assert (st["pages_spare"], st["tier"], st["state"]) == ("0", "device", "RO"), st
        assert values(r.ask("read")) == {"a": [1], "b": [2], "c": [9]}
        r.close()
    for mnt in mounted("backend=host", "no_next_ahead"):
        with open(os.path.join(mnt, "device")) as f:
            assert ",no_next_ahead" in f.read()


def test_a_second_session_waits_until_the_version_before_is_let_go(store):
    r = a_version_beside(store, "a", 9)
    # Two versions at most: the reader is on the one before.
    with pytest.raises(gmsfs.GmsfsError) as e:
        gmsfs.connect(store, "data", timeout=0.3)
    assert e.value.errno in (errno.EAGAIN, errno.ETIMEDOUT), e.value
    assert r.ask("flip")["changed"] == 1
    with gmsfs.connect(store, "data", timeout=0) as w:
        write(w, "a", 10)
        w.commit()
    assert r.ask("flip")["changed"] == 1 and r.ask("read")["a"]["values"] == [10]
    r.close()


@pytest.mark.parametrize("how", ["kill", "abort"])
def test_a_writer_that_ends_mid_version_leaves_the_last_commit_whole(store, how):
    """Never TORN: the writer wrote copies; the readers' version is as committed."""
    publish(store)
    versions(store, 2)
    r = Reader(store)
    before = r.ask("read")
    used = int(state(store)["used"])
    code = """
import gmsfs, os, signal, sys
c = gmsfs.connect(sys.argv[1], "data", timeout=5)
for name in ("a", "b"):
    p = c.import_one(name).ptr
    c.buffer(p, %d, writable=True)[: %d // 2] = b"\\xee" * (%d // 2)
if sys.argv[2] == "abort":
    open(os.path.join(sys.argv[1], "abort"), "w").write("1")
    print(open(os.path.join(sys.argv[1], "state")).read(), flush=True)
os.kill(os.getpid(), signal.SIGKILL)
""" % (SIZE, SIZE, SIZE)
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
    p = subprocess.run([sys.executable, "-c", code, store, how], env=env, capture_output=True, text=True, timeout=30)
    assert p.returncode == -signal.SIGKILL, p.stderr
    if how == "abort":
        aborted = dict(line.split(": ", 1) for line in p.stdout.splitlines() if ": " in line)
        assert aborted["torn"] == "0" and "rolled back" in aborted["last_error"], aborted
    for _ in range(100):
        st = state(store)
        if st["state"] == "RO":
            break
        time.sleep(0.05)
    assert (st["state"], st["torn"], st["generation"]) == ("RO", "0", "1"), st
    assert int(st["used"]) == used  # the copies went
    assert r.ask("read") == before
    r2 = Reader(store)  # and a new reader is granted the same bytes
    assert values(r2.ask("read")) == values(before)
    r2.close()
    r.close()


def test_the_copies_count_against_the_quota(store):
    publish(store)
    versions(store, 2)
    os.setxattr(store, "user.gms.quota", str(4 * SIZE).encode())
    r = Reader(store)
    with gmsfs.connect(store, "data", timeout=0) as w:
        write(w, "a", 7)  # 4 MiB: room for one copy
        with pytest.raises(gmsfs.GmsfsError) as e:
            w.import_one("b")
        # The door's errno and words, as a create past the quota gets them.
        assert e.value.errno == errno.ENOSPC, e.value
        assert "the store's quota is %d bytes" % (4 * SIZE) in str(e.value), e.value
        assert "a copy for the next version: allocs/b: " in state(store)["last_error"], state(store)["last_error"]
        assert state(store)["version_copies"] == "1"
        w.commit()
    assert r.ask("flip")["changed"] == 1
    assert [r.ask("read")[n]["values"] for n in NAMES] == [[7], [2], [3]]
    r.close()


def test_a_copy_asks_the_door_for_room_as_a_create_does():
    """A version's copy is memory made through the daemon's one door: where the mount is
    full, an idle store moves to the host tier to make room for it, as for a create; where
    nothing can give way, the same ENOSPC and words as a create's."""
    for mnt in mounted("backend=host", "max_bytes=4M", "host_bytes=64M"):
        idle, store = os.path.join(mnt, "idle"), os.path.join(mnt, "v")
        for d in (idle, store):
            os.mkdir(d)
        with gmsfs.connect(idle, "rw", timeout=5) as c:
            c.create("w", SIZE)
            c.commit()
        publish(store)  # 4 MiB of 4 used
        versions(store, 2)
        r = Reader(store)
        with gmsfs.connect(store, "data", timeout=0) as w:
            write(w, "a", 7)  # its copy: the idle store went out for it
            assert state(idle)["tier"] == "host" and state(store)["version_copies"] == "1"
            with pytest.raises(gmsfs.GmsfsError) as e:
                w.import_one("b")  # nothing else may give way
            assert e.value.errno == errno.ENOSPC, e.value
            assert "allocs/b: 1048576 bytes: 1048576 bytes more do not fit (used 4194304 of 4194304" in str(e.value), e.value
            w.commit()
        assert r.ask("flip")["changed"] == 1
        assert values(r.ask("read")) == {"a": [7], "b": [2], "c": [3]}
        r.close()
        remove_stores(mnt)


def test_a_shell_builds_a_version_beside_a_reader(store):
    """The data-only session of a script (exec 9>>lock): its writes go to a copy; cat, a
    reader outside the session, reads the last commit until the commit."""
    publish(store)
    versions(store, 2)
    r = Reader(store)
    script = """
set -e
exec 9>>"$1/lock"
head -c 4096 /dev/zero | tr '\\0' '\\125' | dd of="$1/allocs/c" conv=notrunc status=none
grep -x 'beside: 1' "$1/state"
echo 1 > "$1/commit"
"""
    p = subprocess.run(["bash", "-c", script, "sh", store], capture_output=True, text=True, timeout=30)
    assert p.returncode == 0, p.stderr
    assert r.ask("read")["c"]["values"] == [3]
    assert r.ask("flip")["changed"] == 1
    assert r.ask("read")["c"]["values"] == [3, 0x55]
    r.close()


def test_kill_storm_every_reader_reads_one_whole_version(store):
    """Writers killed mid-write, readers killed mid-flip, for a few seconds: whenever a
    reader reads, every byte of every allocation it maps is of one committed version
    (all allocations of version g are written with byte g), never lower than the last it
    read; dropped versions' memory comes back."""
    publish(store, (1, 1, 1))
    versions(store, 2)
    used = int(state(store)["used"])
    writer = """
import gmsfs, sys, os
c = gmsfs.connect(sys.argv[1], "data", timeout=20)
g = c.generation + 1  # version g's bytes are all g
assert g < 256
for name in ("a", "b", "c"):
    p = c.import_one(name).ptr
    buf = c.buffer(p, %d, writable=True)
    for off in range(0, %d, 65536):
        buf[off:off + 65536] = bytes([g]) * 65536
if sys.argv[2] == "commit":
    c.commit()
""" % (SIZE, SIZE)
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
    rng = random.Random(7)
    readers = [Reader(store) for _ in range(3)]
    seen = [0] * len(readers)
    commits = kills = 0
    # 8 s of it, and on until it saw 3 commits and 2 kills (a slow machine takes longer)
    deadline, cap = time.monotonic() + 8, time.monotonic() + 90
    def readers_turn():
        for i, r in enumerate(readers):
            if rng.random() < 0.1:  # a reader killed, another comes
                r.p.kill()
                r.p.wait()
                readers[i] = r = Reader(store)
                seen[i] = 0
            if rng.random() < 0.5:
                r.ask("flip")
            view = r.ask("read")
            versions = {tuple(view[n]["values"]) for n in NAMES}
            assert len(versions) == 1 and len(versions.pop()) == 1, view  # one whole version
            v = view["a"]["values"][0]
            assert v >= seen[i], (v, seen[i])  # never an older version than it read
            seen[i] = v

    while time.monotonic() < deadline or (time.monotonic() < cap and (commits < 3 or kills < 2)):
        commit = rng.random() < 0.6
        w = subprocess.Popen([sys.executable, "-c", writer, store, "commit" if commit else "hold"], env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        kill_at = time.monotonic() + rng.uniform(0.05, 0.4)
        while w.poll() is None:
            readers_turn()
            if not commit and time.monotonic() > kill_at:
                w.kill()
                kills += 1
        w.wait()
        commits += commit and w.returncode == 0
    for r in readers:
        r.ask("flip")
        r.close()
    st = state(store)
    print("commits", commits, "kills", kills, "state", st)
    assert commits >= 3 and kills >= 2, (commits, kills)
    assert (st["state"], st["torn"], st["prev_handles"]) == ("COMMITTED", "0", "0"), st
    assert int(st["used"]) == used, st  # every dropped version's memory came back


def test_the_generation_file_wakes_a_poller_at_each_commit(store):
    """STORE/generation: the committed generation and a newline; poll(2) on it is readable
    once a commit moved it past what the handle last read (state's poll is any change)."""
    import select
    publish(store)
    versions(store, 2)
    r = Reader(store)
    fd = os.open(os.path.join(store, "generation"), os.O_RDONLY)
    try:
        assert os.pread(fd, 64, 0) == b"1\n"
        p = select.poll()
        p.register(fd, select.POLLIN)
        assert p.poll(200) == []  # nothing new
        w = Reader(store, WRITER)
        assert w.ask("write c 9") == {"generation": 1}
        assert p.poll(200) == []  # a session, no commit yet
        w.ask("commit")
        w.close()
        assert p.poll(2000) == [(fd, select.POLLIN)]
        assert os.pread(fd, 64, 0) == b"2\n" and p.poll(100) == []
    finally:
        os.close(fd)
    assert r.ask("flip")["changed"] == 1
    r.close()


# ---- pause: a reader keeps its mappings while a data-only writer writes in place ----


def test_a_paused_reader_keeps_its_mappings_while_a_data_only_writer_writes_in_place(store):
    publish(store)
    r = Reader(store)
    before = r.ask("read")
    assert r.ask("pause") == {"paused": True}
    st = state(store)
    assert (st["state"], st["paused"]) == ("COMMITTED", "1"), st
    # A writer that could replace the memory (rw) waits for the paused reader; a move too.
    with pytest.raises(gmsfs.GmsfsError) as e:
        gmsfs.connect(store, "rw", timeout=0.3)
    assert e.value.errno in (errno.EAGAIN, errno.ETIMEDOUT), e.value
    # A data-only writer goes at once, in place.
    w = Reader(store, WRITER)
    assert r.ask("resume 0.2")["errno"] in (errno.EAGAIN, errno.ETIMEDOUT)  # waits for it: still paused
    assert state(store)["paused"] == "1"
    assert w.ask("write b 77") == {"generation": 1}
    assert w.ask("commit") == {"generation": 2}
    w.close()
    requests = int(state(store)["socket_requests"])
    assert r.ask("resume 5") == {"generation": 2}
    after = r.ask("read")
    assert int(state(store)["socket_requests"]) == requests  # nothing exported again: no map
    assert after["b"] == {"values": [77], "ptr": before["b"]["ptr"]} and after["a"] == before["a"]
    st = state(store)
    assert (st["state"], st["paused"], st["readers"]) == ("RO", "0", "1"), st
    r.close()


def test_a_writer_killed_while_readers_pause_leaves_them_paused_and_refused_until_healed(store):
    publish(store)
    r = Reader(store)
    r.ask("pause")
    code = """
import gmsfs, os, signal, sys
c = gmsfs.connect(sys.argv[1], "data", timeout=5)
p = c.import_one("a").ptr
c.buffer(p, %d, writable=True)[:4096] = b"\\xee" * 4096
os.kill(os.getpid(), signal.SIGKILL)
""" % SIZE
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
    p = subprocess.run([sys.executable, "-c", code, store], env=env, capture_output=True, text=True, timeout=30)
    assert p.returncode == -signal.SIGKILL, p.stderr
    for _ in range(100):
        if state(store)["state"] == "TORN":
            break
        time.sleep(0.05)
    refused = r.ask("resume 1")
    assert refused["errno"] == errno.EUCLEAN and "torn" in refused["error"], refused
    assert state(store)["paused"] == "1"  # still paused: its memory kept
    w = Reader(store, WRITER)
    w.ask("write a 5")
    w.ask("commit")
    w.close()
    assert r.ask("resume 5") == {"generation": 2}
    assert r.ask("read")["a"]["values"] == [5]
    r.close()


def test_a_paused_reader_that_ends_or_disconnects_lets_go(store):
    publish(store)
    r = Reader(store)
    r.ask("pause")
    assert state(store)["paused"] == "1"
    r.p.kill()
    r.p.wait()
    for _ in range(100):
        if state(store)["paused"] == "0":
            break
        time.sleep(0.05)
    st = state(store)
    assert (st["paused"], st["readers"], st["state"]) == ("0", "0", "COMMITTED"), st
    gmsfs.connect(store, "rw", timeout=5).close()  # nothing holds a writer back
    with gmsfs.connect(store, "ro", timeout=5) as c:
        c.import_all()
        c.pause()
        with pytest.raises(gmsfs.GmsfsError) as e:
            c.pause()
        assert e.value.errno == errno.EINVAL
    assert state(store)["paused"] == "0"


def test_a_reader_paused_across_a_version_maps_the_new_one_at_resume(store):
    publish(store)
    versions(store, 2)
    r = Reader(store)
    before = r.ask("read")
    r.ask("pause")
    w = Reader(store, WRITER)  # beside: a paused reader is on the version it maps
    w.ask("write c 66")
    w.ask("commit")
    w.close()
    st = state(store)
    assert (st["prev_handles"], st["paused"]) == ("1", "1"), st
    assert r.ask("resume 5") == {"generation": 2}
    after = r.ask("read")
    assert after["c"] == {"values": [66], "ptr": before["c"]["ptr"]} and after["a"] == before["a"]
    assert state(store)["prev_handles"] == "0"
    r.close()


def test_a_paused_writer_resumes_writable_or_read_only_and_its_commit_seals_each_mapping(store):
    """A committed writer that pauses and resumes as a data-only writer maps its memory
    writable again (or, keep_read_only, read-only until protect makes each writable), and
    its commit makes it read-only again: a write after it faults.  protect refuses what
    the handle may not do, with words."""
    code = r"""
import ctypes, gmsfs, sys
c = gmsfs.connect(sys.argv[1], "rw", timeout=5)
for name in ("a", "b"):
    m = c.create(name, 1 << 20)
c.commit()
def say(what):
    print(what, sorted((m.name, m.writable) for m in c.mappings), flush=True)
say("committed")
c.pause(); c.resume("data", 5)
say("resumed")
c.buffer(c.find("a").ptr, 1 << 20, writable=True)[:4] = b"abcd"
c.commit()
say("committed again")
c.pause(); c.resume("data", 5, keep_read_only=True)
say("kept read-only")
c.protect("b", True)
say("b writable")
c.buffer(c.find("b").ptr, 1 << 20, writable=True)[:4] = b"efgh"
c.protect("b", False)
say("b sealed")
for args in (("b", 2), ("nope", True)):
    try:
        c._check(gmsfs._lib.lib.gmsfs_protect(c._handle(), args[0].encode(), int(args[1])), "protect")
    except gmsfs.GmsfsError as e:
        print("refused", e.errno, str(e), flush=True)
c.commit()
c.pause(); c.resume("ro", 5)
try:
    c.protect("a", True)
except gmsfs.GmsfsError as e:
    print("refused", e.errno, str(e), flush=True)
print("writing after the commit", flush=True)
ctypes.memset(c.find(sys.argv[2]).ptr, 0, 4)
print("wrote", flush=True)
"""
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
    other = store + "-2"
    os.mkdir(other)
    try:
        for where, name in ((store, "a"), (other, "b")):  # a write after the commit into each
            p = subprocess.run([sys.executable, "-c", code, where, name], env=env, capture_output=True, text=True,
                               timeout=60)
            lines = p.stdout.splitlines()
            assert p.returncode == -signal.SIGSEGV, (p.returncode, p.stdout, p.stderr)
            assert lines[:6] == [
                "committed [('a', False), ('b', False)]",
                "resumed [('a', True), ('b', True)]",
                "committed again [('a', False), ('b', False)]",
                "kept read-only [('a', False), ('b', False)]",
                "b writable [('a', False), ('b', True)]",
                "b sealed [('a', False), ('b', False)]"], lines
            assert lines[6].startswith("refused %d " % errno.EINVAL) and "writable is 0 or 1" in lines[6], lines
            assert lines[7].startswith("refused %d " % errno.ENOENT) and "maps no such allocation" in lines[7], lines
            assert lines[8].startswith("refused %d " % errno.EPERM) and "writer's session" in lines[8], lines
            assert lines[9:] == ["writing after the commit"], lines
            with gmsfs.connect(where, "ro", timeout=5) as r:
                r.import_all()
                assert bytes(r.buffer(r.find("a").ptr, 4)) == b"abcd"
                assert bytes(r.buffer(r.find("b").ptr, 4)) == b"efgh"
            assert state(where)["state"] == "COMMITTED"
    finally:
        rmdir_when_let_go(other)


def test_a_paused_writer_killed_after_resuming_as_data_only_writer_leaves_the_store_torn(store):
    """Its kept mappings let it write the committed bytes with nothing exported: the
    resume itself says in place, so a crash before its commit is TORN, never served."""
    code = r"""
import gmsfs, os, signal, sys
c = gmsfs.connect(sys.argv[1], "rw", timeout=5)
c.create("a", 1 << 20)
c.commit()
c.pause()
c.resume("data", 5, keep_read_only=sys.argv[2] == "kept")
c.protect("a", True)
c.buffer(c.find("a").ptr, 1 << 20, writable=True)[:512] = b"x" * 512
os.kill(os.getpid(), signal.SIGKILL)
"""
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
    other = store + "-2"
    os.mkdir(other)
    try:
        for where, how in ((store, "writable"), (other, "kept")):
            p = subprocess.run([sys.executable, "-c", code, where, how], env=env, timeout=60)
            until(lambda: state(where)["state"] == "TORN", 10)  # heard after the parent hears
            st = state(where)
            assert p.returncode == -signal.SIGKILL and (st["state"], st["torn"]) == ("TORN", "1"), st
            with pytest.raises(gmsfs.GmsfsError) as e:
                gmsfs.connect(where, "ro", timeout=1)
            assert e.value.errno == errno.EUCLEAN, e.value
            with gmsfs.connect(where, "data", timeout=5) as w:  # the next commit heals it
                w.import_all()
                w.buffer(w.find("a").ptr, 512, writable=True)[:] = b"y" * 512
                w.commit()
            assert state(where)["torn"] == "0"
    finally:
        rmdir_when_let_go(other)


def open_files():
    """The paths of this process's descriptors."""
    out = []
    for f in os.listdir("/proc/self/fd"):
        try:
            out.append(os.readlink("/proc/self/fd/" + f))
        except FileNotFoundError:  # listdir's own
            pass
    return out


def test_a_resumed_writer_holds_its_session_by_its_handle_alone(store):
    """A resume opens no STORE/lock (connect does, for the children a writer leaves
    behind: a round trip on a refit's path, two more at its pause): the handle holds the
    session, a child the writer starts joins it by opening lock, and the commit and the
    pause after it work as before."""
    lock = os.path.join(store, "lock")
    with gmsfs.connect(store, "rw", timeout=5) as c:
        assert lock in open_files()  # connect's, for children
        c.create("a", 4096)
        c.commit()
        c.pause()
        assert lock not in open_files()
        c.resume("data", 5)
        assert lock not in open_files() and c.lock_mode == "rw"
        child = subprocess.run(["sh", "-c", 'exec 9>"$1/lock" && echo joined', "sh", store],
                               capture_output=True, text=True, timeout=20)
        assert child.returncode == 0 and child.stdout.strip() == "joined", child
        c.buffer(c.find("a").ptr, 4096, writable=True)[:4] = b"done"
        c.commit()
        c.pause()
        assert c.paused and state(store)["paused"] == "1"
    with gmsfs.connect(store, "ro", timeout=5) as r:
        r.import_all()
        assert bytes(r.buffer(r.find("a").ptr, 4)) == b"done"
    assert (state(store)["torn"], state(store)["paused"]) == ("0", "0")


def test_kill_storm_of_paused_trainers_and_engines_never_serves_a_torn_byte(store):
    """In place, no versions: a trainer keeps one connection, resumed as a data-only writer
    for each refit (its mappings writable at once, or kept read-only and made writable
    one by one), writes every allocation, commits and pauses; readers pause, resume and
    read; trainers and readers are killed at random for a few seconds.  Whenever a reader
    reads, every byte of every allocation is the one its generation's commit wrote;
    a trainer killed mid-refit leaves the store TORN and every resume refused until the
    next trainer's commit; no memory is added; at the end all is COMMITTED."""
    publish(store, (2, 2, 2))  # generation 1; generation g holds byte g % 250 + 1 throughout
    used = int(state(store)["used"])
    trainer = r"""
import gmsfs, random, sys, time
names, size = sys.argv[2].split(","), int(sys.argv[3])
rng = random.Random(int(sys.argv[4]))
c = gmsfs.connect(sys.argv[1], "data", timeout=20)
c.import_all()
while True:
    v = (c.generation + 1) % 250 + 1  # the bytes of the commit this session makes
    for name in names:
        c.protect(name, True)
        buf = c.buffer(c.find(name).ptr, size, writable=True)
        for off in range(0, size, 65536):
            buf[off:off + 65536] = bytes([v]) * 65536
        if rng.random() < 0.5:
            c.protect(name, False)
    c.commit()
    c.pause()
    print(c.generation, flush=True)
    time.sleep(rng.uniform(0, 0.02))
    c.resume("data", 20, keep_read_only=rng.random() < 0.5)
"""
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
    rng = random.Random(11)

    def start_trainer():
        return subprocess.Popen([sys.executable, "-c", trainer, store, ",".join(NAMES), str(SIZE),
                                 str(rng.randrange(1 << 30))], env=env, stdout=subprocess.DEVNULL)

    def start_reader():  # an engine that serves between refits: paused but while it reads
        try:
            r = Reader(store)
        except AssertionError:  # torn just now: its connect was refused; another turn
            return None
        assert r.ask("pause") == {"paused": True}
        return r
    readers = [start_reader() for _ in range(3)]
    seen = [0] * len(readers)
    reads = refused = kills = 0
    t = start_trainer()
    # 8 s of it, and on until 20 reads, 3 kills and a torn refusal (a slow machine takes longer)
    deadline, cap = time.monotonic() + 8, time.monotonic() + 90
    while time.monotonic() < deadline or (time.monotonic() < cap and (reads < 20 or kills < 3 or refused < 1)):
        for i, r in enumerate(readers):
            if r is None or rng.random() < 0.05:  # a reader killed while paused, another comes
                if r is not None:
                    r.p.kill()
                    r.p.wait()
                readers[i] = start_reader()
                continue
            got = r.ask("resume 0.2")
            if "errno" in got:  # torn (refused), or a refit under way: still paused
                assert got["errno"] in (errno.EUCLEAN, errno.ETIMEDOUT, errno.EAGAIN), got
                refused += got["errno"] == errno.EUCLEAN
                continue
            view = r.ask("read")
            g = got["generation"]
            assert all(view[n]["values"] == [g % 250 + 1] for n in NAMES), (g, view)  # commit g's, whole
            assert g >= seen[i], (g, seen[i])
            seen[i] = g
            reads += 1
            assert r.ask("pause") == {"paused": True}
        if rng.random() < 0.15:  # the trainer killed, wherever it is
            time.sleep(rng.uniform(0, 0.02))
            t.kill()
            t.wait()
            kills += 1
            t = start_trainer()
    t.kill()
    t.wait()
    # A last trainer commits (healing a torn store), past the paused readers; every
    # reader then reads its commit.
    with gmsfs.connect(store, "data", timeout=20) as c:
        c.import_all()
        for name in NAMES:
            c.buffer(c.find(name).ptr, SIZE, writable=True)[:] = bytes([(c.generation + 1) % 250 + 1]) * SIZE
        c.commit()
        last = c.generation
    for r in readers:
        if r is None:
            continue
        assert r.ask("resume 5") == {"generation": last}
        view = r.ask("read")
        assert all(view[n]["values"] == [last % 250 + 1] for n in NAMES), view
        r.close()
    st = state(store)
    print("reads", reads, "refused (torn)", refused, "trainers killed", kills, "generation", st["generation"])
    assert reads >= 20 and kills >= 3 and refused >= 1, (reads, kills, refused)
    assert (st["state"], st["torn"], st["paused"], st["writer"]) == ("COMMITTED", "0", "0", "0"), st
    assert int(st["used"]) == used, st  # in place: nothing added, nothing left behind
