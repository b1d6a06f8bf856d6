"""A real gmsfs mount (host backend) for the package's tests: the daemon of the build
tree, on a temporary directory, unmounted and ended (by its pid) at the end."""
import os
import subprocess
import sys
import tempfile
import time
import uuid

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BUILD = os.path.join(ROOT, os.environ.get("GMSFS_BUILD", "build"))
sys.path.insert(0, os.path.join(ROOT, "python"))
os.environ.setdefault("GMSFS_LIBRARY", os.path.join(BUILD, "libgmsfs.so.0"))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Each phase's report kept on the test (item.rep_call): a fixture's teardown can see
    whether the test failed, and show the daemon's log."""
    outcome = yield
    rep = outcome.get_result()
    setattr(item, "rep_" + rep.when, rep)


def failed(request):
    rep = getattr(request.node, "rep_call", None)
    return rep is not None and rep.failed


def mounted(*options):
    """A daemon on a fresh directory (options: more -o options), as a generator a fixture
    yields from: the mount point, then the unmount and the daemon's end."""
    mnt = tempfile.mkdtemp(prefix="gmsfs-py.")
    log = open(mnt + ".log", "w")
    daemon = subprocess.Popen([os.path.join(BUILD, "gmsfs"), "-f", "-o", ",".join(("socket=%s.sock" % mnt,) + options),
                               mnt], stderr=log)
    for _ in range(200):
        with open("/proc/mounts") as f:
            if " %s fuse.gmsfs " % mnt in f.read():
                break
        if daemon.poll() is not None:
            raise RuntimeError("gmsfs did not start: " + open(mnt + ".log").read())
        time.sleep(0.05)
    try:
        yield mnt
    finally:  # a test that failed inside `for mnt in mounted(...)` leaves no daemon either
        if subprocess.run(["umount", mnt]).returncode:
            subprocess.run(["umount", "-l", mnt])
        try:
            daemon.wait(5)
        except subprocess.TimeoutExpired:
            daemon.kill()
            daemon.wait()
        log.close()
        os.rmdir(mnt)
        os.unlink(mnt + ".log")


def let_go_of_mount(d, request, lines=40):
    """A test's mount point at its end: the daemon's log shown if the test failed, every
    mount it stacked or left on d unmounted, d and its log removed."""
    if failed(request) and os.path.exists(d + ".log"):
        print("daemon log, last lines:\n" + "".join(open(d + ".log").readlines()[-lines:]))
    for _ in range(5):
        if subprocess.run(["umount", d], capture_output=True).returncode:
            if subprocess.run(["umount", "-l", d], capture_output=True).returncode:
                break
    # A client that made a store while a restart had lifted the mount (a test's process
    # mid-publish) made it in the bare directory, which the next mount hid: gone too, once
    # nothing is mounted there.
    with open("/proc/self/mounts") as f:
        assert " %s " % d not in f.read(), d
    import shutil
    shutil.rmtree(d)
    if os.path.exists(d + ".log"):
        os.unlink(d + ".log")


def remove_stores(mnt, tries=100):
    """rmdir every store of mnt, waiting for each to be let go (a test's connections close
    as it ends; a store on a tier would skew the next test)."""
    for name in os.listdir(mnt):
        p = os.path.join(mnt, name)
        for _ in range(tries if os.path.isdir(p) else 0):
            try:
                os.rmdir(p)
                break
            except OSError:
                time.sleep(0.05)


@pytest.fixture(scope="session")
def mount():
    yield from mounted()


@pytest.fixture
def store(mount):
    """A fresh, empty store of the mount."""
    path = os.path.join(mount, "s-" + uuid.uuid4().hex[:8])
    os.mkdir(path)
    return path


def until(pred, timeout=20, step=0.01):
    """Wait for an event: pred() true within timeout seconds (looked at every step)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(step)
    return pred()


def run_py(code, *args, timeout=60):
    """Run code in a fresh Python process (another process, as an engine would be)."""
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
    return subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True, text=True,
                          timeout=timeout)
