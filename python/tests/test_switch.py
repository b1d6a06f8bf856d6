"""Switches (issue 44), host backend: a store coming in while those that give way go out,
both at once and piece by piece (gmsfs(5), SHARING A GPU).

  - Each switch keeps every byte and hash; the daemon says it switched (not a move out,
    then a move in); the counters count one move each way.
  - The daemon killed mid-switch (GMSFS_FAULT=switch.image:N, switch.give:N: the Nth
    piece's image, or its give back) restarts with every store whole: bytes, hash, and one
    tier each once read.
  - A storm of SIGKILLed clients opening stores (each open a switch) loses nothing.
  - Who gives way: the lowest priority, then the least recently used.
  - gmsfsctl switch and gmsfs.torch.switch, as the man pages show them."""
import json
import os
import random
import signal
import subprocess
import sys
import time

import pytest

from conftest import ROOT, mounted, remove_stores
from test_nothing_lost import died, read_all, restart, start
import gmsfs
from gmsfs.ctl import read_fields

KiB, MiB = 1 << 10, 1 << 20
ENV = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
CTL = [sys.executable, os.path.join(ROOT, "tools", "gmsfsctl")]


def tier(store):
    with open(os.path.join(store, "tier")) as f:
        return f.read().strip()


def device(mnt):
    with open(os.path.join(mnt, "status.json")) as f:
        return json.load(f)["device"]


def fill(store, seed, n=8, size=256 * KiB):
    """A committed store of n allocations of random bytes: {name: bytes}, and its hash."""
    os.mkdir(store)
    rnd = random.Random(seed)
    want = {}
    with gmsfs.connect(store, "rw", timeout=20) as c:
        for i in range(n):
            m = c.create("w%d" % i, size)
            want[m.name] = rnd.randbytes(size)
            c.buffer(m.ptr, size, writable=True)[:] = want[m.name]
            c.meta_put("k%d" % i, m.name, 0, b"seed %d" % seed)
        c.commit()
        return want, c.layout_hash


def whole(store, want, timeout=20):
    got, h = read_all(store, timeout)
    assert got.keys() == want[0].keys(), sorted(got)
    for k in got:
        zeros = got[k] == bytes(len(got[k]))
        assert got[k] == want[0][k], "%s/%s: %s" % (store, k, "zeros" if zeros else "other bytes")
    assert h == want[1], store


@pytest.fixture
def one():
    """A mount whose device holds one 2 MiB store (and a little more)."""
    yield from mounted("backend=host", "max_bytes=3M", "host_bytes=64M")


def test_a_switch_moves_both_ways_at_once_and_keeps_every_byte(one):
    a, b = os.path.join(one, "a"), os.path.join(one, "b")
    want = {a: fill(a, 1), b: fill(b, 2)}  # b's create moved a out (an eviction)
    assert (tier(a), tier(b)) == ("host", "device")
    d0 = device(one)
    for i, s in enumerate([a, b, a, b, a]):
        whole(s, want[s])  # the open of a store on the host tier switches it in
        other = b if s == a else a
        assert (tier(s), tier(other)) == ("device", "host"), i
    d = device(one)
    log = open(one + ".log").read()
    assert log.count("switched in") >= 5 and "gave way for" in log, log[-2000:]
    moves = d["moves_to_host"] - d0["moves_to_host"]
    assert moves == d["moves_to_device"] - d0["moves_to_device"] == 5, d
    remove_stores(one)


def test_a_switch_copies_a_piece_each_way_a_round_even_with_room_to_spare(one):
    # a: one allocation of 2 MiB; b: eight of 256 KiB.  b coming in while a goes out has
    # room for four of b's at once (1 MiB free), but a round copies a piece each way (a
    # sixteenth, at least one allocation): ins of many pieces would keep the outs of the
    # rounds after waiting behind them (gmsfs(5), SHARING A GPU).
    a, b = os.path.join(one, "a"), os.path.join(one, "b")
    want = {a: fill(a, 5, n=1, size=2 * MiB), b: fill(b, 6)}
    whole(a, want[a])  # a in, b out: one out a round
    whole(b, want[b])  # b in, a out
    assert (tier(a), tier(b)) == ("host", "device")
    lines = [l for l in open(one + ".log").read().splitlines() if "switched in" in l]
    assert len(lines) == 2 and ": a: " in lines[0] and ": b: " in lines[1], lines
    assert [int(l.split(" rounds")[0].rsplit(" ", 1)[1]) for l in lines] == [8, 8], lines
    remove_stores(one)


# The daemon dies at a switch's Nth piece: before its image (the piece's stores come back
# as they were before it) or after, before the device memory it left is given back.
CRASHES = [(step, n) for step in ("image", "give") for n in (1, 3)]


def crash_mid_switch(tmp_path, fault, opts, fill_stores, check=lambda s: None):
    """Two stores (fill_stores(mnt): {store: want}) on a device that holds one; a read of
    the one out makes the daemon die at fault mid-switch; the next daemon serves both
    whole, on one tier each (check(store) after each read)."""
    from manager import Manager
    mnt = os.path.realpath(str(tmp_path / "m"))
    os.mkdir(mnt)
    sd = str(tmp_path / "state")
    m = Manager()
    try:
        start(m, mnt, sd, *opts)
        want = fill_stores(mnt)
        a, b = sorted(want)
        restart(m, mnt, sd, *opts, sig=signal.SIGTERM, fault=fault)
        try:
            read_all(a, timeout=5)  # a comes in, b goes out: the daemon dies mid-way
        except (gmsfs.GmsfsError, OSError):
            pass
        assert died(m), "the daemon did not die at " + fault
        restart(m, mnt, sd, *opts)
        tiers = {s: tier(s) for s in want}
        assert set(tiers.values()) <= {"host", "device"}, tiers
        for s in (b, a, b):  # each read brings it in whole (a mixed store: the rest of it)
            whole(s, want[s])
            assert tier(s) == "device"
            check(s)
        m.kill(signal.SIGTERM)
    finally:
        m.close()
        subprocess.run(["umount", "-l", mnt], capture_output=True)


@pytest.mark.parametrize("step,n", CRASHES, ids=["switch.%s:%d" % c for c in CRASHES])
def test_a_crash_mid_switch_loses_nothing(tmp_path, step, n):
    def fill_two(mnt):
        a, b = os.path.join(mnt, "a"), os.path.join(mnt, "b")
        return {a: fill(a, 3), b: fill(b, 4)}
    crash_mid_switch(tmp_path, "switch.%s:%d" % (step, n), ("max_bytes=3M",), fill_two)


def storm_of_readers(stores, clients, seed):
    """clients readers of stores at random, each importing and holding a moment, some
    SIGKILLed while waiting, holding or mapping; returns when all are gone."""
    code = ("import sys, time, gmsfs\n"
            "with gmsfs.connect(sys.argv[1], 'ro', timeout=30) as c:\n"
            "    c.import_all()\n"
            "    time.sleep(float(sys.argv[2]))\n")
    rnd = random.Random(seed)
    live = []
    for _ in range(clients):
        live.append(subprocess.Popen([sys.executable, "-c", code, rnd.choice(stores), "%.3f" % (rnd.random() * 0.05)],
                                     env=ENV, stderr=subprocess.DEVNULL))
        time.sleep(rnd.random() * 0.03)
        if rnd.random() < 0.4:
            victim = rnd.choice(live)
            if victim.poll() is None:
                victim.send_signal(signal.SIGKILL)
    for p in live:
        p.wait(60)


def test_a_storm_of_killed_clients_during_switches_loses_nothing():
    # Four 1 MiB stores on a device that holds two: every open of one on the host tier is
    # a switch; 60 clients open at random, some SIGKILLed waiting, holding or mapping.
    for mnt in mounted("backend=host", "max_bytes=2304K", "host_bytes=64M"):
        stores = [os.path.join(mnt, "s%d" % i) for i in range(4)]
        want = {s: fill(s, 10 + i, n=4) for i, s in enumerate(stores)}
        storm_of_readers(stores, 60, 7)
        for s in stores:
            whole(s, want[s], timeout=30)
            assert tier(s) in ("host", "device")
            st = read_fields(os.path.join(s, "state"))
            assert st["readers"] == "0" and st["writer"] == "0", st
        log = open(mnt + ".log").read()
        assert "switched in" in log and "left on both tiers" not in log
        remove_stores(mnt)


def test_who_gives_way_lowest_priority_then_least_recently_used():
    for mnt in mounted("backend=host", "max_bytes=2304K", "host_bytes=64M"):
        p, q, r = (os.path.join(mnt, n) for n in "pqr")
        want = {p: fill(p, 20, n=4), q: fill(q, 21, n=4)}
        os.setxattr(q, "user.gms.priority", b"5")
        want[r] = fill(r, 22, n=4)  # r's create: p (priority 0) gives way, not q
        assert (tier(p), tier(q), tier(r)) == ("host", "device", "device")
        whole(p, want[p])  # p comes in: r (priority 0) goes, q (5) stays
        assert (tier(p), tier(q), tier(r)) == ("device", "device", "host")
        os.setxattr(q, "user.gms.priority", b"0")
        whole(q, want[q])  # q read last: it is the most recently used
        whole(r, want[r])  # r comes in: p (used before q) gives way
        assert (tier(p), tier(q), tier(r)) == ("host", "device", "device")
        remove_stores(mnt)


def test_gmsfsctl_switch_brings_a_store_in_and_says_who_went_out(one):
    a, b = os.path.join(one, "a"), os.path.join(one, "b")
    want = {a: fill(a, 30), b: fill(b, 31)}
    r = subprocess.run(CTL + ["switch", a], env=ENV, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("%s: device in " % a) and "to the host tier: b" in r.stdout, r.stdout
    assert (tier(a), tier(b)) == ("device", "host")
    r = subprocess.run(CTL + ["switch", a], env=ENV, capture_output=True, text=True)
    assert r.returncode == 0 and "to the host tier" not in r.stdout, r.stdout  # there already
    with gmsfs.connect(a, "ro"):  # a held: b cannot come in
        r = subprocess.run(CTL + ["switch", b, "--timeout", "2"], env=ENV, capture_output=True, text=True)
        assert r.returncode == 1 and "b: host after" in r.stderr, r.stderr
    r = subprocess.run(CTL + ["switch", os.path.join(one, "nothing")], env=ENV, capture_output=True, text=True)
    assert r.returncode == 1 and "not a gmsfs store" in r.stderr, r.stderr
    whole(a, want[a])
    whole(b, want[b])
    remove_stores(one)


def test_torch_switch_sleeps_one_model_and_wakes_the_other(one):
    torch = pytest.importorskip("torch")
    code = r"""
import os, sys, torch, gmsfs.torch as gt
mnt = sys.argv[1]
torch.manual_seed(0)
ms = {n: torch.nn.Linear(1024, 512) for n in "ab"}  # 2 MiB of weights each: one fits
ref = {n: m.weight.detach().clone() for n, m in ms.items()}
for n, m in ms.items():  # each published, then let go: the next one's room
    os.mkdir(os.path.join(mnt, n))
    gt.publish(m, os.path.join(mnt, n)).close()
live = {}
for n in "ab":
    live[n] = torch.nn.Linear(1024, 512, device="meta")
    gt.materialize(live[n], os.path.join(mnt, n))
    gt.sleep(live[n])
gt.wake(live["a"])
ptr = {n: live[n].weight.data_ptr() for n in "ab"}
tier = lambda n: open(os.path.join(mnt, n, "tier")).read().strip()
for want in "baba":
    other = "a" if want == "b" else "b"
    assert gt.switch(live[other], live[want], timeout=20) is live[want]
    assert torch.equal(live[want].weight, ref[want]) and live[want].weight.data_ptr() == ptr[want]
    assert tier(want) == "device" and tier(other) == "host", (tier(want), tier(other))
print("ok")
"""
    r = subprocess.run([sys.executable, "-c", code, one], env=ENV, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stdout + r.stderr
    assert open(one + ".log").read().count("switched in") >= 4
    remove_stores(one)
