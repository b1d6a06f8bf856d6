"""libgmsfs through ctypes: where it is, its prototypes, its version.

Loaded at its first use, not at the package's import (lib is a stand-in until then;
path, version and version_string are read then too).  The library is looked for in this
order: $GMSFS_LIBRARY (a path), the wheel's own
(gmsfs/_native/, with the libmsgpackc it needs: python/wheel_backend.py), the source
tree's build/ (python/gmsfs lives beside it), then the system's libgmsfs.so.0.
"""
import ctypes
import os

# The library this package speaks to: the same major version, at least this minor.
NEED_MAJOR, NEED_MINOR = 0, 3

RO, RW, RW_OR_RO, RW_DATA = 1, 2, 3, 4
EINTR = 0x100  # GMSFS_EINTR: a signal ends a wait with -EINTR; the package retries (PEP 475)
OWN = 0x200  # GMSFS_OWN: a session of its own, as a GMS connection is
VERSION_NAME_MAX = 64  # GMSFS_VERSION_NAME_MAX
DIGEST_RECORD = 1  # GMSFS_DIGEST_RECORD: tell the daemon the content hash
KEEP_READ_ONLY = 0x200  # GMSFS_KEEP_READ_ONLY: resume as RW_DATA, the mappings left read-only
BACKEND_HOST, BACKEND_CUDA = 1, 2
ENTRY_PRIVATE = 1
ENTRY_NOTE = 2  # a note: the layout hash leaves it out


class Mapping(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("tag", ctypes.c_char_p), ("ptr", ctypes.c_void_p),
                ("size", ctypes.c_uint64), ("aligned", ctypes.c_uint64), ("writable", ctypes.c_int)]


class Entry(ctypes.Structure):
    _fields_ = [("key", ctypes.c_char_p), ("alloc", ctypes.c_char_p), ("offset", ctypes.c_uint64),
                ("size", ctypes.c_uint64), ("flags", ctypes.c_uint32), ("value", ctypes.c_char_p),
                ("value_len", ctypes.c_size_t)]  # value: bytes that may hold NULs (value_len says)


class New(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("size", ctypes.c_uint64), ("tag", ctypes.c_char_p),
                ("ptr", ctypes.c_void_p)]


class Meta(ctypes.Structure):
    _fields_ = [("alloc", ctypes.c_char_p), ("offset", ctypes.c_uint64), ("size", ctypes.c_uint64),
                ("flags", ctypes.c_uint32), ("value", ctypes.c_void_p), ("value_len", ctypes.c_size_t),
                ("ptr", ctypes.c_void_p)]


_NATIVE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_native")


def _candidates():
    env = os.environ.get("GMSFS_LIBRARY")
    if env:
        yield env
    if os.path.isdir(_NATIVE):
        # What libgmsfs needs, loaded first from beside it: the dynamic linker then takes
        # this copy for its DT_NEEDED by soname, and no LD_LIBRARY_PATH is asked for.
        for need in sorted(f for f in os.listdir(_NATIVE) if f.startswith("libmsgpack") and ".so" in f):
            ctypes.CDLL(os.path.join(_NATIVE, need))
        yield os.path.join(_NATIVE, "libgmsfs.so.0")
    here = os.path.dirname(os.path.abspath(__file__))
    yield os.path.join(here, "..", "..", "build", "libgmsfs.so.0")
    # Installed (the .deb's): the dynamic linker finds the soname itself.  find_library,
    # which runs ldconfig in a subprocess and imports what that takes (tens of
    # milliseconds of a fresh process), only where it does not.
    yield "libgmsfs.so.0"
    from ctypes.util import find_library  # (a plain import would make ctypes local here)
    found = find_library("gmsfs")
    if found and found != "libgmsfs.so.0":
        yield found


def _load():
    errors = []
    for path in _candidates():
        if os.sep in path and not os.path.exists(path):
            continue
        try:
            return ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL), path
        except OSError as e:
            errors.append("%s: %s" % (path, e))
    raise ImportError("gmsfs: libgmsfs.so.0 not found (set GMSFS_LIBRARY): " + "; ".join(errors))


def _path_of(lib, name):
    """The file the dynamic loader mapped for lib (PyTorch's allocator opens it by path)."""
    if os.sep in name:
        return os.path.realpath(name)
    with open("/proc/self/maps") as f:
        for line in f:
            if "libgmsfs.so" in line and "/" in line:
                return line[line.index("/"):].strip()
    return name


_P = ctypes.c_void_p
_protos = {
    "gmsfs_version": (ctypes.c_int, []),
    "gmsfs_version_string": (ctypes.c_char_p, []),
    "gmsfs_connect": (ctypes.c_int, [ctypes.POINTER(_P), ctypes.c_char_p, ctypes.c_int, ctypes.c_int]),
    "gmsfs_disconnect": (None, [_P]),
    "gmsfs_lock_mode": (ctypes.c_int, [_P]),
    "gmsfs_store_path": (ctypes.c_char_p, [_P]),
    "gmsfs_backend": (ctypes.c_int, [_P]),
    "gmsfs_total_bytes": (ctypes.c_uint64, [_P]),
    "gmsfs_layout_hash": (ctypes.c_int, [_P, ctypes.c_char_p]),
    "gmsfs_generation": (ctypes.c_uint64, [_P]),
    "gmsfs_errmsg": (ctypes.c_char_p, [_P]),
    "gmsfs_strerror": (ctypes.c_char_p, [ctypes.c_int]),
    "gmsfs_mappings": (ctypes.c_size_t, [_P, ctypes.POINTER(ctypes.POINTER(Mapping))]),
    "gmsfs_find": (ctypes.c_int, [_P, ctypes.c_char_p, ctypes.POINTER(Mapping)]),
    "gmsfs_find_ptr": (ctypes.c_int, [_P, _P, ctypes.POINTER(Mapping), ctypes.POINTER(ctypes.c_uint64)]),
    "gmsfs_create": (ctypes.c_int, [_P, ctypes.c_char_p, ctypes.c_uint64, ctypes.c_char_p, ctypes.POINTER(_P)]),
    "gmsfs_create_many": (ctypes.c_int, [_P, ctypes.POINTER(New), ctypes.c_size_t]),
    "gmsfs_free": (ctypes.c_int, [_P, _P]),
    "gmsfs_free_name": (ctypes.c_int, [_P, ctypes.c_char_p]),
    "gmsfs_meta_put_many": (ctypes.c_int, [_P, ctypes.POINTER(Entry), ctypes.c_size_t]),
    "gmsfs_meta_delete": (ctypes.c_int, [_P, ctypes.c_char_p]),
    "gmsfs_commit": (ctypes.c_int, [_P]),
    "gmsfs_import_all": (ctypes.c_int, [_P]),
    "gmsfs_digest": (ctypes.c_int, [_P, ctypes.c_uint, ctypes.c_char_p]),
    "gmsfs_content_hash": (ctypes.c_int, [_P, ctypes.c_char_p]),
    "gmsfs_import": (ctypes.c_int, [_P, ctypes.c_char_p, ctypes.POINTER(_P)]),
    "gmsfs_import_overwrite": (ctypes.c_int, [_P, ctypes.POINTER(ctypes.c_char_p), ctypes.c_size_t]),
    "gmsfs_unmap": (ctypes.c_int, [_P, ctypes.c_char_p]),
    "gmsfs_meta_get": (ctypes.c_int, [_P, ctypes.c_char_p, ctypes.POINTER(Meta)]),
    "gmsfs_meta_free": (None, [ctypes.POINTER(Meta)]),
    "gmsfs_meta_list": (ctypes.c_int, [_P, ctypes.c_char_p, ctypes.POINTER(ctypes.POINTER(ctypes.c_char_p)),
                                       ctypes.POINTER(ctypes.c_size_t)]),
    "gmsfs_list_free": (None, [ctypes.POINTER(ctypes.c_char_p), ctypes.c_size_t]),
    "gmsfs_meta_get_all": (ctypes.c_int, [_P, ctypes.c_char_p, ctypes.POINTER(ctypes.POINTER(ctypes.c_char_p)),
                                          ctypes.POINTER(ctypes.POINTER(Meta)), ctypes.POINTER(ctypes.c_size_t)]),
    "gmsfs_meta_free_all": (None, [ctypes.POINTER(ctypes.c_char_p), ctypes.POINTER(Meta), ctypes.c_size_t]),
    "gmsfs_unmap_all": (ctypes.c_int, [_P]),
    "gmsfs_commit_unmap_all": (ctypes.c_int, [_P]),
    "gmsfs_remap_all": (ctypes.c_int, [_P, ctypes.c_int]),
    "gmsfs_reallocate_all": (ctypes.c_int, [_P, ctypes.c_int]),
    "gmsfs_flip": (ctypes.c_int, [_P, ctypes.POINTER(ctypes.c_size_t)]),
    "gmsfs_commit_version": (ctypes.c_int, [_P, ctypes.c_char_p]),
    "gmsfs_commit_version_unmap_all": (ctypes.c_int, [_P, ctypes.c_char_p]),
    "gmsfs_commit_disconnect": (ctypes.c_int, [_P, ctypes.c_char_p]),
    "gmsfs_commit_soon": (ctypes.c_int, [_P]),
    "gmsfs_pages_old": (ctypes.c_int, [_P, _P, ctypes.c_size_t, ctypes.POINTER(ctypes.c_size_t)]),
    "gmsfs_version_name": (ctypes.c_int, [_P, ctypes.c_char_p]),
    "gmsfs_flip_to": (ctypes.c_int, [_P, ctypes.c_char_p, ctypes.POINTER(ctypes.c_size_t)]),
    "gmsfs_wait_version": (ctypes.c_int, [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int]),
    "gmsfs_pause": (ctypes.c_int, [_P]),
    "gmsfs_resume": (ctypes.c_int, [_P, ctypes.c_int, ctypes.c_int]),
    "gmsfs_paused": (ctypes.c_int, [_P]),
    "gmsfs_protect": (ctypes.c_int, [_P, ctypes.c_char_p, ctypes.c_int]),
    "gmsfs_space_new": (ctypes.c_int, [_P, ctypes.POINTER(_P)]),
    "gmsfs_space_map": (ctypes.c_int, [_P, ctypes.c_char_p, ctypes.POINTER(_P)]),
    "gmsfs_space_free": (ctypes.c_int, [_P]),
    "gmsfs_space_new_range": (ctypes.c_int, [_P, ctypes.c_uint64, ctypes.POINTER(_P)]),
    "gmsfs_pages_reserve": (ctypes.c_int, [_P, ctypes.c_uint64, ctypes.c_uint64, ctypes.POINTER(_P)]),
    "gmsfs_pages_base": (_P, [_P]),
    "gmsfs_pages_size": (ctypes.c_uint64, [_P]),
    "gmsfs_pages_count": (ctypes.c_uint64, [_P]),
    "gmsfs_pages_mapped": (ctypes.c_uint64, [_P]),
    "gmsfs_pages_map": (ctypes.c_int, [_P, ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t, ctypes.c_int]),
    "gmsfs_pages_unmap": (ctypes.c_int, [_P, ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t]),
    "gmsfs_pages_reclaim": (ctypes.c_int, [_P, ctypes.POINTER(ctypes.c_uint64)]),
    "gmsfs_pages_free": (ctypes.c_int, [_P]),
    "gmsfs_pages_keep": (ctypes.c_int, [_P, _P, ctypes.c_size_t]),
    "gmsfs_commit_layout": (ctypes.c_int, [_P]),
    "gmsfs_pages_adopt": (ctypes.c_int, [_P, ctypes.c_uint64, ctypes.c_uint64, ctypes.POINTER(_P),
                                         ctypes.POINTER(ctypes.c_uint64)]),
    "gmsfs_pages_record": (ctypes.c_int, [_P, ctypes.c_uint64, ctypes.POINTER(_P), ctypes.POINTER(ctypes.c_size_t)]),
    "gmsfs_pages_name": (ctypes.c_char_p, [_P]),
    "gmsfs_pages_tie": (ctypes.c_int, [_P, _P]),
    "gmsfs_pages_tied": (ctypes.c_int, [_P, _P]),
    "gmsfs_graph_use": (ctypes.c_int, [_P, ctypes.c_uint64, ctypes.c_uint64]),
    "gmsfs_graph_begin": (ctypes.c_int, []),
    "gmsfs_graph_alloc": (_P, [ctypes.c_ssize_t, ctypes.c_int, _P]),
    "gmsfs_graph_bytes": (ctypes.c_uint64, []),
    "gmsfs_torch_use": (ctypes.c_int, [_P, ctypes.c_uint64]),
    "gmsfs_torch_alloc": (_P, [ctypes.c_ssize_t, ctypes.c_int, _P]),
    "gmsfs_torch_free": (None, [_P, ctypes.c_ssize_t, ctypes.c_int, _P]),
    "gmsfs_torch_slabs": (ctypes.c_size_t, []),
    "gmsfs_torch_manifest": (ctypes.c_int, [_P, ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_size_t)]),
    "gmsfs_text_free": (None, [_P]),
}
_real = None


def _loaded():
    """The library, loaded, its prototypes set and its version checked, at the first call."""
    global _real, path, version, version_string
    if _real is None:
        real, name = _load()
        for fn, (res, args) in _protos.items():
            f = getattr(real, fn)
            f.restype = res
            f.argtypes = args
        path = _path_of(real, name)
        version = real.gmsfs_version()
        version_string = real.gmsfs_version_string().decode()
        if version // 10000 != NEED_MAJOR or (version // 100) % 100 < NEED_MINOR:
            raise ImportError("gmsfs: %s is libgmsfs %s; this package needs %d.%d or a later %d.x"
                              % (path, version_string, NEED_MAJOR, NEED_MINOR, NEED_MAJOR))
        _real = real
    return _real


class _Lib:
    """libgmsfs's functions as attributes, the library loaded at the first one asked (each
    kept on the instance after: no lookup through here again)."""

    def __getattr__(self, name):
        f = getattr(_loaded(), name)
        setattr(self, name, f)
        return f


lib = _Lib()


def __getattr__(name):
    """path, version, version_string: the library's, read as it loads."""
    if name in ("path", "version", "version_string"):
        _loaded()
        return globals()[name]
    raise AttributeError("module %r has no attribute %r" % (__name__, name))

_side_libs = {}


def _side_lib(soname, env, protos, why=""):
    """A library of the package's commands (libgmsfs-load, libgmsfs-peer), looked for as
    libgmsfs is ($env, the build tree, then beside libgmsfs and the system's), at its first
    use, its prototypes set."""
    lib = _side_libs.get(soname)
    if lib is None:
        _loaded()  # for path, beside which it may lie
        here = os.path.dirname(os.path.abspath(__file__))
        names = [os.environ.get(env), os.path.join(here, "..", "..", "build", soname),
                 os.path.join(os.path.dirname(path), soname), soname]
        errors = []
        for name in names:
            if not name or (os.sep in name and not os.path.exists(name)):
                continue
            try:
                lib = ctypes.CDLL(name)
                break
            except OSError as e:
                errors.append("%s: %s" % (name, e))
        else:
            raise ImportError("gmsfs: %s not found%s (set %s): %s" % (soname, why, env, "; ".join(errors)))
        for fn, (res, args) in protos.items():
            f = getattr(lib, fn)
            f.restype = res
            f.argtypes = args
        _side_libs[soname] = lib
    return lib


class LoadOptions(ctypes.Structure):
    """struct gmsfs_load_options (<gmsfs/load.h>)."""
    _fields_ = [("size", ctypes.c_uint32), ("flags", ctypes.c_uint32), ("slab_bytes", ctypes.c_uint64)]


class CopyOptions(ctypes.Structure):
    """struct gmsfs_copy_options."""
    _fields_ = [("size", ctypes.c_uint32), ("flags", ctypes.c_uint32), ("timeout_ms", ctypes.c_int32),
                ("reserved", ctypes.c_uint32)]


class PullOptions(ctypes.Structure):
    """struct gmsfs_pull_options (<gmsfs/peer.h>)."""
    _fields_ = [("size", ctypes.c_uint32), ("flags", ctypes.c_uint32), ("token_file", ctypes.c_char_p),
                ("timeout_ms", ctypes.c_int32), ("stripes", ctypes.c_uint32)]


class Report(ctypes.Structure):
    """struct gmsfs_report: what a copy or a pull did."""
    _fields_ = [("size", ctypes.c_uint32), ("reserved", ctypes.c_uint32), ("allocations", ctypes.c_uint64),
                ("bytes", ctypes.c_uint64), ("seconds", ctypes.c_double), ("bytes_seconds", ctypes.c_double),
                ("layout_hash", ctypes.c_char * 33), ("how", ctypes.c_char * 351)]


def sized(struct, **fields):
    """A struct of the side libraries with its size set, as the C initializers do."""
    return struct(size=ctypes.sizeof(struct), **fields)


def side_errmsg(lib, handle=None):
    """gmsfs_errmsg as the side library lib sees it (the libgmsfs it was bound to): handle's
    words, or the calling thread's for a call that takes no handle."""
    f = lib.gmsfs_errmsg
    f.restype, f.argtypes = ctypes.c_char_p, [_P]
    return (f(handle) or b"").decode(errors="replace")


def load_lib():
    """libgmsfs-load (gmsfs_load, gmsfs_copy)."""
    return _side_lib("libgmsfs-load.so.1", "GMSFS_LOAD_LIBRARY", {
        "gmsfs_load": (ctypes.c_int, [_P, ctypes.c_char_p, ctypes.POINTER(LoadOptions)]),
        "gmsfs_copy": (ctypes.c_int, [ctypes.c_char_p, ctypes.c_char_p, ctypes.POINTER(CopyOptions),
                                      ctypes.POINTER(Report)])})


def peer_lib():
    """libgmsfs-peer (gmsfs_pull): built and installed where UCX is (the gmsfs package)."""
    return _side_lib("libgmsfs-peer.so.1", "GMSFS_PEER_LIBRARY", {
        "gmsfs_pull": (ctypes.c_int, [ctypes.c_char_p, ctypes.c_char_p, ctypes.POINTER(PullOptions),
                                      ctypes.POINTER(Report)])},
        " (gmsfs-peer is built where UCX is: libucx-dev)")


