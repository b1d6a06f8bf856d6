"""Allocations in pieces (issue 56), host backend: past the mount's piece size
(-o piece_bytes=), an allocation is memory in pieces, each its own buffer, mapped side by
side by every client at one address (gmsfs(5), PIECES).

  - Its bytes are one allocation's for every way in: the file (read, write across a
    piece's end), a writer's mapping, a reader's import in another process, gmsfsctl.
  - A store of one such allocation switches in rounds of a piece each way (a store of one
    piece of memory could only go all out, then all in), and loses nothing when the
    daemon dies mid-switch or clients are SIGKILLed during switches.
  - A restart under a service manager (SIGKILL), a takeover, and a move to the host tier
    and back keep it whole."""
import json
import os
import random
import signal
import subprocess
import time

import pytest

from conftest import BUILD, mounted, remove_stores, run_py
from test_nothing_lost import restart, start
from test_switch import crash_mid_switch, storm_of_readers, tier, whole
import gmsfs

KiB, MiB = 1 << 10, 1 << 20


def fill_one(store, seed, size):
    """A committed store of one allocation of size random bytes: ({name: bytes}, hash)."""
    os.mkdir(store)
    data = random.Random(seed).randbytes(size)
    with gmsfs.connect(store, "rw", timeout=20) as c:
        m = c.create("w", size)
        c.buffer(m.ptr, size, writable=True)[:] = data
        c.meta_put("k", "w", 0, b"seed %d" % seed)
        c.commit()
        return {"w": data}, c.layout_hash


def pieces_of(mnt, store):
    with open(os.path.join(mnt, "status.json")) as f:
        st = {s["name"]: s for s in json.load(f)["stores"]}
    return st[os.path.basename(store)]["pieces"]


def rounds(log, store):
    """The rounds of each switch that brought store in, as the daemon's log says them."""
    lines = [l for l in open(log).read().splitlines() if "switched in" in l and ": %s: " % store in l]
    return [int(l.split(" rounds")[0].rsplit(" ", 1)[1]) for l in lines]


@pytest.fixture
def small():
    """Pieces of 1 MiB on a device that holds one store of 8 MiB and a little more."""
    yield from mounted("backend=host", "piece_bytes=1M", "max_bytes=10M", "host_bytes=64M")


def test_bytes_in_pieces_are_one_allocation_every_way_in(small):
    s = os.path.join(small, "s")
    size = 5 * MiB + 12 * KiB  # six pieces, the last of 12 KiB
    want = fill_one(s, 1, size)
    assert pieces_of(small, s) == 6
    f = os.path.join(s, "allocs", "w")
    assert os.path.getsize(f) == size
    with open(f, "rb") as fh:
        assert fh.read() == want[0]["w"]  # read through the file, across every piece's end
    r = run_py("import sys, gmsfs, zlib\n"
               "with gmsfs.connect(sys.argv[1], 'ro', timeout=20) as c:\n"
               "    c.import_all()\n"
               "    m = c.mappings[0]\n"
               "    print(m.size, zlib.crc32(bytes(c.buffer(m.ptr, m.size))))\n", s)
    import zlib
    assert r.returncode == 0 and r.stdout.split() == [str(size), str(zlib.crc32(want[0]["w"]))], r.stdout + r.stderr
    # A writer's session: bytes written through the file across a piece's end.
    with gmsfs.connect(s, "rw", timeout=20) as c:
        fd = os.open(f, os.O_WRONLY)
        os.pwrite(fd, b"\xab" * 8192, MiB - 4096)
        os.close(fd)
        c.import_all()
        m = c.mappings[0]
        got = bytes(c.buffer(m.ptr, m.size))
        assert got[MiB - 4096:MiB + 4096] == b"\xab" * 8192 and got[:MiB - 4096] == want[0]["w"][:MiB - 4096]
        c.commit()
    whole(s, ({"w": want[0]["w"][:MiB - 4096] + b"\xab" * 8192 + want[0]["w"][MiB + 4096:]}, want[1]))
    remove_stores(small)


def test_a_store_of_one_allocation_switches_in_rounds_of_a_piece(small):
    a, b = os.path.join(small, "a"), os.path.join(small, "b")
    want = {a: fill_one(a, 2, 8 * MiB), b: fill_one(b, 3, 8 * MiB)}  # b's create moved a out
    assert (tier(a), tier(b)) == ("host", "device")
    for s in (a, b, a):
        whole(s, want[s])
        assert tier(s) == "device"
    # One piece of memory each way a round: 8 rounds, where one 8 MiB piece of memory
    # could only go all out, then come all in (2).
    assert rounds(small + ".log", "a") == [8, 8] and rounds(small + ".log", "b") == [8], \
        open(small + ".log").read()[-2000:]
    assert "left on both tiers" not in open(small + ".log").read()
    remove_stores(small)


CRASHES = [(step, n) for step in ("image", "give") for n in (1, 4)]


@pytest.mark.parametrize("step,n", CRASHES, ids=["switch.%s:%d" % c for c in CRASHES])
def test_a_crash_mid_switch_of_pieces_loses_nothing(tmp_path, step, n):
    def fill_two(mnt):
        a, b = os.path.join(mnt, "a"), os.path.join(mnt, "b")
        return {a: fill_one(a, 4, 8 * MiB), b: fill_one(b, 5, 8 * MiB)}
    def eight_pieces(s):
        assert pieces_of(os.path.dirname(s), s) == 8
    crash_mid_switch(tmp_path, "switch.%s:%d" % (step, n), ("piece_bytes=1M", "max_bytes=10M"), fill_two,
                     check=eight_pieces)


def test_a_storm_of_killed_clients_during_switches_of_pieces_loses_nothing():
    # Three stores of one 4 MiB allocation in 1 MiB pieces on a device that holds two.
    for mnt in mounted("backend=host", "piece_bytes=1M", "max_bytes=9M", "host_bytes=64M"):
        stores = [os.path.join(mnt, "s%d" % i) for i in range(3)]
        want = {s: fill_one(s, 10 + i, 4 * MiB) for i, s in enumerate(stores)}
        storm_of_readers(stores, 40, 8)
        for s in stores:
            whole(s, want[s], timeout=30)
        log = open(mnt + ".log").read()
        assert "switched in" in log and "left on both tiers" not in log
        remove_stores(mnt)


def test_a_restart_a_takeover_and_a_move_keep_pieces_whole(tmp_path):
    from manager import Manager
    mnt = os.path.realpath(str(tmp_path / "m"))
    os.mkdir(mnt)
    sd = str(tmp_path / "state")
    m = Manager()
    try:
        start(m, mnt, sd, "piece_bytes=1M")
        s = os.path.join(mnt, "s")
        want = fill_one(s, 20, 3 * MiB + 4 * KiB)
        restart(m, mnt, sd, "piece_bytes=1M")  # SIGKILL: back from the manager's descriptors
        whole(s, want)
        assert pieces_of(mnt, s) == 4
        with open(os.path.join(s, "tier"), "w") as f:
            f.write("host\n")
        for _ in range(500):
            if tier(s) == "host":
                break
            time.sleep(0.01)
        assert tier(s) == "host"
        restart(m, mnt, sd, "piece_bytes=1M")  # its memory on the host tier, in pieces
        whole(s, want)  # the open brings it back
        assert tier(s) == "device" and pieces_of(mnt, s) == 4
        m.kill(signal.SIGTERM)
    finally:
        m.close()
        subprocess.run(["umount", "-l", mnt], capture_output=True)
    # A takeover hands it over as it is.
    for mnt in mounted("backend=host", "piece_bytes=1M"):
        s = os.path.join(mnt, "s")
        want = fill_one(s, 21, 2 * MiB + 8 * KiB)
        log = open(mnt + ".takeover.log", "w")
        new = subprocess.Popen([os.path.join(BUILD, "gmsfs"), "-f", "-o", "takeover", mnt], stderr=log)
        try:
            for _ in range(300):
                if "took 1 stores over" in open(mnt + ".takeover.log").read():
                    break
                time.sleep(0.02)
            whole(s, want)
            assert pieces_of(mnt, s) == 3
            dev = open(os.path.join(mnt, "device")).read()
            assert "piece_bytes=1048576" in dev, dev  # kept by the successor
        finally:
            subprocess.run(["umount", mnt], capture_output=True)
            new.wait(10)
            log.close()
            os.unlink(mnt + ".takeover.log")


def test_piece_bytes_is_checked():
    d = os.path.realpath(__import__("tempfile").mkdtemp(prefix="gmsfs-pieces."))
    try:
        r = subprocess.run([os.path.join(BUILD, "gmsfs"), "-f", "-o", "piece_bytes=lots", d], capture_output=True,
                           text=True, timeout=10)
        assert r.returncode == 2 and "piece_bytes=lots: not a size" in r.stderr, r.stderr
    finally:
        os.rmdir(d)
