"""gmsfs.load: a safetensors checkpoint into a writer's store, in this process; gmsfs.copy: a
store into an empty one on another mount (another GPU's); gmsfs.pull: a store that another
node serves into an empty one here."""
import ctypes
import sys

from . import _lib
from ._errors import GmsfsError, _ms


def load(conn, path, slab_bytes=0, progress=False, verbose=False):
    """Load a safetensors checkpoint (a file, or a folder with its index and shards) into
    conn, a writer's connection to a store with no allocations, at gmsfs-load's speed and
    in this process (libgmsfs-load): slabs, every tensor copied in, an entry "torch/NAME"
    per tensor (gmsfs(5), "Tensors").  No commit: the caller commits, or closes and nothing
    stays.  Every header is checked before the store is touched."""
    lib = _lib.load_lib()
    opt = _lib.sized(_lib.LoadOptions, flags=(1 if progress else 0) | (2 if verbose else 0), slab_bytes=slab_bytes)
    e = lib.gmsfs_load(conn._handle(), str(path).encode(), ctypes.byref(opt))
    if e:
        raise GmsfsError(-e, "load %s into %s: %s" % (path, conn.store, _lib.side_errmsg(lib, conn._handle())))


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
