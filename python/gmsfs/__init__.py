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
# Each name is its module's, imported at the name's first use (PEP 562): a command that
# needs only some (gmsfsctl reads files; gmsfs.Group's look at its ranks) starts without
# the library and ctypes, tens of milliseconds of a fresh process.
_FROM = {
    "_connection": ("Connection", "Entry", "Mapping", "connect", "digest", "wait_version"),
    "_store_files": ("committed_version", "content_hash", "prefetch", "versions"),
    "_errors": ("GmsfsError", "StaleLayoutError"),
    "_load": ("copy", "load", "pull"),
    "_ranges": ("PageAllocator", "Pages", "Space"),
    "group": ("Group",),
}
_WHERE = {name: module for module, names in _FROM.items() for name in names}

__all__ = ["connect", "prefetch", "digest", "content_hash", "committed_version", "versions", "wait_version", "Group", "Connection", "Mapping", "Entry", "Space", "Pages", "PageAllocator", "GmsfsError",
           "StaleLayoutError", "load", "copy", "pull", "version", "version_string", "library_path"]


def __getattr__(name):
    """A name of _FROM, from its module; version, version_string, library_path: libgmsfs's,
    which loads at its first use (the first connect, or one of these); a submodule."""
    if name in _WHERE:
        import importlib
        value = getattr(importlib.import_module("." + _WHERE[name], __name__), name)
        globals()[name] = value  # once: the next use is a plain attribute
        return value
    if name in ("version", "version_string", "library_path"):
        from . import _lib
        return _lib.path if name == "library_path" else getattr(_lib, name)
    if name.startswith("__"):
        raise AttributeError("module 'gmsfs' has no attribute %r" % name)
    # A submodule not imported yet (gmsfs._cuda, say, as when this file imported them all):
    # imported now ("from . import _lib" asks here first, too).
    import importlib
    try:
        return importlib.import_module("." + name, __name__)
    except ModuleNotFoundError as e:
        if e.name != __name__ + "." + name:
            raise
        raise AttributeError("module 'gmsfs' has no attribute %r" % name) from None


def __dir__():
    return sorted(set(globals()) | set(_WHERE) | {"version", "version_string", "library_path"})
