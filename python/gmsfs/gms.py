"""gmsfs.gms: the client API of NVIDIA Dynamo's GPU Memory Service (gpu_memory_service.client)
on gmsfs, for engines that integrate GMS today (vLLM's --load-format gms, SGLang's memory
saver, TensorRT-LLM's loader, Dynamo's failover) and should not have to change.

    import gmsfs.gms
    gmsfs.gms.install()            # import gpu_memory_service ... now gives this module
    # or, without touching the engine: PYTHONPATH=$(python3 -m gmsfs.gms --path)

Where GMS runs a server per GPU and tag, gmsfs has a mount per GPU and a store per tag: a
"socket path" names a store.  A path that is a store directory is used as it is;
get_socket_path(device, tag) gives the store TAG of the device's mount ($GMSFS_GMS_MOUNT,
else the mount whose device index or uuid is the device's; the store is made if missing);
a GMS socket path (.../gms_GPU-<uuid>_<tag>.sock) maps to that store too.

GMS's semantics where they differ from gmsfs's own, as GMS's client gives them:
  - a writer's connect starts from nothing (GMS clears the layout), where gmsfs starts
    from the committed layout; a writer that disconnects without committing leaves the
    last commit in place (GMS: nothing), so a crash never loses the published model;
  - commit() publishes, then unmaps the writer and disconnects it (VAs kept);
  - RW_OR_RO, timeouts as TimeoutError("Timeout waiting for lock"), RO sessions refuse
    writes with RuntimeError("... not allowed for RO session");
  - remap_all_vas() raises StaleMemoryLayoutError when the committed structure changed;
  - commit_layout() publishes the layout and leaves the writer RW_DATA (its bytes next); a
    death then leaves the layout (LAYOUT_COMMITTED: gmsfs's TORN, reads refused) for an
    RW_DATA writer to fill and commit.  Where every allocation is a page of gmsfs.Pages,
    gmsfs keeps more than GMS: the store stays COMMITTED and the pages' records say which
    bytes to trust (gmsfs.Pages.adopt).
  - sessions are connections, as GMS's: each session (a manager's, a _GMSClientSession)
    is a lock of its own (gmsfs.connect(own=True), gmsfs(5) "Sessions of their own"), so
    a thread that asks for RW while another thread of the process reads waits for that
    read as a waiting writer, and two readers of one process are two RO sessions (the
    state's read_handles).  gmsfs's own connections and the shell keep the process's
    rules (a reader that asks to write gets EDEADLK at once).
  - allocation ids are new for each layout, as GMS's uuids: the layout slot's name and
    the token of the writer session that made it ("slot000000-3f9c0a..."), the token kept
    in a note of the layout (gmsfs(5), user.gms.note), which its hash leaves out; so a
    layout written again with the same structure (an RL weight refresh) has the same hash,
    remap_all_vas() accepts it and the mappings take its ids, and
    reallocate_all_handles() gives new ids at once;
What remains different, and why:
  - mapping is libgmsfs's (one bulk import per reader, one reservation per batch), so the
    Tier-1 calls that hand out raw descriptors or map at chosen addresses (export_handle,
    reserve_va, map_va, free_va) raise NotImplementedError; handle in LocalMapping is 1
    while mapped, 0 when not (no CUDA handle is kept per mapping);
  - unmap_all_vas() gives the lock back at once (gmsfs's unmap_all), where GMS holds it
    until abort(); the next connect() takes it again when remap_all_vas() or
    reallocate_all_handles() maps (at the same addresses);
On the host backend (no GPU) the same calls work on host memory: CI runs them."""
import logging
import os
import sys
from typing import Dict, List, Optional

import gmsfs
from gmsfs import StaleLayoutError
from gmsfs._fields import read_fields

logger = logging.getLogger(__name__)

__all__ = ["RequestedLockType", "GrantedLockType", "StaleMemoryLayoutError", "LocalMapping", "GMSClientMemoryManager",
           "get_socket_path", "install", "GetAllocationResponse", "AllocateResponse", "GetLockStateResponse",
           "GetAllocationStateResponse"]

# GMS's public names, from the parts that hold them; the private ones this module uses.
from gmsfs._gms_common import (  # noqa: F401
    AllocateResponse, get_socket_path, get_socket_path_in, GetAllocationResponse, GetAllocationStateResponse,
    GetLockStateResponse, GrantedLockType, LocalMapping, RequestedLockType, SLOT_PREFIX, StaleMemoryLayoutError)
from gmsfs._gms_common import (_id_of, _local, _metadata_get, _name_of, _new_ids_token, _rehandle, _RW, _slot_of,
                               _store_of)
from gmsfs._gms_session import _GMSClientSession, _Transport


# ---- the memory manager (gpu_memory_service.client.memory_manager) ----

_GRANULARITY = {}  # mount -> its device's allocation granularity


class GMSClientMemoryManager:
    """GMS's memory manager on a gmsfs store.  The constructor does not connect: call
    connect().  Addresses are libgmsfs's: kept across unmap_all_vas and remap_all_vas."""

    def __init__(self, socket_path: str, *, device: int = 0, tag: Optional[str] = None) -> None:
        self.socket_path = socket_path
        self.device = device
        self.tag = tag
        self._client: Optional[_GMSClientSession] = None
        self._asleep: Optional[gmsfs.Connection] = None  # unmapped, addresses kept, no lock
        self._store: Optional[str] = None  # the store's path, once a session found it
        self._mappings: Dict[int, LocalMapping] = {}
        self._inverse_mapping: Dict[str, int] = {}
        self._names: Dict[int, str] = {}  # each mapping's allocation name (its id is the layout's: _gms_common)
        self._realloc_token: Optional[str] = None  # the ids' token of a reallocation, until its session wakes
        self._unmapped = False
        self._va_preserved = False
        self._granted_lock_type: Optional[GrantedLockType] = None
        self._requested: Optional[RequestedLockType] = None
        self._timeout_ms: Optional[int] = None
        self._granularity_set = None  # what the caller set, if anything

    # ---- properties ----
    @property
    def granted_lock_type(self) -> Optional[GrantedLockType]:
        return self._granted_lock_type

    @property
    def is_connected(self) -> bool:
        return self._client is not None and self._client.is_connected

    @property
    def is_unmapped(self) -> bool:
        return self._unmapped

    @property
    def mappings(self) -> Dict[int, LocalMapping]:
        return self._mappings

    @property
    def total_bytes(self) -> int:
        return sum(m.aligned_size for m in self._mappings.values())

    # ---- connection ----
    def connect(self, lock_type: RequestedLockType, timeout_ms: Optional[int] = None) -> None:
        if self._client is not None:
            raise RuntimeError("Memory manager is already connected")
        lock_type = RequestedLockType(lock_type)
        if self._asleep is not None:
            # The addresses are kept by the sleeping connection: remap_all_vas or
            # reallocate_all_handles takes the lock again as it maps.
            self._requested, self._timeout_ms = lock_type, timeout_ms
            self._granted_lock_type = GrantedLockType.RO if lock_type == RequestedLockType.RO else GrantedLockType.RW
            return
        self._client = _GMSClientSession(self.socket_path, lock_type, timeout_ms)
        self._store = self._client._store
        self._granted_lock_type = self._client.lock_type

    @property
    def granularity(self) -> int:
        """The device's allocation granularity (the host backend's pages are smaller): the
        mount's device file, read at the first ask (a FUSE read), once per mount."""
        if self._granularity_set is not None:
            return self._granularity_set
        try:
            store = self._client._store if self._client is not None else _store_of(self.socket_path)
            mount = os.path.dirname(os.path.abspath(store))
            if mount not in _GRANULARITY:
                d = read_fields(os.path.join(mount, "device"))
        except OSError:
            return 2 << 20  # no store (yet): a CUDA device's
        if mount not in _GRANULARITY:
            _GRANULARITY[mount] = int(d.get("granularity", 2 << 20))
        return _GRANULARITY[mount]

    @granularity.setter
    def granularity(self, value: int) -> None:
        self._granularity_set = value

    def abort(self) -> None:
        """Drop the session; mappings still held are unmapped with their addresses kept."""
        if self._client is not None:
            c, self._client = self._client._c, None
            if c is not None and self._mappings:
                self._sleep(c)
            elif c is not None:
                c.close()
        self._granted_lock_type = None

    def _sleep(self, c, unmapped=False):
        if not unmapped:
            c.unmap_all()
        self._asleep = c
        _rehandle(self._mappings, 0)
        self._va_preserved = self._unmapped = True

    # ---- Tier 1 ----
    def allocate_handle(self, size: int, tag: str = "default"):
        self._require_rw()
        r, m = self._client_rpc._allocate(size, tag)
        self._track(_local(r.allocation_id, m.ptr, m.size, m.aligned, 1, tag, r.layout_slot), m.name)
        return r.allocation_id, r.layout_slot

    def export_handle(self, allocation_id: str) -> int:
        raise NotImplementedError("gmsfs.gms: descriptors stay inside libgmsfs; use create_mapping")

    def reserve_va(self, size: int) -> int:
        raise NotImplementedError("gmsfs.gms: libgmsfs reserves and maps; use create_mapping")

    def map_va(self, *args, **kwargs) -> int:
        raise NotImplementedError("gmsfs.gms: libgmsfs reserves and maps; use create_mapping")

    def unmap_va(self, va: int) -> None:
        raise NotImplementedError("gmsfs.gms: libgmsfs maps and unmaps; use destroy_mapping or unmap_all_vas")

    def free_va(self, va: int) -> None:
        raise NotImplementedError("gmsfs.gms: addresses go with destroy_mapping or close")

    def get_handle_info(self, allocation_id: str) -> GetAllocationResponse:
        return self._client_rpc.get_allocation(allocation_id)

    def free_handle(self, allocation_id: str) -> bool:
        if not self._client_rpc.free(allocation_id):
            raise RuntimeError("GMS free_handle failed for allocation_id=%s" % allocation_id)
        return True

    def list_handles(self, tag: Optional[str] = None) -> List[GetAllocationResponse]:
        return self._client_rpc.list_allocations(tag)

    def get_memory_layout_hash(self) -> str:
        return self._client_rpc.get_memory_layout_hash()

    def metadata_put(self, key: str, allocation_id: str, offset_bytes: int, value: bytes) -> bool:
        return (self._client or self._client_rpc).metadata_put(key, allocation_id, offset_bytes, value)

    def metadata_get(self, key: str):
        # A reader asks once per tensor: straight to the session's connection.
        s = self._client
        c = s._c if s is not None else None
        if c is None:
            return self._client_rpc.metadata_get(key)  # says why not
        r = _metadata_get(c, key)
        return r if r is None or not r[0] else (s._id(r[0]), r[1], r[2])

    def metadata_list(self, prefix: str = "") -> List[str]:
        return self._client_rpc.metadata_list(prefix)

    def metadata_delete(self, key: str) -> bool:
        return self._client_rpc.metadata_delete(key)

    def commit(self) -> bool:
        """Publish, then unmap this writer (addresses kept) and disconnect, as GMS does."""
        self._require_rw(data=True)
        c = self._client_rpc._conn()
        self._client._write_ids(c)
        c.commit(unmap=True)
        self._client._c = None
        self._client = None
        self._granted_lock_type = None
        self._sleep(c, unmapped=True)
        return True

    def commit_layout(self) -> bool:
        """Publish the layout while this writer goes on writing bytes (GMS's commit_layout):
        the lock becomes RW_DATA (no allocation changes; commit() publishes the bytes).  A
        death from here keeps the layout: the store is TORN until a writer (RW_DATA) fills
        and commits it, or, where every allocation is a page of gmsfs.Pages, COMMITTED with
        the pages' records (gmsfs(5), KEPT)."""
        self._require_rw()
        self._client._write_ids(self._client_rpc._conn())
        self._client_rpc._conn().commit_layout()
        self._granted_lock_type = self._client._granted_lock_type = GrantedLockType.RW_DATA
        return True

    # ---- Tier 2 ----
    def create_mapping(self, allocation_id: Optional[str] = None, size: int = 0, tag: str = "default") -> int:
        if allocation_id is not None:
            va = self._inverse_mapping.get(allocation_id)
            if va is not None:
                if self._mappings[va].handle == 0:
                    raise RuntimeError("Allocation %s is cached but unmapped (VA 0x%x). Use remap_all_vas() to "
                                       "restore." % (allocation_id, va))
                return va
            s = self._client or self._client_rpc
            name = s._name(allocation_id)
            by_name = s._by_name
            m = by_name.get(name) if by_name is not None else None
            if m is None:  # the table made, or the error said
                m = s._mapping(name)
            va = m.ptr
            self._mappings[va] = _local(allocation_id, va, m.size, m.aligned, 1, m.tag, _slot_of(name))
            self._inverse_mapping[allocation_id] = va
            self._names[va] = name
            return va
        if size <= 0:
            raise ValueError("size must be > 0 when allocation_id is None")
        if self._granted_lock_type is not _RW:
            self._require_rw()  # says so
        s = self._client or self._client_rpc
        m, slot = s._create(size, tag)  # allocate_handle's, without its response
        va, aid = m.ptr, s._id(m.name)
        self._mappings[va] = _local(aid, va, m.size, m.aligned, 1, tag, slot)
        self._inverse_mapping[aid] = va
        self._names[va] = m.name
        return va

    def destroy_mapping(self, va: int) -> None:
        m = self._mappings.get(va)
        if m is None:
            return
        if self._granted_lock_type == GrantedLockType.RW and self._client is not None:
            self.free_handle(m.allocation_id)
        self._mappings.pop(va, None)
        self._inverse_mapping.pop(m.allocation_id, None)
        self._names.pop(va, None)

    def unmap_all_vas(self) -> None:
        """Unmap everything, addresses kept; the lock goes back (gmsfs's unmap_all)."""
        if self._client is not None and self._client._c is not None:
            c, self._client._c = self._client._c, None
            self._client = None
            self._sleep(c)

    def remap_all_vas(self) -> None:
        """The same allocations at the same addresses; StaleMemoryLayoutError when the
        committed layout's structure changed."""
        c = self._asleep
        if c is None:
            if self._client is None:
                raise RuntimeError("Memory manager is not connected")
            return  # nothing is unmapped
        if self._realloc_pending:  # reallocate_all_handles mapped the fresh memory already
            self._realloc_pending = False
        else:
            try:
                c.remap_all(None if self._timeout_ms is None else self._timeout_ms / 1000.0)
            except StaleLayoutError as e:
                raise StaleMemoryLayoutError("Layout changed: %s" % e) from None
        self._wake(c)

    _realloc_pending = False

    def _wake(self, c):
        self._asleep = None
        self._client = _GMSClientSession.__new__(_GMSClientSession)
        self._client._store = self._store or _store_of(self.socket_path)  # its sleeping connection's
        self._client._requested_lock_type = self._requested or RequestedLockType.RO
        self._client._c = c
        self._client._granted_lock_type = GrantedLockType.RW if c.lock_mode == "rw" else GrantedLockType.RO
        self._client._transport = _Transport(self._client)
        if self._realloc_token is not None:  # the reallocation's ids, for its commit
            self._client._token, self._client._token_unwritten = self._realloc_token, True
            self._realloc_token = None
        self._granted_lock_type = self._client._granted_lock_type
        self._reid(self._client._ids())  # a layout written again since: its ids
        _rehandle(self._mappings, 1)
        self._va_preserved = self._unmapped = False
        self._requested = None

    def reallocate_all_handles(self, tag: str = "default") -> None:
        """Fresh memory behind every kept address, for a writer (a failover's shadow).  The
        handles stay 0 until remap_all_vas(), as GMS's."""
        if self._asleep is None or not self._va_preserved:
            raise RuntimeError("reallocate_all_handles requires preserved VAs (call unmap_all_vas first)")
        if self._requested == RequestedLockType.RO:
            raise RuntimeError("Operation requires RW mode")
        self._asleep.reallocate_all(None if self._timeout_ms is None else self._timeout_ms / 1000.0)
        self._realloc_pending = True  # mapped already: remap_all_vas marks them
        self._realloc_token = _new_ids_token()  # fresh memory: new ids, as GMS's
        self._reid(self._realloc_token)

    def _reid(self, token: str) -> None:
        """Every mapping's id as the layout whose ids' token is token names it (GMS's
        with_server_identity after a remap of a layout written again)."""
        for va, m in list(self._mappings.items()):
            name = self._names.get(va, m.allocation_id)
            aid = _id_of(name, token)
            if aid != m.allocation_id:
                self._inverse_mapping.pop(m.allocation_id, None)
                self._mappings[va] = m.with_server_identity(aid, m.layout_slot)
                self._inverse_mapping[aid] = va

    def close(self, *, best_effort: bool = False) -> None:
        for c in (self._client._c if self._client else None, self._asleep):
            if c is not None:
                c.close()
        self._client = self._asleep = None
        self._mappings.clear()
        self._inverse_mapping.clear()
        self._names.clear()
        self._realloc_token = None
        self._granted_lock_type = None
        self._unmapped = self._va_preserved = False
        registry = sys.modules.get("gmsfs.gms_torch")  # as GMS's: a closed manager is no tag's
        if registry is not None:
            registry.evict_gms_client_memory_manager(self)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ---- internals ----
    @property
    def _client_rpc(self) -> _GMSClientSession:
        if self._client is None:
            if self._unmapped:
                raise RuntimeError("Memory manager is unmapped")
            raise RuntimeError("Memory manager is not connected")
        return self._client

    def _require_rw(self, data=False) -> None:
        if self._granted_lock_type != GrantedLockType.RW and not (data and self._granted_lock_type ==
                                                                  GrantedLockType.RW_DATA):
            raise RuntimeError("Operation requires RW mode")

    def _track(self, m: LocalMapping, name: Optional[str] = None) -> None:
        self._mappings[m.va] = m
        self._inverse_mapping[m.allocation_id] = m.va
        self._names[m.va] = name or m.allocation_id


# ---- import gpu_memory_service: these modules ----

_PACKAGES = ("gpu_memory_service", "gpu_memory_service.client", "gpu_memory_service.common",
             "gpu_memory_service.common.protocol", "gpu_memory_service.client.torch",
             "gpu_memory_service.failover_lock", "gpu_memory_service.failover_lock.flock")
_MODULES = {
    "gpu_memory_service.client.memory_manager": "gmsfs.gms",
    "gpu_memory_service.client.session": "gmsfs.gms",
    "gpu_memory_service.common.locks": "gmsfs.gms",
    "gpu_memory_service.common.utils": "gmsfs.gms",
    "gpu_memory_service.common.protocol.messages": "gmsfs._gms_rpc",
    "gpu_memory_service.client.rpc": "gmsfs._gms_rpc",
    "gpu_memory_service.client.torch.allocator": "gmsfs.gms_torch",
    "gpu_memory_service.client.torch.module": "gmsfs.gms_torch",
    "gpu_memory_service.client.torch.tensor": "gmsfs.gms_torch",
    "gpu_memory_service.failover_lock.interface": "gmsfs.gms_failover",
    "gpu_memory_service.failover_lock.flock.lock": "gmsfs.gms_failover",
}
# What GMS's packages give from their modules, as its __init__ files do.
_PACKAGE_NAMES = {
    "gpu_memory_service.failover_lock": ("gmsfs.gms_failover", ("FailoverLock", "FailoverLockError")),
    "gpu_memory_service.failover_lock.flock": ("gmsfs.gms_failover", ("FlockFailoverLock",)),
}


class _Finder:
    """A meta path finder: GMS's client modules are these (torch's loaded on first use)."""

    def find_spec(self, fullname, path=None, target=None):
        import importlib.machinery
        if fullname in _PACKAGES or fullname in _MODULES:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=fullname in _PACKAGES)
        return None

    def create_module(self, spec):
        import importlib
        import types
        if spec.name in _MODULES:
            return importlib.import_module(_MODULES[spec.name])
        m = types.ModuleType(spec.name, "gmsfs.gms: GMS's %s on gmsfs" % spec.name)
        # Where GMS itself is installed too, what gmsfs does not stand in for (its
        # integrations for vLLM, SGLang and TRT-LLM, its server) is found in GMS's own
        # package, and takes the client from here.
        m.__path__ = _gms_dirs(spec.name)
        if spec.name == "gpu_memory_service.client":
            m.GMSClientMemoryManager = GMSClientMemoryManager
        if spec.name in _PACKAGE_NAMES:
            source, names = _PACKAGE_NAMES[spec.name]
            source = importlib.import_module(source)
            m.__dict__.update({n: getattr(source, n) for n in names}, __all__=list(names))
        return m

    def exec_module(self, module):
        pass


def _gms_dirs(package: str) -> List[str]:
    """The directories of GMS's own package on sys.path (not gmsfs's alias of it)."""
    alias, parts = alias_path(), package.split(".")
    dirs = []
    for entry in sys.path:
        d = os.path.join(entry or ".", *parts)
        if os.path.abspath(entry or ".") != alias and os.path.isfile(os.path.join(d, "__init__.py")) and d not in dirs:
            dirs.append(d)
    return dirs


def install():
    """From now on `import gpu_memory_service...` (the client side: memory_manager,
    session, common.locks, common.utils, the torch helpers, the failover lock) gives
    gmsfs's; where GMS is installed too, its other modules (integrations, server) are
    its own, on gmsfs's client.  Idempotent."""
    if any(isinstance(f, _Finder) for f in sys.meta_path):
        return
    alias = alias_path()
    for name in list(sys.modules):  # the real GMS's client, if it was imported, is replaced
        if name in _PACKAGES or name in _MODULES:
            if not (getattr(sys.modules[name], "__file__", None) or "").startswith(alias):
                del sys.modules[name]
    sys.meta_path.insert(0, _Finder())


def invalidate_uuid_cache() -> None:
    """GMS's: the device's mount is looked up at each get_socket_path."""


def wait_for_weights_socket(device: int) -> None:
    """GMS's: block until the device's weights can be asked for: on gmsfs, until a mount
    serves the device (its daemon up), checked every 0.1 s as GMS checks its socket."""
    import time
    from gmsfs._gms_common import _mount_of_device
    while True:
        try:
            _mount_of_device(device)
            return
        except FileNotFoundError:
            time.sleep(0.1)


def fail(message: str, *args, exc_info=None) -> "NoReturn":
    """GMS's: a fatal error, said at CRITICAL, then the process ends at once (os._exit(1))."""
    logger.critical(message, *args, exc_info=exc_info)
    logging.shutdown()
    os._exit(1)


def alias_path() -> str:
    """A directory to put on PYTHONPATH: its gpu_memory_service package installs this."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "gms_alias")


def pth_path() -> str:
    """Where --pth puts gpu_memory_service: a .pth file of this environment's site-packages."""
    import sysconfig
    return os.path.join(sysconfig.get_paths()["purelib"], "gmsfs-gms.pth")


if __name__ == "__main__":
    if sys.argv[1:] == ["--path"]:
        print(alias_path())
    elif sys.argv[1:] == ["--pth"]:  # opt-in, for this environment (a venv, an image)
        with open(pth_path(), "w") as f:
            f.write(alias_path() + "\n")
        print("%s: import gpu_memory_service is gmsfs.gms in this environment" % pth_path())
    elif sys.argv[1:] == ["--no-pth"]:
        if os.path.exists(pth_path()):
            os.unlink(pth_path())
    else:
        print("usage: python3 -m gmsfs.gms --path   a PYTHONPATH entry where gpu_memory_service is gmsfs.gms\n"
              "       python3 -m gmsfs.gms --pth    the same for this environment, by a .pth file (--no-pth: undo)")
        sys.exit(2)
