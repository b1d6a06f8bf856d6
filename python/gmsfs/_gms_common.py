"""gmsfs.gms's names for what GMS's client and session share (gpu_memory_service.common):
the lock types, the responses, a local mapping, the layout slots that stand for
allocation ids, where a GMS socket path leads (a store), and metadata keys as paths.
gmsfs.gms re-exports all of it."""
import enum
import os
import re
import uuid
from dataclasses import dataclass

from gmsfs._fields import read_fields


class RequestedLockType(str, enum.Enum):
    RW = "rw"
    RO = "ro"
    RW_OR_RO = "rw_or_ro"
    RW_DATA = "rw_data"  # the committed layout's bytes, no allocation changed (after commit_layout)


class GrantedLockType(str, enum.Enum):
    RW = "rw"
    RO = "ro"
    RW_DATA = "rw_data"


_RW = GrantedLockType.RW  # for the hot paths' checks (an enum's class attribute is a descriptor call)


class StaleMemoryLayoutError(Exception):
    """The committed layout changed while this process was unmapped: a LAYOUT check (sizes,
    tags, names, metadata), not a content one."""


@dataclass(frozen=True)
class GetAllocationResponse:
    allocation_id: str
    size: int
    aligned_size: int
    tag: str
    layout_slot: int


@dataclass(frozen=True)
class AllocateResponse:
    allocation_id: str
    size: int
    aligned_size: int
    layout_slot: int


@dataclass(frozen=True)
class GetLockStateResponse:
    state: str
    has_rw_session: bool
    ro_session_count: int
    waiting_writers: int
    committed: bool
    is_ready: bool


@dataclass(frozen=True)
class GetAllocationStateResponse:
    allocation_count: int


@dataclass(frozen=True)
class LocalMapping:
    allocation_id: str
    va: int
    size: int
    aligned_size: int
    handle: int  # 1 while mapped, 0 when unmapped (VA reserved)
    tag: str
    layout_slot: int

    def with_handle(self, handle: int) -> "LocalMapping":
        m = _new(LocalMapping)
        d = m.__dict__
        d.update(self.__dict__)
        d["handle"] = handle
        return m

    def with_server_identity(self, allocation_id: str, layout_slot: int) -> "LocalMapping":
        return _local(allocation_id, self.va, self.size, self.aligned_size, self.handle, self.tag, layout_slot)


_new = object.__new__


def _local(allocation_id, va, size, aligned_size, handle, tag, layout_slot):
    """LocalMapping(...) without the frozen dataclass's per-field setattr: a model has
    hundreds of mappings, and unmap_all_vas and remap_all_vas remake every one."""
    m = _new(LocalMapping)
    d = m.__dict__
    d["allocation_id"], d["va"], d["size"], d["aligned_size"] = allocation_id, va, size, aligned_size
    d["handle"], d["tag"], d["layout_slot"] = handle, tag, layout_slot
    return m


def _rehandle(mappings, handle):
    """Every LocalMapping of mappings remade with handle, as GMS's unmap_all_vas and
    remap_all_vas do (with_handle copies the fields: a model has hundreds)."""
    for va, m in mappings.items():
        mappings[va] = m.with_handle(handle)


# ---- stores: where GMS says socket ----

SLOT_PREFIX = "slot"

# A layout's allocation ids are its allocations' names with the token of the writer
# session that made them ("slot000000-3f9c..."), new for each layout as GMS's uuids are.
# The token is a note of the layout (gmsfs(5), user.gms.note: the layout hash leaves it
# out, so a layout written again with the same structure has the same hash, as GMS's
# structural hash has), on the layout's first allocation.  Its key is one no GMS key maps
# to ("%" then no hex).
IDS_NOTE = "%gms.ids"


def _new_ids_token() -> str:
    return uuid.uuid4().hex[:12]


def _ids_token_of(store: str) -> str:
    """The token of the layout the caller's lock on store sees, "" when it has none (a
    layout no GMS writer made).  Read through the mount, not from libgmsfs's table of
    entries: a remap keeps that table when the layout hash is the same, and a note may
    have changed with the hash the same."""
    try:
        with open(os.path.join(store, "meta", IDS_NOTE), "rb") as f:
            return f.read().decode()
    except FileNotFoundError:
        return ""


def _id_of(name: str, token: str) -> str:
    return name + "-" + token if token else name


def _name_of(allocation_id: str, token: str) -> str:
    """The allocation's name for an id of the layout whose token is token; another
    layout's id stays as it is (no allocation has that name: "unknown allocation_id")."""
    if token and allocation_id.endswith(token) and allocation_id[-len(token) - 1:-len(token)] == "-":
        return allocation_id[:-len(token) - 1]
    return allocation_id


def _slot_of(name: str) -> int:
    try:
        return int(name[len(SLOT_PREFIX):]) if name.startswith(SLOT_PREFIX) else -1
    except ValueError:
        return -1


def _mount_of_device(device: int) -> str:
    env = os.environ.get("GMSFS_GMS_MOUNT")
    if env:
        return env
    from gmsfs import ctl
    for m in ctl.mounts():
        try:
            d = ctl.status(m)["device"]
        except (OSError, ValueError):
            continue
        if d.get("index") == device:
            return m
    raise FileNotFoundError("no gmsfs mount for device %d (set GMSFS_GMS_MOUNT)" % device)


def get_socket_path(device: int, tag: str = "weights") -> str:
    """The store of the device's mount for tag (made when missing): what GMS's
    get_socket_path names a server socket for."""
    return get_socket_path_in(_mount_of_device(device), tag)


def _store_of(socket_path: str) -> str:
    if os.path.isfile(os.path.join(socket_path, "lock")):
        return socket_path
    base = os.path.basename(socket_path)
    if base.startswith("gms_") and base.endswith(".sock"):  # gms_GPU-<uuid>_<tag>.sock
        uuid, _, tag = base[4:-5].partition("_")
        from gmsfs import ctl
        for m in ctl.mounts():
            try:
                if ctl.status(m)["device"].get("uuid") == uuid:
                    return get_socket_path_in(m, tag)
            except (OSError, ValueError):
                continue
    raise FileNotFoundError("%s: neither a gmsfs store nor a GMS socket of a gmsfs mount's device" % socket_path)


def get_socket_path_in(mount: str, tag: str) -> str:
    store = os.path.join(mount, tag)
    try:
        os.mkdir(store)
    except FileExistsError:
        pass
    return store


# Metadata keys: GMS's are any string; a gmsfs key is a path.  A key that is not one (or
# that starts with %) is kept hex-escaped behind a %.
_PLAIN_KEY = re.compile(r"(?!%)(?!(?:.*/)?\.\.?(?:/|\Z))[^/\0]+(?:/[^/\0]+)*\Z", re.S)


def _key_path(key: str) -> str:
    # The common key at the cost of a few string scans (a model has a key per tensor): no
    # "%", "/" or "." first, no empty or dot component, no NUL, ASCII, short.  The rest
    # through the pattern.
    if key and key[0] not in "%/." and key[-1] != "/" and "/." not in key and "//" not in key and \
            "\0" not in key and len(key) <= 1024 and key.isascii():
        return key
    if _PLAIN_KEY.match(key) and len(key) <= 1024 and (key.isascii() or len(key.encode()) <= 1024):
        return key
    return "%" + key.encode().hex()


def _key_of(path: str) -> str:
    return bytes.fromhex(path[1:]).decode() if path.startswith("%") else path


def _metadata_get(c, key):
    """GMS's metadata_get on the connection c: (allocation id, offset, value), None if absent."""
    try:
        e = c.meta_get(_key_path(key))
    except KeyError:
        return None
    return e.alloc, e.offset, e.value


def _state(store: str) -> dict:
    return read_fields(os.path.join(store, "state"))
