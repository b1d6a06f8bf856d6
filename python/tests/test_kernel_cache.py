"""The kernel keeps the layout's names and attributes (LAYOUT_TIMEOUT, 10 s), so `ls -l`
and repeated stats do not ask the daemon; whatever changes the layout behind the
kernel's back (the socket's calls, an abort, a writer that dies) makes the kernel drop
what it kept, before the call returns."""
import os
import signal
import subprocess
import sys
import time

import gmsfs
from conftest import run_py


def requests(store):
    with open(os.path.join(store, "state")) as f:
        return next(int(line.split()[1]) for line in f if line.startswith("requests:"))


def gone(path, within=5.0):
    deadline = time.monotonic() + within
    while os.path.exists(path):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_a_second_stat_asks_the_daemon_nothing(store):
    with gmsfs.connect(store, "rw") as c:
        c.create("d/w", 4096)
        c.meta_put("k", "d/w", value=b"v")
        c.commit()
    paths = [os.path.join(store, "allocs", "d", "w"), os.path.join(store, "meta", "k")]
    for p in paths:
        os.stat(p)
    before = requests(store)
    for _ in range(10):
        for p in paths:
            os.stat(p)
    assert requests(store) == before


def test_socket_calls_are_seen_at_once(store):
    with gmsfs.connect(store, "rw") as c:
        c.create("w", 4096)
        c.create("x", 8192)
        c.meta_put("k", "w", value=b"ab")
        c.commit()
    x, k = os.path.join(store, "allocs", "x"), os.path.join(store, "meta", "k")
    assert os.stat(x).st_size == 8192 and os.stat(k).st_size == 2  # now kept by the kernel
    with gmsfs.connect(store, "rw") as c:
        c.import_all()
        c.free("x")
        assert not os.path.exists(x)
        c.meta_put("k", "w", value=b"abcdef")
        assert os.stat(k).st_size == 6
        with open(k, "rb") as f:
            assert f.read() == b"abcdef"
        c.create("x", 4096 * 3)
        assert os.stat(x).st_size == 4096 * 3
        c.meta_delete("k")
        assert not os.path.exists(k)
        c.commit()


def test_abort_is_seen_at_once(store):
    with gmsfs.connect(store, "rw") as c:
        c.create("kept", 4096)
        c.commit()
    with gmsfs.connect(store, "rw") as c:
        c.import_all()
        c.create("y", 4096)
        c.free("kept")
        y, kept = os.path.join(store, "allocs", "y"), os.path.join(store, "allocs", "kept")
        assert os.path.exists(y) and not os.path.exists(kept)
        with open(os.path.join(store, "abort"), "w") as f:
            f.write("1\n")
        assert not os.path.exists(y)
        assert os.stat(kept).st_size == 4096


def test_a_writer_that_dies_is_rolled_back_for_the_kernel_too(store):
    with gmsfs.connect(store, "rw") as c:
        c.create("kept", 4096)
        c.commit()
    z = os.path.join(store, "allocs", "z")
    # The writer sees its own allocation through the kernel; this process, outside its
    # session, never does: the kernel keeps no layout name while a session runs.
    code = ("import gmsfs, os, sys, time\n"
            "c = gmsfs.connect(sys.argv[1], 'rw')\n"
            "c.create('z', 4096)\n"
            "print('made', os.stat(sys.argv[1] + '/allocs/z').st_size, flush=True)\n"
            "time.sleep(60)\n")
    env = dict(os.environ, PYTHONPATH=os.path.join(os.path.dirname(gmsfs.__file__), ".."))
    p = subprocess.Popen([sys.executable, "-c", code, store], env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "made 4096"
        assert not os.path.exists(z), "an uncommitted allocation is seen outside its session"
        assert sorted(os.listdir(os.path.join(store, "allocs"))) == ["kept"]
        p.send_signal(signal.SIGKILL)
        p.wait()
        assert gone(z), "the dead writer's allocation is still seen"  # well inside the 10 s timeout
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert run_py("import gmsfs, sys; c = gmsfs.connect(sys.argv[1], 'ro'); c.import_all(); "
                  "print(sorted(m.name for m in c.mappings))", store).stdout.strip() == "['kept']"


def kernel_nodes(mount):
    with open(os.path.join(mount, "metrics")) as f:
        return next(int(line.split()[1]) for line in f if line.startswith("gmsfs_kernel_nodes{"))


def forgotten(mount):
    """Make the kernel forget what it can (drop its cached dentries and inodes); the count left."""
    last = None
    for _ in range(100):
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("2\n")
        time.sleep(0.02)
        n = kernel_nodes(mount)
        if n == last:
            return n
        last = n
    return last


def test_a_listing_gives_the_kernel_every_attribute(store):
    """readdirplus: ls -l asks for the names once, not for each name again (a lookup)."""
    with gmsfs.connect(store, "rw") as c:
        c.create_many([("d/%03d" % i, 4096 * (i + 1)) for i in range(200)])
        c.commit()
    d = os.path.join(store, "allocs", "d")
    names = os.listdir(d)
    before = requests(store)
    sizes = [os.stat(os.path.join(d, n)).st_size for n in names]
    assert requests(store) == before
    assert sorted(sizes) == [4096 * (i + 1) for i in range(200)]


def test_the_kernel_references_a_listing_gives_are_all_given_back(mount):
    """Each readdirplus entry counts as a lookup, once: the kernel's forgets free every node."""
    base = forgotten(mount)
    store = os.path.join(mount, "listed")
    os.mkdir(store)
    with gmsfs.connect(store, "rw") as c:
        c.create_many([("d/%03d" % i, 4096) for i in range(300)])
        c.meta_put_many([("m/%03d" % i, "d/000", 0, b"v", 0) for i in range(300)])
        c.commit()
    for _ in range(2):
        subprocess.run(["ls", "-lR", store], stdout=subprocess.DEVNULL, check=True)
    assert kernel_nodes(mount) >= base + 600 + 4  # the entries, d, m, allocs, meta
    assert forgotten(mount) == base  # the kernel kept none for itself: all forgotten
    subprocess.run(["ls", "-lR", store], stdout=subprocess.DEVNULL, check=True)
    os.rmdir(store)  # the nodes leave the store while the kernel holds them
    assert forgotten(mount) == base


def test_every_page_of_a_long_listing_gives_each_entry_its_type(store):
    """The kernel asks for the first page with attributes and later ones as plain readdir,
    which carries the type alone: directories and files are told apart on every page."""
    with gmsfs.connect(store, "rw") as c:
        c.create_many([("%04d/w" % i if i % 3 == 0 else "%04d" % i, 4096) for i in range(3000)])
        c.commit()
    with os.scandir(os.path.join(store, "allocs")) as it:
        kinds = {e.name: e.is_dir(follow_symlinks=False) for e in it}
    assert kinds == {"%04d" % i: i % 3 == 0 for i in range(3000)}
