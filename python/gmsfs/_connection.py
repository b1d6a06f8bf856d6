"""Connection: one lock on one store, and what it maps and reads (gmsfs.connect)."""
import ctypes
import errno as _errno
import json as _json
from collections import namedtuple

from . import _cuda, _lib
from ._errors import GmsfsError, _raise, _ms, _waiting
from ._lib import lib as _c
from ._ranges import Space

Mapping = namedtuple("Mapping", "name tag ptr size aligned writable")
Mapping.__doc__ = "An allocation mapped in this process: ptr stays valid until it is freed or the connection closes."
Entry = namedtuple("Entry", "key alloc offset size private value ptr")
Entry.__doc__ = ("A metadata entry: the extent [offset, offset+size) of allocation alloc, its value (bytes), "
                 "and ptr, where the extent is in this process (a copy of its own if private; None if unmapped).")

_MODES = {"ro": _lib.RO, "rw": _lib.RW, "auto": _lib.RW_OR_RO, "data": _lib.RW_DATA}
_NAMES = {_lib.RO: "ro", _lib.RW: "rw"}


def connect(store, mode="ro", timeout=None, own=False, expect=None, version=None):
    """Connect to store (a directory of a gmsfs mount) and take its lock.

    mode: "ro" (a reader: waits for a committed layout and for the writer), "rw" (the
    writer; it starts from the last committed layout), "auto" (rw where nothing is
    committed, else ro, as GMS's RW_OR_RO) or "data" (a writer of the committed
    allocations' bytes only, as GMS's RW_DATA: making, freeing or sizing allocations and
    putting or deleting entries fail with EPERM; it waits for a first commit; the
    connection's mode then reads "rw").  timeout: seconds to wait for the lock, 0 for
    one try (EAGAIN), None for as long as it takes.  own: the connection is a session
    of its own, as a GMS connection is (gmsfs(5), "Sessions of their own"): a thread
    that asks for "rw" while another thread of this process reads waits for that read
    (a waiting writer) instead of EDEADLK, and never joins this process's writer.
    expect: a reader's: the content hash (gmsfs(5), CONTENT HASH) the store's committed
    bytes must have, 32 hex digits; the daemon's word when it knows it, else computed
    under this lock (every byte read once); another is GmsfsError EIO, the lock given
    back: an engine is never served bytes it did not ask for.  version: a reader's: the
    name of the commit it must hold (gmsfs(5), NAMED VERSIONS), waited for first (timeout
    seconds, the same limit); a store committed past it is GmsfsError ESTALE, the lock
    given back."""
    if mode not in _MODES:
        raise ValueError("mode: 'ro', 'rw', 'auto' or 'data', not %r" % (mode,))
    if expect is not None and (mode != "ro" or not isinstance(expect, str) or len(expect) != 32 or
                               expect.strip("0123456789abcdef")):
        raise ValueError("expect: a reader's (mode 'ro'), 32 lowercase hex digits, not %r" % (expect,))
    if version is not None:
        if mode != "ro":
            raise ValueError("version: a reader's (mode 'ro')")
        wait_version(store, version, timeout)
    c = Connection(store, _MODES[mode] | (_lib.OWN if own else 0), _ms(timeout))
    if version is not None and c.version != version:
        got = c.version
        c.close()
        raise GmsfsError(_errno.ESTALE, "%s: committed past version %s meanwhile (it holds %s)" % (
            store, version, got or "a commit with no name"))
    if expect is not None:
        try:  # the daemon's word, if it is of the commit this lock holds (a reader on the
            # version before, beside a data-only writer's commit, holds another)
            word = ctypes.create_string_buffer(33)
            known = word.value.decode() if _c.gmsfs_content_hash(c._handle(), word) == 0 else None
            got = known if known is not None else c.digest()
        except BaseException:
            c.close()
            raise
        if got != expect:
            c.close()
            raise GmsfsError(_errno.EIO, "%s: its bytes' content hash is %s, not the %s asked for%s" % (
                store, got, expect, "" if known is not None else " (computed: the daemon knew none)"))
    return c


def digest(store, record=True, timeout=None):
    """The content hash of store's committed bytes (gmsfs(5), CONTENT HASH), computed under
    a read lock (timeout: seconds to wait for it) and, with record, told to the daemon
    (write permission on the store needed: GmsfsError EACCES otherwise), so that
    STORE/content_hash says it until the store changes."""
    with connect(store, "ro", timeout) as c:
        return c.digest(record)


def wait_version(store, name, timeout=None):
    """Wait, holding no lock, until store's last commit is the one named name (gmsfs(5),
    NAMED VERSIONS): timeout seconds, 0 for one look, None for as long as it takes.
    GmsfsError ETIMEDOUT, or ESTALE when the store has committed past it."""
    if not isinstance(name, str):
        raise TypeError("wait_version: a name is a str, not %s" % type(name).__name__)
    e = _c.gmsfs_wait_version(str(store).encode(), name.encode(), -1 if timeout is None else _ms(timeout))
    if e in (-_errno.ESTALE, -_errno.ETIMEDOUT):
        raise GmsfsError(-e, "wait_version %s: %s" % (store, "committed past version %s" % name if e == -_errno.ESTALE
                                                      else "no version %s committed within %ss" % (name, timeout)))
    if e:
        _raise(e, "wait_version %s %s" % (store, name))


def _entry(key, alloc, offset, value, size, private, note=False):
    """An entry for gmsfs_meta_put_many; a str value is UTF-8."""
    if type(value) is not bytes:
        value = value.encode() if isinstance(value, str) else bytes(value)
    flags = (_lib.ENTRY_PRIVATE if private else 0) | (_lib.ENTRY_NOTE if note else 0)
    return _lib.Entry(key.encode(), alloc.encode(), offset, size, flags, value, len(value))


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

    def digest(self, record=False):
        """A reader's: the content hash of the committed layout it holds (gmsfs(5), CONTENT
        HASH), 32 hex digits: every allocation imported and read.  record: tell the daemon
        (write permission on the store needed), so that STORE/content_hash says it."""
        buf = ctypes.create_string_buffer(33)
        self._check(_c.gmsfs_digest(self._handle(), _lib.DIGEST_RECORD if record else 0, buf), "digest")
        return buf.value.decode()

    def import_all(self):
        """Map every allocation of the layout and load its metadata (one round trip)."""
        self._import_all()
        return self.mappings

    def _import_all(self):
        """import_all without the list of mappings (a Mapping each: tens of us for a model)."""
        self._check(_c.gmsfs_import_all(self._handle()), "import_all")

    def import_overwrite(self, names=None):
        """A writer's import of allocations it will write whole (names: a list; None: every
        one), mapped read-write.  Beside readers (a store with versions) their next version's
        memory is made without a copy of the last commit's bytes: until written it holds
        what a new allocation holds.  One mapped already stays as it is."""
        if names is None:
            arr, n = None, 0
        else:
            names = list(names)
            arr, n = (ctypes.c_char_p * len(names))(*[x.encode() for x in names]), len(names)
        self._check(_c.gmsfs_import_overwrite(self._handle(), arr, n),
                    "import_overwrite %s" % ("(every allocation)" if names is None else ", ".join(names)))

    def import_one(self, name):
        p = ctypes.c_void_p()
        self._check(_c.gmsfs_import(self._handle(), name.encode(), ctypes.byref(p)), "import %s" % name)
        return self.find(name)

    def unmap(self, name):
        """Let the handle's mapping of one allocation go (libgmsfs(3), gmsfs_unmap): a writer
        done with it, whose writes to it have landed (the caller waits: an unmap under a
        running copy faults).  The allocation and its bytes stay; import_one maps it again."""
        self._check(_c.gmsfs_unmap(self._handle(), name.encode()), "unmap %s" % name)

    # ---- metadata ----
    def meta_put(self, key, alloc, offset=0, value=b"", size=0, private=False, note=False):
        """One entry, meta_put_many's fields: a GMS-style writer puts one per tensor, so
        this is meta_put_many's work without its lists.  note: an entry about the layout
        that its hash leaves out (gmsfs(5), user.gms.note)."""
        self._check(_c.gmsfs_meta_put_many(self._handle(), _entry(key, alloc, offset, value, size, private, note), 1),
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
    def commit(self, unmap=False, version=None, close=False):
        """Validate and publish; the mappings become read-only, the lock a read lock.
        unmap=True: then unmap_all at once, the mappings not made read-only in between
        (GMS's commit, which unmaps its writer; half the CUDA calls of the two).
        version: the commit's name (gmsfs(5), NAMED VERSIONS), a store's once: GmsfsError
        EEXIST when a commit of the store had it, EINVAL when it is not a name.
        close=True: then close(), the lock given back by the commit's own request
        (gmsfs_commit_disconnect: a writer done with the store saves a close's round
        trips); a failed commit leaves the connection open and as it was."""
        if close:
            name = None if version is None else str(version).encode()
            self._check(_c.gmsfs_commit_disconnect(self._handle(), name),
                        "commit" if version is None else "commit %s" % version)
            self._g = ctypes.c_void_p()  # freed by it
            return
        if version is not None:
            commit = _c.gmsfs_commit_version_unmap_all if unmap else _c.gmsfs_commit_version
            self._check(commit(self._handle(), str(version).encode()), "commit %s" % version)
        elif unmap:
            self._check(_c.gmsfs_commit_unmap_all(self._handle()), "commit")
        else:
            self._check(_c.gmsfs_commit(self._handle()), "commit")

    def commit_soon(self):
        """A writer's hint: its commit follows within milliseconds (once the copies it queued
        land), so the daemon watches for it instead of sleeping (gmsfs_commit_soon; where
        the daemon spins).  Nothing changes."""
        self._check(_c.gmsfs_commit_soon(self._handle()), "commit_soon")

    def commit_layout(self):
        """Publish the layout while this writer goes on writing bytes (GMS's commit_layout):
        the lock stays; its end without commit goes back to this layout, COMMITTED where
        every allocation is a page of gmsfs.Pages (their records say what to trust), TORN
        otherwise (the layout kept for a writer to fill and commit)."""
        self._check(_c.gmsfs_commit_layout(self._handle()), "commit_layout")

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

    def pause(self):
        """A reader (a committed writer too) gives its lock back and keeps its mappings:
        a data-only writer may write them in place meanwhile (an in-place refit); nothing
        else changes that memory until resume().  Read nothing through them meanwhile."""
        self._check(_c.gmsfs_pause(self._handle()), "pause")

    def resume(self, mode="ro", timeout=None, keep_read_only=False):
        """Lock again ("ro", or "data" for a trainer's next refit): the same mappings, no
        map call.  EUCLEAN (the store torn meanwhile) or a timeout leave it paused; a
        failure after the grant gives the lock back untouched and leaves it unmapped
        (remap_all maps it again).  keep_read_only (with "data"): the mappings stay
        read-only, each made writable by protect() before it is written."""
        if mode not in ("ro", "data"):
            raise ValueError("resume: mode 'ro' or 'data', not %r" % (mode,))
        if keep_read_only and mode != "data":
            raise ValueError("resume: keep_read_only goes with mode 'data'")
        g, m = self._handle(), _MODES[mode] | (_lib.KEEP_READ_ONLY if keep_read_only else 0)
        self._check(_waiting(_ms(timeout), lambda ms: _c.gmsfs_resume(g, m, ms), "resume"), "resume")

    def protect(self, name, writable):
        """Set the access of this connection's mapping of allocation name: writable
        (a writer's session only) or read-only.  A writer that writes its allocations one
        after another makes each writable just before it writes it and read-only once its
        writes have landed: on a GPU the access changes then overlap the copies."""
        self._check(_c.gmsfs_protect(self._handle(), name.encode(), 1 if writable else 0), "protect %s" % name)

    @property
    def paused(self):
        return bool(self._g and _c.gmsfs_paused(self._g))

    def flip(self, version=None):
        """A reader of a store with versions (user.gms.versions 2) moves to the last
        commit: the allocations that changed are mapped again at the same addresses
        (tensors over them see the new bytes), the rest stay.  Returns how many were
        mapped again (0: it was on the last commit already).  version: only to the commit
        of that name, or nothing changes: GmsfsError ESTALE (the last commit is another:
        gmsfs.wait_version waits for it), ENOENT (no commit had the name)."""
        n = ctypes.c_size_t(0)
        if version is not None:
            self._check(_c.gmsfs_flip_to(self._handle(), str(version).encode(), ctypes.byref(n)),
                        "flip to %s" % version)
        else:
            self._check(_c.gmsfs_flip(self._handle(), ctypes.byref(n)), "flip")
        return n.value

    @property
    def version(self):
        """The name of the commit this connection holds (gmsfs(5), NAMED VERSIONS), or None."""
        buf = ctypes.create_string_buffer(_lib.VERSION_NAME_MAX + 1)
        e = _c.gmsfs_version_name(self._handle(), buf)
        if e == -_errno.ENODATA:
            return None
        self._check(e, "version")
        return buf.value.decode()

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
