"""gmsfs.load: a safetensors checkpoint into a writer's store, in this process; gmsfs.copy: a
store into an empty one on another mount (another GPU's); gmsfs.pull: a store that another
node serves into an empty one here."""
import ctypes
import json
import os
import sys

from . import _lib
from ._errors import GmsfsError, _ms


def load(conn, path, slab_bytes=0, progress=False, verbose=False, replace=False, commit=False, digest=True):
    """Load a safetensors checkpoint (a file, or a folder with its index and shards) into
    conn, a writer's connection, at gmsfs-load's speed and in this process (libgmsfs-load):
    slabs, every tensor copied in, an entry "torch/NAME" per tensor (gmsfs(5), "Tensors"),
    and the note "%gmsfs.source" naming the checkpoint's files.  Every header is checked
    before the store is touched.  True when loaded: the caller commits, or closes and
    nothing stays; with commit=True this commits and tells the daemon the bytes' content
    hash, hashed as they passed through host memory (gmsfs.content_hash says it; a caller
    that commits itself leaves it unknown until gmsfs.digest).  digest=False: the tensors
    copied as they lie, unhashed.  False when the store's last commit holds this checkpoint
    already (its note names the same files, sizes, times and inodes): nothing done,
    nothing to commit.  A store that holds another layout: GmsfsError EEXIST, unless
    replace (its allocations freed in the session first)."""
    lib = _lib.load_lib()
    flags = (1 if progress else 0) | (2 if verbose else 0) | (4 if replace else 0) | (8 if commit else 0) | \
        (0 if digest else 16)
    opt = _lib.sized(_lib.LoadOptions, flags=flags, slab_bytes=slab_bytes)
    e = lib.gmsfs_load(conn._handle(), str(path).encode(), ctypes.byref(opt))
    if e < 0:
        raise GmsfsError(-e, "load %s into %s: %s" % (path, conn.store, _lib.side_errmsg(lib, conn._handle())))
    return e == 0


SOURCE_NOTE = "%gmsfs.source"


def _checkpoint_files(path):
    """The files gmsfs_load reads for path: a folder's index's shards, or its
    model.safetensors, or the file itself."""
    path = os.fspath(path)
    if not os.path.isdir(path):
        return [path]
    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            return [os.path.join(path, n) for n in sorted(set(json.load(f)["weight_map"].values()))]
    return [os.path.join(path, "model.safetensors")]


def _hub_digest(p):
    """A file's SHA-256 where a Hugging Face hub cache names it (the file a link to
    blobs/HEX), else None: as gmsfs_load records it."""
    try:
        target = os.readlink(p)
    except OSError:
        return None
    folder, base = os.path.split(target)
    hexdigits = set("0123456789abcdef")
    if os.path.basename(folder) != "blobs" or len(base) != 64 or not set(base) <= hexdigits:
        return None
    return base


def source(path):
    """The files gmsfs_load records of path in the note "%gmsfs.source" (beside the
    generation its commit got): by name, each with its size, modification time (ns),
    inode, and its SHA-256 where a hub cache names it (its link's blob)."""
    files = []
    for p in _checkpoint_files(path):
        st = os.stat(p)
        f = {"name": os.path.basename(p), "size": st.st_size, "mtime_ns": st.st_mtime_ns, "ino": st.st_ino}
        if _hub_digest(p):
            f["sha256"] = _hub_digest(p)
        files.append(f)
    return sorted(files, key=lambda f: f["name"])


def source_differs(conn, path):
    """Why the layout conn holds is not path's checkpoint as gmsfs_load recorded it (its
    source note names other files, these files changed since, or the store was committed
    again since: a refit, a version flipped to), or None: the same, or a layout with no
    source note (published otherwise: nothing to judge by)."""
    try:
        noted = json.loads(conn.meta_get(SOURCE_NOTE).value)
    except KeyError:
        return None
    except ValueError as e:
        return "its note %s is not gmsfs-load's (%s)" % (SOURCE_NOTE, e)
    files = noted.get("files") if isinstance(noted, dict) else None
    if not isinstance(files, list) or not all(isinstance(f, dict) and isinstance(f.get("name"), str) for f in files):
        return "its note %s is not gmsfs-load's" % SOURCE_NOTE
    if noted.get("generation") != conn.generation:
        return "it was loaded as commit %s and committed again since (commit %d now)" % (noted.get("generation"),
                                                                                           conn.generation)
    now = source(path)
    if files == now:
        return None
    was = {f["name"]: f for f in files}
    for f in now:
        old = was.pop(f["name"], None)
        if old is None:
            return "%s is not among the files it was loaded from" % f["name"]
        for k in ("size", "mtime_ns", "ino", "sha256"):
            if old.get(k) != f.get(k):
                return "%s's %s was %s when it was loaded, is %s now" % (f["name"], k, old.get(k), f.get(k))
    return "it was loaded from files this checkpoint lacks: %s" % ", ".join(sorted(was))


def copy(src, dst, timeout=None):
    """Copy the committed store src into the empty store dst, on this machine's mounts (one
    GPU's, two GPUs', or the host backend's), in this process: src under a read lock
    (timeout: seconds to wait for it; None: as long as it takes), dst in one writer
    session; the bytes device to device (dst's GPU reads src's over NVLink or PCIe where it
    can reach it, else through pinned host memory), then the entries and the commit, which
    must give src's layout hash.  Returns how the bytes went.  On any failure dst is as it
    was and src untouched (GmsfsError with the reason: EEXIST when dst holds allocations)."""
    lib = _lib.load_lib()
    opt, out = _lib.sized(_lib.CopyOptions, timeout_ms=_ms(timeout)), _lib.sized(_lib.Report)
    e = lib.gmsfs_copy(str(src).encode(), str(dst).encode(), ctypes.byref(opt), ctypes.byref(out))
    if e:
        raise GmsfsError(-e, "copy %s to %s: %s" % (src, dst, _lib.side_errmsg(lib)))
    return out.how.decode()


def pull(url, store, token_file, timeout=30, progress=None, stripes=None):
    """Pull url (gmsfs://HOST:PORT/NAME, served by `gmsfs-peer serve` on another node) into
    store, an empty store of this machine's mounts, in this process (libgmsfs-peer): the
    layout and entries, the bytes (each allocation's xxh3 checked), then the commit, which
    must give the peer's layout hash.  token_file: the token both sides share, in a file
    only its owner reads.  timeout: seconds any wait may last with nothing moving.
    progress: a line on stderr as bytes land (None: where stderr is a terminal).
    stripes: the connections asked for, 1 to 16 (None: GMSFS_PEER_STRIPES, else 4); a host
    mount's bytes go through bounce buffers on 8 cores or more unless GMSFS_PEER_BOUNCE
    (0 or 1) says (gmsfs-peer(1)).  Returns what was done; on any failure (GmsfsError:
    EACCES the peer refused, EEXIST store holds allocations, EIO bytes not the peer's,
    ESTALE the peer's store committed again meanwhile, ETIMEDOUT, ECONNRESET) store is as
    it was."""
    if timeout is None or not 0 < timeout <= 86400:
        raise ValueError("pull: timeout is seconds, more than 0, at most a day (not %r)" % (timeout,))
    if stripes is not None and (type(stripes) is not int or not 1 <= stripes <= 16):
        raise ValueError("pull: stripes is the connections asked for, 1 to 16 (not %r)" % (stripes,))
    if progress is None:
        progress = sys.stderr.isatty()
    lib = _lib.peer_lib()
    opt = _lib.sized(_lib.PullOptions, flags=1 if progress else 0, token_file=str(token_file).encode(),
                     timeout_ms=int(timeout * 1000), stripes=stripes or 0)  # 1: GMSFS_PULL_PROGRESS
    out = _lib.sized(_lib.Report)
    e = lib.gmsfs_pull(str(url).encode(), str(store).encode(), ctypes.byref(opt), ctypes.byref(out))
    if e:
        raise GmsfsError(-e, "pull %s into %s: %s" % (url, store, _lib.side_errmsg(lib)))
    return out.how.decode()
