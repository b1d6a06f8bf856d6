"""gpu_memory_service.client.rpc on gmsfs: GMS's raw transport, for the requests that take
no lock and change nothing (what operators and GMS's tests ask a server): the runtime
state, the event history, the lock, allocation and layout-hash state.  On gmsfs they are
the store's files (`state`, `history`, gmsfs(5)), read with no lock taken and no side
effect; a "socket path" is a store (gmsfs.gms's docstring).  Sessions (handshake,
allocations, commit) are gmsfs.gms.GMSClientMemoryManager's and _GMSClientSession's: this
transport refuses them, saying so."""
import os
from dataclasses import dataclass, field
from typing import List

from gmsfs._fields import read_fields
from gmsfs._gms_common import (AllocateResponse, GetAllocationResponse, GetAllocationStateResponse,  # noqa: F401
                               GetLockStateResponse, _store_of)  # (messages' names too: GMS's module has them)


@dataclass(frozen=True)
class GetRuntimeStateRequest:
    pass


@dataclass(frozen=True)
class GetRuntimeStateResponse(GetLockStateResponse):
    """The lock's state, the allocations and the layout hash."""
    allocation_count: int = 0
    memory_layout_hash: str = ""


@dataclass(frozen=True)
class GMSRuntimeEvent:
    kind: str
    allocation_count: int = 0


@dataclass(frozen=True)
class GetEventHistoryRequest:
    pass


@dataclass(frozen=True)
class GetEventHistoryResponse:
    events: List[GMSRuntimeEvent] = field(default_factory=list)


@dataclass(frozen=True)
class GetLockStateRequest:
    pass


@dataclass(frozen=True)
class GetAllocationStateRequest:
    pass


@dataclass(frozen=True)
class GetStateHashRequest:
    pass


@dataclass(frozen=True)
class GetStateHashResponse:
    memory_layout_hash: str


# STORE/history's kinds as GMS's server names its events: a session's end without commit
# (an abort, a crash, one that tore the store) is GMS's rw_aborted; data-only sessions
# and kept layouts are gmsfs's own (GMS records neither).
_GMS_KINDS = {"rw_connected": "rw_connected", "committed": "committed", "aborted": "rw_aborted",
              "left": "rw_aborted", "torn": "rw_aborted"}


def runtime_state(store: str) -> GetRuntimeStateResponse:
    """GMS's runtime state, from the store's state file."""
    s = read_fields(os.path.join(store, "state"))
    committed = s["state"] in ("COMMITTED", "RO")  # GMS: a writer's session is no committed layout
    return GetRuntimeStateResponse(
        state=s["state"], has_rw_session=s.get("writer", "0") != "0",
        ro_session_count=int(s.get("read_handles", 0)), waiting_writers=int(s.get("waiting_writers", 0)),
        committed=committed, is_ready=committed, allocation_count=int(s.get("allocations", 0)),
        memory_layout_hash=s.get("layout_hash", "") if committed else "")


def event_history(store: str) -> GetEventHistoryResponse:
    """GMS's event history, from the store's history file (its last 64 lock events): an
    abort that a session's end follows is one rw_aborted, as GMS ends the connection."""
    events, last = [], None
    with open(os.path.join(store, "history")) as f:
        for line in f:
            _seq, _when, kind, pid, _gen = line.split()
            gms = _GMS_KINDS.get(kind)
            if gms and not (kind == "left" and last == ("aborted", pid)):
                events.append(GMSRuntimeEvent(kind=gms))
            last = (kind, pid)
    return GetEventHistoryResponse(events=events)


class _GMSRPCTransport:
    """GMS's raw transport on a store: the lock-free requests, answered from its files."""

    def __init__(self, socket_path: str):
        self.socket_path = socket_path
        self._store = None

    @property
    def is_connected(self) -> bool:
        return self._store is not None

    def connect(self) -> None:
        try:
            self._store = _store_of(self.socket_path)
        except (OSError, ValueError) as e:
            raise ConnectionError("GMS server not running at %s (%s)" % (self.socket_path, e)) from None

    def close(self) -> None:
        self._store = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def request(self, request, response_type):
        if self._store is None:
            raise RuntimeError("Attempted GMS request on disconnected transport")
        answer = _ANSWERS.get(type(request))
        if answer is None:
            raise NotImplementedError("%s: on gmsfs a session's requests are gmsfs.gms.GMSClientMemoryManager's; "
                                      "this transport answers %s" % (type(request).__name__,
                                                                     ", ".join(t.__name__ for t in _ANSWERS)))
        response = answer(self._store)
        if not isinstance(response, response_type):
            raise RuntimeError("GMS request %s returned unexpected response type: %s"
                               % (type(request).__name__, type(response)))
        return response


def _lock_state(store):
    r = runtime_state(store)
    return GetLockStateResponse(state=r.state, has_rw_session=r.has_rw_session, ro_session_count=r.ro_session_count,
                                waiting_writers=r.waiting_writers, committed=r.committed, is_ready=r.is_ready)


_ANSWERS = {
    GetRuntimeStateRequest: runtime_state,
    GetEventHistoryRequest: event_history,
    GetLockStateRequest: _lock_state,
    GetAllocationStateRequest: lambda s: GetAllocationStateResponse(allocation_count=runtime_state(s).allocation_count),
    GetStateHashRequest: lambda s: GetStateHashResponse(memory_layout_hash=runtime_state(s).memory_layout_hash),
}
