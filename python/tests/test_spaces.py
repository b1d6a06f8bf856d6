"""Virtual spaces (host backend): an allocation at several addresses, one memory; the
access follows the connection's (read-only after commit and for readers, as
/proc/self/maps shows); unmap_all and remap_all keep the addresses; refusals; nothing
left mapped after a free."""
import errno
import os

import pytest

import gmsfs

MiB = 1 << 20


def perms(ptr):
    """The permissions of the mapping at ptr in this process ("r--s", "rw-s", "---p"), or None."""
    with open("/proc/self/maps") as f:
        for line in f:
            lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
            if lo <= ptr < hi:
                return line.split()[1]
    return None


def test_one_allocation_at_three_addresses(store):
    with gmsfs.connect(store, "rw") as c:
        m = c.create("kv", 2 * MiB)
        c.buffer(m.ptr, 2 * MiB, writable=True)[:4] = b"abcd"
        with c.space() as s1, c.space() as s2:
            a, b = s1.map("kv"), s2.map("kv")
            assert len({m.ptr, a, b}) == 3 and s1.map("kv") == a
            assert bytes(c.buffer(a, 4)) == b"abcd" == bytes(c.buffer(b, 4))
            c.buffer(a, 4, writable=True)[:] = b"wxyz"  # through one address, seen at the others
            assert bytes(c.buffer(m.ptr, 4)) == b"wxyz" == bytes(c.buffer(b, 4))
            assert perms(a) == "rw-s"
            c.commit()
            assert perms(a) == perms(m.ptr) == "r--s"  # read-only after commit, as the handle's
            c.unmap_all()  # asleep: nothing mapped, the addresses kept
            assert perms(a) == "---p" and perms(b) == "---p"
            c.remap_all()
            assert s1.map("kv") == a and bytes(c.buffer(a, 4)) == b"wxyz" and perms(a) == "r--s"
        assert perms(a) is None and perms(b) is None  # freed: the addresses are given back


def test_unmap_all_undoes_every_neighbour_and_remap_all_maps_them_again(store):
    """An import_all maps the layout back to back in one reservation; unmap_all unmaps
    every page of every allocation (its address kept), and remap_all maps each again
    with its bytes."""
    sizes = {"a": MiB, "b": 3 * MiB, "c/d": 2 * MiB, "e": MiB}
    with gmsfs.connect(store, "rw") as w:
        for i, (name, size) in enumerate(sizes.items()):
            m = w.create(name, size)
            w.buffer(m.ptr, size, writable=True)[:] = bytes([i + 1]) * size
        w.commit()
    with gmsfs.connect(store, "ro") as r:
        r.import_all()
        got = sorted((m.ptr, m.size, m.name) for m in r.mappings)
        assert all(a[0] + a[1] == b[0] for a, b in zip(got, got[1:])), got  # back to back
        r.unmap_all()
        pages = [p for ptr, size, _ in got for p in range(ptr, ptr + size, 4096)]
        assert {perms(p) for p in pages} == {"---p"}
        r.remap_all()
        assert [m.ptr for m in sorted(r.mappings, key=lambda m: m.ptr)] == [x[0] for x in got]
        for ptr, size, name in got:
            assert perms(ptr) == perms(ptr + size - 1) == "r--s"
            assert set(bytes(r.buffer(ptr, size))) == {list(sizes).index(name) + 1}


def test_a_readers_space_is_read_only(store):
    with gmsfs.connect(store, "rw") as w:
        m = w.create("x", MiB)
        w.buffer(m.ptr, 3, writable=True)[:] = b"abc"
        w.commit()
    with gmsfs.connect(store, "ro") as r:
        r.import_all()
        s = r.space()
        p = s.map("x")
        assert bytes(r.buffer(p, 3)) == b"abc" and perms(p) == "r--s"
    # The connection closed with the space not freed: it went with it.
    assert perms(p) is None


def test_refusals(store):
    with gmsfs.connect(store, "rw") as c:
        m = c.create("a", MiB)
        s = c.space()
        with pytest.raises(gmsfs.GmsfsError) as e:
            s.map("nope")
        assert e.value.errno == errno.ENOENT and "nope" in str(e.value)
        s.map("a")
        with pytest.raises(gmsfs.GmsfsError) as e:
            c.free(m)
        assert e.value.errno == errno.EBUSY and "space" in str(e.value)
        s.free()
        with pytest.raises(gmsfs.GmsfsError) as e:
            s.free()
        assert e.value.errno == errno.EINVAL and "freed already" in str(e.value)
        with pytest.raises(gmsfs.GmsfsError) as e:
            s.map("a")
        assert e.value.errno == errno.EINVAL
        c.free(m)  # no space maps it now
        c.commit()
        c.unmap_all()
        with pytest.raises(gmsfs.GmsfsError) as e:
            c.space()
        assert e.value.errno == errno.EINVAL and "no lock" in str(e.value)
    with pytest.raises(gmsfs.GmsfsError) as e:
        c.space()
    assert e.value.errno == errno.EBADF
    with pytest.raises(gmsfs.GmsfsError) as e:
        s.map("a")
    assert e.value.errno == errno.EBADF


def test_a_thousand_spaces_leave_nothing_mapped(store):
    with gmsfs.connect(store, "rw") as c:
        c.create("a", MiB)
        before = sum(1 for _ in open("/proc/self/maps"))
        for _ in range(1000):
            with c.space() as s:
                s.map("a")
        assert sum(1 for _ in open("/proc/self/maps")) <= before + 2


def test_a_range_space_puts_its_mappings_side_by_side(store):
    with gmsfs.connect(store, "rw") as c:
        for n in ("c0", "c1", "c2"):
            m = c.create(n, MiB)
            c.buffer(m.ptr, 1, writable=True)[:] = n[-1].encode()
        with c.space(span=2 * MiB) as s:
            a, b = s.map("c0"), s.map("c1")
            assert b == a + MiB  # one run of addresses: a tensor may cross from one to the next
            assert bytes(c.buffer(a, 1)) == b"0" and bytes(c.buffer(a + MiB, 1)) == b"1"
            with pytest.raises(gmsfs.GmsfsError) as e:  # past its range
                s.map("c2")
            assert e.value.errno == errno.ENOSPC and "does not fit" in str(e.value)
        assert perms(a) is None  # the range goes back whole


def test_the_graph_pool_gives_each_capture_new_addresses_over_the_largest_ones_memory(store):
    # The allocator's logic, with no GPU: what gmsfs.torch.GraphPool drives on the device.
    from gmsfs._lib import lib
    with gmsfs.connect(store, "rw") as c:
        assert lib.gmsfs_graph_use(c._handle(), MiB, 16 * MiB) == 0
        try:
            sizes = {"small": 1 * MiB + 5, "large": 5 * MiB, "middle": 3 * MiB}
            seen = {}
            for name, n in sizes.items():  # captured in any order
                assert lib.gmsfs_graph_begin() == 0
                p = lib.gmsfs_graph_alloc(n, 0, None)
                seen[name] = p
                assert p and p not in [v for k, v in seen.items() if k != name]
                c.buffer(p, 8, writable=True)[:] = name[:8].ljust(8).encode()
            assert lib.gmsfs_graph_bytes() == 5 * MiB  # the largest capture, not the sum (9 MiB)
            # One memory: the last write, through any capture's address.
            assert all(bytes(c.buffer(p, 8)) == b"middle  " for p in seen.values())
            assert sorted(os.path.basename(n) for n in os.listdir(os.path.join(store, "allocs", "graph"))) == \
                ["chunk%05d" % i for i in range(5)]
            assert lib.gmsfs_graph_alloc(16 * MiB, 0, None) is None  # past a capture's span
        finally:
            lib.gmsfs_graph_use(None, 0, 0)
