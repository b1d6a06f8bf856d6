"""Several models on one GPU's mount (host backend): quotas, the host tier, priorities and
eviction, deferred removal.  A mount of its own: a 64 MiB device and a 48 MiB host tier."""
import errno
import json
import os
import random
import signal
import subprocess
import sys
import time

import pytest

from conftest import mounted, remove_stores
import gmsfs
from gmsfs.ctl import read_fields

MiB = 1 << 20


@pytest.fixture(scope="module")
def small():
    yield from mounted("backend=host", "max_bytes=64M", "host_bytes=48M")


@pytest.fixture
def clean(small):
    """The small mount, emptied after the test (a store left on a tier would skew the next)."""
    yield small
    remove_stores(small)


def state(store):
    return read_fields(os.path.join(store, "state"))


def device(mnt):
    return read_fields(os.path.join(mnt, "device"))


def tier(store):
    with open(os.path.join(store, "tier")) as f:
        return f.read().strip()


def set_tier(store, where):
    with open(os.path.join(store, "tier"), "w") as f:
        f.write(where + "\n")


def wait_tier(store, where, timeout=10):
    t = time.time()
    while tier(store) != where:
        assert time.time() - t < timeout, "%s is %s, not %s" % (store, tier(store), where)
        time.sleep(0.01)


def publish(mnt, name, sizes, seed):
    """A committed store of random bytes; returns the bytes per allocation and its hash."""
    store = os.path.join(mnt, name)
    os.mkdir(store)
    rng = random.Random(seed)
    data = {}
    with gmsfs.connect(store, "rw") as c:
        for i, n in enumerate(sizes):
            m = c.create("a%d" % i, n)
            data["a%d" % i] = bytes(rng.getrandbits(8) for _ in range(4096)) * (n // 4096)
            c.buffer(m.ptr, n, writable=True)[:] = data["a%d" % i]
        c.meta_put("w", "a0", 0, b"value")
        c.commit()
        return store, data, c.layout_hash


def read_all(store):
    with gmsfs.connect(store, "ro", timeout=10) as c:
        c.import_all()
        return {m.name: bytes(c.buffer(m.ptr, m.size)) for m in c.mappings}, c.layout_hash, c.meta_get("w").value


def test_quota_refuses_past_it_and_says_so(clean):
    store = os.path.join(clean, "q")
    os.mkdir(store)
    os.setxattr(store, "user.gms.quota", b"8M")
    assert os.getxattr(store, "user.gms.quota") == str(8 * MiB).encode()
    for bad in (b"", b"abc", b"-1", b"0", b"8X", b"1M\n2"):
        with pytest.raises(OSError) as e:
            os.setxattr(store, "user.gms.quota", bad)
        assert e.value.errno == errno.EINVAL, bad
    with gmsfs.connect(store, "rw") as c:
        c.create("a", 6 * MiB)
        with pytest.raises(gmsfs.GmsfsError) as e:
            c.create("b", 4 * MiB)
        assert e.value.errno == errno.ENOSPC
        assert "quota is 8388608 bytes, 6291456 used" in state(store)["last_error"]
        with pytest.raises(OSError) as e:  # below what it holds
            os.setxattr(store, "user.gms.quota", b"4M")
        assert e.value.errno == errno.EINVAL
        c.create("b", 2 * MiB)  # up to the quota exactly
        c.commit()
    st = os.statvfs(store)
    assert st.f_blocks * st.f_frsize == 8 * MiB and st.f_bfree == 0
    status = json.load(open(os.path.join(clean, "status.json")))
    s = next(s for s in status["stores"] if s["name"] == "q")
    assert s["quota"] == 8 * MiB
    metrics = open(os.path.join(clean, "metrics")).read()
    assert 'gmsfs_store_quota_bytes{device="%s",gpu="0",UUID="%s",store="q"} %d' % (status["device"]["uuid"], status["device"]["uuid"], 8 * MiB) in metrics
    assert 'gmsfs_store_used_bytes{device="%s",gpu="0",UUID="%s",store="q"} %d' % (status["device"]["uuid"], status["device"]["uuid"], 8 * MiB) in metrics
    os.removexattr(store, "user.gms.quota")
    with pytest.raises(OSError):
        os.getxattr(store, "user.gms.quota")


def test_a_store_seen_on_the_host_tier_has_given_its_device_memory_back(clean):
    """Whoever reads tier "host" reads the device memory free too: the move gives it back
    before it shows (a reader of state and device never sees both tiers hold it)."""
    store, data, h = publish(clean, "r", [2 * MiB] * 12, 1)
    dev = int(device(clean)["used_bytes"])
    seen = []
    for _ in range(30):
        set_tier(store, "host")
        wait_tier(store, "host")
        seen.append(int(device(clean)["used_bytes"]))
        with open(os.path.join(store, "prefetch"), "w") as f:
            f.write("1\n")
        wait_tier(store, "device")
    assert seen == [dev - 24 * MiB] * 30, seen


def test_a_store_moves_to_the_host_tier_and_back_unchanged(clean):
    store, data, h = publish(clean, "t", [4 * MiB, 8 * MiB], 1)
    dev = int(device(clean)["used_bytes"])
    set_tier(store, "host")
    wait_tier(store, "host")
    d = device(clean)
    assert int(d["used_bytes"]) == dev - 12 * MiB and int(d["host_used_bytes"]) == 12 * MiB
    assert state(store)["layout_hash"] == h and state(store)["generation"] == "1"
    got, h2, w = read_all(store)  # the import brings it back
    assert tier(store) == "device" and got == data and h2 == h and w == b"value"
    # Its host memory is kept for the next move out, which copies into it.
    d = device(clean)
    assert int(d["host_used_bytes"]) == 12 * MiB and int(d["host_standby_bytes"]) == 12 * MiB
    set_tier(store, "host")
    wait_tier(store, "host")
    d = device(clean)
    assert int(d["host_used_bytes"]) == 12 * MiB and int(d["host_standby_bytes"]) == 0
    assert read_all(store) == (data, h, b"value")


def test_kept_host_memory_is_given_up_when_the_host_tier_needs_room(clean):
    # 48 MiB host tier: a keeps 32 MiB after its round trip; b's 24 MiB needs 8 of them.
    a, data_a, ha = publish(clean, "kept_a", [16 * MiB, 16 * MiB], 3)
    set_tier(a, "host")
    wait_tier(a, "host")
    set_tier(a, "device")
    wait_tier(a, "device")
    assert int(device(clean)["host_standby_bytes"]) == 32 * MiB
    b, data_b, hb = publish(clean, "kept_b", [24 * MiB], 4)
    set_tier(b, "host")
    wait_tier(b, "host")
    d = device(clean)
    assert int(d["host_standby_bytes"]) == 0 and int(d["host_used_bytes"]) == 24 * MiB
    status = json.load(open(os.path.join(clean, "status.json")))
    assert status["device"]["host_standby_bytes"] == 0
    assert read_all(a) == (data_a, ha, b"value") and read_all(b) == (data_b, hb, b"value")


def test_a_sleeping_reader_remaps_at_the_same_addresses(clean):
    store, data, h = publish(clean, "sleep", [4 * MiB], 2)
    with gmsfs.connect(store, "ro") as c:
        c.import_all()
        ptr = c.mappings[0].ptr
        c.unmap_all()  # asleep: it holds no lock, so the store may move
        set_tier(store, "host")
        wait_tier(store, "host")
        c.remap_all(timeout=10)
        assert tier(store) == "device"
        assert c.mappings[0].ptr == ptr and bytes(c.buffer(ptr, 4 * MiB)) == data["a0"]


def test_what_may_not_move_is_refused(clean):
    store = os.path.join(clean, "busy")
    os.mkdir(store)
    with pytest.raises(OSError) as e:  # nothing committed
        set_tier(store, "host")
    assert e.value.errno == errno.EINVAL
    with gmsfs.connect(store, "rw") as c:
        c.create("a", MiB)
        with pytest.raises(OSError) as e:  # a writer's session moves nothing
            set_tier(store, "host")
        assert e.value.errno in (errno.EINVAL, errno.EBUSY)
        c.commit()
        with pytest.raises(OSError) as e:  # a reader holds it
            set_tier(store, "host")
        assert e.value.errno == errno.EBUSY and "in use" in state(store)["last_error"]
    for bad in ("hots", "", "device host"):
        with pytest.raises(OSError) as e:
            set_tier(store, bad)
        assert e.value.errno == errno.EINVAL
    assert tier(store) == "device"


def test_an_open_that_may_not_wait_fails_and_brings_it_back(clean):
    store, data, h = publish(clean, "nb", [MiB], 3)
    set_tier(store, "host")
    wait_tier(store, "host")
    with pytest.raises(OSError) as e:
        os.open(os.path.join(store, "lock"), os.O_RDONLY | os.O_NONBLOCK)
    assert e.value.errno == errno.EAGAIN and "host" in state(store)["last_error"]
    wait_tier(store, "device")  # the refused open asked for it all the same
    with open(os.path.join(store, "prefetch"), "w") as f:  # on the device already: nothing to do
        f.write("\n")


def test_eviction_lowest_priority_first_then_least_recently_used(clean):
    a, da, ha = publish(clean, "a", [16 * MiB], 4)
    b, db, hb = publish(clean, "b", [16 * MiB], 5)
    c, dc, hc = publish(clean, "c", [16 * MiB], 6)
    os.setxattr(b, "user.gms.priority", b"5")
    for bad in (b"1001", b"x", b"1.5", b""):
        with pytest.raises(OSError):
            os.setxattr(b, "user.gms.priority", bad)
    read_all(a)  # a used after c: c is the least recently used of priority 0
    new = os.path.join(clean, "new")
    os.mkdir(new)
    with gmsfs.connect(new, "rw") as w:
        w.create("x", 24 * MiB)  # 48 + 24 > 64: one store of 16 goes... c first
        assert (tier(a), tier(b), tier(c)) == ("device", "device", "host")
        w.create("y", 24 * MiB)  # then a (priority 0), never b before them
        assert (tier(a), tier(b), tier(c)) == ("host", "device", "host")
        with pytest.raises(gmsfs.GmsfsError) as e:  # b alone cannot make room for 32: nothing moves
            w.create("z", 32 * MiB)
        assert e.value.errno == errno.ENOSPC and tier(b) == "device"
        why = state(new)["last_error"]
        assert "host tier" in why and "b holds 16777216 (idle)" in why and "new holds" in why, why
        os.setxattr(new, "user.gms.quota", b"56M")
        with pytest.raises(gmsfs.GmsfsError) as e:  # past the quota: nobody is moved for it
            w.create("q", 16 * MiB)
        assert e.value.errno == errno.ENOSPC and tier(b) == "device" and "quota" in state(new)["last_error"]
        w.commit()
    status = json.load(open(os.path.join(clean, "status.json")))
    assert status["device"]["evictions"] >= 2 and status["device"]["moves_to_host"] >= 2
    os.rmdir(new)  # room again: every store reads back as published
    for s, d, h in ((a, da, ha), (b, db, hb), (c, dc, hc)):
        got, h2, _ = read_all(s)
        assert got == d and h2 == h


def test_removal_is_deferred_while_readers_hold_the_store(clean):
    store, data, h = publish(clean, "r", [8 * MiB], 7)
    used = int(device(clean)["used_bytes"])
    with gmsfs.connect(store, "ro") as c:
        c.import_all()
        os.rmdir(store)  # succeeds with a reader
        assert not os.path.exists(store)
        with pytest.raises(OSError):
            os.open(os.path.join(store, "lock"), os.O_RDONLY)
        gone = [s for s in json.load(open(os.path.join(clean, "status.json")))["stores"] if s["name"] == "r"]
        assert len(gone) == 1 and gone[0]["removing"] is True
        os.mkdir(store)  # the name is free at once
        assert int(device(clean)["used_bytes"]) == used  # the memory stays while held
        assert bytes(c.buffer(c.mappings[0].ptr, 8 * MiB)) == data["a0"]
    t = time.time()
    while int(device(clean)["used_bytes"]) != used - 8 * MiB:
        assert time.time() - t < 5
        time.sleep(0.02)
    assert [s["name"] for s in json.load(open(os.path.join(clean, "status.json")))["stores"]].count("r") == 1


READER = """
import sys, time
sys.path.insert(0, sys.argv[2])
import gmsfs
while True:
    with gmsfs.connect(sys.argv[1], "ro", timeout=30) as c:
        c.import_all()
        c.unmap_all()
"""


def test_a_kill_storm_across_moves_loses_nothing(clean):
    """Readers SIGKILLed at random while the store goes to the host tier and back: every
    move completes or is refused, and the bytes and the hash stay."""
    store, data, h = publish(clean, "storm", [4 * MiB, 4 * MiB], 8)
    pkg = os.path.join(os.path.dirname(gmsfs.__file__), "..")
    rng = random.Random(9)
    procs = []
    moved = 0
    t = time.time()
    while time.time() - t < 8:
        procs.append(subprocess.Popen([sys.executable, "-c", READER, store, pkg]))
        time.sleep(rng.random() * 0.05)
        try:
            set_tier(store, rng.choice(["host", "device"]))
            moved += 1
        except OSError as e:
            assert e.errno == errno.EBUSY
        if len(procs) > 3 or rng.random() < 0.5:
            p = procs.pop(rng.randrange(len(procs)))
            p.send_signal(signal.SIGKILL)
            p.wait()
    for p in procs:
        p.kill()
        p.wait()
    assert moved > 0
    got, h2, w = read_all(store)
    assert got == data and h2 == h and w == b"value"
    st = state(store)
    assert st["readers"] == "0" and st["state"] == "COMMITTED"


def test_gmsfsctl_tier_and_prefetch(clean):
    store, data, h = publish(clean, "ctl", [MiB], 10)
    ctl = [sys.executable, "-m", "gmsfs.ctl"]
    env = dict(os.environ, PYTHONPATH=os.path.join(os.path.dirname(gmsfs.__file__), ".."))
    r = subprocess.run(ctl + ["tier", store, "host"], env=env, capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout == "host\n" and tier(store) == "host", r.stderr
    r = subprocess.run(ctl + ["list", clean], env=env, capture_output=True, text=True)
    assert r.returncode == 0 and "ctl" in r.stdout and " host " in r.stdout, r.stdout
    gmsfs.prefetch(store)
    wait_tier(store, "device")
    with gmsfs.connect(store, "ro"):  # held: refused, with the reason
        r = subprocess.run(ctl + ["tier", store, "host"], env=env, capture_output=True, text=True)
        assert r.returncode == 1 and "in use" in r.stderr, r.stderr
    got, h2, _ = read_all(store)
    assert got == data and h2 == h


def wait_kept(mnt, n, timeout=10):
    t = time.time()
    while int(device(mnt)["host_standby_bytes"]) != n:
        assert time.time() - t < timeout, "host_standby_bytes %s, not %d" % (device(mnt)["host_standby_bytes"], n)
        time.sleep(0.02)


def test_host_ahead_makes_host_memory_before_the_first_move_out_within_host_bytes():
    # By default (host_ahead): committed stores get their host memory made while nothing
    # else is asked of the tier, lowest priority first, never past host_bytes (24 MiB here).
    for mnt in mounted("backend=host", "max_bytes=64M", "host_bytes=24M"):
        assert ",host_ahead," in "," + device(mnt)["options"] + ","
        a, data_a, ha = publish(mnt, "ahead_a", [8 * MiB, 4 * MiB], 5)
        wait_kept(mnt, 12 * MiB)  # a reader holding it or not: made in a second or so
        os.setxattr(a, "user.gms.priority", b"5")
        b, data_b, hb = publish(mnt, "ahead_b", [16 * MiB], 6)
        time.sleep(2.5)  # b's 16 MiB does not fit beside a's 12: nothing given up for it
        assert int(device(mnt)["host_standby_bytes"]) == 12 * MiB
        set_tier(a, "host")  # the first move out copies into what was made
        wait_tier(a, "host")
        d = device(mnt)
        assert int(d["host_standby_bytes"]) == 0 and int(d["host_used_bytes"]) == 12 * MiB
        set_tier(a, "device")
        wait_tier(a, "device")
        assert read_all(a) == (data_a, ha, b"value") and read_all(b) == (data_b, hb, b"value")
        wait_kept(mnt, 12 * MiB)  # a's memory, kept from its move in; b's still does not fit
        with open(mnt + ".log") as f:
            log = f.read()
        assert "ahead_a: 12582912 bytes of host memory made ahead of its first move out" in log, log
        assert "ahead_b: 16777216 bytes of host memory made ahead" not in log
        remove_stores(mnt)
    for mnt in mounted("backend=host", "max_bytes=64M", "host_bytes=24M", "no_host_ahead"):
        assert ",no_host_ahead," in "," + device(mnt)["options"] + ","
        publish(mnt, "not_ahead", [4 * MiB], 7)
        time.sleep(1.5)  # the mover thread looks every second when it makes memory ahead
        assert int(device(mnt)["host_standby_bytes"]) == 0
        remove_stores(mnt)


def test_host_ahead_waits_for_a_quiet_mount_at_most_10_s():
    # Pinning host memory holds the driver: an engine mapping or committing beside it
    # waits.  So host memory is made ahead once no client has asked anything that maps,
    # makes or commits for a second, or after 10 s of waiting for that (gmsfs(8)).
    for mnt in mounted("backend=host", "max_bytes=64M", "host_bytes=24M"):
        busy, _, _ = publish(mnt, "busy", [4 * MiB], 8)
        t0, kept_at = time.time(), None
        while time.time() - t0 < 14 and kept_at is None:  # a client connecting every 0.2 s
            with gmsfs.connect(busy, "ro", timeout=5):
                pass
            if int(device(mnt)["host_standby_bytes"]) == 4 * MiB:
                kept_at = time.time() - t0
            time.sleep(0.2)
        assert kept_at is not None and 9 <= kept_at <= 13, kept_at
        publish(mnt, "quiet", [4 * MiB], 9)
        t = time.time()
        wait_kept(mnt, 8 * MiB, timeout=5)  # nobody asks: made a second or two after the commit
        assert time.time() - t >= 0.8
        remove_stores(mnt)
