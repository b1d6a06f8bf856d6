"""gmsfs.load: a safetensors checkpoint into a writer's store, in this process."""
import ctypes

from . import _lib
from ._errors import GmsfsError


def load(conn, path, slab_bytes=0, progress=False, verbose=False):
    """Load a safetensors checkpoint (a file, or a folder with its index and shards) into
    conn, a writer's connection to a store with no allocations, at gmsfs-load's speed and
    in this process (libgmsfs-load): slabs, every tensor copied in, an entry "torch/NAME"
    per tensor (gmsfs(5), "Tensors").  No commit: the caller commits, or closes and nothing
    stays.  Every header is checked before the store is touched."""
    err = ctypes.create_string_buffer(1024)
    flags = (1 if progress else 0) | (2 if verbose else 0)
    e = _lib.load_lib().gmsfs_load(conn._handle(), str(path).encode(), slab_bytes, flags, err, len(err))
    if e:
        raise GmsfsError(-e, "load %s into %s: %s" % (path, conn.store, err.value.decode(errors="replace")))
