"""gmsfs: GPU memory stores shared between processes, from Python.

A thin layer over libgmsfs (ctypes, no compiled extension).  One Connection is one
lock on one store (a directory of a gmsfs mount):

    import gmsfs
    with gmsfs.connect("/run/gmsfs/GPU-.../llama", mode="ro", timeout=10) as c:
        c.import_all()                      # every allocation and entry, one round trip
        e = c.meta_get("torch/lm_head.weight")
        print(e.alloc, e.offset, e.size, e.ptr)

Errors raise GmsfsError (an OSError: errno, and the library's words in strerror);
a layout that changed under remap_all raises StaleLayoutError.  gmsfs.torch shares
PyTorch modules; Connection.array gives numpy views on the host backend.
"""
from ._connection import (Connection, Entry, Mapping, committed_version, connect, content_hash, digest, prefetch,
                          versions, wait_version)
from ._errors import GmsfsError, StaleLayoutError
from ._load import copy, load, pull
from ._ranges import PageAllocator, Pages, Space
from .group import Group

__all__ = ["connect", "prefetch", "digest", "content_hash", "committed_version", "versions", "wait_version", "Group", "Connection", "Mapping", "Entry", "Space", "Pages", "PageAllocator", "GmsfsError",
           "StaleLayoutError", "load", "copy", "pull", "version", "version_string", "library_path"]


def __getattr__(name):
    """version, version_string, library_path: libgmsfs's, which loads at its first use
    (the first connect, or one of these)."""
    from . import _lib
    if name in ("version", "version_string"):
        return getattr(_lib, name)
    if name == "library_path":
        return _lib.path
    raise AttributeError("module 'gmsfs' has no attribute %r" % name)
