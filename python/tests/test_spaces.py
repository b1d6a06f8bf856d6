"""Virtual spaces (host backend): an allocation at several addresses, one memory; the
access follows the connection's (read-only after commit and for readers, as
/proc/self/maps shows); unmap_all and remap_all keep the addresses; refusals; nothing
left mapped after a free."""
import errno

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
