"""gmsfs.gms's session (gpu_memory_service.client.session): one connection to one store
with its granted lock, and what it does under that lock.  gmsfs.gms re-exports it."""
import errno
import logging
import os
from typing import List, Optional

import gmsfs
from gmsfs import GmsfsError
from gmsfs._gms_common import (
    AllocateResponse, GetAllocationResponse, GetAllocationStateResponse,
    GetLockStateResponse, GrantedLockType, IDS_NOTE, RequestedLockType, SLOT_PREFIX, _id_of, _ids_token_of,
    _key_of, _key_path, _metadata_get, _name_of, _new_ids_token, _RW, _slot_of, _state, _store_of)

logger = logging.getLogger("gmsfs.gms")  # its messages are gmsfs.gms's


# ---- a session: one lock on one store ----

class _Link:
    """What GMS's transport socket is to a test that drops it: closing it ends the session
    (its lock, and a writer's uncommitted work)."""

    def __init__(self, session):
        self._session = session

    def shutdown(self, how=None):
        self._session._end()

    def close(self):
        self._session._end()


class _Transport:
    def __init__(self, session):
        self._socket = _Link(session)

    @property
    def is_connected(self):
        return self._socket is not None and self._socket._session._c is not None


_MODES = {RequestedLockType.RO: "ro", RequestedLockType.RW: "rw", RequestedLockType.RW_OR_RO: "auto",
          RequestedLockType.RW_DATA: "data"}
_NOT_A_STORE = (errno.ENOENT, errno.ENOTDIR, errno.ENOTTY)  # gmsfs.connect's errors for a path that is no store


class _GMSClientSession:
    """A connected session with its granted lock (gpu_memory_service.client.session)."""

    _next_slot = None  # the slot after the highest held, once counted
    _by_name = None  # the session's mappings by name, once asked for
    _token = None  # the token of this layout's allocation ids (_gms_common): None until read
    _token_unwritten = False  # a writer's new token, put as the layout's note before its commit

    def __init__(self, socket_path: str, lock_type: RequestedLockType, timeout_ms: Optional[int]):
        self._requested_lock_type = RequestedLockType(lock_type)
        mode = _MODES[self._requested_lock_type]
        timeout = None if timeout_ms is None else max(timeout_ms, 0) / 1000.0
        self._store = socket_path
        try:
            try:  # a store's path, most often: no stat to tell first
                self._c = gmsfs.connect(socket_path, mode, timeout, own=True)
            except GmsfsError as e:
                if e.errno not in _NOT_A_STORE:
                    raise
                self._store = _store_of(socket_path)  # a GMS socket's path, or the error that says it is neither
                self._c = gmsfs.connect(self._store, mode, timeout, own=True)
        except GmsfsError as e:
            if e.errno in (errno.ETIMEDOUT, errno.EAGAIN):
                raise TimeoutError("Timeout waiting for lock") from e
            raise
        granted = self._c.lock_mode if mode == "auto" else mode  # RO, RW and RW_DATA are granted as asked
        self._granted_lock_type = {"rw": GrantedLockType.RW, "data": GrantedLockType.RW_DATA}.get(granted,
                                                                                                GrantedLockType.RO)
        self._transport = _Transport(self)
        # Whether the store had a committed layout, as the grant said (no round trip:
        # asking for the layout hash here cost a writer's connect 0.13 ms of its 0.7).
        self._committed = self._c.generation > 0
        if self._granted_lock_type == GrantedLockType.RW:
            if self._committed:
                self._clear()  # GMS: a writer starts from nothing (the store is empty when nothing is committed)
            self._token, self._token_unwritten = _new_ids_token(), True  # its allocations' ids are new
            # The table of mappings by name, kept by allocate and free from now on (made
            # at the first metadata_put instead, it would cost a writer of 1000
            # allocations a Mapping object each again, 4 us a put).  A new connection
            # maps nothing until it creates or imports: its first slot is 0.
            self._by_name = {}
            self._next_slot = 0
        else:  # the table of mappings by name from import_all's list (a model has hundreds);
            # RW_DATA's writable, to fill the layout a commit_layout kept
            self._by_name = {m.name: m for m in self._c.import_all()}
        if logger.isEnabledFor(logging.INFO):
            logger.info("Connected with %s lock (granted=%s), committed=%s", self._requested_lock_type.value,
                        self._granted_lock_type.value, self.committed)

    def _clear(self):
        """The committed layout, gone from this session (the writer's own: a member of its
        session, it unlinks through the mount; a rollback would bring it back)."""
        for area in ("meta", "allocs"):
            root = os.path.join(self._store, area)
            for d, dirs, files in os.walk(root, topdown=False):
                for f in files:
                    os.unlink(os.path.join(d, f))
                for x in dirs:
                    os.rmdir(os.path.join(d, x))

    def _end(self):
        if self._c is not None:
            self._c.close()
            self._c = None

    def _conn(self):
        if self._c is None:
            raise ConnectionError("GMS session is closed")
        return self._c

    def _mapping(self, name, what=""):
        """The gmsfs Mapping of allocation name, from one table of the session's mappings
        (made when it began; a writer's allocate and free keep it)."""
        c = self._conn()
        if self._by_name is None:
            self._by_name = {m.name: m for m in c.mappings}
        try:
            return self._by_name[name]
        except KeyError:
            raise RuntimeError("%sunknown allocation_id %s" % (what, name)) from None

    def _ids(self) -> str:
        t = self._token
        if t is None:
            self._conn()  # says so when the session is closed
            t = self._token = _ids_token_of(self._store)
        return t

    def _id(self, name: str) -> str:
        """GMS's allocation id of the allocation name in this layout."""
        return _id_of(name, self._token if self._token is not None else self._ids())

    def _name(self, allocation_id: str) -> str:
        return _name_of(allocation_id, self._token if self._token is not None else self._ids())

    def _write_ids(self, c) -> None:
        """Before a commit: a writer's new ids' token, as the layout's note (an entry names
        an allocation: the first; a layout of none needs no ids)."""
        if self._token_unwritten:
            first = min((m.name for m in c.mappings), default=None)
            if first is not None:
                c.meta_put(IDS_NOTE, first, 0, self._token, note=True)
            self._token_unwritten = False

    def _need_rw(self, what, data=False):
        if self._granted_lock_type != GrantedLockType.RW and not (data and self._granted_lock_type ==
                                                                  GrantedLockType.RW_DATA):
            raise RuntimeError("%s not allowed for %s session" % (what, self._granted_lock_type.name))

    @property
    def committed(self) -> bool:
        """Whether the store had a committed layout when the lock was granted (or this
        session committed); the lock keeps it so for a reader."""
        return self._committed

    @property
    def lock_type(self) -> GrantedLockType:
        return self._granted_lock_type

    @property
    def is_connected(self) -> bool:
        return self._c is not None

    def is_ready(self) -> bool:
        return self.committed

    def get_lock_state(self) -> GetLockStateResponse:
        s = _state(self._store)
        committed = int(s.get("generation", "0")) > 0
        return GetLockStateResponse(state=s["state"], has_rw_session=s.get("writer", "0") != "0",
                                    ro_session_count=int(s.get("read_handles", s.get("readers", 0))),
                                    waiting_writers=int(s.get("waiting_writers", 0)), committed=committed,
                                    is_ready=committed)

    def get_allocation_state(self) -> GetAllocationStateResponse:
        return GetAllocationStateResponse(allocation_count=len(self.list_allocations()))

    def _info(self, m) -> GetAllocationResponse:
        return GetAllocationResponse(allocation_id=self._id(m.name), size=m.size, aligned_size=m.aligned, tag=m.tag,
                                     layout_slot=_slot_of(m.name))

    def allocate_info(self, size: int, tag: str = "default") -> AllocateResponse:
        return self._allocate(size, tag)[0]

    def _allocate(self, size, tag):
        """(AllocateResponse, its gmsfs Mapping)."""
        m, slot = self._create(size, tag)
        return AllocateResponse(allocation_id=self._id(m.name), size=m.size, aligned_size=m.aligned,
                                layout_slot=slot), m

    def _create(self, size, tag):
        """(gmsfs Mapping, layout slot) of a new allocation: what allocate and
        create_mapping make, without the response (a model has hundreds)."""
        if self._granted_lock_type is not _RW:
            raise RuntimeError("allocate not allowed for RO session")
        c = self._c
        if c is None:
            raise ConnectionError("GMS session is closed")
        slot = self._next_slot
        if slot is None:  # counted once, not per allocation
            slot = max([_slot_of(m.name) for m in c.mappings] + [-1]) + 1
        m = c.create("%s%06d" % (SLOT_PREFIX, slot), int(size), tag)
        self._next_slot = slot + 1
        if self._by_name is not None:
            self._by_name[m.name] = m
        return m, slot

    def allocate(self, size: int, tag: str = "default"):
        r = self.allocate_info(size, tag)
        return r.allocation_id, r.aligned_size

    def export(self, allocation_id: str) -> int:
        raise NotImplementedError("gmsfs.gms: descriptors stay inside libgmsfs; map with create_mapping")

    def get_allocation(self, allocation_id: str) -> GetAllocationResponse:
        return self._info(self._mapping(self._name(allocation_id)))

    def list_allocations(self, tag: Optional[str] = None) -> List[GetAllocationResponse]:
        infos = [self._info(m) for m in self._conn().mappings if tag is None or m.tag == tag]
        return sorted(infos, key=lambda i: i.layout_slot)

    def free(self, allocation_id: str) -> bool:
        self._need_rw("free")
        name = self._name(allocation_id)
        try:
            self._conn().free(name)  # and the entries naming it
        except KeyError:
            return False
        self._next_slot = None  # the highest may have gone: its slot is the next again
        if self._by_name is not None:
            self._by_name.pop(name, None)
        return True

    def metadata_put(self, key: str, allocation_id: str, offset_bytes: int, value: bytes) -> bool:
        # A model has a key per tensor: straight to gmsfs, whose daemon checks the lock, the
        # allocation and the offset.  A refusal is put again through the checks below, which
        # raise GMS's errors.  (Looking the allocation up first cost each put 3-4 times its
        # Python, timed by turns: most likely cache misses on the table's objects between
        # round trips.)
        c = self._c
        t = self._token
        name = _name_of(allocation_id, t if t is not None else self._ids())
        if c is not None and type(offset_bytes) is int:
            try:
                c.meta_put(_key_path(key), name, offset_bytes, value)
                return True
            except GmsfsError:
                pass
        if self._granted_lock_type is not _RW or c is None:
            self._need_rw("metadata_put")
            c = self._conn()
        by_name = self._by_name
        m = by_name.get(name) if by_name is not None else None
        if m is None:  # the table made, or the error said
            m = self._mapping(name, "metadata_put %s: " % key)
        if not 0 <= offset_bytes < m.aligned:
            raise RuntimeError("metadata_put %s: offset %d out of range for %s (%d bytes)"
                               % (key, offset_bytes, allocation_id, m.aligned))
        c.meta_put(_key_path(key), name, int(offset_bytes), value)
        return True

    def metadata_get(self, key: str):
        r = _metadata_get(self._conn(), key)
        return r if r is None or not r[0] else (self._id(r[0]), r[1], r[2])

    def metadata_delete(self, key: str) -> bool:
        self._need_rw("metadata_delete")
        try:
            self._conn().meta_delete(_key_path(key))
        except GmsfsError as e:
            if e.errno == errno.ENOENT:
                return False
            raise
        return True

    def metadata_list(self, prefix: str = "") -> List[str]:
        keys = [_key_of(p) if p[:1] == "%" else p for p in self._conn().meta_list() if p != IDS_NOTE]
        return sorted(k for k in keys if k.startswith(prefix)) if prefix else sorted(keys)

    def get_memory_layout_hash(self) -> str:
        return self._conn().layout_hash

    def commit(self) -> bool:
        self._need_rw("commit", data=True)
        self._write_ids(self._conn())
        self._conn().commit()
        self._committed = True
        self._end()
        logger.info("Committed weights and released RW connection")
        return True

    def close(self) -> None:
        self._end()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
