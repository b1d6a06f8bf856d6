"""Elastic stores (issue 46, host backend): KV-cache pages that come and go in a writer's
session, under the mount's budget, quotas, minimums and priorities.  A mount of its own: a
64 MiB device (1 MiB pages), a 16 MiB host tier."""
import contextlib
import ctypes
import errno
import os
import random
import signal
import subprocess
import sys
import threading
import time

import pytest

from conftest import mounted, remove_stores, ROOT
import gmsfs
from gmsfs.ctl import read_fields

MiB = 1 << 20


@pytest.fixture(scope="module")
def small():
    yield from mounted("backend=host", "max_bytes=64M", "host_bytes=16M")


@pytest.fixture
def clean(small):
    yield small
    remove_stores(small)


def state(store):
    return {k: (int(v) if v.isdigit() else v) for k, v in read_fields(os.path.join(store, "state")).items()}


def used(mnt):
    return int(read_fields(os.path.join(mnt, "device"))["used_bytes"])


def kv(mnt, name, **xattrs):
    path = os.path.join(mnt, name)
    os.mkdir(path)
    for k, v in xattrs.items():
        os.setxattr(path, "user.gms." + k, str(v).encode())
    return path


def test_pages_within_the_minimum_stay_where_they_were(clean):
    """A page unmapped within the minimum stays mapped where it was: mapped there again it
    is the same memory, bytes and all, with no request; a map elsewhere moves one; a
    lowered minimum lets them go."""
    store = kv(clean, "kv", min=4 * MiB)
    with gmsfs.connect(store, "rw") as c, gmsfs.Pages(c, 8 * MiB, MiB) as p:
        p.map(range(4))
        for i in range(4):
            ctypes.memset(p.ptr(i), i + 1, MiB)
        p.unmap(range(4))
        assert (p.mapped, state(store)["used"]) == (0, 4 * MiB)
        p.map([2, 1])  # where they stayed: their own bytes (a held page taken last-in would be 4's)
        assert [ctypes.string_at(p.ptr(i), 1) for i in (1, 2)] == [b"\x02", b"\x03"]
        p.map([5, 6])  # moved from where 0 and 3 stayed: one each, both writable
        got = sorted(ctypes.string_at(p.ptr(i), 1) for i in (5, 6))
        assert got == [b"\x01", b"\x04"] and state(store)["allocations"] == 4
        for i in (5, 6):
            ctypes.memset(p.ptr(i), 0x50 + i, MiB)
        with pytest.raises(gmsfs.GmsfsError) as e:  # a place a page moved from is unmapped
            p.unmap([0])
        assert e.value.errno == errno.ENOENT
        p.unmap([1, 2, 5, 6])
        os.removexattr(store, "user.gms.min")
        assert p.reclaim() == 0 and (p.mapped, state(store)["used"]) == (0, 0)  # let go: unmapped, given back
        p.map([6])  # a new page where one stayed before
        assert state(store)["used"] == MiB
    assert state(store)["used"] == 0


def test_pages_at_their_place_and_back(clean):
    store = kv(clean, "kv", quota=32 * MiB)
    with gmsfs.connect(store, "rw") as c, gmsfs.Pages(c, 40 * MiB, MiB) as p:
        assert (p.count, p.page_size, p.mapped) == (40, MiB, 0)
        assert state(store)["reserved"] == 40 * MiB and state(store)["used"] == 0  # address space only
        p.map([0, 7, 39])
        for i in (0, 7, 39):  # each page is its own memory, at its place
            ctypes.memset(p.ptr(i), i + 1, MiB)
        assert [ctypes.string_at(p.ptr(i) + MiB - 1, 1) for i in (0, 7, 39)] == [b"\x01", b"\x08", b"\x28"]
        s = state(store)
        assert (s["used"], s["peak"], s["allocations"], s["state"]) == (3 * MiB, 3 * MiB, 3, "RW")
        p.unmap([7])
        assert p.mapped == 2 and state(store)["used"] == 2 * MiB and state(store)["peak"] == 3 * MiB
        p.map([7])  # the page it gave back, kept for its growth, again at that place
        assert ctypes.string_at(p.ptr(7), 1) == b"\x08" and state(store)["pages_spare"] == 0
    s = state(store)
    assert (s["used"], s["reserved"], s["allocations"]) == (0, 0, 0)  # the session's end gave all back


def test_pages_within_the_minimum_stay_with_the_engine(clean):
    """The minimum's pages are made at reserve and stay in the engine's process when it
    unmaps them (held, mapped again without a request); past it, unmaps give back."""
    store = kv(clean, "kv", min=4 * MiB, quota=6 * MiB)
    with gmsfs.connect(store, "rw") as c, gmsfs.Pages(c, 8 * MiB, MiB) as p:
        s = state(store)
        assert (p.mapped, s["used"], s["allocations"]) == (0, 4 * MiB, 4)  # made at reserve
        p.map(range(4))
        assert (state(store)["used"], state(store)["allocations"]) == (4 * MiB, 4)  # the same pages
        for i in range(4):
            ctypes.memset(p.ptr(i), i + 1, MiB)
        assert [ctypes.string_at(p.ptr(i) + MiB - 1, 1) for i in range(4)] == [b"\x01", b"\x02", b"\x03", b"\x04"]
        with pytest.raises(gmsfs.GmsfsError) as e:  # past the quota: all or nothing, held ones too
            p.map(range(4, 8))
        assert e.value.errno == errno.ENOSPC and p.mapped == 4 and state(store)["used"] == 4 * MiB
        p.map([4, 5])
        assert state(store)["used"] == 6 * MiB
        p.unmap([0, 1, 2])  # two past the minimum go back, one stays held
        assert (p.mapped, state(store)["used"]) == (3, 4 * MiB)
        p.unmap([3, 4, 5])
        assert (p.mapped, state(store)["used"], state(store)["allocations"]) == (0, 4 * MiB, 4)
        p.map([7, 6])  # held pages, at new places, writable
        ctypes.memset(p.ptr(7), 0x77, MiB)
        assert ctypes.string_at(p.ptr(7), 1) == b"\x77" and state(store)["used"] == 4 * MiB
        os.removexattr(store, "user.gms.min")
        assert p.reclaim() == 0  # it reads the minimum again: what is held past it goes back
        assert (p.mapped, state(store)["used"]) == (2, 2 * MiB)
        p.unmap([6])
        assert state(store)["used"] == MiB
    s = state(store)
    assert (s["used"], s["allocations"]) == (0, 0)


def test_bad_calls_change_nothing(clean):
    store = kv(clean, "kv", quota=8 * MiB)
    with gmsfs.connect(store, "rw") as c:
        with pytest.raises(gmsfs.GmsfsError) as e:
            gmsfs.Pages(c, 4 * MiB, 4096 + 1)
        assert e.value.errno == errno.EINVAL and "multiple of the granularity" in str(e.value)
        p = gmsfs.Pages(c, 16 * MiB, MiB)
        p.map([1, 2])
        for idx, code, words in (([2], errno.EEXIST, "mapped already"), ([3, 3], errno.EINVAL, "twice"),
                                 ([16], errno.EINVAL, "past the range"), ([0, 2], errno.EEXIST, "mapped already")):
            with pytest.raises(gmsfs.GmsfsError) as e:
                p.map(idx)
            assert e.value.errno == code and words in str(e.value), e.value
        with pytest.raises(gmsfs.GmsfsError) as e:
            p.unmap([5])
        assert e.value.errno == errno.ENOENT
        with pytest.raises(gmsfs.GmsfsError) as e:  # the quota: all or nothing
            p.map(range(3, 10))
        assert e.value.errno == errno.ENOSPC and "quota" in str(e.value), e.value
        assert p.mapped == 2 and state(store)["used"] == 2 * MiB
        with pytest.raises(gmsfs.GmsfsError) as e:  # pages are working memory: no sleeping with them
            c.unmap_all()
        assert e.value.errno == errno.EBUSY
        p.free()
        with pytest.raises(gmsfs.GmsfsError) as e:
            p.free()
        assert e.value.errno == errno.EINVAL
        with pytest.raises(gmsfs.GmsfsError):
            p.map([1])
        assert state(store)["used"] == 0
    committed = kv(clean, "committed")
    with gmsfs.connect(committed, "rw") as w:
        w.commit()
    with gmsfs.connect(committed, "ro") as r, pytest.raises(gmsfs.GmsfsError) as e:
        gmsfs.Pages(r, MiB)  # a reader has no session to hold pages in
    assert e.value.errno == errno.EPERM, e.value


def test_minimums_and_their_limits(clean):
    a = kv(clean, "a", min=40 * MiB)
    b = kv(clean, "b")
    with pytest.raises(OSError) as e:  # the minimums together may not pass the budget
        os.setxattr(b, "user.gms.min", b"30M")
    assert e.value.errno == errno.EINVAL
    assert "would pass the mount's" in state(b)["last_error"]
    with pytest.raises(OSError):
        os.setxattr(a, "user.gms.quota", b"20M")  # a quota below the minimum
    with gmsfs.connect(b, "rw") as cb, gmsfs.Pages(cb, 64 * MiB, MiB) as pb:
        with pytest.raises(gmsfs.GmsfsError) as e:  # 24 MiB free: the other 40 are a's
            pb.map(range(25))
        assert e.value.errno == errno.ENOSPC
        pb.map(range(24))
        with gmsfs.connect(a, "rw") as ca, gmsfs.Pages(ca, 64 * MiB, MiB) as pa:
            pa.map(range(40))  # a's minimum was kept for it
            assert used(clean) == 64 * MiB
    os.removexattr(a, "user.gms.min")
    assert "user.gms.min" not in os.listxattr(a)


@contextlib.contextmanager
def giving_back(pages, held):
    """An engine's loop beside the block: free pages (of held, the indices it maps) whenever
    the daemon asks.  Yields the log: {"held", "given"}."""
    log, stop = {"held": set(held), "given": 0}, threading.Event()

    def loop():
        while not stop.is_set():
            want = pages.reclaim()
            if want:
                n = min(-(-want // pages.page_size), len(log["held"]))
                idx = sorted(log["held"])[-n:]
                pages.unmap(idx)
                log["held"].difference_update(idx)
                log["given"] += n
            time.sleep(0.002)

    t = threading.Thread(target=loop)
    t.start()
    try:
        yield log
    finally:
        stop.set()
        t.join()


def test_growth_takes_pages_back_from_lower_priority_only(clean):
    low = kv(clean, "low", priority=1)
    high = kv(clean, "high", priority=5)
    with gmsfs.connect(low, "rw") as cl, gmsfs.Pages(cl, 64 * MiB, MiB) as pl, \
            gmsfs.connect(high, "rw") as ch, gmsfs.Pages(ch, 64 * MiB, MiB) as ph:
        pl.map(range(50))
        with giving_back(pl, range(50)) as log:
            ph.map(range(30), timeout_ms=2000)  # 14 free: 16 asked of low, which gives them
        assert log["given"] == 16 and pl.mapped == 34, log["given"]  # asked what was lacking, not more
        assert state(low)["reclaim"] == 0
        # The other way: low may not take from high.
        t0 = time.monotonic()
        with pytest.raises(gmsfs.GmsfsError) as e:
            pl.map(range(50, 54), timeout_ms=1000)
        assert e.value.errno == errno.ENOSPC and time.monotonic() - t0 < 0.5  # nobody to ask: at once
        assert state(high)["reclaim"] == 0 and ph.mapped == 30


def test_a_truncate_takes_pages_back_as_a_create_does(clean):
    """The one door (src/fs/memory.c): a shell's truncate that lacks room asks elastic stores
    of lower priority for pages as the socket's create does, waits while they give them,
    and a size refused for room changes nothing (the same descriptor may ask another)."""
    low = kv(clean, "low", priority=1)
    high = kv(clean, "high", priority=5)
    with gmsfs.connect(low, "rw") as cl, gmsfs.Pages(cl, 64 * MiB, MiB) as pl:
        pl.map(range(50))
        lock = os.open(os.path.join(high, "lock"), os.O_RDWR)  # a shell's session: exec 9<>lock
        fd = os.open(os.path.join(high, "allocs", "w"), os.O_CREAT | os.O_RDWR)
        try:
            with giving_back(pl, range(50)) as log:
                os.ftruncate(fd, 30 * MiB)  # 14 free: 16 asked of low, which gives them
            assert log["given"] == 16 and pl.mapped == 34 and os.fstat(fd).st_size == 30 * MiB
            assert used(clean) == 64 * MiB
            t0 = time.monotonic()
            fd2 = os.open(os.path.join(high, "allocs", "x"), os.O_CREAT | os.O_RDWR)
            try:
                with pytest.raises(OSError) as e:  # asked again, nobody gives: refused in time
                    os.ftruncate(fd2, 8 * MiB)
                assert e.value.errno == errno.ENOSPC and 1.5 < time.monotonic() - t0 < 10
                why = state(high)["last_error"]
                assert "allocs/x: 8388608 bytes" in why and "asked back of elastic stores" in why, why
                assert used(clean) == 64 * MiB and pl.mapped == 34  # changed nothing
                pl.unmap(range(30, 34))
                os.ftruncate(fd2, 4 * MiB)  # the same descriptor asks a size that fits
                assert os.fstat(fd2).st_size == 4 * MiB
            finally:
                os.close(fd2)
        finally:
            os.close(fd)
            os.close(lock)


def test_a_move_in_takes_pages_back_as_a_create_does(clean):
    """A store on the host tier that a reader opens comes back through the same room as a
    create: idle stores out first, then elastic stores of lower priority asked for pages,
    and the move tried again as they give them."""
    high = kv(clean, "high", priority=5)
    with gmsfs.connect(high, "rw") as c:
        m = c.create("w", 8 * MiB)
        ctypes.memset(m.ptr, 0x3c, 8 * MiB)
        c.commit()
    with open(os.path.join(high, "tier"), "w") as f:
        f.write("host\n")
    t0 = time.monotonic()
    while state(high)["tier"] != "host":
        assert time.monotonic() - t0 < 10, state(high)
        time.sleep(0.01)
    low = kv(clean, "low", priority=1)
    with gmsfs.connect(low, "rw") as cl, gmsfs.Pages(cl, 64 * MiB, MiB) as pl:
        pl.map(range(60))  # 4 MiB free: the move in lacks 4
        with giving_back(pl, range(60)) as log:
            with gmsfs.connect(high, "ro", timeout=10) as r:  # its open brings it back
                r.import_all()
                assert ctypes.string_at(r.find("w").ptr + 8 * MiB - 4, 4) == b"\x3c" * 4
        assert state(high)["tier"] == "device" and 4 <= log["given"] <= 8, log["given"]
        assert pl.mapped == 60 - log["given"]


def test_an_engine_that_does_not_give_back_keeps_its_pages(clean):
    low = kv(clean, "low", priority=1)
    high = kv(clean, "high", priority=5)
    with gmsfs.connect(low, "rw") as cl, gmsfs.Pages(cl, 64 * MiB, MiB) as pl, \
            gmsfs.connect(high, "rw") as ch, gmsfs.Pages(ch, 64 * MiB, MiB) as ph:
        pl.map(range(60))
        ptr = pl.ptr(59)
        ctypes.memset(ptr, 0x5a, 64)
        with pytest.raises(gmsfs.GmsfsError) as e:
            ph.map(range(10), timeout_ms=300)
        assert e.value.errno == errno.ENOSPC and "waited 300 ms" in str(e.value)
        assert state(low)["reclaim"] == 6 * MiB  # asked, never taken
        assert pl.mapped == 60 and ctypes.string_at(ptr, 4) == b"\x5a" * 4


def test_growth_within_a_minimum_asks_any_store_above_its_own(clean):
    hi = kv(clean, "hi", priority=9)
    guaranteed = kv(clean, "guaranteed", priority=0)
    with gmsfs.connect(hi, "rw") as ch, gmsfs.Pages(ch, 64 * MiB, MiB) as ph:
        ph.map(range(60))
        os.setxattr(guaranteed, "user.gms.min", b"16M")  # set while hi holds 60 of 64
        with gmsfs.connect(guaranteed, "rw") as cg, gmsfs.Pages(cg, 64 * MiB, MiB) as pg:
            with giving_back(ph, range(60)) as log:
                pg.map(range(16), timeout_ms=2000)  # lower priority, but within its minimum
            assert pg.mapped == 16 and log["given"] == 12
            with pytest.raises(gmsfs.GmsfsError):  # past its minimum, the priorities rule again
                pg.map([16], timeout_ms=200)


def test_page_allocator_for_a_block_manager(clean):
    store = kv(clean, "kv")
    with gmsfs.connect(store, "rw") as c, gmsfs.Pages(c, 8 * MiB, MiB) as p:
        a = gmsfs.PageAllocator(p, 256 << 10)  # 4 blocks a page
        blocks = a.alloc(6)
        assert len(set(blocks)) == 6 and p.mapped == 2
        a.free(blocks[:3], shrink=False)
        assert p.mapped == 2
        more = a.alloc(7)  # the 5 free blocks reused, one page more
        assert p.mapped == 3 and not set(more) & set(blocks[3:])
        a.free(blocks[3:] + more)
        assert p.mapped == 0 and state(store)["used"] == 0
        with pytest.raises(gmsfs.GmsfsError) as e:
            a.alloc(33)
        assert e.value.errno == errno.ENOSPC and p.mapped == 0


ENGINE = r"""
import os, random, sys, time, gmsfs
store, seed, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
rnd = random.Random(seed)
c = gmsfs.connect(store, "rw")
p = gmsfs.Pages(c, 32 << 20, 1 << 20)
held = set()
while not os.path.exists(out + ".quiet"):
    want = p.reclaim()
    if want and held:
        give = sorted(held)[: -(-want // p.page_size)]
        p.unmap(give); held.difference_update(give)
    elif rnd.random() < 0.55 and len(held) < p.count:
        idx = rnd.sample(sorted(set(range(p.count)) - held), min(rnd.randint(1, 8), p.count - len(held)))
        try:
            p.map(idx, timeout_ms=50)
            held.update(idx)
        except gmsfs.GmsfsError:
            pass
    elif held:
        give = rnd.sample(sorted(held), rnd.randint(1, len(held)))
        p.unmap(give); held.difference_update(give)
with open(out + ".tmp", "w") as f:  # a quiet moment: what it holds, then nothing more
    f.write("%d\n" % len(held))
os.rename(out + ".tmp", out)
time.sleep(3600)
"""


def test_kill_storm_of_engines_growing_and_shrinking(clean, tmp_path):
    """Engines grow and shrink (and give back when asked) while some are SIGKILLed: no page
    of a killed engine stays, the daemon's accounting is the pages mapped, quotas and
    minimums hold, and a store of weights beside them is untouched."""
    weights = os.path.join(clean, "weights")
    os.mkdir(weights)
    with gmsfs.connect(weights, "rw") as w:
        m = w.create("w", 4 * MiB)
        ctypes.memset(m.ptr, 0x3c, 4 * MiB)
        w.commit()
        whash = w.layout_hash
    stores = [kv(clean, "e%d" % i, priority=i % 3, quota=24 * MiB, **({"min": 8 * MiB} if i == 0 else {}))
              for i in range(5)]
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
    rnd = random.Random(46)
    procs, deaths = {}, 0

    def start(i, seed):
        out = str(tmp_path / ("e%d-%d.held" % (i, seed)))
        procs[i] = (subprocess.Popen([sys.executable, "-c", ENGINE, stores[i], str(seed), out], env=env,
                                     stderr=subprocess.PIPE), out)

    try:
        for i in range(len(stores)):
            start(i, i)
        t_end = time.monotonic() + 8
        while time.monotonic() < t_end:
            time.sleep(rnd.uniform(0.05, 0.3))
            i = rnd.randrange(1, len(stores))  # e0 lives: its minimum is probed below
            os.kill(procs[i][0].pid, signal.SIGKILL)
            procs[i][0].wait()
            deaths += 1
            for _ in range(200):  # its session rolls back: every page back, the writer gone
                st = state(stores[i])
                if st["used"] == 0 and st["writer"] == 0:
                    break
                time.sleep(0.01)
            assert state(stores[i])["used"] == 0 and state(stores[i])["writer"] == 0, state(stores[i])
            start(i, 100 + deaths)
        for _, out in procs.values():  # a quiet moment: each engine says what it holds, then stops
            open(out + ".quiet", "w").close()
        for _, out in procs.values():
            for _ in range(500):
                if os.path.exists(out):
                    break
                time.sleep(0.01)
        total = 0
        for i, s in enumerate(stores):
            st = state(s)
            held = int(open(procs[i][1]).read())
            # What a store holds is its pages mapped, and for e0 up to its minimum held
            # unmapped by its engine (made at reserve, unless the storm left no room then).
            most = max(held * MiB, 8 * MiB if i == 0 else 0)
            assert st["used"] == st["allocations"] * MiB and held * MiB <= st["used"] <= most, (i, st, held)
            assert st["peak"] <= 24 * MiB  # the quota held throughout
            total += st["used"]
        on_device = 4 * MiB if open(os.path.join(weights, "tier")).read().strip() == "device" else 0
        assert used(clean) == total + on_device  # the device's accounting: the pages (and the weights, idle:
        # they may have given way to the host tier)
        # e0's minimum: whatever the others hold, it may grow to 8 MiB.
        for i in range(1, len(stores)):
            os.kill(procs[i][0].pid, signal.SIGKILL)
            procs[i][0].wait()
        for i in range(1, len(stores)):  # the others take all they can, without giving back
            c = gmsfs.connect(stores[i], "rw")
            procs[i] = (c, gmsfs.Pages(c, 32 * MiB, MiB))
            try:
                procs[i][1].map(range(24), timeout_ms=0)
            except gmsfs.GmsfsError:
                pass
        assert used(clean) <= 64 * MiB - max(0, 8 * MiB - state(stores[0])["used"])
        os.kill(procs[0][0].pid, signal.SIGKILL)
        procs[0][0].wait()
        with gmsfs.connect(stores[0], "rw") as c0, gmsfs.Pages(c0, 32 * MiB, MiB) as p0:
            p0.map(range(8))  # its minimum was kept
        for i in range(1, len(stores)):
            procs[i][1].free()
            procs[i][0].close()
        with gmsfs.connect(weights, "ro") as r:
            r.import_all()
            assert r.layout_hash == whash and ctypes.string_at(r.find("w").ptr, 4 * MiB) == b"\x3c" * (4 * MiB)
        assert deaths >= 10
    finally:
        for p in procs.values():
            if isinstance(p[0], subprocess.Popen) and p[0].poll() is None:
                p[0].kill()
                p[0].wait()


def test_one_tensor_over_the_range(clean):
    torch = pytest.importorskip("torch")
    import gmsfs.torch as gt
    store = kv(clean, "kv")
    with gmsfs.connect(store, "rw") as c, gmsfs.Pages(c, 8 * MiB, MiB) as p:
        cache = gt.pages_tensor(p, torch.float32, (8, MiB // 4))  # a page a row
        assert cache.data_ptr() == p.base and cache.shape == (8, MiB // 4)
        p.map([2, 5])
        cache[2].fill_(1.5)
        cache[5, :4] = torch.arange(4, dtype=torch.float32)
        assert ctypes.string_at(p.ptr(5), 16) == torch.arange(4, dtype=torch.float32).numpy().tobytes()
        assert float(cache[2].sum()) == 1.5 * (MiB // 4)
        p.unmap([2])
        p.map([2])  # the same tensor sees the page mapped again (one kept for its store)
        cache[2].fill_(2.5)
        assert ctypes.string_at(p.ptr(2), 4) == torch.tensor([2.5]).numpy().tobytes()


def test_pages_given_back_are_kept_for_the_stores_own_growth(clean):
    """A page given back stays made for its store's next growth (no memory made again),
    out of its use and the device's; anyone else's room takes kept pages first, and the
    session's end gives them all back."""
    dev = lambda: read_fields(os.path.join(clean, "device"))
    a, b = kv(clean, "kv-a", quota=24 * MiB), kv(clean, "kv-b")
    with gmsfs.connect(a, "rw") as ca, gmsfs.Pages(ca, 24 * MiB, MiB) as pa:
        pa.map(range(24))
        for i in range(24):
            ctypes.memset(pa.ptr(i), 0xA0, MiB)
        pa.unmap(range(4, 24))
        s = state(a)
        assert (s["used"], s["pages_spare"], s["allocations"]) == (4 * MiB, 20 * MiB, 4)
        assert (int(dev()["used_bytes"]), int(dev()["pages_spare_bytes"])) == (4 * MiB, 20 * MiB)
        pa.map(range(4, 24))  # the kept ones again: within the quota, which counts them as used
        s = state(a)
        assert (s["used"], s["pages_spare"]) == (24 * MiB, 0)
        with pytest.raises(gmsfs.GmsfsError) as e:  # still the quota's limit, kept or not
            gmsfs.Pages(ca, MiB, MiB).map([0])
        assert e.value.errno == errno.ENOSPC
        pa.unmap(range(24))
        assert (state(a)["used"], state(a)["pages_spare"]) == (0, 24 * MiB)
        # Another store's 56 MiB: more than the 40 free; kept pages give up what it lacks.
        with gmsfs.connect(b, "rw") as cb, gmsfs.Pages(cb, 56 * MiB, MiB) as pb:
            pb.map(range(56))
            for i in range(56):  # its own memory, whatever a's was
                ctypes.memset(pb.ptr(i), 0x0B, MiB)
            kept = state(a)["pages_spare"]
            assert kept == 8 * MiB and int(dev()["used_bytes"]) == 56 * MiB  # what it lacked, no more
            assert int(dev()["used_bytes"]) + int(dev()["pages_spare_bytes"]) <= 64 * MiB
            with pytest.raises(gmsfs.GmsfsError):  # a's growth past what it kept: no room
                pa.map(range(kept // MiB + 1))
            assert state(a)["used"] == 0
    s = state(a)
    assert (s["used"], s["pages_spare"]) == (0, 0) and int(dev()["pages_spare_bytes"]) == 0
    assert int(dev()["used_bytes"]) == 0
    # A session that commits ends too: what it kept goes, what it committed stays.
    with gmsfs.connect(a, "rw") as ca, gmsfs.Pages(ca, 8 * MiB, MiB) as pa:
        pa.map(range(4))
        pa.unmap([2, 3])
        assert state(a)["pages_spare"] == 2 * MiB
        ca.commit()
        s = state(a)
        assert (s["state"], s["allocations"], s["used"], s["pages_spare"]) == ("RO", 2, 2 * MiB, 0)
        assert int(dev()["pages_spare_bytes"]) == 0


def test_pages_a_commit_published_are_read_only_to_the_process_that_was_their_writer(clean):
    """A commit publishes the pages mapped then as allocations of the store: they are its
    committed memory, and the writer that was is now a reader.  Its pages' mappings become
    read-only as its other mappings do, so a write after the commit faults instead of
    changing the committed bytes unseen (before, it changed them, the store still saying
    COMMITTED and torn 0)."""
    store = kv(clean, "kv-sealed")
    code = r"""
import ctypes, sys, gmsfs
c = gmsfs.connect(sys.argv[1], "rw", timeout=5)
p = gmsfs.Pages(c, 8 << 20, 1 << 20)
p.map([0, 1, 2, 5])
for i in (0, 1, 2, 5):
    ctypes.memset(p.ptr(i), 0x41 + i, p.page_size)
c.commit()
print("committed", flush=True)
ctypes.memset(p.ptr(int(sys.argv[2])), 0x7a, 16)
print("wrote", flush=True)
"""
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
    for page in (1, 5):  # within a run of neighbours, and a run of one
        remove_stores(clean)
        os.mkdir(store)
        p = subprocess.run([sys.executable, "-c", code, store, str(page)], env=env, capture_output=True, text=True,
                           timeout=60)
        assert p.returncode == -signal.SIGSEGV, (p.returncode, p.stdout, p.stderr)
        assert p.stdout.splitlines() == ["committed"], p.stdout
        s = state(store)
        assert (s["state"], s["torn"], s["allocations"]) == ("COMMITTED", 0, 4), s
        with gmsfs.connect(store, "ro", timeout=5) as r:
            r.import_all()
            got = sorted(bytes(r.buffer(m.ptr, 1))[0] for m in r.mappings)
            assert got == [0x41, 0x42, 0x43, 0x46], got
