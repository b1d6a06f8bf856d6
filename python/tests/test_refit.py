"""gmsfs.torch.refit on the host backend (PyTorch on the CPU): a trainer's new weights
copied into the store its engines serve, in place, while they sleep; engines woken see
them at the same addresses, bit for bit the trainer's; no allocation is added; a source
that differs in a name, a shape or a dtype is refused with both sides named and nothing
written; a trainer killed mid-refit leaves the store TORN (refused) until the next one
commits.  The engines run in processes of their own."""
import errno
import json
import os
import signal
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

import gmsfs
import gmsfs.torch as gt
from conftest import ROOT, run_py, until
from gmsfs._fields import read_fields

MODEL = """
import torch
class Net(torch.nn.Module):
    def __init__(self, extra=False, wb_dtype=torch.bfloat16):
        super().__init__()
        self.embed = torch.nn.Embedding(50, 16)
        self.layers = torch.nn.ModuleList([torch.nn.Linear(16, 16) for _ in range(3)])
        self.head = torch.nn.Linear(16, 50, bias=False)
        self.head.weight = self.embed.weight          # tied
        self.register_buffer("scale", torch.ones(16))
        self.register_buffer("none", torch.zeros(0))   # empty
        self.wb = torch.nn.Parameter(torch.zeros(4, 4, dtype=wb_dtype))
        if extra:
            self.extra = torch.nn.Linear(2, 2)
    def forward(self, x):
        h = self.embed(x) * self.scale + self.wb.float().sum()
        for l in self.layers:
            h = torch.relu(l(h))
        return self.head(h)
def build(seed=0, **kw):
    torch.manual_seed(seed)
    return Net(**kw)
x = torch.tensor([[1, 2, 3, 49]])
"""
ns = {}
exec(MODEL, ns)  # the trainer's side: the same class, in this process

# An engine: materializes the store, says its output and addresses; then on each line of
# stdin, "sleep" or "wake", does it and says the same (or the error of a refused wake).
ENGINE = MODEL + """
import gmsfs, gmsfs.torch as gt, json, sys
m = build(seed=99)
gt.materialize(m, sys.argv[1])
def say():
    print(json.dumps({"out": m(x).tolist(), "ptrs": [p.data_ptr() for p in m.parameters()]}), flush=True)
say()
for line in sys.stdin:
    try:
        if line.strip() == "sleep":
            gt.sleep(m)
            print("{}", flush=True)
        elif line.strip() == "pause":
            gt.pause(m)
            print("{}", flush=True)
        elif line.strip() == "resume":
            gt.resume(m, 5)
            say()
        elif line.split()[0] == "flip":  # "flip [VERSION]"
            n = gt.flip(m, *line.split()[1:])
            print(json.dumps({"out": m(x).tolist(), "ptrs": [p.data_ptr() for p in m.parameters()],
                              "changed": n}), flush=True)
        elif line.split()[0] == "ahead":  # "ahead NAME TIMEOUT": gt.flip_ahead, then as it serves
            a = gt.flip_ahead(m, line.split()[1], float(line.split()[2]))
            say()
        elif line.split()[0] in ("swap", "back", "let"):  # the Ahead's flip, back, close
            n = {"swap": a.flip, "back": a.back, "let": a.close}[line.split()[0]]()
            print(json.dumps({"out": m(x).tolist(), "ptrs": [p.data_ptr() for p in m.parameters()],
                              "changed": n, "version": m._gmsfs.version}), flush=True)
        elif line.startswith("follow"):
            gen = gt.follow(m, float(line.split()[1]))
            print(json.dumps({"out": m(x).tolist(), "ptrs": [p.data_ptr() for p in m.parameters()],
                              "generation": gen}), flush=True)
        else:
            gt.wake(m, 5)
            say()
    except (gmsfs.GmsfsError, TimeoutError) as e:
        print(json.dumps({"errno": e.errno, "error": str(e)}), flush=True)
"""


class Engine:
    def __init__(self, store):
        env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
        self.p = subprocess.Popen([sys.executable, "-c", ENGINE, store], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True, env=env)
        self.first = self._read()

    def __del__(self):  # one a test left: ended, its read lock with it
        if self.p.poll() is None:
            self.p.kill()
            self.p.wait()

    def _read(self):
        line = self.p.stdout.readline()
        assert line, "the engine ended"
        return json.loads(line)

    def ask(self, what):
        self.tell(what)
        return self._read()

    def tell(self, what):  # the answer read later (answer())
        self.p.stdin.write(what + "\n")
        self.p.stdin.flush()

    def answer(self):
        return self._read()

    def close(self):
        self.p.stdin.close()
        assert self.p.wait(20) == 0


def publish(store, seed=1):
    w = run_py(MODEL + "import gmsfs.torch as gt, sys\ngt.publish(build(seed=%d), sys.argv[1]).close()" % seed, store)
    assert w.returncode == 0, w.stderr


def state(store):
    with open(os.path.join(store, "state")) as f:
        return dict(line.split(": ", 1) for line in f.read().splitlines() if ": " in line)


def trained(seed=1, **kw):
    """The trainer's model: the published weights, then one SGD step."""
    m = ns["build"](seed=seed, **kw)
    opt = torch.optim.SGD(m.parameters(), lr=0.5)
    m(ns["x"]).float().pow(2).mean().backward()
    opt.step()
    return m


def out(m):
    with torch.no_grad():
        return m(ns["x"]).tolist()


def test_refit_in_place_engines_wake_to_the_trainers_weights_bit_for_bit(store):
    publish(store)
    engines = [Engine(store), Engine(store)]
    before = state(store)
    assert engines[0].first["out"] == out(ns["build"](seed=1))
    for e in engines:
        assert e.ask("sleep") == {}
    trainer = trained()
    assert out(trainer) != engines[0].first["out"]  # the step changed something to see
    c = gt.refit(trainer, store, timeout=10)
    assert c.lock_mode == "ro"  # committed: the trainer now reads what it wrote
    c.close()
    after = state(store)
    # In place: the layout as it was, the same allocations (no second copy), a new generation.
    assert (after["state"], after["torn"], after["layout_hash"], after["allocations"], after["bytes"]) == \
        ("COMMITTED", "0", before["layout_hash"], before["allocations"], before["bytes"]), (before, after)
    assert int(after["generation"]) == int(before["generation"]) + 1
    for e in engines:
        woke = e.ask("wake")
        assert woke["ptrs"] == e.first["ptrs"]  # the same addresses
        assert woke["out"] == out(trainer)  # exactly the trainer's forward
        e.close()


def test_refit_takes_a_state_dict_and_strict_false_a_part(store):
    publish(store)
    trainer = trained()
    sd = trainer.state_dict()
    with pytest.raises(KeyError) as e:
        gt.refit({"layers.0.bias": sd["layers.0.bias"]}, store, timeout=5)
    assert "the source lacks" in str(e.value) and "layers.1.weight" in str(e.value), e.value
    gt.refit({"layers.0.bias": sd["layers.0.bias"]}, store, strict=False, timeout=5).close()
    m = ns["build"](seed=5)
    gt.materialize(m, store)
    try:
        assert torch.equal(m.layers[0].bias, sd["layers.0.bias"])
        assert torch.equal(m.layers[1].weight, ns["build"](seed=1).layers[1].weight)  # not refitted
    finally:
        m._gmsfs.close()
    gt.refit(sd, store, timeout=5).close()
    e = Engine(store)
    assert e.first["out"] == out(trainer)
    e.close()


@pytest.mark.parametrize("bad", ["name", "shape", "dtype", "nothing"])
def test_refit_refuses_a_source_that_differs_and_writes_nothing(store, bad):
    publish(store)
    before = state(store)
    want = Engine(store).first["out"]  # and gone: nothing holds the read lock
    if bad == "name":
        src, err, said = trained(extra=True), KeyError, ["the store lacks ['extra.bias', 'extra.weight']"]
    elif bad == "shape":
        sd = trained().state_dict()
        sd["layers.2.weight"] = torch.zeros(16, 8)
        src, err, said = sd, RuntimeError, ["size mismatch for layers.2.weight: the store has shape [16, 16], "
                                            "the source has shape [16, 8]", "nothing was written"]
    elif bad == "dtype":
        src, err, said = trained(wb_dtype=torch.float32), RuntimeError, [
            "dtype mismatch for wb: the store has bfloat16, the source has float32"]
    else:
        os.rmdir(store)
        os.mkdir(store)
        src, err, said = trained(), gmsfs.GmsfsError, ["no tensors"]
    with pytest.raises(err) as e:
        gt.refit(src, store, timeout=5)
    for s in said:
        assert s in str(e.value), e.value
    if bad == "nothing":
        return
    after = state(store)
    assert (after["state"], after["torn"], after["generation"], after["layout_hash"]) == \
        ("COMMITTED", "0", before["generation"], before["layout_hash"]), (before, after)
    again = Engine(store)  # the bytes as published
    assert again.first["out"] == want
    again.close()


def test_refit_waits_for_sleeping_engines_and_times_out_while_one_reads(store):
    publish(store)
    e = Engine(store)  # awake: it holds the read lock
    with pytest.raises(gmsfs.GmsfsError) as err:
        gt.refit(trained(), store, timeout=0.3)
    assert err.value.errno in (errno.EAGAIN, errno.ETIMEDOUT), err.value
    assert state(store)["generation"] == "1"
    assert e.ask("sleep") == {}
    gt.refit(trained(), store, timeout=5).close()
    assert e.ask("wake")["out"] == out(trained())
    e.close()


@pytest.mark.parametrize("how", ["killed", "closed"])
def test_a_trainer_that_ends_mid_refit_leaves_the_store_torn_until_the_next_commit(store, how):
    publish(store)
    e = Engine(store)
    assert e.ask("sleep") == {}
    # The trainer copies every tensor in, then dies (or lets go) before its commit.
    end = "os.kill(os.getpid(), signal.SIGKILL)" if how == "killed" else "c.close()"
    t = run_py(MODEL + """
import gmsfs.torch as gt, os, signal, sys, torch
m = build(seed=1)
with torch.no_grad():
    for p in m.parameters():
        p.add_(1)
c = gt.refit(m, sys.argv[1], timeout=5, commit=False)
""" + end, store)
    assert t.returncode == (-signal.SIGKILL if how == "killed" else 0), t.stderr
    # The daemon hears of the trainer's end after its parent does (the kernel's release of
    # its files, its socket's close): waited for, not read once.
    until(lambda: state(store)["state"] == "TORN", 10)
    st = state(store)
    assert (st["state"], st["torn"]) == ("TORN", "1"), st
    woke = e.ask("wake")
    assert woke["errno"] == errno.EUCLEAN and "torn" in woke["error"], woke
    r = run_py(MODEL + "import gmsfs.torch as gt, sys\ngt.materialize(build(), sys.argv[1])", store)
    assert r.returncode != 0 and "torn" in r.stderr, r.stderr
    # The next refit heals it: a commit of whole new weights.
    trainer = trained()
    gt.refit(trainer, store, timeout=5).close()
    st = state(store)
    assert (st["state"], st["torn"]) == ("COMMITTED", "0"), st
    assert e.ask("wake")["out"] == out(trainer)
    e.close()


def test_a_data_only_session_writes_bytes_and_changes_no_layout(store):
    """connect(store, "data") (GMS's RW_DATA; what refit takes): the committed bytes are
    written in place; every change of the layout is refused with EPERM and said in
    last_error, nothing changed; its commit is a new generation of the same layout hash."""
    publish(store)
    before = state(store)
    with gmsfs.connect(store, "data", timeout=5) as c:
        assert c.lock_mode == "rw" and state(store)["data_only"] == "1"
        some = c.meta_items()[0]
        refused = [lambda: c.create("new", 4096), lambda: c.meta_put("k", some.alloc, value=b"v"),
                   lambda: c.meta_delete(some.key)]
        for change in refused:
            with pytest.raises(gmsfs.GmsfsError) as e:
                change()
            assert e.value.errno == errno.EPERM and "data-only" in str(e.value), e.value
        assert "data-only" in state(store)["last_error"]
        c.commit()
    st = state(store)
    assert (st["generation"], st["layout_hash"], st["allocations"], st["entries"], st["data_only"]) == (
        "2", before["layout_hash"], before["allocations"], before["entries"], "0"), st
    # The refit through such a session: the trainer's bytes, the same layout.
    trainer = trained()
    gt.refit(trainer, store, timeout=5).close()
    assert state(store)["layout_hash"] == before["layout_hash"]
    e = Engine(store)
    assert e.first["out"] == out(trainer)
    e.close()


def test_a_data_only_session_waits_for_a_first_commit(store):
    with pytest.raises(gmsfs.GmsfsError) as e:
        gmsfs.connect(store, "data", timeout=0.3)
    assert e.value.errno in (errno.EAGAIN, errno.ETIMEDOUT), e.value
    publish(store)
    gmsfs.connect(store, "data", timeout=5).close()
    assert state(store)["state"] == "COMMITTED"  # nothing written: nothing torn


def test_engines_follow_the_trainers_commits_past_a_torn_one(store):
    """gmsfs.torch.follow: each engine sleeps and waits (poll on state, no lock) for the next
    whole commit, then wakes at it: the trainer's weights, the same addresses; a trainer
    killed mid-refit (TORN) is waited past; no commit in time: TimeoutError, asleep."""
    publish(store)
    engines = [Engine(store), Engine(store)]
    for e in engines:
        e.tell("follow 20")
    trainer = trained()
    gt.refit(trainer, store, timeout=10).close()
    for e in engines:
        got = e.answer()
        assert (got["out"], got["ptrs"], got["generation"]) == (out(trainer), e.first["ptrs"], 2), got
    for e in engines:
        e.tell("follow 20")
    killed = run_py(MODEL + """
import gmsfs.torch as gt, os, signal, sys
m = build(seed=3)
c = gt.refit(m, sys.argv[1], timeout=10, commit=False)
os.kill(os.getpid(), signal.SIGKILL)""", store)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert until(lambda: state(store)["state"] == "TORN", 10), state(store)  # heard after the parent
    healed = trained(seed=1)
    with torch.no_grad():
        for p in healed.parameters():
            p.mul_(2)
    gt.refit(healed, store, timeout=10).close()
    for e in engines:
        got = e.answer()
        assert (got["out"], got["generation"]) == (out(healed), 3), got
    late = engines[0].ask("follow 0.3")
    assert late["errno"] == errno.ETIMEDOUT, late
    assert state(store)["readers"] == "1"  # the other engine; the one that timed out sleeps
    for e in engines:
        e.close()


def test_a_versioned_refit_runs_beside_serving_engines_who_flip_to_it(store):
    """user.gms.versions 2: the trainer does not wait for the engines, which keep serving
    the last commit while it writes; only the allocations its tensors lie in are copied;
    each engine flips when it chooses, at the same addresses, to exactly the trainer's
    weights; a killed trainer leaves what the engines serve whole (never TORN)."""
    publish(store)
    os.setxattr(store, "user.gms.versions", b"2")
    used = state(store)["used"]
    engines = [Engine(store), Engine(store)]
    old = out(ns["build"](seed=1))
    assert engines[0].first["out"] == old
    killed = run_py(MODEL + """
import gmsfs.torch as gt, os, signal, sys
c = gt.refit(build(seed=3), sys.argv[1], timeout=0, commit=False)
os.kill(os.getpid(), signal.SIGKILL)""", store)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert (state(store)["state"], state(store)["torn"]) == ("RO", "0")
    flipped = engines[0].ask("flip")
    assert (flipped["changed"], flipped["out"]) == (0, old)  # nothing committed: served as it was
    # One tensor: only the allocation it lies in is copied (strict=False: a part).
    trainer = trained()
    one = {"layers.0.bias": trainer.layers[0].bias.detach().clone()}
    copies = int(state(store)["version_copies"])
    gt.refit(one, store, strict=False, timeout=0).close()  # at once: the engines read on
    st = state(store)
    assert (st["generation"], st["prev_handles"], int(st["version_copies"])) == ("2", "2", copies + 1), st
    partial = ns["build"](seed=1)
    with torch.no_grad():
        partial.layers[0].bias.copy_(one["layers.0.bias"])
    for e in engines:
        got = e.ask("flip")
        assert (got["changed"], got["out"], got["ptrs"]) == (1, out(partial), e.first["ptrs"]), got
    # The whole trainer, once both flipped: granted at once again.
    gt.refit(trainer, store, timeout=0).close()
    for e in engines:
        got = e.ask("flip")
        assert (got["out"], got["ptrs"]) == (out(trainer), e.first["ptrs"]), got
        e.close()
    st = state(store)
    assert (st["state"], st["torn"], st["prev_handles"], st["used"]) == ("COMMITTED", "0", "0", used), st


def test_a_versioned_refit_that_writes_an_allocation_whole_makes_its_next_version_uncopied(store):
    """The next version of an allocation whose every byte the refit's tensors write is
    made without a copy of the last commit's bytes (version_overwrites); one with bytes
    that no tensor covers is copied; the engine flips to exactly the trainer's weights."""
    code = """
import torch
def build(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(128, 128, bias=False), torch.nn.Linear(128, 128, bias=False))
"""
    w = run_py(code + "import gmsfs.torch as gt, sys\ngt.publish(build(1), sys.argv[1]).close()", store)
    assert w.returncode == 0, w.stderr
    os.setxattr(store, "user.gms.versions", b"2")
    engine = subprocess.Popen([sys.executable, "-c", code + """
import gmsfs.torch as gt, json, sys
m = build(9)
gt.materialize(m, sys.argv[1])
x = torch.ones(1, 128)
for line in sys.stdin:
    gt.flip(m)
    print(json.dumps(m(x).tolist()), flush=True)
""", store], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                              env=dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python")))
    cns = {}
    exec(code, cns)
    trainer = cns["build"](2)
    before = state(store)
    gt.refit(trainer, store, timeout=10).close()  # every tensor: the allocation written whole
    st = state(store)
    made = int(st["version_copies"]) - int(before["version_copies"])
    assert made >= 1 and int(st["version_overwrites"]) - int(before["version_overwrites"]) == made, st
    assert st["version_copied_bytes"] == before["version_copied_bytes"], st
    engine.stdin.write("flip\n")
    engine.stdin.flush()
    assert json.loads(engine.stdout.readline()) == trainer(torch.ones(1, 128)).tolist()
    # One of the two tensors: half the allocation, so it is copied first.
    half = cns["build"](3)
    gt.refit({"0.weight": half[0].weight}, store, strict=False, timeout=10).close()
    st2 = state(store)
    assert (int(st2["version_copies"]) - int(st["version_copies"]), st2["version_overwrites"]) == (1, st["version_overwrites"]), st2
    engine.stdin.write("flip\n")
    engine.stdin.flush()
    with torch.no_grad():
        trainer[0].weight.copy_(half[0].weight)
    assert json.loads(engine.stdout.readline()) == trainer(torch.ones(1, 128)).tolist()
    engine.stdin.close()
    assert engine.wait(20) == 0


def test_a_named_refit_and_engines_that_flip_to_that_name_only(store):
    """gmsfs(5), NAMED VERSIONS: gt.refit(version=) names its commit; an engine's
    gt.flip(m, NAME) goes to that commit or changes nothing; a name is refused again
    before a byte is written."""
    publish(store)
    os.setxattr(store, "user.gms.versions", b"2")
    e = Engine(store)
    old = e.first["out"]
    got = e.ask("flip step-1")
    assert got["errno"] == errno.ENOENT  # not committed yet
    trainer = trained()
    gt.refit(trainer, store, timeout=0, version="step-1").close()
    assert gmsfs.committed_version(store) == "step-1"
    got = e.ask("flip step-1")
    assert (got["out"], got["ptrs"], got["changed"] > 0) == (out(trainer), e.first["ptrs"], True), got
    with pytest.raises(gmsfs.GmsfsError) as err:
        gt.refit(ns["build"](seed=5), store, timeout=0, version="step-1")
    assert err.value.errno == errno.EEXIST and state(store)["generation"] == "2"
    gt.refit(ns["build"](seed=1), store, timeout=0, version="step-2").close()
    got = e.ask("flip step-1")  # the one it serves: nothing to do
    assert (got["changed"], got["out"]) == (0, out(trainer)), got
    got = e.ask("flip step-2")
    assert got["out"] == old, got
    got = e.ask("flip step-1")  # gone by: refused, served as it was
    assert got["errno"] == errno.ESTALE
    got = e.ask("flip step-2")
    assert (got["changed"], got["out"], got["ptrs"]) == (0, old, e.first["ptrs"]), got
    e.close()
    with pytest.raises(ValueError):
        gt.refit(trainer, store, commit=False, version="step-3")


def test_a_flip_made_ahead_points_the_engines_tensors_at_the_next_version_or_back(store):
    """gt.flip_ahead: the trainer's commit mapped beside the one the engine serves, which
    serves on unchanged; flip() points every tensor at the new commit's memory (other
    addresses, the trainer's bytes), back() at the old again; close() lets go of the old
    one, so that the next versioned refit is granted at once; the commit served already
    gives an Ahead with nothing to flip; a name not committed is refused, nothing
    changed."""
    publish(store)
    os.setxattr(store, "user.gms.versions", b"2")
    e = Engine(store)
    old, first = e.first["out"], e.first["ptrs"]
    got = e.ask("ahead step-1 0.2")
    assert got["errno"] == errno.ETIMEDOUT, got  # not committed: the engine as it was
    got = e.ask("flip")
    assert (got["changed"], got["out"], got["ptrs"], state(store)["read_handles"]) == (0, old, first, "1"), got
    trainer = trained()
    gt.refit(trainer, store, timeout=0, version="step-1").close()
    got = e.ask("ahead step-1 5")
    assert (got["out"], got["ptrs"]) == (old, first), got  # mapped beside: served as before
    assert state(store)["prev_handles"] == "1"  # the engine's old reader, on the version before
    got = e.ask("swap")
    assert got["out"] == out(trainer) and got["version"] == "step-1", got
    assert not set(got["ptrs"]) & set(first) and got["changed"] >= len(first), got
    new = got["ptrs"]
    got = e.ask("back")
    assert (got["out"], got["ptrs"], got["version"]) == (old, first, None), got
    got = e.ask("swap")
    assert (got["out"], got["ptrs"]) == (out(trainer), new), got
    got = e.ask("let")  # the old version let go: nobody is on it
    assert (got["out"], state(store)["prev_handles"], state(store)["read_handles"]) == (out(trainer), "0", "1"), got
    second = ns["build"](seed=7)
    gt.refit(second, store, timeout=0, version="step-2").close()  # granted at once
    assert e.ask("ahead step-2 5")["out"] == out(trainer)
    got = e.ask("swap")
    assert got["out"] == out(second) and got["version"] == "step-2", got
    e.ask("let")
    got = e.ask("ahead step-2 5")  # the one it serves: nothing to point
    assert (e.ask("swap")["changed"], e.ask("let")["out"]) == (0, out(second)), got
    e.close()


def test_engines_that_pause_and_a_trainer_that_keeps_its_connection_map_nothing_again(store):
    """An in-place refit with no unmap and no map: each engine pauses (its lock given back,
    its mappings kept), the trainer resumes its own paused connection as a data-only
    writer, copies, commits and pauses again; each engine resumes at the same addresses
    to the trainer's weights, bit for bit.  Twice, with the same connection."""
    publish(store)
    engines = [Engine(store), Engine(store)]
    conn = gmsfs.connect(store, "ro", timeout=5)  # the trainer's, kept from refit to refit
    conn.pause()
    for step in (1, 2):
        for e in engines:
            assert e.ask("pause") == {}
        trainer = trained(seed=1)
        with torch.no_grad():
            for p in trainer.parameters():
                p.mul_(step)
        requests = int(state(store)["socket_requests"])
        assert gt.refit(trainer, conn, timeout=5) is conn and conn.paused
        if step == 2:  # the second: its mappings and tensors kept, nothing exported again
            assert int(state(store)["socket_requests"]) - requests <= 2, state(store)  # bind + commit
        for e in engines:
            woke = e.ask("resume")
            assert (woke["out"], woke["ptrs"]) == (out(trainer), e.first["ptrs"]), woke
    st = state(store)
    assert (st["generation"], st["paused"], st["torn"]) == ("3", "1", "0"), st
    assert not any(m.writable for m in conn.mappings)  # each sealed as its copies landed
    # A source that differs is refused before the connection resumes: still paused, the
    # engines resume to the last refit, nothing torn; the next good one goes through.
    for e in engines:
        assert e.ask("pause") == {}
    with pytest.raises(KeyError) as err:
        gt.refit({"embed.weight": trained(seed=2).embed.weight}, conn, timeout=5)
    assert "the source lacks" in str(err.value) and conn.paused
    st = state(store)
    assert (st["generation"], st["paused"], st["torn"], st["writer"]) == ("3", "3", "0", "0"), st
    for e in engines:
        assert e.ask("resume")["out"] == out(trainer)
    conn.close()
    assert state(store)["paused"] == "0"
    for e in engines:
        e.close()


def test_a_refit_prepared_ahead_copies_and_commits_only(store):
    """gt.refit_prepare does everything before the copies while the trainer's step still
    computes the weights (the write lock, the checks, the next version's imports): the
    engines serve on meanwhile; the refit through its connection then makes and imports
    nothing more, and commits the values the source holds then, not at the prepare.  A
    prepared connection closed writes nothing; a source that differs is refused at the
    prepare with nothing held."""
    publish(store)
    os.setxattr(store, "user.gms.versions", b"2")
    e = Engine(store)
    old = e.first["out"]
    trainer = trained()
    conn = gt.refit_prepare(trainer, store, timeout=0)
    assert conn.lock_mode == "rw"
    with pytest.raises(gmsfs.GmsfsError):  # the store's one writer is the prepared trainer
        gmsfs.connect(store, "data", timeout=0).close()
    prepared = state(store)
    got = e.ask("flip")
    assert (got["changed"], got["out"]) == (0, old), got  # nothing committed yet: served as it was
    with torch.no_grad():  # the step's weights, computed after the prepare
        for p in trainer.parameters():
            p.mul_(2)
    requests = int(state(store)["socket_requests"])
    assert gt.refit(trainer, conn, version="step-1") is conn
    st = state(store)
    assert (st["version_copies"], st["version_overwrites"]) == (prepared["version_copies"],
                                                                 prepared["version_overwrites"]), st
    assert int(st["socket_requests"]) - requests <= 1, st  # its commit
    conn.close()
    assert gmsfs.committed_version(store) == "step-1"
    got = e.ask("flip")
    assert (got["out"], got["ptrs"]) == (out(trainer), e.first["ptrs"]), got
    # Prepared, then closed: nothing written, the last commit served as it was.
    gt.refit_prepare(trained(seed=4), store, timeout=0).close()
    st = state(store)
    assert (st["generation"], st["torn"], st["writer"]) == ("2", "0", "0"), st
    assert e.ask("flip")["out"] == out(trainer)
    # A source that differs: refused at the prepare, and the write lock not kept.
    with pytest.raises(RuntimeError):
        gt.refit_prepare({"embed.weight": torch.zeros(3, 3)}, store, strict=False, timeout=0)
    gt.refit_prepare(trainer, store, timeout=0).close()
    e.close()


def test_a_group_of_torch_ranks_refits_prepared_or_not_and_lets_go_of_its_mappings(store, tmp_path):
    """gmsfs.Group with gt.refit's sources (a module: callable, yet not a writer function):
    each rank's refit commits its step and lets go of its mappings and lock; a rank
    prepared during the step commits the values its tensors hold at the refit, and one
    refused at the refit lets its session go; the engines flip to each step, bit for bit
    the trainer's."""
    stores = [store, store + "-1"]
    os.mkdir(stores[1])
    for s in stores:
        publish(s)
        os.setxattr(s, "user.gms.versions", b"2")
    group = tmp_path / "model.group"
    group.write_text("\n".join(stores) + "\n")
    g = gmsfs.Group.open(str(group))
    engines = [Engine(s) for s in stores]
    trainer = trained()
    assert [g.refit(r, trainer, "step-1", timeout=5) for r in range(2)] == [True, True]
    for s in stores:
        st = state(s)
        assert (st["writer"], st["readers"], st["torn"]) == ("0", "1", "0"), st  # the engine's only
    for e in engines:
        got = e.ask("flip step-1")
        assert (got["out"], got["ptrs"]) == (out(trainer), e.first["ptrs"]), got
    prepared = [g.prepare(r, trainer, "step-2", timeout=5) for r in range(2)]
    with torch.no_grad():
        for p in trainer.parameters():
            p.add_(1)
    with pytest.raises(RuntimeError):  # a source that differs at the refit: refused, the session let go
        g.refit(0, {"embed.weight": torch.zeros(3, 3)}, "step-2", prepared=prepared[0], strict=False)
    assert state(stores[0])["writer"] == "0"
    prepared[0] = g.prepare(0, trainer, "step-2", timeout=0)
    assert [g.refit(r, trainer, "step-2", prepared=prepared[r]) for r in range(2)] == [True, True]
    assert g.version() == "step-2"
    for e in engines:
        got = e.ask("flip step-2")
        assert (got["out"], got["ptrs"]) == (out(trainer), e.first["ptrs"]), got
        e.close()


def test_a_refit_that_closes_leaves_its_mappings_to_the_close_after_the_commit(store, monkeypatch):
    """gmsfs.Group's refit (the connection closed by its commit, commit(close=True)) makes
    no access change and no unmap before the commit (on a GPU the unmaps would stretch the
    copies they run beside): the commit's close lets the mappings go.  Readers get the
    trainer's weights; the store is left free."""
    monkeypatch.setattr(gt, "SLAB_BYTES", 4096)  # publish packs the small model into slabs of 4 KiB
    gt.publish(ns["build"](seed=1), store, private=("scale",)).close()
    with gmsfs.connect(store, "ro") as r:
        assert len(r.import_all()) >= 3
    calls = []
    for name in ("unmap", "commit", "protect"):
        real = getattr(gmsfs.Connection, name)
        monkeypatch.setattr(gmsfs.Connection, name, lambda self, *a, _real=real, _name=name, **kw:
                            (calls.append((_name,) + a + tuple(sorted(kw.items()))), _real(self, *a, **kw))[1])
    trainer = trained()
    conn = gt.refit(trainer, store, timeout=5, version="step-1", _closing=True)
    with pytest.raises(gmsfs.GmsfsError) as e:
        conn.mappings  # closed by its commit
    assert e.value.errno == errno.EBADF
    conn.close()  # nothing left to do
    assert calls[-1] == ("commit", ("close", True), ("version", "step-1")), calls
    assert not [c for c in calls if c[0] == "unmap" or (c[0] == "protect" and not c[2])], calls  # none made read-only
    assert gmsfs.committed_version(store) == "step-1"
    st = read_fields(os.path.join(store, "state"))
    assert st["writer"] == "0" and st["readers"] == "0", st
    engine = Engine(store)
    assert engine.first["out"] == out(trainer)
    engine.close()
