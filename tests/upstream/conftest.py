"""GMS's own client-flow tests (NVIDIA Dynamo, lib/gpu_memory_service/tests) against gmsfs:
this conftest stands in for what those tests start in-process (GMS's server) with a real
gmsfs mount, and gives the server-side names they import a gmsfs meaning or a refusal.
run.sh copies the upstream files here (never committed) and runs them; see its header for
the tests that cannot apply and why.

The `server` a runtime-flow test gets is a view of the store's `state` file: state,
readers, waiting writers, allocations; what GMS's server keeps in memory, gmsfs shows
in that file."""
import enum
import os
import sys
import time
import types
import uuid

import pytest

ROOT = os.environ.get("GMSFS_ROOT") or os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BUILD = os.path.join(ROOT, os.environ.get("GMSFS_BUILD", "build"))
sys.path.insert(0, os.path.join(ROOT, "python"))
os.environ.setdefault("GMSFS_LIBRARY", os.path.join(BUILD, "libgmsfs.so.0"))

import gmsfs.gms  # noqa: E402
from gmsfs.ctl import read_fields  # noqa: E402

gmsfs.gms.install()


class ServerState(str, enum.Enum):
    """GMS's server states: gmsfs's store states have the same names (gmsfs(5))."""
    EMPTY = "EMPTY"
    RW = "RW"
    COMMITTED = "COMMITTED"
    RO = "RO"


class _ServerInternals:
    """A name the upstream tests import from GMS's server or its RPC layer: there is no such
    object on gmsfs (run.sh deselects the tests that use one)."""

    def __init__(self, *args, **kwargs):
        raise NotImplementedError("GMS's server internals have no gmsfs counterpart: %s" % type(self).__name__)


def _module(name, **attrs):
    m = types.ModuleType(name, "gmsfs's stand-in for GMS's %s (tests/upstream)" % name)
    m.__dict__.update(attrs)
    if "." in name:
        m.__path__ = []
    sys.modules[name] = m
    return m


def _internal(name):
    return type(name, (_ServerInternals,), {})


_module("gpu_memory_service.server")
_module("gpu_memory_service.server.fsm", ServerState=ServerState)
_module("gpu_memory_service.server.allocations", GMSAllocationManager=_internal("GMSAllocationManager"))
_module("gpu_memory_service.server.rpc", GMSRPCServer=_internal("GMSRPCServer"))
# gpu_memory_service.client.rpc and .common.protocol.messages are gmsfs.gms's own
# (gmsfs/_gms_rpc.py): the runtime state and event history read from the store's files.
try:
    import pynvml  # noqa: F401  (the GPU-memory tests use it; they are deselected off a GPU)
except ImportError:
    _module("pynvml")


def _state(store):
    return read_fields(os.path.join(store, "state"))


class StoreView:
    """What the runtime-flow tests read from GMS's server object, read from the store."""

    def __init__(self, store):
        self.store = store
        self._gms = self
        self._sessions = self

    @property
    def state(self):
        return ServerState(_state(self.store)["state"])

    def snapshot(self):
        s = _state(self.store)
        return types.SimpleNamespace(waiting_writers=int(s["waiting_writers"]), ro_session_count=int(s["read_handles"]))

    @property
    def allocation_count(self):
        """The allocations GMS's server holds: the writer's session's while one is open (the
        shim's writer starts from nothing), else the committed ones."""
        if self.state == ServerState.RW:
            return len(os.listdir(os.path.join(self.store, "allocs")))
        return int(_state(self.store)["allocations"])

    @property
    def committed(self):
        return self.state in (ServerState.COMMITTED, ServerState.RO)


def _package_tests():
    """python/tests/conftest.py, the package's own fixtures (loaded under another name:
    this file is the conftest here)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("gmsfs_package_tests",
                                                  os.path.join(ROOT, "python", "tests", "conftest.py"))
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m


@pytest.fixture(scope="session")
def gmsfs_mount():
    """One daemon for the run: the host backend, or GMSFS_BACKEND (cuda on the GPU machine)."""
    yield from _package_tests().mounted("backend=" + os.environ.get("GMSFS_BACKEND", "host"))


@pytest.fixture
def running_gms(request, gmsfs_mount):
    """Upstream's fixture of the same name started GMS's server on a socket path; here a
    fresh store of the mount is that path.  The runtime flows get (server view, path),
    the torch tests the path alone, as upstream's fixtures give."""
    store = os.path.join(gmsfs_mount, "gms-" + uuid.uuid4().hex[:8])
    os.mkdir(store)
    yield store if "torch" in request.module.__name__ else (StoreView(store), store)
    for _ in range(100):  # the test's sessions are closed as it ends
        try:
            os.rmdir(store)
            break
        except OSError:
            time.sleep(0.05)


def pytest_configure(config):
    # Upstream's marks (its CI's selectors and plugins): known here, with no effect.
    for mark in ("pre_merge", "integration", "unit", "none", "gpu_0", "gpu_1", "timeout(seconds)", "asyncio"):
        config.addinivalue_line("markers", mark + ": upstream's (no effect on gmsfs)")
