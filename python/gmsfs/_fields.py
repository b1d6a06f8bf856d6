"""The key: value lines of gmsfs's text files (a store's state, a mount's device), for the
library's modules and gmsfsctl alike."""
import errno
import os
import select
import time


def read_fields(path):
    """The key: value lines of a gmsfs text file (a store's state, a mount's device)."""
    with open(path) as f:
        return dict(line.rstrip("\n").split(": ", 1) for line in f if ": " in line)


def wait_generation(store, after, timeout=None):
    """Wait, by poll(2) on the store's state (no lock taken, no busy loop), for a commit
    newer than generation `after` that is whole (not TORN: a refit's trainer killed
    mid-way is waited past, until a later one commits).  Returns the state's fields.
    TimeoutError after timeout seconds (None: as long as it takes); FileNotFoundError
    once the store is removed."""
    deadline = None if timeout is None else time.monotonic() + timeout
    fd = os.open(os.path.join(store, "state"), os.O_RDONLY | os.O_CLOEXEC)
    try:
        p = select.poll()
        p.register(fd, select.POLLIN)
        while True:
            text = os.pread(fd, 65536, 0).decode()
            st = dict(line.split(": ", 1) for line in text.splitlines() if ": " in line)
            if st.get("state") == "REMOVED":
                raise FileNotFoundError(errno.ENOENT, "removed while waiting for a commit", store)
            if int(st.get("generation", 0)) > after and st.get("torn") == "0" and st.get("state") != "RW":
                return st
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise TimeoutError(errno.ETIMEDOUT, "no commit after generation %d within %g s (state %s, generation "
                                   "%s)" % (after, timeout, st.get("state"), st.get("generation")), store)
            p.poll(1000 if left is None else max(1, min(1000, int(left * 1000))))
    finally:
        os.close(fd)
