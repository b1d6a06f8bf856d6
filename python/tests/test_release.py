"""Memory is released off the daemon's mutex (gmsfs(8), src/fs/fs.h): a backend's release
that takes its time (the host backend slowed by GMSFS_SLOW_RELEASE_MS, as a driver's
cuMemRelease of gigabytes is) holds up no other request of the mount, and an rmdir
returns at once (the kernel holds the mount's root while it runs), its room back."""
import os
import subprocess
import threading
import time

import pytest

from conftest import mounted
from gmsfs.ctl import read_fields

SLOW_MS = 800


@pytest.fixture(scope="module")
def slow():
    os.environ["GMSFS_SLOW_RELEASE_MS"] = str(SLOW_MS)
    try:
        gen = mounted("backend=host", "max_bytes=64M")
        mnt = next(gen)
    finally:
        del os.environ["GMSFS_SLOW_RELEASE_MS"]
    yield mnt
    next(gen, None)


def committed(mnt, name, size=1 << 20):
    store = os.path.join(mnt, name)
    os.mkdir(store)
    subprocess.run(["bash", "-ec", "exec 9>%s/lock; truncate -s %d %s/allocs/x; echo > %s/commit" %
                    (store, size, store, store)], check=True)
    return store


def used(mnt):
    return int(read_fields(os.path.join(mnt, "device"))["used_bytes"])


def test_a_slow_release_holds_up_no_other_request(slow):
    gone, other = committed(slow, "gone"), committed(slow, "other")
    before = used(slow)
    took = {}

    def remove():
        t0 = time.monotonic()
        os.rmdir(gone)
        took["rmdir"] = time.monotonic() - t0

    t = threading.Thread(target=remove)
    t.start()
    time.sleep(SLOW_MS / 8000)  # the release runs by now
    t0 = time.monotonic()
    state = read_fields(os.path.join(other, "state"))["state"]  # a request that needs the daemon's mutex
    os.mkdir(os.path.join(slow, "third"))
    took["others"] = time.monotonic() - t0
    t.join()
    assert state == "COMMITTED"
    assert took["others"] < SLOW_MS / 2000, took  # not behind the release (it was, under the mutex)
    assert took["rmdir"] < SLOW_MS / 2000, took  # nor the rmdir itself
    assert used(slow) == before - (1 << 20) and not os.path.exists(gone)  # its room, at once
    dev = os.path.join(slow, "device")
    assert read_fields(dev)["releasing_bytes"] == str(1 << 20)  # its memory, on its way (the device file says)
    deadline = time.monotonic() + 10
    while read_fields(dev)["releasing_bytes"] != "0" and time.monotonic() < deadline:
        time.sleep(0.02)
    assert read_fields(dev)["releasing_bytes"] == "0"
    os.rmdir(os.path.join(slow, "third"))
    os.rmdir(other)  # also slow: every release goes the same way
    assert used(slow) == before - (2 << 20)


def test_a_rolled_back_session_releases_off_the_mutex(slow):
    store = os.path.join(slow, "rb")
    os.mkdir(store)
    before = used(slow)
    # A writer makes an allocation and leaves without commit: its session rolls back when
    # its lock goes, and the allocation's memory is released then.
    subprocess.run(["bash", "-ec", "exec 9>%s/lock; truncate -s 1048576 %s/allocs/x" % (store, store)], check=True)
    t0 = time.monotonic()
    fields = read_fields(os.path.join(store, "state"))
    took = time.monotonic() - t0
    assert took < SLOW_MS / 2000, took
    deadline = time.monotonic() + 10
    while used(slow) != before and time.monotonic() < deadline:
        time.sleep(0.02)
    assert used(slow) == before and fields["state"] in ("EMPTY", "RW")
    os.rmdir(store)


def test_a_sessions_spare_pages_go_off_the_mutex(slow):
    """The pages an elastic store's engine gave back (spares, kept for its growth) go when
    its session ends: out of pages_spare at once, their memory on the releaser thread."""
    store, other = os.path.join(slow, "kv"), committed(slow, "other2")
    os.mkdir(store)
    import gmsfs
    with gmsfs.connect(store, "rw") as c, gmsfs.Pages(c, 4 << 20, 1 << 20) as p:
        p.map(range(2))
        p.unmap(range(2))
        assert int(read_fields(os.path.join(store, "state"))["pages_spare"]) == 2 << 20
        t0 = time.monotonic()
    ended = time.monotonic() - t0  # the session's end: two slow releases
    t1 = time.monotonic()
    st = read_fields(os.path.join(other, "state"))
    took = time.monotonic() - t1
    assert ended < SLOW_MS / 1000 and took < SLOW_MS / 2000, (ended, took)
    assert int(read_fields(os.path.join(store, "state"))["pages_spare"]) == 0 and st["state"] == "COMMITTED"
    os.rmdir(store)
    os.rmdir(other)
