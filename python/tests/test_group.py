"""Groups (gmsfs.Group, gmsfs(5) NAMED VERSIONS): a model over N ranks as one, on N
daemons and N mounts of the host backend.  Every rank serves version V or none does: a
trainer rank killed mid-refit leaves every engine on the version before, the next refit
of the same name completes it (the ranks that have it skipped), another name is refused
until it does, a fresh engine waits for a version every rank has, and engines flip only
to a version every rank has.  Trainers and engines are processes of their own, one per
rank, as in tensor parallel serving."""
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

import gmsfs
from conftest import ROOT, mounted

RANKS = 3
SIZE = 1 << 16
ENV = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))


@pytest.fixture(scope="module")
def mounts():
    gens = [mounted("backend=host") for _ in range(RANKS)]
    yield [next(g) for g in gens]
    for g in gens:
        next(g, None)


@pytest.fixture
def group(mounts, tmp_path):
    """A group of one store per mount, versions 2, published as version step-0."""
    stores = [os.path.join(m, "model-%d" % random.randrange(1 << 30)) for m in mounts]
    for r, s in enumerate(stores):
        os.mkdir(s)
        os.setxattr(s, "user.gms.versions", b"2")
        with gmsfs.connect(s, "rw", timeout=5) as c:
            m = c.create("w", SIZE)
            c.buffer(m.ptr, SIZE, writable=True)[:] = bytes([value(r, 0)]) * SIZE
            c.commit(version="step-0")
    path = tmp_path / "model.group"
    path.write_text("# a model over %d ranks\n%s\n" % (RANKS, "\n".join(stores)))
    yield str(path)
    remove_when_let_go(stores)


def remove_when_let_go(stores):
    """Stores a test made, removed once their last process let them go."""
    for s in stores:
        for _ in range(200):
            try:
                os.rmdir(s)
                break
            except OSError:
                time.sleep(0.02)


def value(rank, step):
    """The byte rank's weights hold at step."""
    return (step * 7 + rank) % 251 + 1


ENGINE = r"""
import gmsfs, json, sys
g = gmsfs.Group.open(sys.argv[1])
rank = int(sys.argv[2])
try:
    c = g.connect(rank, timeout=float(sys.argv[3]))
except gmsfs.GmsfsError as e:
    print(json.dumps({"errno": e.errno, "error": str(e)}), flush=True)
    sys.exit(0)
c.import_all()
m = c.find("w")
def say(**kw):
    print(json.dumps(dict(kw, version=c.version, values=sorted(set(bytes(c.buffer(m.ptr, m.size)))))), flush=True)
say()
for line in sys.stdin:
    try:
        if line.split()[0] == "flip":  # "flip [NAME]": the group's version, or NAME
            say(changed=g.flip(rank, c, *line.split()[1:]))
        else:
            say()
    except gmsfs.GmsfsError as e:
        print(json.dumps({"errno": e.errno, "error": str(e)}), flush=True)
"""

TRAINER = r"""
import gmsfs, sys
g = gmsfs.Group.open(sys.argv[1])
rank, step, value = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
def write(c):
    m = c.import_one("w")
    c.buffer(m.ptr, m.size, writable=True)[:] = bytes([value]) * m.size
    if len(sys.argv) > 5:  # "go": written, held until told to commit
        print("writing", flush=True)
        sys.stdin.readline()
try:
    print("committed" if g.refit(rank, write, "step-%d" % step, timeout=10) else "skipped", flush=True)
except gmsfs.GmsfsError as e:
    print("errno %d %s" % (e.errno, e), flush=True)
"""


class Engine:
    def __init__(self, group, rank, timeout=20):
        self.rank = rank
        self.p = subprocess.Popen([sys.executable, "-c", ENGINE, group, str(rank), str(timeout)],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=ENV)
        self.first = self._read()

    def _read(self):
        line = self.p.stdout.readline()
        assert line, "the engine of rank %d ended" % self.rank
        return json.loads(line)

    def ask(self, what="read"):
        self.p.stdin.write(what + "\n")
        self.p.stdin.flush()
        return self._read()

    def close(self):
        if self.p.stdin:
            self.p.stdin.close()
        assert self.p.wait(20) == 0


def trainer(group, rank, step, held=False):
    """Rank's trainer for step; held: it says "writing" once its bytes are written and
    commits when told (a line on its stdin)."""
    return subprocess.Popen([sys.executable, "-c", TRAINER, group, str(rank), str(step), str(value(rank, step))] +
                            (["held"] if held else []), stdin=subprocess.PIPE if held else None,
                            stdout=subprocess.PIPE, text=True, env=ENV)


def train(group, step, ranks=range(RANKS)):
    """Every rank's trainer, to the end: what each said."""
    ps = [trainer(group, r, step) for r in ranks]
    return [p.communicate(timeout=30)[0].strip() for p in ps]


def serve_one_version(engines, step):
    """Every engine serves step's version, its rank's bytes of it."""
    for e in engines:
        got = e.ask()
        assert (got["version"], got["values"]) == ("step-%d" % step, [value(e.rank, step)]), (e.rank, got)


def test_a_group_file_names_its_ranks(group, tmp_path):
    g = gmsfs.Group.open(group)
    assert len(g) == RANKS and g.version() == "step-0" and g.pending() is None
    assert [v for _, v, _ in g.status()] == ["step-0"] * RANKS
    with pytest.raises(ValueError):
        g.flip(RANKS, None)
    empty = tmp_path / "empty.group"
    empty.write_text("# nothing\n\n")
    with pytest.raises(ValueError):
        gmsfs.Group.open(str(empty))
    with pytest.raises(ValueError):
        gmsfs.Group([g.stores[0], g.stores[0]])


def test_a_rank_left_behind_holds_every_engine_back_until_its_refit_completes(group):
    g = gmsfs.Group.open(group)
    engines = [Engine(group, r) for r in range(RANKS)]
    assert train(group, 1, ranks=[0, 2]) == ["committed", "committed"]  # rank 1's trainer never came
    assert g.version() == "step-0" and g.pending() == ("step-1", [0, 2])
    for e in engines:  # nobody flips: every rank serves step-0
        got = e.ask("flip step-1")
        assert got["errno"] == errno.EAGAIN and "on ranks [0, 2] of 3" in got["error"], got
        assert e.ask("flip")["changed"] == 0  # to the group's version: the one it serves
    for r in range(RANKS):  # nor is it mapped ahead: refused before the module is looked at
        with pytest.raises(gmsfs.GmsfsError) as err:
            g.flip_ahead(r, None, "step-1")
        assert err.value.errno == errno.EAGAIN and "on ranks [0, 2] of 3" in str(err.value)
    serve_one_version(engines, 0)
    # A fresh engine of rank 0, whose store serves step-1 already, waits for the group.
    late = Engine(group, 0, timeout=0.3)
    assert late.first["errno"] == errno.ETIMEDOUT
    late.close()
    # Another name is refused until step-1 is complete; the same name completes it.
    assert train(group, 2, ranks=[1])[0].startswith("errno %d" % errno.EBUSY)
    with pytest.raises(gmsfs.GmsfsError) as e:
        g.wait("step-1", timeout=0.2)
    assert e.value.errno == errno.ETIMEDOUT and "ranks [0, 2] of 3" in str(e.value)
    waited = []
    t = threading.Thread(target=lambda: waited.append(g.wait("step-1", timeout=30) or "complete"))
    t.start()
    assert train(group, 1) == ["skipped", "committed", "skipped"]
    t.join(30)
    assert waited == ["complete"]
    assert g.version() == "step-1" and g.pending() is None
    assert train(group, 0, ranks=[2])[0].startswith("errno %d" % errno.ESTALE)  # past it: not skipped silently
    for e in engines:
        assert e.ask("flip")["changed"] == 1
    serve_one_version(engines, 1)
    fresh = Engine(group, 1)
    assert (fresh.first["version"], fresh.first["values"]) == ("step-1", [value(1, 1)])
    for e in engines + [fresh]:
        e.close()


def test_ranks_prepared_ahead_commit_together_and_a_prepare_closed_writes_nothing(group):
    """Group.prepare: each rank's look at the group, its write lock and session made before
    the step's weights exist; refit(prepared=) then writes and commits only.  Refusals as
    refit's: a rank past the name is skipped (None); another name pending is EBUSY."""
    g = gmsfs.Group.open(group)
    engines = [Engine(group, r) for r in range(RANKS)]
    step = {}

    def write(c):  # the step's bytes, as the trainer has them when the refit runs
        m = c.import_one("w")
        c.buffer(m.ptr, m.size, writable=True)[:] = bytes([step["value"](c)]) * m.size

    prepared = [g.prepare(r, write, "step-1", timeout=10) for r in range(RANKS)]
    with pytest.raises(gmsfs.GmsfsError):  # each rank's one writer is its prepared trainer
        gmsfs.connect(g.stores[0], "data", timeout=0).close()
    with pytest.raises(ValueError):
        g.refit(0, write, "step-1", prepared=prepared[1])
    serve_one_version(engines, 0)  # meanwhile the engines serve on
    step["value"] = lambda c: value(g.stores.index(c.store), 1)
    assert [g.refit(r, write, "step-1", prepared=prepared[r]) for r in range(RANKS)] == [True] * RANKS
    assert g.version() == "step-1"
    for e in engines:
        assert e.ask("flip")["changed"] == 1
    serve_one_version(engines, 1)
    assert g.prepare(0, write, "step-1") is None  # committed there already: skipped
    # A prepare closed: nothing written, the group's version as it was; the next goes on.
    g.prepare(0, write, "step-2", timeout=10).close()
    assert g.version() == "step-1" and g.pending() is None
    assert train(group, 2, ranks=[0]) == ["committed"]
    with pytest.raises(gmsfs.GmsfsError) as err:
        g.prepare(1, write, "step-3", timeout=10)
    assert err.value.errno == errno.EBUSY  # step-2 is on rank 0 only
    for e in engines:
        e.close()


def test_a_flip_to_a_name_one_rank_went_past_looks_at_that_ranks_list(group):
    """Group.flip(NAME) asks each rank its last commit's name; a rank whose last commit is
    another name still has NAME where its list of commits says so: every rank committed
    step-1, rank 0 then step-2, and rank 1's engine flips to step-1 (not EAGAIN)."""
    g = gmsfs.Group.open(group)
    engines = [Engine(group, r) for r in range(RANKS)]
    assert train(group, 1) == ["committed"] * RANKS
    assert engines[0].ask("flip step-1")["version"] == "step-1"  # rank 0's readers leave step-0
    assert train(group, 2, ranks=[0]) == ["committed"]
    got = engines[1].ask("flip step-1")
    assert (got.get("changed"), got.get("version"), got.get("values")) == (1, "step-1", [value(1, 1)]), got
    got = engines[1].ask("flip step-2")
    assert got["errno"] == errno.EAGAIN and "on ranks [0] of %d" % RANKS in got["error"], got
    for e in engines:
        e.close()


def test_kill_storm_of_trainer_ranks_every_engine_serves_one_version(group):
    """Trainer ranks SIGKILLed at random moments of their refits: after each round every
    engine serves the same version, the one every rank has; the round run again completes
    what was killed, and the engines flip together."""
    rnd = random.Random(int(os.environ.get("GMSFS_SEED", "85")))
    g = gmsfs.Group.open(group)
    engines = [Engine(group, r) for r in range(RANKS)]
    served, partial = 0, 0
    step = 0
    while partial < 6 and step < 60:  # until six rounds were left part-way
        step += 1
        ps = [trainer(group, r, step, held=True) for r in range(RANKS)]
        for p in ps:
            assert p.stdout.readline().strip() == "writing"
        for p in ps:  # a victim dies with its bytes written, or as it commits
            victim = rnd.random() < 0.4
            if not victim or rnd.random() < 0.5:
                p.stdin.write("go\n")
                p.stdin.flush()
            if victim:
                time.sleep(rnd.random() * 0.005)
                p.send_signal(signal.SIGKILL)
        for p in ps:
            p.communicate(timeout=30)
        # Whatever was killed where: every engine still serves one version, and flips to
        # this step only when every rank has it.
        serve_one_version(engines, served)
        if not g.ready("step-%d" % step):
            partial += 0 < len(g.committed("step-%d" % step)) < RANKS
            for e in engines:
                assert e.ask("flip step-%d" % step)["errno"] == errno.EAGAIN
                assert e.ask("flip")["changed"] == 0
            serve_one_version(engines, served)
            said = train(group, step)  # the round again: it completes the step
            assert "committed" in said and all(s in ("committed", "skipped") for s in said), said
        assert g.ready("step-%d" % step) and g.version() == "step-%d" % step
        for e in engines:
            e.ask("flip")
        served = step
        serve_one_version(engines, served)
    assert partial == 6, "%d rounds left some ranks refitted and others not in %d" % (partial, step)
    for e in engines:
        e.close()


def ctl(*args):
    return subprocess.run([sys.executable, os.path.join(ROOT, "tools", "gmsfsctl"), "group"] + list(args),
                          capture_output=True, text=True, env=dict(ENV, PATH=os.path.join(ROOT, "build") + ":" +
                                                                        os.environ.get("PATH", "")), timeout=120)


def test_one_command_each_for_the_whole_group(group, tmp_path):
    """gmsfsctl group: status, tier, switch, and a snapshot of every rank at once under one
    manifest (refused while the ranks are not one version), restored into another group
    as that version on every rank, every byte checked."""
    g = gmsfs.Group.open(group)
    r = ctl("status", group)
    assert r.returncode == 0 and r.stdout.count(": step-0 (generation 1)") == RANKS and "group: step-0" in r.stdout
    r = ctl("tier", group, "host")
    assert r.returncode == 0 and r.stdout.count(": host") == RANKS, r.stderr
    r = ctl("switch", group)
    assert r.returncode == 0 and r.stdout.count(": device") == RANKS, r.stderr
    assert ctl("tier", group, "sideways").returncode != 0
    snap = str(tmp_path / "snap")
    assert train(group, 1, ranks=[0]) == ["committed"]  # rank 0 alone: not one version
    r = ctl("snapshot", group, snap)
    assert r.returncode == 1 and "one version on every rank" in r.stderr
    assert "step-1 on ranks [0] only" in ctl("status", group).stdout
    assert train(group, 1) == ["skipped", "committed", "committed"]
    r = ctl("snapshot", group, snap)
    assert r.returncode == 0 and "3 ranks of version step-1 saved" in r.stdout, r.stderr
    man = json.load(open(os.path.join(snap, "group.json")))
    assert man["version"] == "step-1" and [x["dir"] for x in man["ranks"]] == ["rank-0", "rank-1", "rank-2"]
    # Into another group: one empty store on each mount.
    other = tmp_path / "other.group"
    stores = [os.path.join(os.path.dirname(s), "copy-%d" % random.randrange(1 << 30)) for s in g.stores]
    for s in stores:
        os.mkdir(s)
    other.write_text("\n".join(stores) + "\n")
    r = ctl("restore", str(other), snap)
    assert r.returncode == 0 and "3 ranks of version step-1 restored" in r.stdout, r.stderr
    o = gmsfs.Group.open(str(other))
    assert o.version() == "step-1" and [v for _, v, _ in o.status()] == ["step-1"] * RANKS
    for rank, s in enumerate(stores):
        with gmsfs.connect(s, "ro", timeout=5) as c:
            m = c.import_one("w")
            assert set(bytes(c.buffer(m.ptr, m.size))) == {value(rank, 1)}
    # A shard changed on one rank: that rank refused, the group without a version.
    for s in stores:
        os.rmdir(s)
        os.mkdir(s)
    shard = os.path.join(snap, "rank-2", "shard-000.bin")
    with open(shard, "r+b") as f:
        f.seek(100)
        b = f.read(1)
        f.seek(100)
        f.write(bytes([b[0] ^ 1]))
    r = ctl("restore", str(other), snap)
    assert r.returncode == 1 and "rank 2:" in r.stderr and "no version until every rank" in r.stderr
    assert o.version() is None and gmsfs.committed_version(stores[2]) is None
    remove_when_let_go(stores)


def test_a_command_that_reads_the_group_starts_without_the_library(group):
    """gmsfsctl group status and Group's look at its ranks read the ranks' files only: a
    fresh process that runs them loads neither libgmsfs nor ctypes' helpers (what made
    every gmsfsctl command tens of milliseconds slower), and connects load them at once."""
    probe = """
import sys
from gmsfs import ctl
import gmsfs
rc = ctl.main(["group", "status", sys.argv[1]])
g = gmsfs.Group.open(sys.argv[1])
v = g.version()
print(rc, v, "gmsfs._lib" in sys.modules, "ctypes.util" in sys.modules, "gmsfs._connection" in sys.modules)
with g.connect(0, timeout=5) as c:
    print(c.version, "gmsfs._lib" in sys.modules)
"""
    r = subprocess.run([sys.executable, "-c", probe, group], capture_output=True, text=True, env=ENV, timeout=60)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[-2] == "0 step-0 False False False", r.stdout
    assert lines[-1] == "step-0 True", r.stdout
