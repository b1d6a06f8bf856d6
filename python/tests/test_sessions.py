"""Sessions the daemon cannot misjudge (gmsfs(5), LOCKS and "What a session shows"):
a session begins by any open for writing or create, from Python as from C and the shell,
and its member sees its own changes at once; outside it, every lookup, getattr, readdir,
getxattr, open and read shows exactly a committed layout, never the absence of a name
that is committed when the call ends, never an uncommitted name.  The property test runs
writers (some killed with SIGKILL) beside outside readers; GMSFS_STEPS (writer sessions,
60 by default) and GMSFS_SEED reproduce or lengthen a run."""
import errno
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time

import pytest

from conftest import ROOT, run_py


def fields(store):
    with open(os.path.join(store, "state")) as f:
        return dict(line.split(": ", 1) for line in f.read().splitlines() if ": " in line)


def wait_state(store, *states, tries=400):
    for _ in range(tries):
        st = fields(store)
        if st["state"] in states:
            return st
        time.sleep(0.025)
    raise AssertionError("%s stayed %s" % (store, fields(store)["state"]))


def commit(store):
    fd = os.open(os.path.join(store, "commit"), os.O_WRONLY)
    try:
        os.write(fd, b"\n")
    finally:
        os.close(fd)


WAYS = [
    ("lock", os.O_WRONLY),
    ("lock", os.O_RDWR),
    ("allocs/x", os.O_CREAT | os.O_RDWR),
    ("allocs/x", os.O_CREAT | os.O_WRONLY),
    ("allocs/x", os.O_CREAT | os.O_WRONLY | os.O_TRUNC),
    ("meta/e", os.O_CREAT | os.O_RDWR),
    ("meta/e", os.O_CREAT | os.O_WRONLY | os.O_TRUNC),
    ("meta/e", os.O_CREAT | os.O_WRONLY | os.O_APPEND),
]


@pytest.mark.parametrize("path,flags", WAYS, ids=["%s-%o" % w for w in WAYS])
def test_a_session_begins_by_any_open_for_writing_or_create(store, path, flags):
    """This process begins the session by its first open and is its member at once: its
    fstat, stat, ftruncate, write, read, mkdir and setxattr of what it made work, and its
    commit publishes them."""
    first = os.open(os.path.join(store, path), flags, 0o644)
    try:
        made = []
        for rel, size, data in (("allocs/x", 8192, b"hello"), ("meta/e", 3, b"{1}"), ("allocs/d/y", 4096, b"y")):
            p = os.path.join(store, rel)
            if rel == "allocs/d/y":
                os.mkdir(os.path.join(store, "allocs/d"))
            fd = first if rel == path else os.open(p, os.O_CREAT | os.O_RDWR, 0o644)
            st = os.fstat(fd)
            assert os.stat(p).st_ino == st.st_ino  # by name and by descriptor: the same file
            os.ftruncate(fd, size)
            assert os.fstat(fd).st_size == size and os.stat(p).st_size == size
            if fd == first and flags & os.O_APPEND:  # pwrite appends on O_APPEND (Linux)
                os.ftruncate(fd, 0)
                os.write(fd, data)
                assert os.fstat(fd).st_size == size
            else:
                os.pwrite(fd, data, 0)
            with open(p, "rb") as f:  # a member's read by another descriptor
                assert f.read(len(data)) == data
            made.append(fd)
        os.setxattr(os.path.join(store, "meta/e"), "user.gms.alloc", b"d/y")
        assert sorted(os.listdir(os.path.join(store, "allocs"))) == ["d", "x"]
        commit(store)
    finally:
        for fd in set(made + [first]):
            os.close(fd)
    st = wait_state(store, "COMMITTED")
    assert st["generation"] == "1"
    with open(os.path.join(store, "allocs/x"), "rb") as f:  # now a reader, outside any session
        assert f.read(5) == b"hello"
    assert os.getxattr(os.path.join(store, "meta/e"), "user.gms.alloc") == b"d/y"


def test_a_lone_create_rolls_back_when_its_process_ends(store):
    """os.open(O_CREAT) alone in a fresh process: the session is that process's and ends
    with it, without commit; the store is as before."""
    code = "import os, sys; fd = os.open(sys.argv[1], os.O_CREAT | os.O_RDWR); os.ftruncate(fd, 4096); print(os.fstat(fd).st_size)"
    r = subprocess.run([sys.executable, "-c", code, os.path.join(store, "allocs/x")], capture_output=True, text=True,
                       timeout=30)
    assert r.returncode == 0 and r.stdout.strip() == "4096", r.stderr
    wait_state(store, "EMPTY")
    assert os.listdir(os.path.join(store, "allocs")) == []


def test_a_leader_that_closed_its_descriptor_is_no_member_before_the_release(store):
    """This process begins the session by an open of lock, passes the descriptor to
    another process and closes its own: the kernel's release does not come (the other
    holds the file), yet this process is no longer a member at once (gmsfs(5), LOCKS):
    its change is refused with EBUSY, as any outsider's while another holds the store."""
    import socket
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    holder = subprocess.Popen([sys.executable, "-c", "import socket, sys\n"
                               "s = socket.socket(fileno=int(sys.argv[1]))\n"
                               "msg, fds, _, _ = socket.recv_fds(s, 16, 1)\n"
                               "s.send(b'held')\n"
                               "s.recv(16)\n", str(b.fileno())], pass_fds=(b.fileno(),))
    b.close()
    fd = os.open(os.path.join(store, "lock"), os.O_WRONLY)
    try:
        # (no call of this process between: nothing has looked at its descriptors yet)
        socket.send_fds(a, [b"x"], [fd])
        assert a.recv(16) == b"held"
        os.close(fd)
        fd = -1
        with pytest.raises(OSError) as e:
            os.mkdir(os.path.join(store, "allocs", "d"))
        assert e.value.errno == errno.EBUSY
        assert fields(store)["state"] == "RW"  # the session goes on: the other holds it
    finally:
        if fd >= 0:
            os.close(fd)
        a.close()
        holder.wait(10)
    wait_state(store, "EMPTY")  # its last descriptor closed without commit: rolled back


# ---- the property test: writers and outside readers side by side ----

POOL = ["e%d" % i for i in range(6)]


def layout(seed, v):
    """The committed layout of generation v: {entry: (value, allocation)}.  Generation 1 is
    the store's first commit; each writer session that commits makes the next."""
    rng = random.Random("%d/%d" % (seed, v))
    names = [n for n in POOL if rng.random() < 0.6] or [POOL[v % len(POOL)]]
    return {n: (json.dumps({"v": v, "n": n, "pad": "x" * rng.randint(0, 40)}), rng.choice("ab")) for n in names}


# A writer: one session from layout(v - 1) to layout(v), begun one of several ways, each
# change checked by the member itself; then it commits, aborts, or just exits (a rollback).
# Exit status 3 and a line on stderr: the member did not see its own change.
WRITER = r"""
import json, os, random, sys, time
store, old, new, how, end, seed = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3]), sys.argv[4], sys.argv[5], int(sys.argv[6])
rng = random.Random(seed)
meta = os.path.join(store, "meta")
def bad(what):
    sys.stderr.write("member: %s\n" % what)
    sys.exit(3)
def pause():
    time.sleep(rng.random() * 0.01)
first = {"lock": lambda: os.open(os.path.join(store, "lock"), os.O_WRONLY),
         "alloc": lambda: os.open(os.path.join(store, "allocs", "a"), os.O_WRONLY),
         "create": lambda: os.open(os.path.join(meta, "tmp"), os.O_CREAT | os.O_WRONLY, 0o644)}[how]()
if how == "create":
    if os.stat(os.path.join(meta, "tmp")).st_size != 0:
        bad("the new entry tmp has no size 0")
    os.unlink(os.path.join(meta, "tmp"))
    if os.path.exists(os.path.join(meta, "tmp")):
        bad("tmp still there after its unlink")
for n in sorted(set(old) | set(new)):
    p = os.path.join(meta, n)
    pause()
    if n in old and (n not in new or rng.random() < 0.5):
        os.unlink(p)
        if os.path.exists(p):
            bad("%s still there after its unlink" % n)
    if n in new:
        value, alloc = new[n]
        with open(p, "w") as f:
            f.write(value)
        os.setxattr(p, "user.gms.alloc", alloc.encode())
        with open(p) as f:
            if f.read() != value:
                bad("%s does not read back" % n)
        if os.stat(p).st_size != len(value) or os.getxattr(p, "user.gms.alloc") != alloc.encode():
            bad("%s: attributes not its own" % n)
if sorted(os.listdir(meta)) != sorted(new):
    bad("meta/ lists %s, not %s" % (sorted(os.listdir(meta)), sorted(new)))
pause()
if end == "commit":
    with open(os.path.join(store, "commit"), "w") as f:
        f.write("\n")
elif end == "abort":
    with open(os.path.join(store, "abort"), "w") as f:
        f.write("\n")
"""


class Outsider(threading.Thread):
    """Looks at the store outside any session until stopped: each look is checked against
    the layouts committed while it ran (generation before and after it)."""

    def __init__(self, store, seed, rng):
        super().__init__(daemon=True)
        self.store, self.seed, self.rng = store, seed, rng
        self.stop = threading.Event()
        self.looks, self.violations = 0, []

    def generation(self):
        return int(fields(self.store)["generation"])

    def look(self):
        meta = os.path.join(self.store, "meta")
        op, n = self.rng.choice(["listdir", "stat", "getxattr", "read", "read"]), self.rng.choice(POOL)
        p = os.path.join(meta, n)
        try:
            if op == "listdir":
                seen = sorted(os.listdir(meta))
            elif op == "stat":
                seen = os.stat(p).st_size
            elif op == "getxattr":
                seen = os.getxattr(p, "user.gms.alloc").decode()
            else:
                with open(p) as f:
                    seen = f.read()
        except FileNotFoundError:
            seen = None
        except OSError as e:
            seen = "error " + errno.errorcode.get(e.errno, str(e.errno))
        return op, n, seen

    @staticmethod
    def expect(lay, op, n):
        if op == "listdir":
            return sorted(lay)
        if n not in lay:
            return None
        value, alloc = lay[n]
        return {"stat": len(value), "getxattr": alloc, "read": value}[op]

    def run(self):
        while not self.stop.is_set():
            g0 = self.generation()
            op, n, seen = self.look()
            g1 = self.generation()
            self.looks += 1
            if not any(self.expect(layout(self.seed, v), op, n) == seen for v in range(g0, g1 + 1)):
                self.violations.append("%s %s saw %r, generations %d..%d committed %r" % (
                    op, n, seen, g0, g1, [self.expect(layout(self.seed, v), op, n) for v in range(g0, g1 + 1)]))


PUBLISH_NAMES = r"""
import os, sys
store, names = sys.argv[1], sys.argv[2:]
meta = os.path.join(store, "meta")
with open(os.path.join(store, "lock"), "w"):
    with open(os.path.join(store, "allocs", "a"), "wb") as f:
        f.truncate(4096)
    for n in set(os.listdir(meta)) - set(names):
        os.unlink(os.path.join(meta, n))
    for n in names:
        with open(os.path.join(meta, n), "w") as f:
            f.write(n)
        os.setxattr(os.path.join(meta, n), "user.gms.alloc", b"a")
    with open(os.path.join(store, "commit"), "w") as f:
        f.write("commit\n")
"""


def publish_names(store, names):
    """A commit whose meta/ holds exactly names, by another process: this one stays outside."""
    r = run_py(PUBLISH_NAMES, store, *names)
    assert r.returncode == 0, r.stderr
    wait_state(store, "COMMITTED")


@pytest.mark.parametrize("before,after", [
    (["e5", "e3"], ["e5", "e2", "e4"]),  # CI's case: the listing's last call came after the commit
    (["a%04d-%s" % (i, "x" * 200) for i in range(600)], ["b%04d-%s" % (i, "y" * 200) for i in range(900)]),
], ids=["end-of-listing", "mid-listing"])
def test_one_listing_begun_before_a_commit_is_the_commit_it_began_in(store, before, after):
    """gmsfs(5): an outsider sees exactly the last commit, readdir too.  One listing that
    spans a commit (its first getdents before, the rest after) is the listing it began with,
    not the old commit's first part and the new one's rest; the next listing is the new
    commit's."""
    meta = os.path.join(store, "meta")
    publish_names(store, before)
    with os.scandir(meta) as it:
        first = next(it)
        publish_names(store, after)
        got = [first.name] + [e.name for e in it]
    assert sorted(got) == sorted(before)
    assert len(got) == len(set(got))
    assert sorted(os.listdir(meta)) == sorted(after)
    for n in after:
        assert os.stat(os.path.join(meta, n)).st_size == len(n)


def test_a_writers_listing_is_the_layout_it_began_with(store):
    """In the writer's session too: names removed while its listing runs neither hide
    others (a removal moves the directory's last child into its place) nor come twice."""
    meta = os.path.join(store, "meta")
    names = ["a%04d-%s" % (i, "x" * 200) for i in range(600)]
    publish_names(store, names)
    with open(os.path.join(store, "lock"), "w"):
        with os.scandir(meta) as it:
            seen = [next(it).name]
            seen += [next(it).name for _ in range(20)]
            for n in seen:
                os.unlink(os.path.join(meta, n))
            seen += [e.name for e in it]
        assert sorted(seen) == sorted(names)
        assert sorted(os.listdir(meta)) == sorted(set(names) - set(seen[:21]))
        commit(store)
    wait_state(store, "COMMITTED")
    assert len(os.listdir(meta)) == 600 - 21


def publish_first(store, lay):
    with open(os.path.join(store, "lock"), "w"):
        for a in "ab":
            with open(os.path.join(store, "allocs", a), "wb") as f:
                f.truncate(4096)
        for n, (value, alloc) in lay.items():
            p = os.path.join(store, "meta", n)
            with open(p, "w") as f:
                f.write(value)
            os.setxattr(p, "user.gms.alloc", alloc.encode())
        commit(store)
    wait_state(store, "COMMITTED")


def test_property_writers_killed_and_outside_readers_see_only_commits(store):
    seed = int(os.environ.get("GMSFS_SEED", os.getpid()))
    sessions = int(os.environ.get("GMSFS_STEPS", "60"))
    rng = random.Random(seed)
    publish_first(store, layout(seed, 1))
    readers = [Outsider(store, seed, random.Random(seed + i)) for i in (1, 2)]
    for r in readers:
        r.start()
    member_bad, ends = [], {"commit": 0, "abort": 0, "exit": 0, "killed": 0}
    try:
        for step in range(sessions):
            g = int(fields(store)["generation"])
            end = rng.choice(["commit", "commit", "commit", "abort", "exit"])
            how = rng.choice(["lock", "alloc", "create"])
            old, new = layout(seed, g), layout(seed, g + 1)
            w = subprocess.Popen([sys.executable, "-c", WRITER, store, json.dumps(old), json.dumps(new), how, end,
                                  str(rng.randrange(1 << 30))], stderr=subprocess.PIPE, text=True)
            kill = rng.random() < 0.3
            if kill:
                time.sleep(rng.random() * 0.12)
                w.send_signal(signal.SIGKILL)
            err = w.communicate(timeout=60)[1]
            if w.returncode == -signal.SIGKILL:
                ends["killed"] += 1
            elif w.returncode == 0:
                ends[end] += 1
            else:
                member_bad.append("seed %d, session %d (%s, %s): status %d: %s" % (seed, step, how, end, w.returncode,
                                                                                 err.strip()[-500:]))
            st = wait_state(store, "COMMITTED")  # a killed or ended writer's session is rolled back
            if int(st["generation"]) not in (g, g + 1):
                member_bad.append("generation %s after %d" % (st["generation"], g))
    finally:
        for r in readers:
            r.stop.set()
        for r in readers:
            r.join(60)
    looks = sum(r.looks for r in readers)
    violations = [v for r in readers for v in r.violations]
    print("seed %d: %d writer sessions (%s), %d outside looks, %d violations, %d member failures" % (
        seed, sessions, ", ".join("%s %d" % kv for kv in ends.items()), looks, len(violations), len(member_bad)))
    assert not member_bad, member_bad[:5]
    assert not violations, "seed %d: %s" % (seed, violations[:5])
    assert looks > sessions  # the readers did look while the writers wrote
    assert ends["commit"] and int(fields(store)["generation"]) > 1
