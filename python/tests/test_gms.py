"""gmsfs.gms, GMS's client API on gmsfs (host backend): the flows of GMS's own
test_runtime_flows.py that need no CUDA (lock types, metadata, commit, hash, stale
detection, timeouts), through the same classes, and the import alias."""
import errno
import os
import subprocess
import sys
import threading
import time

import pytest

from conftest import ROOT
import gmsfs.ctl
import gmsfs.gms as gms
from gmsfs.ctl import read_fields
from gmsfs.gms import GMSClientMemoryManager, GrantedLockType, RequestedLockType, StaleMemoryLayoutError
from gmsfs._gms_session import _GMSClientSession as Session


def waiting_writers(store):
    return int(read_fields(os.path.join(store, "state"))["waiting_writers"])


def wait_writers(store, n, timeout=5):
    end = time.time() + timeout
    while waiting_writers(store) != n:
        assert time.time() < end, "waiting writers: %d, not %d" % (waiting_writers(store), n)
        time.sleep(0.01)


def writer_in_thread(store):
    """A thread that asks for RW (5 s): the thread, and what it got ("session" or "error")."""
    got = {}

    def open_writer():
        try:
            got["session"] = Session(store, RequestedLockType.RW, 5000)
        except Exception as e:
            got["error"] = e
    t = threading.Thread(target=open_writer)
    t.start()
    return t, got


def test_commit_publishes_allocations_metadata_and_hash_and_ends_the_writer(store):
    w = GMSClientMemoryManager(store)
    w.connect(RequestedLockType.RW)
    va = w.create_mapping(size=4096, tag="weights")
    aid = w.mappings[va].allocation_id
    assert w.granted_lock_type == GrantedLockType.RW and w.mappings[va].layout_slot == 0
    w.metadata_put("tensor.0", aid, 0, b"weights")
    assert w.commit()
    assert w.is_unmapped and not w.is_connected and w.mappings[va].handle == 0  # as GMS: unmapped, VAs kept
    with Session(store, RequestedLockType.RO, None) as r:
        assert r.lock_type == GrantedLockType.RO and r.committed
        assert [a.allocation_id for a in r.list_allocations()] == [aid]
        assert r.metadata_get("tensor.0") == (aid, 0, b"weights")
        assert len(r.get_memory_layout_hash()) == 32
    w.close()


def test_a_dropped_writer_leaves_nothing_and_the_next_starts_clean(store):
    w = Session(store, RequestedLockType.RW, None)
    aid, _ = w.allocate(4096, "weights")
    w.metadata_put("stale", aid, 0, b"value")
    w._transport._socket.shutdown()  # the connection lost mid-session
    w._transport._socket.close()
    with Session(store, RequestedLockType.RW, None) as n:
        assert n.list_allocations() == [] and n.metadata_list() == []


def test_rw_or_ro_is_a_writer_on_an_empty_store_and_a_reader_on_a_committed_one(store):
    s = Session(store, RequestedLockType.RW_OR_RO, 100)
    assert s.lock_type == GrantedLockType.RW
    s.commit()
    with Session(store, RequestedLockType.RW_OR_RO, 100) as s:
        assert s.lock_type == GrantedLockType.RO and s.committed


def test_a_writer_starts_from_nothing_but_its_crash_keeps_the_last_commit(store):
    w = GMSClientMemoryManager(store)
    w.connect(RequestedLockType.RW)
    va = w.create_mapping(size=4096, tag="weights")
    w.metadata_put("tensor.0", w.mappings[va].allocation_id, 0, b"v1")
    w.commit()
    second = Session(store, RequestedLockType.RW, None)
    assert second.list_allocations() == [] and second.metadata_list() == []  # GMS's semantics
    second.close()  # without commit: gmsfs keeps the published model (GMS would have lost it)
    with Session(store, RequestedLockType.RO, None) as r:
        assert r.metadata_get("tensor.0")[2] == b"v1"
    w.close()


HOLD_READ = """
import sys
import gmsfs.gms as g
from gmsfs._gms_session import _GMSClientSession
s = _GMSClientSession(sys.argv[1], g.RequestedLockType.RO, None)
print("held", flush=True)
sys.stdin.readline()
s.close()
"""


def test_a_waiting_writer_holds_new_readers_back_until_the_last_reader_goes(store):
    # The reader is another process here; the test after this one has it a thread of this
    # one, as GMS's own test does.
    Session(store, RequestedLockType.RW, None).commit()
    reader = subprocess.Popen([sys.executable, "-c", HOLD_READ, store], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True, env=dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python")))
    assert reader.stdout.readline().strip() == "held"
    t, got = writer_in_thread(store)
    wait_writers(store, 1)
    with pytest.raises(TimeoutError, match="Timeout waiting for lock"):
        Session(store, RequestedLockType.RO, 100)
    with pytest.raises(TimeoutError, match="Timeout waiting for lock"):
        Session(store, RequestedLockType.RW_OR_RO, 100)
    reader.communicate("go\n")
    t.join(5)
    assert got["session"].lock_type == GrantedLockType.RW
    got["session"].close()


def test_sessions_are_connections_as_gms_has_them_threads_of_one_process_included(store):
    """GMS's own test, as it is written: the reader is a thread of this process.  Its
    sessions are its connections' (GMSFS_OWN): the writer waits for the same process's
    read, counted as a waiting writer, new readers wait behind it, and it is granted when
    the read ends; two readers of one process are two RO sessions."""
    Session(store, RequestedLockType.RW, None).commit()
    reader = Session(store, RequestedLockType.RO, None)
    other = Session(store, RequestedLockType.RO, None)
    assert reader.get_lock_state().ro_session_count == 2
    other.close()
    t, got = writer_in_thread(store)
    wait_writers(store, 1)
    assert t.is_alive() and reader.get_lock_state().waiting_writers == 1
    with pytest.raises(TimeoutError, match="Timeout waiting for lock"):
        Session(store, RequestedLockType.RO, 100)
    reader.close()
    t.join(5)
    assert "error" not in got and got["session"].lock_type == GrantedLockType.RW
    got["session"].close()


def test_a_session_of_its_own_keeps_the_process_rules_for_everything_else(store):
    """gmsfs.connect(own=True) beside the process's own locks: a plain reader that asks to
    write still gets EDEADLK at once (a shell never waits for itself); an own writer in the
    same thread waits its timeout out, counted while it waits, then nothing changed; an own
    reader does not join this process's writer session."""
    import gmsfs
    with gmsfs.connect(store, "rw") as w:
        w.create("x", 4096)
        w.commit()
    r = gmsfs.connect(store, "ro")
    t0 = time.monotonic()
    with pytest.raises(gmsfs.GmsfsError) as e:
        gmsfs.connect(store, "rw", timeout=5)
    assert e.value.errno == errno.EDEADLK and time.monotonic() - t0 < 2
    with pytest.raises(gmsfs.GmsfsError) as e:
        gmsfs.connect(store, "rw", timeout=0.3, own=True)
    assert e.value.errno == errno.ETIMEDOUT
    assert read_fields(os.path.join(store, "state"))["waiting_writers"] == "0"
    r.close()
    w = gmsfs.connect(store, "rw")
    with pytest.raises(gmsfs.GmsfsError) as e:
        gmsfs.connect(store, "ro", timeout=0.3, own=True)  # a plain one would join the session
    assert e.value.errno == errno.ETIMEDOUT
    w.close()


def test_a_reader_refuses_writes_and_states_follow_the_store(store):
    w = Session(store, RequestedLockType.RW, None)
    aid, aligned = w.allocate(4096, "weights")
    ls = w.get_lock_state()
    assert ls.state == "RW" and ls.has_rw_session and ls.ro_session_count == 0
    assert w.get_allocation_state().allocation_count == 1
    for offset in (aligned, -1):  # refused by the daemon, then by GMS's checks with GMS's error
        with pytest.raises(RuntimeError, match="out of range"):
            w.metadata_put("tensor.bad", aid, offset, b"x")
    with pytest.raises(RuntimeError, match="unknown allocation_id nope"):
        w.metadata_put("tensor.bad", "nope", 0, b"x")
    assert w.metadata_list() == []  # nothing changed
    w.metadata_put("tensor.0", aid, 0, b"x")
    w.commit()
    with Session(store, RequestedLockType.RO, None) as r:
        for call in (lambda: r.allocate(4096, "weights"), r.commit, lambda: r.metadata_delete("tensor.0"),
                     lambda: r.metadata_put("tensor.0", aid, 0, b"y")):
            with pytest.raises(RuntimeError, match="not allowed for RO session"):
                call()
        ls = r.get_lock_state()
        assert ls.state == "RO" and not ls.has_rw_session and ls.ro_session_count == 1 and ls.is_ready
        assert r.get_allocation_state().allocation_count == 1
        assert r.metadata_get("tensor.0")[2] == b"x"


def test_destroy_mapping_frees_the_allocation_and_its_metadata(store):
    w = GMSClientMemoryManager(store)
    w.connect(RequestedLockType.RW)
    va = w.create_mapping(size=4096, tag="weights")
    w.metadata_put("tensor.0", w.mappings[va].allocation_id, 0, b"payload")
    w.destroy_mapping(va)
    assert w.list_handles() == [] and w.metadata_list() == []
    w.close()


def test_remap_after_the_same_structure_and_after_another(store):
    def publish(size, value):
        w = GMSClientMemoryManager(store)
        w.connect(RequestedLockType.RW)
        va = w.create_mapping(size=size, tag="weights")
        gmsfs_buf = w._client._conn().buffer(va, 4, writable=True)
        gmsfs_buf[:] = value
        w.metadata_put("tensor.0", w.mappings[va].allocation_id, 0, b"shape")
        w.commit()
        w.close()
    publish(4096, b"one!")
    r = GMSClientMemoryManager(store)
    r.connect(RequestedLockType.RO)
    aid = r.list_handles()[0].allocation_id
    va = r.create_mapping(allocation_id=aid)
    r.unmap_all_vas()
    r.abort()
    publish(4096, b"two!")  # the same structure, new bytes: accepted, at the same address
    r.connect(RequestedLockType.RO)
    r.remap_all_vas()
    assert r.mappings[va].handle and r.mappings[va].va == va
    assert bytes(r._client._conn().buffer(va, 4)) == b"two!"
    new = r.mappings[va].allocation_id  # a new layout's allocation: a new id, as GMS's
    assert new != aid and new.startswith("slot000000-") and r.metadata_get("tensor.0") == (new, 0, b"shape")
    assert r.list_handles()[0].allocation_id == new and "%gms.ids" not in r.metadata_list()
    with pytest.raises(RuntimeError, match="unknown allocation_id " + aid):
        r.get_handle_info(aid)  # the old layout's id
    r.unmap_all_vas()
    r.abort()
    publish(8192, b"big!")  # another structure
    r.connect(RequestedLockType.RO)
    with pytest.raises(StaleMemoryLayoutError, match="Layout changed"):
        r.remap_all_vas()
    r.close()


def test_reallocate_all_handles_puts_fresh_memory_behind_the_kept_addresses(store):
    m = GMSClientMemoryManager(store)
    m.connect(RequestedLockType.RW)
    va = m.create_mapping(size=4096, tag="weights")
    m._client._conn().buffer(va, 4, writable=True)[:] = b"old!"
    assert m.commit()
    m.connect(RequestedLockType.RW)
    m.reallocate_all_handles(tag="weights")
    assert m.mappings[va].handle == 0  # as GMS: mapped at remap_all_vas
    m.remap_all_vas()
    assert m.mappings[va].va == va and m.mappings[va].handle and m.granted_lock_type == GrantedLockType.RW
    assert bytes(m._client._conn().buffer(va, 4)) == b"\0\0\0\0"  # fresh memory
    m.close()


def test_a_kv_cache_paused_uncommitted_resumes_on_fresh_memory_at_its_addresses(store):
    """SGLang's KV cache through GMS's memory saver: a writer that never commits pauses
    (unmap_all_vas, abort: its session rolls back, the memory goes) and resumes (connect
    RW, reallocate_all_handles, remap_all_vas): fresh memory at the same addresses, though
    the allocations it names went with the rolled-back session."""
    m = GMSClientMemoryManager(store)
    m.connect(RequestedLockType.RW)
    vas = [m.create_mapping(size=8192, tag="kv_cache") for _ in range(3)]
    m._client._conn().buffer(vas[0], 4, writable=True)[:] = b"kv!!"
    m.unmap_all_vas()
    m.abort()
    assert read_fields(os.path.join(store, "state"))["state"] == "EMPTY"  # rolled back: nothing held
    m.connect(RequestedLockType.RW)
    m.reallocate_all_handles(tag="kv_cache")
    m.remap_all_vas()
    assert [m.mappings[va].va for va in vas] == vas and all(m.mappings[va].handle for va in vas)
    assert m.granted_lock_type == GrantedLockType.RW
    c = m._client._conn()
    c.buffer(vas[2], 4, writable=True)[:] = b"new!"
    assert bytes(c.buffer(vas[2], 4)) == b"new!" and bytes(c.buffer(vas[0], 4)) == b"\0\0\0\0"
    m.close()


def test_metadata_keys_that_are_no_paths_round_trip(store):
    w = Session(store, RequestedLockType.RW, None)
    aid, _ = w.allocate(4096)
    keys = ["model.layers.0.weight", "a/b", "with space", "/abs", "a//b", "%x", "..", "ünïcode"]
    for k in keys:
        w.metadata_put(k, aid, 0, k.encode())
    assert w.metadata_list() == sorted(keys) and w.metadata_list("a") == ["a//b", "a/b"]
    assert all(w.metadata_get(k) == (aid, 0, k.encode()) for k in keys)
    assert w.metadata_delete("a//b") and not w.metadata_delete("a//b")
    w.close()


def test_unknown_stores_and_raw_descriptors_are_refused_clearly(store, tmp_path):
    with pytest.raises(FileNotFoundError, match="neither a gmsfs store"):
        Session(str(tmp_path / "gms.sock"), RequestedLockType.RO, 0)
    w = GMSClientMemoryManager(store)
    w.connect(RequestedLockType.RW)
    with pytest.raises(NotImplementedError, match="libgmsfs"):
        w.export_handle("slot000000")
    w.close()


def test_get_socket_path_is_the_store_of_the_tag(mount, monkeypatch):
    monkeypatch.setenv("GMSFS_GMS_MOUNT", mount)
    p = gms.get_socket_path(0, "kv_cache")
    assert p == os.path.join(mount, "kv_cache") and os.path.isfile(os.path.join(p, "lock"))
    os.rmdir(p)


def test_a_gms_socket_path_of_the_mounts_device_is_its_store_of_the_tag(mount, tmp_path, monkeypatch):
    monkeypatch.setattr(gmsfs.ctl, "mounts", lambda: [mount])  # host mounts of one machine share a uuid
    uuid = gmsfs.ctl.status(mount)["device"]["uuid"]
    sock = str(tmp_path / ("gms_%s_weights.sock" % uuid))  # where GMS's server would listen
    w = GMSClientMemoryManager(sock)
    w.connect(RequestedLockType.RW)
    w.create_mapping(size=4096, tag="weights")
    assert w.commit() and os.path.isfile(os.path.join(mount, "weights", "allocs", "slot000000"))
    r = Session(os.path.join(mount, "weights"), RequestedLockType.RO, None)  # the store's own path: the same store
    assert [a.allocation_id.split("-")[0] for a in r.list_allocations()] == ["slot000000"]
    r.close()
    w.close()
    os.rmdir(os.path.join(mount, "weights"))


IMPORTS = """
import gpu_memory_service.client.memory_manager as mm
from gpu_memory_service.client.session import _GMSClientSession
from gpu_memory_service.common.locks import RequestedLockType
from gpu_memory_service.common.protocol.messages import GetAllocationResponse
import gmsfs.gms
assert mm.GMSClientMemoryManager is gmsfs.gms.GMSClientMemoryManager and mm.StaleMemoryLayoutError
assert RequestedLockType.RW_OR_RO.value == "rw_or_ro"
print("ok")
"""


def test_import_gpu_memory_service_gives_the_shim():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.join(ROOT, "python"), gms.alias_path()]))
    r = subprocess.run([sys.executable, "-c", IMPORTS], env=env, capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr
    r = subprocess.run([sys.executable, "-m", "gmsfs.gms", "--path"], env=env, capture_output=True, text=True)
    assert r.stdout.strip() == gms.alias_path()


def test_torch_helpers_publish_and_materialize_a_module(store):
    torch = pytest.importorskip("torch")
    import gmsfs.gms_torch as gtm
    w = GMSClientMemoryManager(store)
    w.connect(RequestedLockType.RW)
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.Linear(4, 2))
    va = w.create_mapping(size=4096, tag="weights")
    off = 0
    model = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.Linear(4, 2))
    for (name, p), (_, q) in zip(model.named_parameters(), ref.named_parameters()):  # into the store
        t = gtm._tensor_from_pointer(va + off, list(p.shape), list(p.stride()), p.dtype, 0, torch.device("cpu"))
        t.copy_(q.detach())
        mod, attr = gtm._resolve_module_attr(model, name)
        mod._parameters[attr] = torch.nn.Parameter(t, requires_grad=False)
        off += (p.numel() * p.element_size() + 511) // 512 * 512
    gtm.register_module_tensors(w, model)
    w.commit()
    r = GMSClientMemoryManager(store)
    r.connect(RequestedLockType.RO)
    fresh = torch.nn.Sequential(torch.nn.Linear(8, 4, device="meta"), torch.nn.Linear(4, 2, device="meta"))
    gtm.materialize_module_from_gms(r, fresh, device_index=0)
    x = torch.randn(3, 8)
    assert torch.equal(fresh(x), ref(x))
    assert sorted(r.metadata_list()) == sorted(n for n, _ in ref.named_parameters())
    specs = gtm.GMSTensorSpec.load_all(r)  # GMS's other way: a spec per tensor, each materialized alone
    assert sorted(specs) == sorted(n for n, _ in ref.named_parameters())
    for name, q in ref.named_parameters():
        assert specs[name].allocation_id == r.list_handles()[0].allocation_id and torch.equal(
            specs[name].materialize(r, 0), q.detach())
    r.close()
    w.close()


def test_gms_common_utils_that_gms_itself_imports():
    """What GMS's own modules (its server's, its CUDA helpers) take from common.utils and the
    manager's calls that hand out raw addresses: there, with GMS's contract."""
    gms.install()
    from gpu_memory_service.common.utils import fail, wait_for_weights_socket  # noqa: F401
    r = subprocess.run([sys.executable, "-c", "import gmsfs.gms as g; g.fail('the end: %s', 'said')"],
                       env=dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python")), capture_output=True, text=True)
    assert r.returncode == 1 and "the end: said" in r.stderr
    with pytest.raises(NotImplementedError, match="destroy_mapping or unmap_all_vas"):
        GMSClientMemoryManager("/nowhere").unmap_va(0)


def test_key_paths_fast_and_pattern_agree():
    # _key_path takes common keys by a few string scans and the rest by the pattern: both
    # must give the same path for any key (random keys over the characters that matter).
    import random
    from gmsfs._gms_common import _PLAIN_KEY, _key_path

    def by_pattern(key):
        if _PLAIN_KEY.match(key) and len(key) <= 1024 and (key.isascii() or len(key.encode()) <= 1024):
            return key
        return "%" + key.encode().hex()
    rng = random.Random(7)
    keys = ["".join(rng.choice("ab/.%\0\u00e9x") for _ in range(rng.randint(0, 8))) for _ in range(20000)]
    for key in keys + ["", "a" * 1024, "a" * 1025, "\u00e9" * 600, "layers/0/w", "x/..", "./a"]:
        assert _key_path(key) == by_pattern(key), repr(key)


def test_granularity_is_the_mounts_device_and_may_be_set(store):
    mm = GMSClientMemoryManager(store)
    dev = read_fields(os.path.join(os.path.dirname(store), "device"))
    assert mm.granularity == int(dev["granularity"])  # before connect too: read at the first ask
    mm.connect(RequestedLockType.RW)
    assert mm.granularity == int(dev["granularity"])
    mm.granularity = 1 << 21
    assert mm.granularity == 1 << 21
    mm.close()
    assert GMSClientMemoryManager("/nonexistent/store").granularity == 2 << 20  # no store: a CUDA device's


HOLD_FAILOVER = """
import asyncio, sys
import gmsfs.gms
gmsfs.gms.install()
from gpu_memory_service.failover_lock.flock import FlockFailoverLock
asyncio.run(FlockFailoverLock(sys.argv[1]).acquire("engine-a"))  # held until this process dies
print("held", flush=True)
sys.stdin.readline()
"""


def test_gms_failover_lock_elects_one_engine_and_a_death_hands_it_on(tmp_path):
    """gpu_memory_service.failover_lock on gmsfs.gms: the active engine holds it until it
    releases or dies; a standby waits (or times out with FailoverLockError), then takes it
    and says so in the file; owner() reads who took it last."""
    import asyncio
    gms.install()
    from gpu_memory_service.failover_lock import FailoverLock, FailoverLockError
    from gpu_memory_service.failover_lock.flock import FlockFailoverLock
    path = str(tmp_path / "engine.lock")
    standby = FlockFailoverLock(path)
    assert isinstance(standby, FailoverLock) and asyncio.run(standby.owner()) is None
    active = subprocess.Popen([sys.executable, "-c", HOLD_FAILOVER, path], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True,
                              env=dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python")))
    try:
        assert active.stdout.readline().strip() == "held"
        assert asyncio.run(standby.owner()) == "engine-a"
        with pytest.raises(FailoverLockError, match="not acquired within"):
            asyncio.run(standby.acquire("engine-b", poll_interval=0.01, timeout=0.2))
        assert standby._fd is None
        active.kill()  # its flock goes with it
        active.wait()

        async def take_and_give_back():
            await standby.acquire("engine-b", poll_interval=0.01, timeout=10)
            assert await standby.owner() == "engine-b"
            with pytest.raises(FailoverLockError, match="held already"):
                await standby.acquire("engine-b")
            await standby.release()
            assert standby._fd is None and await standby.owner() == "engine-b"  # the last holder's words
        asyncio.run(take_and_give_back())
    finally:
        active.kill()
        active.wait()


def test_docs_gms_table_says_only_what_gmsfs_gives():
    """docs/gms.md's table of GMS's client: every name it says gmsfs gives is there
    (tests/upstream/run.sh checks the other way, against GMS's tree)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("api_table", os.path.join(ROOT, "tests", "upstream", "api_table.py"))
    table = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(table)
    assert len(table.rows()) > 70
    assert table.missing_in_gmsfs() == []



def test_the_transport_answers_runtime_state_and_event_history_from_the_stores_files(store):
    """GMS's _GMSRPCTransport on a store: the runtime state (the state file) and the event
    history (STORE/history, in GMS's words) with no session taken and nothing changed;
    an abort and its session's end are one rw_aborted, as is a killed writer; session
    requests are refused, saying whose they are."""
    from gmsfs._gms_rpc import (_GMSRPCTransport, GetEventHistoryRequest, GetEventHistoryResponse,
                                GetRuntimeStateRequest, GetRuntimeStateResponse, GetStateHashRequest,
                                GetStateHashResponse)

    def ask(req, resp):
        with _GMSRPCTransport(store) as t:
            t.connect()
            return t.request(req, resp)

    def kinds():
        return [e.kind for e in ask(GetEventHistoryRequest(), GetEventHistoryResponse).events]

    empty = ask(GetRuntimeStateRequest(), GetRuntimeStateResponse)
    assert (empty.state, empty.committed, empty.is_ready, empty.memory_layout_hash) == ("EMPTY", False, False, "")
    w = GMSClientMemoryManager(store)
    w.connect(RequestedLockType.RW)
    w.create_mapping(size=4096, tag="weights")
    during = ask(GetRuntimeStateRequest(), GetRuntimeStateResponse)
    assert during.state == "RW" and during.has_rw_session and not during.committed
    assert w.commit()
    s = ask(GetRuntimeStateRequest(), GetRuntimeStateResponse)
    assert (s.state, s.committed, s.is_ready, s.ro_session_count, s.waiting_writers, s.allocation_count) == \
        ("COMMITTED", True, True, 0, 0, 1)
    assert s.memory_layout_hash == open(os.path.join(store, "layout_hash")).read().strip() != ""
    assert ask(GetStateHashRequest(), GetStateHashResponse).memory_layout_hash == s.memory_layout_hash
    assert kinds() == ["rw_connected", "committed"]
    assert read_fields(os.path.join(store, "state"))["read_handles"] == "0"  # asking took no read

    w2 = GMSClientMemoryManager(store)
    w2.connect(RequestedLockType.RW)
    w2.abort()
    assert kinds() == ["rw_connected", "committed", "rw_connected", "rw_aborted"]
    subprocess.run(["bash", "-c", "exec 9>$0/lock; echo > $0/abort", store], check=True)  # aborted, then left
    assert kinds()[4:] == ["rw_connected", "rw_aborted"]
    child = subprocess.Popen([sys.executable, "-c", "import os, sys, time; fd = os.open(sys.argv[1], os.O_WRONLY); "
                              "print(flush=True); time.sleep(60)", os.path.join(store, "lock")],
                             stdout=subprocess.PIPE)
    child.stdout.readline()  # it holds the writer's lock
    child.kill()
    child.wait()
    wait_writers(store, 0)
    end = time.time() + 5
    while len(kinds()) < 8:
        assert time.time() < end, kinds()
        time.sleep(0.01)
    assert kinds()[6:] == ["rw_connected", "rw_aborted"]

    with _GMSRPCTransport(store) as t:
        with pytest.raises(RuntimeError, match="disconnected"):
            t.request(GetRuntimeStateRequest(), GetRuntimeStateResponse)
        t.connect()
        with pytest.raises(NotImplementedError, match="GMSClientMemoryManager"):
            t.request(object(), object)
    with pytest.raises(ConnectionError, match="not running"):
        _GMSRPCTransport(os.path.join(store, "no-such")).connect()
    w.close()


def test_gms_modules_for_the_transport_and_messages_are_gmsfs_s(store):
    """import gpu_memory_service.client.rpc and .common.protocol.messages give gmsfs's
    transport and GMS's message names (the responses the client returns among them)."""
    code = ("import gmsfs.gms; gmsfs.gms.install(); "
            "from gpu_memory_service.client.rpc import _GMSRPCTransport; "
            "from gpu_memory_service.common.protocol.messages import (GetEventHistoryRequest, "
            "GetRuntimeStateResponse, GetLockStateResponse, AllocateResponse); "
            "print(_GMSRPCTransport.__module__, GetLockStateResponse.__module__)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python")))
    assert r.returncode == 0 and r.stdout.split() == ["gmsfs._gms_rpc", "gmsfs._gms_common"], r.stderr
