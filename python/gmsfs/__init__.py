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
import ctypes
import errno as _errno
import json as _json
import os as _os
import time as _time
from collections import namedtuple

from . import _cuda, _lib
from ._lib import lib as _c

__all__ = ["connect", "Connection", "Mapping", "Entry", "Space", "GmsfsError", "StaleLayoutError", "load", "version",
           "version_string", "library_path"]

version = _lib.version
version_string = _lib.version_string
library_path = _lib.path

Mapping = namedtuple("Mapping", "name tag ptr size aligned writable")
Mapping.__doc__ = "An allocation mapped in this process: ptr stays valid until it is freed or the connection closes."
Entry = namedtuple("Entry", "key alloc offset size private value ptr")
Entry.__doc__ = ("A metadata entry: the extent [offset, offset+size) of allocation alloc, its value (bytes), "
                 "and ptr, where the extent is in this process (a copy of its own if private; None if unmapped).")

_MODES = {"ro": _lib.RO, "rw": _lib.RW, "auto": _lib.RW_OR_RO}
_NAMES = {_lib.RO: "ro", _lib.RW: "rw"}


class GmsfsError(OSError):
    """A libgmsfs call failed: errno is the error code, strerror the library's message."""


class StaleLayoutError(GmsfsError):
    """remap_all: the committed layout's structure changed while the connection slept."""


def _raise(e, what, g=None):
    e = -e
    msg = _c.gmsfs_errmsg(g).decode(errors="replace") if g else _c.gmsfs_strerror(-e).decode()
    cls = StaleLayoutError if e == _errno.ESTALE else GmsfsError
    raise cls(e, "%s: %s" % (what, msg or _c.gmsfs_strerror(-e).decode()))


def _ms(timeout):
    if timeout is None:
        return -1
    if timeout < 0:
        raise ValueError("timeout: seconds >= 0, or None to wait as long as it takes")
    return int(timeout * 1000)


def _waiting(timeout_ms, call, what):
    """call(ms) until it is not interrupted, as Python retries a system call since PEP 475:
    a signal ends libgmsfs's wait (GMSFS_EINTR), the interpreter runs its handlers when
    call returns (one that raises ends the wait with its exception), and the wait goes on
    with what is left of the timeout.  call's last result; a wait that ran out after a
    signal raises ETIMEDOUT naming the whole timeout and what waited."""
    deadline = None if timeout_ms <= 0 else _time.monotonic() + timeout_ms / 1000
    ms = timeout_ms
    while True:
        e = call(ms)
        if e == -_errno.ETIMEDOUT and ms != timeout_ms:
            raise GmsfsError(_errno.ETIMEDOUT, "%s: lock not granted within %d ms" % (what, timeout_ms))
        if e != -_errno.EINTR:
            return e
        if deadline is not None:
            # Past the deadline: done, as libgmsfs's own retry is (signals every
            # millisecond would otherwise end every 1 ms try and the loop never).
            left = deadline - _time.monotonic()
            if left <= 0:
                raise GmsfsError(_errno.ETIMEDOUT, "%s: lock not granted within %d ms" % (what, timeout_ms))
            ms = max(1, int(left * 1000))


def connect(store, mode="ro", timeout=None):
    """Connect to store (a directory of a gmsfs mount) and take its lock.

    mode: "ro" (a reader: waits for a committed layout and for the writer), "rw" (the
    writer; it starts from the last committed layout) or "auto" (rw where nothing is
    committed, else ro, as GMS's RW_OR_RO).  timeout: seconds to wait for the lock,
    0 for one try (EAGAIN), None for as long as it takes."""
    if mode not in _MODES:
        raise ValueError("mode: 'ro', 'rw' or 'auto', not %r" % (mode,))
    return Connection(store, _MODES[mode], _ms(timeout))


def prefetch(store):
    """Ask for a store on the host tier to come back to the device, without waiting (an
    adapter needed soon).  Nothing to do for a store on the device."""
    with open(_os.path.join(store, "prefetch"), "w") as f:
        f.write("\n")


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


def _entry(key, alloc, offset, value, size, private):
    """An entry for gmsfs_meta_put_many; a str value is UTF-8."""
    if type(value) is not bytes:
        value = value.encode() if isinstance(value, str) else bytes(value)
    return _lib.Entry(key.encode(), alloc.encode(), offset, size, _lib.ENTRY_PRIVATE if private else 0, value,
                      len(value))


class Connection:
    """One lock on one store.  A context manager: leaving it disconnects (a writer that
    did not commit is rolled back).  Use it from one thread at a time."""

    def __init__(self, store, mode, timeout_ms):
        self.store = str(store)
        self._g = ctypes.c_void_p()
        path = self.store.encode()
        _cuda.make_current(self.store)  # libgmsfs maps in the thread's context: the GPU's, if none

        def attempt(ms):
            if self._g:
                _c.gmsfs_disconnect(self._g)  # an interrupted try's handle
                self._g = ctypes.c_void_p()
            return _c.gmsfs_connect(ctypes.byref(self._g), path, mode | _lib.EINTR, ms)

        try:
            e = _waiting(timeout_ms, attempt, "connect %s" % self.store)
        except GmsfsError:
            _c.gmsfs_disconnect(self._g)
            self._g = ctypes.c_void_p()
            raise
        if e:
            g = self._g
            self._g = ctypes.c_void_p()
            try:
                _raise(e, "connect %s" % self.store, g)
            finally:
                _c.gmsfs_disconnect(g)

    # ---- the connection ----
    def close(self):
        """Unmap everything, give the lock back."""
        if self._g:
            _c.gmsfs_disconnect(self._g)
            self._g = ctypes.c_void_p()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        self.close()

    # One lock held by this process: a copy of what holds the connection (a model that
    # materialize bound, copy.deepcopy(model)) shares it; it does not travel to another.
    def __copy__(self):
        return self

    def __deepcopy__(self, memo):
        return self

    def __reduce__(self):
        raise TypeError("a gmsfs connection is a lock this process holds on %s and cannot be pickled: "
                        "connect in the other process" % self.store)

    def _handle(self):
        if not self._g:
            raise GmsfsError(_errno.EBADF, "the connection is closed")
        return self._g

    def _check(self, e, what):
        if e:
            _raise(e, what, self._g)

    @property
    def lock_mode(self):
        """"ro", "rw", or None while unmapped (between unmap_all and remap_all)."""
        return _NAMES.get(_c.gmsfs_lock_mode(self._handle()))

    @property
    def backend(self):
        """"cuda" (pointers are device pointers) or "host"."""
        return {_lib.BACKEND_HOST: "host", _lib.BACKEND_CUDA: "cuda"}.get(_c.gmsfs_backend(self._handle()))

    @property
    def layout_hash(self):
        """The committed layout's hash, 32 hex digits; "" when nothing is committed."""
        buf = ctypes.create_string_buffer(33)
        self._check(_c.gmsfs_layout_hash(self._handle(), buf), "layout_hash")
        return buf.value.decode()

    @property
    def generation(self):
        """The store's commits so far as this connection last learned them (when its lock
        was granted, at its commit, at layout_hash): 0 when nothing was committed then.
        No round trip."""
        return _c.gmsfs_generation(self._handle())

    @property
    def total_bytes(self):
        return _c.gmsfs_total_bytes(self._handle())

    # ---- mappings ----
    @staticmethod
    def _mapping(m):
        return Mapping(m.name.decode(), m.tag.decode(), m.ptr, m.size, m.aligned, bool(m.writable))

    @property
    def mappings(self):
        """This connection's mappings, in creation or import order."""
        p = ctypes.POINTER(_lib.Mapping)()
        n = _c.gmsfs_mappings(self._handle(), ctypes.byref(p))
        return [self._mapping(p[i]) for i in range(n)]

    def find(self, name):
        m = _lib.Mapping()
        e = _c.gmsfs_find(self._handle(), name.encode(), ctypes.byref(m))
        if e == -_errno.ENOENT:
            raise KeyError(name)
        self._check(e, "find %s" % name)
        return self._mapping(m)

    def find_ptr(self, ptr):
        """(Mapping, offset) of the mapping that holds address ptr, or None."""
        m, off = _lib.Mapping(), ctypes.c_uint64()
        if _c.gmsfs_find_ptr(self._handle(), ctypes.c_void_p(ptr), ctypes.byref(m), ctypes.byref(off)):
            return None
        return self._mapping(m), off.value

    def create(self, name, size, tag=None):
        """A new allocation allocs/NAME of size bytes, mapped read-write (a writer's)."""
        p = ctypes.c_void_p()
        self._check(_c.gmsfs_create(self._handle(), name.encode(), size, tag.encode() if tag else None,
                                    ctypes.byref(p)), "create %s" % name)
        return self.find(name)

    def create_many(self, allocs):
        """New allocations in one request, all or nothing: each a (name, size) or (name, size, tag)
        tuple or a dict with those keys.  Returns their Mappings, in order."""
        rows = []
        for x in allocs:
            if isinstance(x, dict):
                x = (x["name"], x["size"], x.get("tag"))
            name, size, tag = tuple(x) + (None,) * (3 - len(x))
            rows.append((name.encode(), size, tag.encode() if tag else None))
        arr = (_lib.New * len(rows))(*[_lib.New(n, s, t, None) for n, s, t in rows])
        self._check(_c.gmsfs_create_many(self._handle(), arr, len(rows)),
                    "create_many (%d allocations)" % len(rows))
        return [self.find(n.decode()) for n, _, _ in rows]

    def free(self, what):
        """Unmap and delete an allocation (a Mapping, its name or its pointer) and the entries naming it.
        By name it need not be mapped: a writer that replaces committed allocations without
        importing them never holds them writable, and its crash leaves the last commit whole."""
        if isinstance(what, str):
            return self._check(_c.gmsfs_free_name(self._handle(), what.encode()), "free %s" % what)
        ptr = what.ptr if isinstance(what, Mapping) else what
        self._check(_c.gmsfs_free(self._handle(), ctypes.c_void_p(ptr)), "free")

    def import_all(self):
        """Map every allocation of the layout and load its metadata (one round trip)."""
        self._import_all()
        return self.mappings

    def _import_all(self):
        """import_all without the list of mappings (a Mapping each: tens of us for a model)."""
        self._check(_c.gmsfs_import_all(self._handle()), "import_all")

    def import_one(self, name):
        p = ctypes.c_void_p()
        self._check(_c.gmsfs_import(self._handle(), name.encode(), ctypes.byref(p)), "import %s" % name)
        return self.find(name)

    # ---- metadata ----
    def meta_put(self, key, alloc, offset=0, value=b"", size=0, private=False):
        """One entry, meta_put_many's fields: a GMS-style writer puts one per tensor, so
        this is meta_put_many's work without its lists."""
        self._check(_c.gmsfs_meta_put_many(self._handle(), _entry(key, alloc, offset, value, size, private), 1),
                    "meta_put")

    def meta_put_many(self, entries):
        """Put entries in one round trip, all or nothing.  Each is a dict (key, alloc, offset=0,
        value=b"", size=0, private=False) or a tuple in that order; a str value is UTF-8."""
        rows = []  # each Entry keeps its bytes alive (ctypes' c_char_p fields hold them)
        defaults = (None, None, 0, b"", 0, False)
        for x in entries:
            if isinstance(x, dict):
                x = (x["key"], x["alloc"], x.get("offset", 0), x.get("value", b""), x.get("size", 0),
                     x.get("private", False))
            key, alloc, offset, value, size, private = tuple(x) + defaults[len(x):]
            rows.append(_entry(key, alloc, offset, value, size, private))
        arr = (_lib.Entry * len(rows))(*rows)
        self._check(_c.gmsfs_meta_put_many(self._handle(), arr, len(rows)), "meta_put")

    def meta_get(self, key):
        m = _lib.Meta()
        e = _c.gmsfs_meta_get(self._handle(), key.encode(), ctypes.byref(m))
        if e == -_errno.ENOENT:
            raise KeyError(key)
        self._check(e, "meta_get %s" % key)
        try:
            value = ctypes.string_at(m.value, m.value_len) if m.value_len else b""
            return Entry(key, m.alloc.decode() if m.alloc else None, m.offset, m.size,
                         bool(m.flags & _lib.ENTRY_PRIVATE), value, m.ptr)
        finally:
            _c.gmsfs_meta_free(ctypes.byref(m))

    def meta_list(self, prefix=""):
        """Keys that start with prefix, sorted."""
        keys, n = ctypes.POINTER(ctypes.c_char_p)(), ctypes.c_size_t()
        self._check(_c.gmsfs_meta_list(self._handle(), prefix.encode(), ctypes.byref(keys), ctypes.byref(n)),
                    "meta_list")
        try:
            return [keys[i].decode() for i in range(n.value)]
        finally:
            _c.gmsfs_list_free(keys, n.value)

    def meta_items(self, prefix=""):
        """Every entry whose key starts with prefix, sorted by key, in one library call."""
        keys, v, n = ctypes.POINTER(ctypes.c_char_p)(), ctypes.POINTER(_lib.Meta)(), ctypes.c_size_t()
        self._check(_c.gmsfs_meta_get_all(self._handle(), prefix.encode(), ctypes.byref(keys), ctypes.byref(v),
                                          ctypes.byref(n)), "meta_items")
        try:
            out = []
            for i in range(n.value):
                m = v[i]
                alloc, vlen = m.alloc, m.value_len
                out.append(Entry(keys[i].decode(), alloc.decode() if alloc else None, m.offset, m.size,
                                 bool(m.flags & _lib.ENTRY_PRIVATE),
                                 ctypes.string_at(m.value, vlen) if vlen else b"", m.ptr))
            return out
        finally:
            _c.gmsfs_meta_free_all(keys, v, n.value)

    def meta_delete(self, key):
        self._check(_c.gmsfs_meta_delete(self._handle(), key.encode()), "meta_delete %s" % key)

    def meta_json(self, key):
        """An entry whose value is JSON, decoded."""
        return _json.loads(self.meta_get(key).value)

    # ---- publishing, sleeping ----
    def commit(self, unmap=False):
        """Validate and publish; the mappings become read-only, the lock a read lock.
        unmap=True: then unmap_all at once, the mappings not made read-only in between
        (GMS's commit, which unmaps its writer; half the CUDA calls of the two)."""
        if unmap:
            self._check(_c.gmsfs_commit_unmap_all(self._handle()), "commit")
        else:
            self._check(_c.gmsfs_commit(self._handle()), "commit")

    def unmap_all(self):
        """Unmap everything, keep every address reserved, give the lock back."""
        self._check(_c.gmsfs_unmap_all(self._handle()), "unmap_all")

    def remap_all(self, timeout=None):
        """Lock again and map the same layout at the same addresses (StaleLayoutError if it changed)."""
        g = self._handle()
        self._check(_waiting(_ms(timeout), lambda ms: _c.gmsfs_remap_all(g, ms), "remap_all"), "remap_all")

    def reallocate_all(self, timeout=None):
        """A writer: fresh memory behind the same addresses, to fill and commit."""
        g = self._handle()
        self._check(_waiting(_ms(timeout), lambda ms: _c.gmsfs_reallocate_all(g, ms), "reallocate_all"),
                    "reallocate_all")

    def space(self, span=None):
        """A new virtual space: this connection's allocations at addresses of their own
        (Space.map), the same memory.  span: one range of span bytes, where mappings lie
        side by side in the order they are mapped.  Freed by Space.free, or with the
        connection."""
        return Space(self, span)

    # ---- views on the host backend ----
    def buffer(self, ptr, nbytes, writable=False):
        """A ctypes array over nbytes at ptr (host backend): what numpy and torch.frombuffer take."""
        if self.backend != "host":
            raise GmsfsError(_errno.EINVAL, "buffer: the store is on a GPU: its pointers are device pointers")
        return (ctypes.c_uint8 * nbytes).from_address(ptr)

    def array(self, what, dtype="uint8", shape=None, offset=0):
        """A numpy array over an allocation (a name or Mapping) or an Entry's extent, without a copy
        (host backend).  Read-only unless the mapping is writable."""
        import numpy as np
        if isinstance(what, Entry):
            ptr, nbytes, writable = what.ptr, what.size, what.private
        else:
            m = what if isinstance(what, Mapping) else self.find(what)
            ptr, nbytes, writable = m.ptr + offset, m.size - offset, m.writable
        if ptr is None:
            raise GmsfsError(_errno.ENOENT, "array: not mapped (import first)")
        dtype = np.dtype(dtype)
        count = (nbytes // dtype.itemsize) if shape is None else int(np.prod(shape))
        a = np.frombuffer(self.buffer(ptr, nbytes), dtype=dtype, count=count)
        if shape is not None:
            a = a.reshape(shape)
        a.flags.writeable = bool(writable)
        return a


class _Range:
    """What Space and Pages share: address space of a connection, freed once (free(), or
    leaving a with block; EINVAL a second time), gone with the connection."""

    _free_name = ""  # the libgmsfs call that frees it ("gmsfs_space_free": errors say "space free")

    def __init__(self, conn):
        self._conn, self._r, self.freed = conn, ctypes.c_void_p(), False

    def _range(self):
        self._conn._handle()  # EBADF once the connection is closed: its ranges went with it
        return self._r

    def free(self):
        """Unmap everything the range maps and give its memory and addresses back."""
        self._conn._check(getattr(_c, self._free_name)(self._range()), self._free_name[6:].replace("_", " "))
        self.freed = True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if not self.freed and self._conn._g:
            self.free()


class Space(_Range):
    """Address ranges of their own over a connection's allocations (gmsfs_space_*): map(name)
    gives the allocation's memory at a new address, with the connection's access; writes
    through either address are seen at the other.  unmap_all and remap_all keep the
    addresses.  A context manager: leaving it frees the space."""

    _free_name = "gmsfs_space_free"

    def __init__(self, conn, span=None):
        super().__init__(conn)
        if span:
            conn._check(_c.gmsfs_space_new_range(conn._handle(), span, ctypes.byref(self._r)), "space")
        else:
            conn._check(_c.gmsfs_space_new(conn._handle(), ctypes.byref(self._r)), "space")

    def map(self, name):
        """The address of allocation name (imported by the connection) in this space; the
        same address each time."""
        ptr = ctypes.c_void_p()
        self._conn._check(_c.gmsfs_space_map(self._range(), name.encode(), ctypes.byref(ptr)), "space map")
        return ptr.value


class Pages(_Range):
    """A KV cache's memory that grows and shrinks with its load (gmsfs_pages_*, libgmsfs(3)
    PAGES): span bytes of address space set aside at once, filled page by page with device
    memory from the GPU's budget (each page read-write at base + index * page_size) and
    emptied again.  The connection must hold the writer session (mode "rw"); its store's
    user.gms.quota, user.gms.min and user.gms.priority say how far it may grow, what is kept
    for it, and who gives pages back when the budget is short.  Pages within the minimum
    are made at once and stay in this process when unmapped, to map again with no request.
    A context manager: leaving it frees the range."""

    _free_name = "gmsfs_pages_free"

    def __init__(self, conn, span, page_size=0):
        super().__init__(conn)
        conn._check(_c.gmsfs_pages_reserve(conn._handle(), span, page_size, ctypes.byref(self._r)), "pages reserve")
        self.base = _c.gmsfs_pages_base(self._r)
        self.page_size = _c.gmsfs_pages_size(self._r)
        self.count = _c.gmsfs_pages_count(self._r)

    @staticmethod
    def _array(idx):
        idx = list(idx)
        return (ctypes.c_uint64 * max(len(idx), 1))(*idx), len(idx)

    def map(self, idx, timeout_ms=0):
        """Map the pages idx (an iterable of indices) in one request, all or nothing; where
        the budget is short, wait up to timeout_ms for lower-priority stores to give back."""
        arr, n = self._array(idx)
        self._conn._check(_c.gmsfs_pages_map(self._range(), arr, n, int(timeout_ms)), "pages map (%d)" % n)

    def unmap(self, idx):
        """Unmap the pages idx (after the GPU work this thread's context queued: a kernel
        still writing a page would fault); those within the store's minimum stay held here,
        the rest go back to the daemon in one request."""
        arr, n = self._array(idx)
        self._conn._check(_c.gmsfs_pages_unmap(self._range(), arr, n), "pages unmap (%d)" % n)

    @property
    def mapped(self):
        """Pages mapped now."""
        return _c.gmsfs_pages_mapped(self._range())

    def reclaim(self):
        """Bytes the daemon asks this store to give back now (0: none); held pages past a
        lowered minimum go back as it reads it."""
        n = ctypes.c_uint64()
        self._conn._check(_c.gmsfs_pages_reclaim(self._range(), ctypes.byref(n)), "pages reclaim")
        return n.value

    def ptr(self, index):
        """The address of page index."""
        if not 0 <= index < self.count:
            raise IndexError(index)
        return self.base + index * self.page_size



class PageAllocator:
    """Blocks of a KV cache over Pages, for an engine's block manager: alloc(n) gives n free
    block numbers, mapping the pages they fall in first; free(blocks) gives blocks back and
    unmaps pages that hold no block any more (shrink=True) or keeps them for the next alloc.
    give_back() unmaps free pages until the daemon's reclaim is met, for an engine to call
    from its loop."""

    def __init__(self, pages, block_bytes, timeout_ms=1000):
        if block_bytes <= 0 or pages.page_size % block_bytes:
            raise ValueError("block_bytes must divide the page size (%d)" % pages.page_size)
        self.pages, self.timeout_ms = pages, timeout_ms
        self.per_page = pages.page_size // block_bytes
        self.used = [0] * pages.count          # blocks in use, per page
        self.mapped = [False] * pages.count
        self.free_blocks = []                  # free blocks of mapped pages
        self.in_use = set()

    def alloc(self, n):
        """n block numbers; OSError(ENOSPC) when no page can be had (nothing changes then)."""
        need = max(0, n - len(self.free_blocks))
        pages = []
        if need:
            empty = [i for i, m in enumerate(self.mapped) if not m]
            want = -(-need // self.per_page)
            if want > len(empty):
                raise GmsfsError(_errno.ENOSPC, "pages: the range is full (%d pages)" % self.pages.count)
            pages = empty[:want]
            self.pages.map(pages, self.timeout_ms)
            for p in pages:
                self.mapped[p] = True
                self.free_blocks.extend(range(p * self.per_page, (p + 1) * self.per_page))
        got = [self.free_blocks.pop() for _ in range(n)]
        for b in got:
            self.used[b // self.per_page] += 1
            self.in_use.add(b)
        return got

    def free(self, blocks, shrink=True):
        emptied = []
        for b in blocks:
            self.in_use.remove(b)
            p = b // self.per_page
            self.used[p] -= 1
            self.free_blocks.append(b)
            if not self.used[p]:
                emptied.append(p)
        if shrink and emptied:
            self._unmap(emptied)

    def _unmap(self, pages):
        gone = set()
        for p in pages:
            gone.update(range(p * self.per_page, (p + 1) * self.per_page))
            self.mapped[p] = False
        self.free_blocks = [b for b in self.free_blocks if b not in gone]
        self.pages.unmap(pages)

    def give_back(self):
        """Unmap pages that hold no block, as many as the daemon asks for; returns the bytes
        given.  Pages in use stay: their blocks are the engine's to evict first."""
        want = self.pages.reclaim()
        idle = [p for p, m in enumerate(self.mapped) if m and not self.used[p]]
        take = idle[:-(-want // self.pages.page_size)] if want else []
        if take:
            self._unmap(take)
        return len(take) * self.pages.page_size

