"""Kept KV caches (issue 62, host backend): an elastic store's layout committed while its
engine goes on writing (gmsfs_pages_keep), the engine's death keeping the pages, their
bytes and records, the next writer adopting them (gmsfs_pages_adopt); a kill storm of
engines that write, keep and adopt.  A mount of its own: a 64 MiB device, 1 MiB pages."""
import ctypes
import errno
import os
import random
import signal
import subprocess
import sys
import tempfile
import time

import pytest

from conftest import mounted, remove_stores, ROOT, let_go_of_mount, run_py, until
from manager import Manager
import gmsfs
from gmsfs.ctl import read_fields

MiB = 1 << 20


@pytest.fixture(scope="module")
def small():
    yield from mounted("backend=host", "max_bytes=64M", "host_bytes=32M")


@pytest.fixture
def clean(small):
    yield small
    remove_stores(small)


def state(store):
    return {k: (int(v) if v.lstrip("-").isdigit() else v) for k, v in read_fields(os.path.join(store, "state")).items()}


def used(mnt):
    return int(read_fields(os.path.join(mnt, "device"))["used_bytes"])


def engine(store, code, timeout=60):
    """code run by a fresh process holding store's writer session as c (an engine); its
    output.  It ends without a word to the daemon: os._exit, as a crash would."""
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
    prog = "import ctypes, os, sys, gmsfs\nMiB = 1 << 20\nc = gmsfs.connect(sys.argv[1], 'rw')\n" + code + \
        "\nsys.stdout.flush()\nos._exit(0)\n"
    r = subprocess.run([sys.executable, "-c", prog, store], env=env, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, r.stderr
    return r.stdout


def kept_by_a_dead_engine(store, records):
    """An engine keeps pages {index: record} of an 8-page range, each page full of byte
    0x30 + its index, and dies."""
    engine(store, "p = gmsfs.Pages(c, 8 * MiB, MiB)\np.map(%r)\nfor i in %r:\n    ctypes.memset(p.ptr(i), 0x30 + i, MiB)\n"
           "p.keep(%r)\n" % (sorted(records), sorted(records), records))


def holds_its_index(p, i):
    return ctypes.string_at(p.ptr(i), MiB) == bytes([0x30 + i]) * MiB


def test_a_dead_engines_pages_are_adopted_with_bytes_and_records(clean):
    """The pages kept, their bytes and records, are the next writer's at the same indices;
    what the engine did after its last keep is rolled back (a page mapped since is gone, a
    page given back since is back); the store stays COMMITTED, never TORN."""
    store = os.path.join(clean, "kv")
    os.mkdir(store)
    engine(store, """
p = gmsfs.Pages(c, 16 * MiB, MiB)
p.map(range(6))
for i in range(6):
    ctypes.memset(p.ptr(i), 0x40 + i, MiB)
p.keep({0: b"seq 7 tokens 0-15", 1: b"seq 7 tokens 16-31"})
assert open(sys.argv[1] + "/state").read().count("kept: 1") == 1
p.map([9])             # after the keep: rolled back
p.unmap([5])           # after the keep: back again
""")
    st = state(store)
    assert (st["state"], st["torn"], st["kept"], st["allocations"], st["entries"]) == ("COMMITTED", 0, 0, 6, 6)
    assert st["used"] == 6 * MiB
    with gmsfs.connect(store, "rw") as c:
        p = gmsfs.Pages.adopt(c, 16 * MiB)
        assert (p.adopted, p.page_size, p.count, p.mapped) == (6, MiB, 16, 6)
        recs = p.records()
        assert recs == {0: b"seq 7 tokens 0-15", 1: b"seq 7 tokens 16-31", 2: None, 3: None, 4: None, 5: None}
        for i in range(6):
            assert ctypes.string_at(p.ptr(i), MiB) == bytes([0x40 + i]) * MiB
        assert state(store)["kept"] == 1
        # The adopter goes on: a new page, a record cleared, then its own end.
        p.map([9])
        p.keep({9: b"seq 8", 1: b""})
        p.unmap([0])
    with gmsfs.connect(store, "rw") as c:
        p = gmsfs.Pages.adopt(c, 16 * MiB)
        assert p.records() == {0: b"seq 7 tokens 0-15", 1: None, 2: None, 3: None, 4: None, 5: None, 9: b"seq 8"}
    assert used(clean) == 7 * MiB
    os.rmdir(store)
    # A removed store's memory goes with its last handle: the adopter's directory, whose
    # release the kernel sends after close() returned (FUSE does not wait for releases).
    assert until(lambda: used(clean) == 0, timeout=10), "a dropped cache's pages come back: %d" % used(clean)


def weights_store(mnt, name, byte):
    """A committed weights store of one 1 MiB allocation full of byte."""
    w = os.path.join(mnt, name)
    os.mkdir(w)
    with gmsfs.connect(w, "rw") as c:
        ctypes.memset(c.create("w", MiB).ptr, byte, MiB)
        c.commit()
    return w


def test_kv_is_tied_to_the_weights_that_made_it(clean):
    """An engine ties its KV pages to its weights (Pages.tie): each keep records the store,
    its commit and content hash.  An adopter serving the same weights takes the pages; one
    serving other weights (another store, or the same store committed again: a refit) is
    refused them (ESTALE), or adopts them with every record cleared (stale="mark"); pages
    kept with no tie are refused to an adopter that says its weights (ENOENT)."""
    a, b = weights_store(clean, "wa", 1), weights_store(clean, "wb", 2)
    gmsfs.digest(a)  # its content hash known too: part of what the pages record
    kv = os.path.join(clean, "kv")
    os.mkdir(kv)
    with gmsfs.connect(kv, "rw") as c, gmsfs.connect(a, "ro") as wa:  # nothing kept: one call starts an engine
        assert gmsfs.Pages.adopt(c, 8 * MiB, weights=wa).adopted == 0
    engine(kv, "w = gmsfs.connect(%r, 'ro')\np = gmsfs.Pages(c, 8 * MiB, MiB)\np.tie(w)\np.map([0, 1])\n"
               "p.keep({0: b'seq 1', 1: b'seq 2'})\n" % a)
    note = open(os.path.join(kv, "meta", "%gmsfs.weights")).read()
    assert "store %s\n" % os.path.realpath(a) in note and "content_hash %s\n" % gmsfs.content_hash(a) in note
    with gmsfs.connect(kv, "rw") as c, gmsfs.connect(b, "ro") as wb:
        with pytest.raises(gmsfs.GmsfsError) as e:
            gmsfs.Pages.adopt(c, 8 * MiB, weights=wb)
        assert e.value.errno == errno.ESTALE and "computed with the weights of %s" % os.path.realpath(a) in str(e.value)
        assert state(kv)["kept"] == 0, "refused: nothing adopted"
    with gmsfs.connect(kv, "rw") as c, gmsfs.connect(a, "ro") as wa:
        p = gmsfs.Pages.adopt(c, 8 * MiB, weights=wa)
        assert p.adopted == 2 and p.stale is None and p.records() == {0: b"seq 1", 1: b"seq 2"}
        p.keep()  # tied to a still: the next adopter checks against it
    with gmsfs.connect(a, "data") as w:  # a refit in place: the same store, a new commit
        w.import_all()
        ctypes.memset(w.find("w").ptr, 9, 1)
        w.commit()
    with gmsfs.connect(kv, "rw") as c, gmsfs.connect(a, "ro") as wa:
        with pytest.raises(gmsfs.GmsfsError) as e:
            gmsfs.Pages.adopt(c, 8 * MiB, weights=wa)
        assert e.value.errno == errno.ESTALE
        p = gmsfs.Pages.adopt(c, 8 * MiB, weights=wa, stale="mark")
        assert p.adopted == 2 and "other weights" in p.stale and p.records() == {0: None, 1: None}
    with gmsfs.connect(kv, "rw") as c, gmsfs.connect(a, "ro") as wa:  # cleared and tied anew: the same weights
        p = gmsfs.Pages.adopt(c, 8 * MiB, weights=wa)
        assert p.stale is None and p.records() == {0: None, 1: None}
        p.tie(None)
        p.keep()
    assert not os.path.exists(os.path.join(kv, "meta", "%gmsfs.weights"))
    with gmsfs.connect(kv, "rw") as c, gmsfs.connect(a, "ro") as wa:
        with pytest.raises(gmsfs.GmsfsError) as e:
            gmsfs.Pages.adopt(c, 8 * MiB, weights=wa)
        assert e.value.errno == errno.ENOENT and "without gmsfs_pages_tie" in str(e.value)
        with pytest.raises(ValueError):
            gmsfs.Pages.adopt(c, 8 * MiB, weights=wa, stale="maybe")
        assert gmsfs.Pages.adopt(c, 8 * MiB).adopted == 2, "no weights said: adopted as before"


def test_after_a_flip_the_engine_is_told_which_pages_are_the_old_weights(clean):
    """An engine serving weights with versions flips to a trainer's refit and ties its
    pages anew: the pages it held are named old (Pages.tie returns them, Pages.old), their
    records cleared at its next keep; a page kept again with a record is new; an adopter
    of the new weights takes the pages, trusting only those.  The note names the version."""
    a = os.path.join(clean, "wv")
    os.mkdir(a)
    os.setxattr(a, "user.gms.versions", b"2")
    with gmsfs.connect(a, "rw") as c:
        ctypes.memset(c.create("w", MiB).ptr, 1, MiB)
        c.commit(version="step-1")
    kv = os.path.join(clean, "kv")
    os.mkdir(kv)
    wa = gmsfs.connect(a, "ro")
    wa.import_all()
    c = gmsfs.connect(kv, "rw")
    p = gmsfs.Pages(c, 8 * MiB, MiB)
    assert p.tie(wa) == []  # the first tie: nothing before it
    p.map([0, 1, 2])
    p.keep({0: b"s0", 1: b"s1", 2: b"s2"})
    assert "version step-1\n" in open(os.path.join(kv, "meta", "%gmsfs.weights")).read()
    trainer = run_py("import gmsfs, ctypes, sys\nw = gmsfs.connect(sys.argv[1], 'data', timeout=5)\n"
                     "ctypes.memset(w.import_one('w').ptr, 2, 1 << 20)\nw.commit(version='step-2')\n", a)
    assert trainer.returncode == 0, trainer.stderr
    assert p.tie(wa) == [] and p.old == []  # the same weights (the engine has not flipped)
    assert wa.flip(version="step-2") == 1
    assert p.tie(wa) == [0, 1, 2] and p.old == [0, 1, 2]
    p.keep({1: b"s1 again"})  # page 1 computed anew; 0 and 2 are still the old weights'
    assert p.old == [0, 2] and p.records() == {0: None, 1: b"s1 again", 2: None}
    p.unmap([2])
    assert p.old == [0]
    p.keep()
    c.close()
    with gmsfs.connect(kv, "rw") as c2:
        q = gmsfs.Pages.adopt(c2, 8 * MiB, weights=wa)  # the weights it was tied to at the last keep
        assert q.adopted == 2 and q.stale is None and q.records() == {0: None, 1: b"s1 again"}
    note = open(os.path.join(kv, "meta", "%gmsfs.weights")).read()
    assert "version step-2\n" in note and "generation 2\n" in note
    wa.close()


def test_a_page_allocator_over_adopted_pages(clean):
    """PageAllocator over an adopted cache: its pages mapped, their blocks free until the
    engine claims those its index names; alloc maps new pages past them."""
    store = os.path.join(clean, "kv")
    os.mkdir(store)
    engine(store, """
p = gmsfs.Pages(c, 8 * MiB, MiB)
a = gmsfs.PageAllocator(p, MiB // 4)
blocks = a.alloc(6)   # two pages
p.keep({b // 4: b"seq 1" for b in blocks})
""")
    with gmsfs.connect(store, "rw") as c:
        p = gmsfs.Pages.adopt(c, 8 * MiB)
        a = gmsfs.PageAllocator(p, MiB // 4)
        assert sorted(i for i, m in enumerate(a.mapped) if m) == sorted(p.records()) and len(a.free_blocks) == 8
        a.claim([0, 1])
        with pytest.raises(ValueError):
            a.claim([1])
        assert len(a.alloc(6)) == 6 and p.mapped == 2
        assert len(a.alloc(4)) == 4 and p.mapped == 3


def test_bad_keeps_and_adoptions_are_refused_and_change_nothing(clean):
    store = os.path.join(clean, "kv")
    os.mkdir(store)
    with gmsfs.connect(store, "rw") as c:
        p = gmsfs.Pages(c, 8 * MiB, MiB)
        p.map([0, 1])
        for recs, err in (({2: b"x"}, errno.ENOENT), ({9: b"x"}, errno.EINVAL),
                          ({0: b"x" * ((1 << 20) + 1)}, errno.EINVAL)):
            with pytest.raises(gmsfs.GmsfsError) as e:
                p.keep(recs)
            assert e.value.errno == err
        assert state(store)["generation"] == 0
        p.keep({0: b"a"})
        assert state(store)["generation"] == 1
        assert state(store)["kept"] == 1
    with gmsfs.connect(store, "rw") as c:
        for span, size, why in ((MiB, 0, "past a span"), (8 * MiB, 2 * MiB, "not a kept page")):
            with pytest.raises(gmsfs.GmsfsError) as e:
                gmsfs.Pages.adopt(c, span, size)
            assert e.value.errno == errno.EINVAL and why in str(e.value), str(e.value)
        p = gmsfs.Pages.adopt(c, 8 * MiB)
        assert p.records() == {0: b"a", 1: None}


def test_a_kept_layout_with_other_allocations_is_torn_by_its_writers_death(clean):
    """GMS's commit_layout of any layout: its bytes are not marked, so the writer's death
    leaves the layout for a data-only writer to fill and commit (TORN: reads refused)."""
    store = os.path.join(clean, "w")
    os.mkdir(store)
    engine(store, """
ptr = c.create("weights", MiB).ptr
ctypes.memset(ptr, 7, MiB)
c.commit_layout()
assert "leaves the layout TORN" in open(sys.argv[1] + "/state").read()
ctypes.memset(ptr, 8, MiB // 2)   # half the new bytes, then the death
""")
    until(lambda: state(store)["state"] == "TORN", 10)  # the daemon hears of the death after its parent
    st = state(store)
    assert (st["state"], st["torn"], st["allocations"]) == ("TORN", 1, 1)
    with pytest.raises(gmsfs.GmsfsError) as e:
        gmsfs.connect(store, "ro", timeout=0)
    assert e.value.errno == errno.EUCLEAN
    with gmsfs.connect(store, "data") as c:
        m = c.import_all()[0]
        ctypes.memset(m.ptr, 9, MiB)
        c.commit()
    with gmsfs.connect(store, "ro") as c:
        assert ctypes.string_at(c.import_all()[0].ptr, MiB) == b"\x09" * MiB


def test_gms_commit_layout_then_rw_data(clean):
    """gmsfs.gms: commit_layout() leaves the writer RW_DATA (no new allocations); after its
    death an RW_DATA client maps the kept layout writable and commits its bytes."""
    store = os.path.join(clean, "g")
    os.mkdir(store)
    engine(store, """
c.close()
from gmsfs.gms import GMSClientMemoryManager, RequestedLockType, GrantedLockType
w = GMSClientMemoryManager(sys.argv[1])
w.connect(RequestedLockType.RW)
va = w.create_mapping(size=MiB, tag="kv")
w.metadata_put("layer.0", w.mappings[va].allocation_id, 0, b"k")
assert w.commit_layout() and w.granted_lock_type == GrantedLockType.RW_DATA
try:
    w.create_mapping(size=MiB, tag="kv")
    raise SystemExit("a new allocation after commit_layout")
except RuntimeError:
    pass
ctypes.memset(va, 5, MiB)
""")
    assert until(lambda: state(store)["state"] == "TORN", 10), state(store)
    from gmsfs.gms import GMSClientMemoryManager, RequestedLockType, GrantedLockType
    d = GMSClientMemoryManager(store)
    d.connect(RequestedLockType.RW_DATA)
    assert d.granted_lock_type == GrantedLockType.RW_DATA
    (aid,) = [a.allocation_id for a in d._client.list_allocations()]
    va = d.create_mapping(aid)
    assert ctypes.string_at(va, 4) == b"\x05" * 4  # the dead writer's bytes, there to finish
    ctypes.memset(va, 6, MiB)
    assert d.commit()
    d.close()
    with gmsfs.connect(store, "ro") as c:
        (m,) = c.import_all()
        assert ctypes.string_at(m.ptr, MiB) == b"\x06" * MiB and c.meta_get("layer.0").value == b"k"


def test_a_kept_cache_counts_against_its_quota_and_an_empty_store_adopts_nothing(clean):
    store = os.path.join(clean, "kv")
    os.mkdir(store)
    os.setxattr(store, "user.gms.quota", str(4 * MiB).encode())
    with gmsfs.connect(store, "rw") as c:
        p = gmsfs.Pages.adopt(c, 8 * MiB, MiB)
        assert (p.adopted, p.mapped) == (0, 0)
        p.map(range(4))
        p.keep()
    with gmsfs.connect(store, "rw") as c:
        p = gmsfs.Pages.adopt(c, 8 * MiB)
        assert p.adopted == 4
        with pytest.raises(gmsfs.GmsfsError) as e:
            p.map([4])
        assert e.value.errno in (errno.ENOSPC, errno.EDQUOT)
        p.unmap([3])  # a kept page: its memory is the store's until the next keep (a death
        with pytest.raises(gmsfs.GmsfsError):  # before it brings the page back)
            p.map([4])
        p.keep()
        p.map([4])
        p.keep()
    assert used(clean) == 4 * MiB


def test_an_idle_kept_cache_moves_to_the_host_tier_and_back_for_its_adopter(clean):
    """Kept for nobody, a cache is an idle store: it gives way to the host tier as any
    (here asked through its tier file) and its adopter's open brings it back, bytes and
    records whole."""
    store = os.path.join(clean, "kv")
    os.mkdir(store)
    kept_by_a_dead_engine(store, {2: b"two", 5: b"five"})
    with open(os.path.join(store, "tier"), "w") as f:
        f.write("host\n")
    t0 = time.monotonic()
    while state(store)["tier"] != "host":
        assert time.monotonic() - t0 < 10, state(store)
        time.sleep(0.01)
    assert used(clean) == 0
    with gmsfs.connect(store, "rw", timeout=10) as c:
        p = gmsfs.Pages.adopt(c, 8 * MiB)
        assert state(store)["tier"] == "device" and p.records() == {2: b"two", 5: b"five"}
        assert holds_its_index(p, 2) and holds_its_index(p, 5)


def test_a_daemon_restart_keeps_a_kept_cache(request):
    mnt = os.path.realpath(tempfile.mkdtemp(prefix="gmsfs-kept."))
    state_dir = mnt + ".state"
    os.mkdir(state_dir)
    m = Manager()
    try:
        m.start(mnt, "backend=host", "state=" + state_dir)
        store = os.path.join(mnt, "kv")
        os.mkdir(store)
        kept_by_a_dead_engine(store, {1: b"one", 3: b"three"})
        m.kill(signal.SIGKILL)
        subprocess.run(["umount", "-l", mnt], capture_output=True)
        m.start(mnt, "backend=host", "state=" + state_dir)
        assert state(store)["state"] == "COMMITTED"
        with gmsfs.connect(store, "rw") as c:
            p = gmsfs.Pages.adopt(c, 8 * MiB)
            assert p.records() == {1: b"one", 3: b"three"}
            assert holds_its_index(p, 1) and holds_its_index(p, 3)
    finally:
        m.close()
        let_go_of_mount(mnt, request, 60)
        subprocess.run(["rm", "-rf", state_dir])


# An engine of the storm: it adopts what the last one kept, checks every page whose record
# says it is whole (its bytes: the record's seed), then writes, keeps, rewrites, unmaps and
# maps at random until it is killed.  Before a page is written again its record is cleared
# by a keep; a record is set by a keep after its bytes are written.
STORM_ENGINE = r"""
import ctypes, hashlib, os, random, sys, time
import gmsfs
PAGE = 1 << 20
def fill(p, i, seed):
    ctypes.memmove(p.ptr(i), hashlib.sha256(seed).digest() * (PAGE // 32), PAGE)
c = gmsfs.connect(sys.argv[1], "rw", timeout=60)
p = gmsfs.Pages.adopt(c, 24 * PAGE, PAGE)
bad = 0
recs = p.records()
for i, r in recs.items():
    if r is not None and ctypes.string_at(p.ptr(i), PAGE) != hashlib.sha256(r).digest() * (PAGE // 32):
        bad += 1
print("adopted %d whole %d bad %d at %.6f" % (p.adopted, sum(r is not None for r in recs.values()), bad,
                                              time.monotonic()), flush=True)
rng = random.Random(os.getpid())
n = 0
while True:
    n += 1
    mapped = [i for i in range(p.count) if i in recs]
    act = rng.random()
    if act < 0.3 and len(mapped) < 20:
        new = rng.sample([i for i in range(p.count) if i not in recs], rng.randint(1, 3))
        p.map(new)
        for i in new:
            recs[i] = None
            seed = b"%d.%d.%d" % (os.getpid(), n, i)
            fill(p, i, seed)
        p.keep({i: b"%d.%d.%d" % (os.getpid(), n, i) for i in new})
        for i in new:
            recs[i] = b"%d.%d.%d" % (os.getpid(), n, i)
    elif act < 0.7 and mapped:
        i = rng.choice(mapped)
        p.keep({i: b""})                  # cleared before the bytes change
        recs[i] = None
        seed = b"%d.%d.%d" % (os.getpid(), n, i)
        fill(p, i, seed)
        if rng.random() < 0.8:
            p.keep({i: seed})
            recs[i] = seed
    elif mapped:
        gone = rng.sample(mapped, min(len(mapped), rng.randint(1, 2)))
        p.unmap(gone)
        for i in gone:
            del recs[i]
        if rng.random() < 0.5:
            p.keep()
"""


def test_kill_storm_of_engines_keeping_and_adopting(clean):
    """Engines killed at random points: every adopted page whose record says whole holds
    what its last writer wrote; the next engine adopts only after the last one's death
    (one writer at a time); the store is never TORN; the accounting is the pages it holds;
    an rmdir gives every page back."""
    store = os.path.join(clean, "kv")
    os.mkdir(store)
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
    rng = random.Random(62)
    rounds = int(os.environ.get("GMSFS_KEPT_STORM", "25"))
    start = lambda: subprocess.Popen([sys.executable, "-c", STORM_ENGINE, store], env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
    cur = start()
    line = cur.stdout.readline()
    adopted_total = whole_total = 0
    for k in range(rounds):
        assert line.startswith("adopted"), (line, cur.stderr.read() if cur.poll() is not None else "")
        f = line.split()
        assert f[5] == "0", "round %d: %s pages whose record says whole differ from it" % (k, f[5])
        adopted_total += int(f[1])
        whole_total += int(f[3])
        nxt = start()  # waits for the writer session meanwhile
        time.sleep(rng.uniform(0.01, 0.3))
        assert cur.poll() is None, cur.stderr.read()
        killed = time.monotonic()
        cur.send_signal(signal.SIGKILL)
        cur.wait()
        cur.stdout.close()
        cur.stderr.close()
        cur, line = nxt, nxt.stdout.readline()
        assert line.startswith("adopted"), (line, cur.stderr.read() if cur.poll() is not None else "")
        assert float(line.split()[-1]) > killed, "adopted before the last writer was killed"
        st = state(store)
        assert st["torn"] == 0 and st["state"] == "RW"
    cur.send_signal(signal.SIGKILL)
    cur.wait()
    cur.stdout.close()
    cur.stderr.close()
    # The kernel reports the dead engine's close after wait() returns: its session ends then.
    assert until(lambda: state(store)["state"] == "COMMITTED", timeout=10), state(store)
    st = state(store)
    assert st["state"] == "COMMITTED" and st["torn"] == 0
    assert st["used"] == st["allocations"] * MiB == st["bytes"], st
    assert used(clean) == st["used"]
    assert adopted_total > rounds and whole_total > 0, (adopted_total, whole_total)
    os.rmdir(store)
    assert used(clean) == 0



def test_a_paged_decoder_killed_mid_decode_is_finished_by_its_shadow(clean):
    """bench/kv_kept.py, small, on the host: a paged decoder over a kept cache SIGKILLed
    mid-decode, a shadow waiting in its connect adopts it and finishes every sequence with
    every token equal to an uninterrupted run and no prompt token recomputed."""
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
    r = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "kv_kept.py"), clean, "--cache-mib", "8",
                        "--batch", "2", "--prompt", "40", "--steps", "20", "--kill-at", "10", "--tpb", "16",
                        "--shape", "128,4,2,512", "--goal", "30"], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "tokens: 42 of 42 equal" in r.stdout and "prompt tokens recomputed: 0" in r.stdout, r.stdout
