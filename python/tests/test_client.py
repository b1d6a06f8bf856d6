"""The package's client API over a real mount (host backend): modes and timeouts,
metadata, errors, sleep and wake, numpy views, the C allocator."""
import ctypes
import errno
import hashlib
import os

import numpy as np
import pytest

import gmsfs
from conftest import run_py


def publish_words(store, n=4, size=65536):
    """A writer's layout: w/K holds uint32 words K*1000000 + i; entries t/K describe them."""
    with gmsfs.connect(store, "rw", timeout=5) as c:
        for m in c.import_all():  # a new writer starts from the committed layout: from scratch here
            c.free(m)
        for k in range(n):
            m = c.create("w/%d" % k, size, tag="weights")
            a = c.array(m, "uint32")
            a[:] = np.arange(a.size, dtype=np.uint32) + k * 1000000
        c.meta_put_many([("t/%d" % k, "w/%d" % k, 0, "u32[%d]" % (size // 4), size) for k in range(n)])
        c.commit()
        return c.layout_hash


def test_version_is_checked():
    assert gmsfs.version == 300 and gmsfs.version_string == "0.3.0"
    assert os.path.exists(gmsfs.library_path)


def test_modes_and_timeouts(store):
    # A reader of an empty store waits: with a timeout it gives up, with 0 it tries once.
    with pytest.raises(gmsfs.GmsfsError) as e:
        gmsfs.connect(store, "ro", timeout=0.2)
    assert e.value.errno == errno.ETIMEDOUT and "not granted within 200 ms" in e.value.strerror
    with pytest.raises(gmsfs.GmsfsError) as e:
        gmsfs.connect(store, "ro", timeout=0)
    assert e.value.errno == errno.EAGAIN
    with gmsfs.connect(store, "auto") as c:  # nothing committed: RW
        assert c.lock_mode == "rw" and c.backend == "host" and c.layout_hash == "" and c.generation == 0
        c.create("a", 4096)
        c.commit()
        assert c.lock_mode == "ro" and c.generation == 1  # commit downgrades
    with gmsfs.connect(store, "auto") as c:  # committed: RO
        assert c.lock_mode == "ro" and c.generation == 1
        # A writer elsewhere waits for this reader; a writer's try fails at once.
        r = run_py("import gmsfs, sys\ntry:\n gmsfs.connect(sys.argv[1], 'rw', timeout=0)\n"
                   "except gmsfs.GmsfsError as e:\n print(e.errno)", store)
        assert r.stdout.strip() == str(errno.EAGAIN), r.stderr
    with pytest.raises(ValueError):
        gmsfs.connect(store, "write")


def test_a_lock_taken_by_a_thread_is_its_process_s(store):
    # The daemon learns the caller's process from its thread: one system call for a main
    # thread, /proc for another; both must name the process, not the thread.
    import threading
    seen = {}

    def writer():
        with gmsfs.connect(store, "rw", timeout=5) as c:
            with open(os.path.join(store, "state")) as f:
                seen["thread"] = dict(l.split(": ", 1) for l in f.read().splitlines() if ": " in l)["writer"]
            c.create("a", 4096)
            c.commit()

    t = threading.Thread(target=writer)
    t.start()
    t.join()
    assert seen["thread"] == str(os.getpid()) and threading.get_native_id() == os.getpid(), seen
    with gmsfs.connect(store, "rw", timeout=5) as c:
        with open(os.path.join(store, "state")) as f:
            assert "writer: %d\n" % os.getpid() in f.read()


def test_another_process_reads_what_a_writer_published(store):
    h = publish_words(store)
    r = run_py("""
import gmsfs, sys, numpy as np
with gmsfs.connect(sys.argv[1], 'ro', timeout=5) as c:
    c.import_all()
    bad = 0
    for k in c.meta_list('t/'):
        e = c.meta_get(k)
        a = np.frombuffer(c.buffer(e.ptr, e.size), dtype=np.uint32)
        bad += int((a != np.arange(a.size, dtype=np.uint32) + int(k[2:]) * 1000000).sum())
    print(len(c.mappings), bad, c.layout_hash)
""", store)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["4", "0", h]


def test_values_of_every_size_arrive_whole_in_another_process(store):
    """The manifest's messages are 64 KiB: small values come whole in one, big ones in
    chunks over several; a reader gets each back byte for byte."""
    sizes = [0, 1, 100, 65000, 65536, 200000, 1 << 20] + [7] * 3000
    with gmsfs.connect(store, "rw") as c:
        c.create("w", 4096)
        c.meta_put_many([("v/%05d" % i, "w", 0, bytes((i + j) % 251 for j in range(n)))
                         for i, n in enumerate(sizes)])
        c.commit()
    r = run_py("""
import gmsfs, sys, hashlib
with gmsfs.connect(sys.argv[1], 'ro', timeout=5) as c:
    c.import_all()
    for k in c.meta_list('v/'):
        print(k, hashlib.sha256(c.meta_get(k).value).hexdigest())
""", store)
    assert r.returncode == 0, r.stderr
    want = ["v/%05d %s" % (i, hashlib.sha256(bytes((i + j) % 251 for j in range(n))).hexdigest())
            for i, n in enumerate(sizes)]
    assert r.stdout.split("\n")[:-1] == want


def test_create_many_is_one_request_all_or_nothing(store):
    with gmsfs.connect(store, "rw") as c:
        with pytest.raises(gmsfs.GmsfsError) as e:
            c.create_many([("a", 4096), ("b//x", 4096)])
        assert e.value.errno == errno.EINVAL and "b//x" in e.value.strerror
        assert c.mappings == []
        made = c.create_many([("a", 4096), ("b", 10000, "odd"), {"name": "c/d", "size": 1}])
        assert [(m.name, m.size, m.tag, m.writable) for m in made] == \
            [("a", 4096, "default", True), ("b", 10000, "odd", True), ("c/d", 1, "default", True)]
        with pytest.raises(gmsfs.GmsfsError) as e:
            c.create_many([("x", 4096), ("b", 4096)])
        assert e.value.errno == errno.EEXIST
        c.array(made[1], "uint8")[:] = 7
        c.commit()
    with gmsfs.connect(store, "ro") as c:
        assert sorted(m.name for m in c.import_all()) == ["a", "b", "c/d"]
        assert int(c.array("b", "uint8").sum()) == 7 * 10000


def test_metadata_bulk_all_or_nothing_and_errors(store):
    with gmsfs.connect(store, "rw") as c:
        c.create("slab", 8192)
        with pytest.raises(gmsfs.GmsfsError) as e:
            c.meta_put_many([{"key": "a", "alloc": "slab"}, {"key": "b", "alloc": "slab", "offset": 8000, "size": 500}])
        assert e.value.errno == errno.EINVAL and "entries[1] (b)" in e.value.strerror
        assert c.meta_list() == []
        c.meta_put_many([{"key": "x/a", "alloc": "slab", "value": "one"}, ("x/b", "slab", 16, b"two", 32, True)])
        assert c.meta_list("x/") == ["x/a", "x/b"]
        b = c.meta_get("x/b")
        assert (b.alloc, b.offset, b.size, b.private, b.value) == ("slab", 16, 32, True, b"two")
        c.meta_put("y", "slab", 8, "three")
        assert c.meta_items("x/") == [c.meta_get("x/a"), b]  # every entry of a prefix in one call
        assert [e.key for e in c.meta_items()] == ["x/a", "x/b", "y"] and c.meta_items("z") == []
        with pytest.raises(KeyError):
            c.meta_get("x/none")
        c.meta_delete("x/a")
        c.meta_delete("y")
        assert c.meta_list() == ["x/b"]
        with pytest.raises(gmsfs.GmsfsError) as e:
            c.create("../bad", 10)
        assert e.value.errno == errno.EINVAL and "not a valid name" in e.value.strerror
        with pytest.raises(gmsfs.GmsfsError) as e:
            c.import_one("nope")
        assert e.value.errno == errno.ENOENT and "allocs/nope does not exist" in e.value.strerror


def test_sleep_and_wake_keep_addresses_and_a_changed_layout_is_stale(store):
    publish_words(store, n=2)
    c = gmsfs.connect(store, "ro")
    before = {m.name: m.ptr for m in c.import_all()}
    c.unmap_all()
    assert c.lock_mode is None
    c.remap_all(timeout=5)
    assert {m.name: m.ptr for m in c.mappings} == before
    assert c.array("w/1", "uint32")[7] == 1000007
    c.unmap_all()
    publish_words(store, n=3)  # another structure
    with pytest.raises(gmsfs.StaleLayoutError) as e:
        c.remap_all(timeout=5)
    assert e.value.errno == errno.ESTALE and "layout hash was" in e.value.strerror
    c.close()


def test_commit_with_unmap_publishes_and_leaves_the_writer_asleep(store):
    c = gmsfs.connect(store, "rw")
    m = c.create("w/0", 65536)
    c.array(m, "uint32")[:] = 7
    c.meta_put("own", "w/0", 0, b"u32[4]", size=16, private=True)
    c.meta_get("own")  # the writer's copy of the metadata, loaded: its private extents are copied before the unmap
    c.commit(unmap=True)
    assert c.lock_mode is None and c.generation == 1  # unmapped, the lock given back
    r = run_py("import gmsfs, sys\nwith gmsfs.connect(sys.argv[1], 'ro', timeout=5) as c:\n"
               " print(int(c.array(c.import_all()[0], 'uint32').sum()), c.layout_hash)", store)
    total, h = r.stdout.split()
    assert int(total) == 7 * 16384, r.stderr
    c.remap_all(timeout=5)  # the committed layout, at the same address, read-only
    assert c.lock_mode == "ro" and c.layout_hash == h and [(x.ptr, x.writable) for x in c.mappings] == [(m.ptr, False)]
    own = c.meta_get("own")
    assert own.private and own.ptr != m.ptr and list(c.array(own, "uint32")) == [7] * 4
    with pytest.raises(gmsfs.GmsfsError) as e:
        c.commit(unmap=True)  # a reader's
    assert e.value.errno == errno.EPERM and c.lock_mode == "ro"
    c.close()


def test_a_readers_unmap_all_gives_its_lock_back_by_its_socket_while_it_unmaps(store):
    def state():
        return dict(l.split(": ", 1) for l in open(os.path.join(store, "state")).read().splitlines() if ": " in l)
    with gmsfs.connect(store, "rw") as w:
        w.array(w.create("a", 65536), "uint8")[:] = 3
        w.commit()
    c = gmsfs.connect(store, "ro")
    c.import_all()
    asked = int(state()["socket_requests"])
    c.unmap_all()
    st = state()  # read right after: the daemon answered the UNLOCK before unmap_all returned
    assert st["readers"] == "0" and int(st["socket_requests"]) == asked + 1, st
    with gmsfs.connect(store, "rw", timeout=5) as w:  # the writer's lock is free at once
        w.import_all()
    c.remap_all(timeout=5)
    assert int(c.array(c.mappings[0], "uint8").sum()) == 3 * 65536 and state()["readers"] == "1"
    c.close()


def test_unmap_lets_one_mapping_go_and_keeps_the_allocation(store):
    c = gmsfs.connect(store, "rw")
    a, b, p = c.create_many([("a", 65536), ("b", 65536), ("p", 4096)])
    c.array(a, "uint32")[:] = 3
    c.array(b, "uint32")[:] = 4
    c.meta_put("a/x", "a", 0, b"u32", size=16)
    c.meta_put("own", "p", 0, b"u8", size=16, private=True)
    c.unmap("a")  # written: a writer lets it go before its commit
    assert sorted(m.name for m in c.mappings) == ["b", "p"] and c.meta_get("a/x").ptr is None
    for name, err, words in (("a", errno.ENOENT, "maps no such allocation"), ("../a", errno.EINVAL, "not a valid"),
                             ("p", errno.EBUSY, "meta/own is private")):
        with pytest.raises(gmsfs.GmsfsError) as e:
            c.unmap(name)
        assert e.value.errno == err and words in e.value.strerror, (name, e.value)
    with c.space() as s:
        s.map("b")
        with pytest.raises(gmsfs.GmsfsError) as e:
            c.unmap("b")
        assert e.value.errno == errno.EBUSY and "space" in e.value.strerror
    assert sorted(m.name for m in c.mappings) == ["b", "p"]  # the refused ones stay mapped
    c.commit(unmap=True)
    with gmsfs.connect(store, "ro") as r:
        r.import_all()
        assert int(r.array("a", "uint32").sum()) == 3 * 16384 and int(r.array("b", "uint32").sum()) == 4 * 16384
        r.unmap("b")
        assert r.meta_get("a/x").ptr == r.find("a").ptr and sorted(m.name for m in r.mappings) == ["a", "p"]
        assert int(r.array(r.import_one("b"), "uint32").sum()) == 4 * 16384  # mapped again
        r.unmap_all()
        with pytest.raises(gmsfs.GmsfsError) as e:
            r.unmap("a")
        assert e.value.errno == errno.EINVAL and "remap_all first" in e.value.strerror
    c.close()


def test_private_entries_are_copies(store):
    with gmsfs.connect(store, "rw") as c:
        m = c.create("buf", 4096)
        c.array(m, "float32")[:] = 1.5
        c.meta_put("scale", "buf", 0, b"f32[1024]", size=4096, private=True)
        c.meta_put("shared", "buf", 0, b"f32[1024]", size=4096)
        c.commit()
    with gmsfs.connect(store, "ro") as c:
        c.import_all()
        mine, shared = c.meta_get("scale"), c.meta_get("shared")
        assert mine.private and mine.ptr != shared.ptr == c.find("buf").ptr
        a = c.array(mine, "float32")
        assert a.flags.writeable and a[0] == 1.5
        a[:] = 7.0  # this process's own copy
        assert c.array(shared, "float32")[0] == 1.5
        assert not c.array("buf", "float32").flags.writeable


def test_reader_cannot_write(store):
    publish_words(store, n=1)
    with gmsfs.connect(store, "ro") as c:
        c.import_all()
        for call in (lambda: c.create("x", 10), lambda: c.commit(), lambda: c.meta_put("k", "w/0"),
                     lambda: c.free("w/0")):
            with pytest.raises(gmsfs.GmsfsError) as e:
                call()
            assert e.value.errno == errno.EPERM
        c.unmap_all()
        with pytest.raises(gmsfs.GmsfsError) as e:
            c.reallocate_all()
        assert e.value.errno == errno.EPERM


def test_the_c_allocator_carves_tensors_out_of_slabs(store):
    lib = gmsfs._lib.lib
    with gmsfs.connect(store, "rw") as c:
        assert lib.gmsfs_torch_use(c._handle(), 1 << 20) == 0
        ptrs = [lib.gmsfs_torch_alloc(n, 0, None) for n in (1000, 300000, 5, 800000)]
        assert all(p and p % 512 == 0 for p in ptrs)
        assert lib.gmsfs_torch_slabs() == 2  # 1000 + 300000 + 5 fit one 1 MiB slab; 800000 needs a second
        assert {c.find_ptr(p)[0].name for p in ptrs} == {"torch/slab00000", "torch/slab00001"}
        lib.gmsfs_torch_free(ptrs[1], 300000, 0, None)
        again = lib.gmsfs_torch_alloc(200000, 0, None)
        assert again == ptrs[1]  # first fit reuses the freed range
        big = lib.gmsfs_torch_alloc(3 << 20, 0, None)
        slab = c.find_ptr(big)[0]
        assert slab.name == "torch/slab00002" and slab.size == 4 << 20  # of its own, in 2 MiB steps
        lib.gmsfs_torch_use(None, 0)
        assert lib.gmsfs_torch_alloc(10, 0, None) is None  # no store: out of memory
        c.commit()
    with gmsfs.connect(store, "ro", timeout=5) as r:
        assert lib.gmsfs_torch_use(r._handle(), 0) == -errno.EPERM


def test_digest_read_in_chunks_is_the_digest_in_place(store, monkeypatch):
    """GPU memory is read a chunk at a time (32 MiB, four buffers round robin) while threads
    hash the chunks before; GMSFS_DIGEST_COPY takes the host backend through that path: the
    same hash as hashing in place, for allocations over many chunks and of odd sizes."""
    sizes = {"a": (100 << 20) + 5, "b": 70 << 20, "c/d": 1, "e": (32 << 20) - 1}
    with gmsfs.connect(store, "rw") as c:
        for i, (name, size) in enumerate(sorted(sizes.items())):
            m = c.create(name, size)
            for off in range(0, size, 1 << 20):  # each MiB its own byte
                ctypes.memset(m.ptr + off, (i * 7 + off // (1 << 20)) & 0xff, min(1 << 20, size - off))
        c.commit()
    with gmsfs.connect(store, "ro") as r:
        in_place = r.digest()
        monkeypatch.setenv("GMSFS_DIGEST_COPY", "1")
        assert r.digest() == in_place
    with gmsfs.connect(store, "data") as w:  # the last byte of "a", in its fourth chunk
        w.import_all()
        ctypes.memset(w.find("a").ptr + sizes["a"] - 1, 0xee, 1)
        w.commit()
    with gmsfs.connect(store, "ro") as r:
        copied = r.digest()
        monkeypatch.delenv("GMSFS_DIGEST_COPY")
        assert r.digest() == copied != in_place


def test_digest_is_a_readers_and_the_daemon_keeps_it_for_its_commit(store):
    """gmsfs.digest / Connection.digest (gmsfs(5), CONTENT HASH; 10-shell.bats checks the
    hash against the recipe's, from the mount's files): recorded, STORE/content_hash says
    it; a writer's handle is refused; a commit makes it unknown; a changed byte changes it."""
    with gmsfs.connect(store, "rw") as c:
        a, b = c.create("a", 4096 + 7), c.create("dir/b", 1 << 20)
        ctypes.memset(a.ptr, 1, a.size)
        ctypes.memset(b.ptr, 2, b.size)
        with pytest.raises(gmsfs.GmsfsError) as e:
            c.digest()
        assert e.value.errno == errno.EPERM and "a reader's" in e.value.strerror
        c.commit()
    assert gmsfs.content_hash(store) is None
    with gmsfs.connect(store, "ro") as r:
        h = r.digest()  # not recorded
        assert len(h) == 32 and gmsfs.content_hash(store) is None
        assert r.digest(record=True) == h
    assert gmsfs.content_hash(store) == h == gmsfs.digest(store)
    from gmsfs._lib import lib as _c
    with gmsfs.connect(store, "ro") as r:  # the C call that reads the daemon's word for the handle's commit
        buf = ctypes.create_string_buffer(33)
        assert _c.gmsfs_content_hash(r._handle(), buf) == 0 and buf.value.decode() == h
    with gmsfs.connect(store, "data") as w:  # a byte changed in place, then committed
        w.import_all()
        ctypes.memset(w.find("dir/b").ptr + 5, 3, 1)
        w.commit()
    assert gmsfs.content_hash(store) is None
    assert "committed again" in open(os.path.join(store, "content_hash")).read()
    with gmsfs.connect(store, "ro") as r:
        assert _c.gmsfs_content_hash(r._handle(), buf) == -errno.ENODATA and buf.value == b""
    h2 = gmsfs.digest(store)
    assert h2 != h and gmsfs.content_hash(store) == h2
    # An engine asks for the bytes it wants by their hash: given, or refused with EIO.
    with gmsfs.connect(store, "ro", expect=h2) as r:
        assert r.generation == 2
    with pytest.raises(gmsfs.GmsfsError) as e:
        gmsfs.connect(store, "ro", expect=h)
    assert e.value.errno == errno.EIO and "not the %s asked for" % h in e.value.strerror
    os.removexattr(store, "user.gms.content_hash")  # unknown: computed under the reader's lock
    with pytest.raises(gmsfs.GmsfsError, match="computed: the daemon knew none"):
        gmsfs.connect(store, "ro", expect=h)
    with gmsfs.connect(store, "ro", expect=h2):
        pass
    for bad in ("x" * 32, h2.upper(), h2[:30], 5):
        with pytest.raises(ValueError):
            gmsfs.connect(store, "ro", expect=bad)
    with pytest.raises(ValueError):
        gmsfs.connect(store, "rw", expect=h2)
    state = open(os.path.join(store, "state")).read()
    assert "\nreaders: 0\n" in state and "\nread_handles: 0\n" in state  # every refusal gave its lock back


def test_the_package_gives_every_name_at_its_first_use():
    """import gmsfs imports nothing of the library; each public name (and a submodule, as
    scripts reach gmsfs._cuda or gmsfs._lib) is there at its first use; an unknown name is
    an AttributeError; from gmsfs import * gives every name of __all__."""
    r = run_py("""
import sys, gmsfs
print("gmsfs._connection" in sys.modules, "ctypes" in sys.modules)
print(gmsfs.connect.__module__, gmsfs.Group.__module__, gmsfs.versions.__module__, gmsfs._cuda.__name__)
print(gmsfs.library_path.endswith("libgmsfs.so.0"), "connect" in dir(gmsfs))
try:
    gmsfs.nosuch
except AttributeError as e:
    print("AttributeError", e)
ns = {}
exec("from gmsfs import *", ns)
print(sorted(set(gmsfs.__all__) - set(ns)))
""")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [
        "False False", "gmsfs._connection gmsfs.group gmsfs._store_files gmsfs._cuda", "True True",
        "AttributeError module 'gmsfs' has no attribute 'nosuch'", "[]"], r.stdout
