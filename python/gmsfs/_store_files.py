"""A store's text files (gmsfs(5)), read or written without libgmsfs: what gmsfsctl and
gmsfs.Group need of a store without taking its lock, so that they start without loading
the library (ctypes and its imports cost a fresh process tens of milliseconds)."""
import os


def content_hash(store):
    """What the daemon knows of store's content hash: 32 hex digits, or None when it is
    not known now (STORE/content_hash says why)."""
    with open(os.path.join(store, "content_hash")) as f:
        text = f.read().strip()
    return None if text.startswith("unknown") else text


def committed_version(store):
    """The name of store's last commit, or None where it has none (STORE/version; gmsfs.version
    is libgmsfs's own)."""
    with open(os.path.join(store, "version")) as f:
        text = f.read().strip()
    return None if text.startswith("none:") else text


def versions(store):
    """The store's named commits it keeps, oldest first: [(generation, name, state)], state
    "serving" (the last commit), "held N" (the version before, N readers on it) or
    "gone"."""
    out = []
    with open(os.path.join(store, "versions")) as f:
        for line in f:
            gen, name, state = line.rstrip("\n").split(" ", 2)
            out.append((int(gen), name, state))
    return out


def prefetch(store):
    """Ask for a store on the host tier to come back to the device, without waiting (an
    adapter needed soon).  Nothing to do for a store on the device."""
    with open(os.path.join(store, "prefetch"), "w") as f:
        f.write("\n")
