"""gmsfs.torch.refit: a trainer's new weights into the store its engines serve, in place.
gmsfs.torch re-exports it."""
import errno
import json
import os

import torch

from gmsfs import Connection, GmsfsError, connect, versions
from gmsfs._fields import read_fields
from gmsfs._torch_layout import PREFIX, _bytes_at, _device, _DTYPES, _ITEMSIZE, _where
from gmsfs._torch_materialize import _DTYPE_NAMES, _names_differ


def _sources(source):
    """{name: tensor} of a module (its parameters and buffers, tied ones under each name)
    or of a dict name -> tensor (a state_dict)."""
    if isinstance(source, torch.nn.Module):
        return {name: t for name, (_, _, t, _, _) in _where(source).items()}
    if isinstance(source, dict):
        return dict(source)
    raise TypeError("refit: source is a torch.nn.Module or a dict of name -> tensor, not %s" % type(source).__name__)


def _targets(conn):
    """{name: (alloc, offset, size, dtype, shape, stride, storage_offset)} of the store's
    tensor entries (metadata only: nothing is mapped)."""
    out = {}
    for e in conn.meta_items(PREFIX):
        v = json.loads(e.value)
        out[e.key[len(PREFIX):]] = (e.alloc, e.offset, e.size, _DTYPES[v["dtype"]], tuple(v["shape"]),
                                    tuple(v["stride"]), v["storage_offset"])
    return out


def _check(store, targets, sources, strict):
    """Every difference between the store's tensors and source's, both sides named: a
    KeyError for names, a RuntimeError for shapes and dtypes."""
    missing = sorted(set(sources) - set(targets))
    extra = sorted(set(targets) - set(sources)) if strict else []
    if missing or extra:
        # _names_differ says what the store lacks, then what the module (here: source) lacks.
        raise KeyError(_names_differ("refit", store, missing, extra).replace("the module lacks",
                                                                             "the source lacks"))
    bad = []
    for name, t in sources.items():
        target = targets[name]
        if t.shape == target[4] and t.dtype == target[3]:
            continue  # the common case first: a refit checks each tensor at the copies' start
        dtype, shape = target[3:5]
        if tuple(t.shape) != shape:
            bad.append("size mismatch for %s: the store has shape %s, the source has shape %s"
                       % (name, list(shape), list(t.shape)))
        elif t.dtype != dtype:
            bad.append("dtype mismatch for %s: the store has %s, the source has %s"
                       % (name, _DTYPE_NAMES.get(dtype, dtype), _DTYPE_NAMES.get(t.dtype, t.dtype)))
    if bad:
        raise RuntimeError("refit %s: %d tensor(s) do not match, nothing was written:\n  %s"
                           % (store, len(bad), "\n  ".join(bad)))


def _plan(conn):
    """The store's tensors and the destinations made so far, kept on the connection while
    its layout is the same (a data-only session cannot change it): a trainer that refits
    again through the same connection reads no metadata and makes no tensor again."""
    plan = getattr(conn, "_refit_plan", None)
    if plan is not None and plan.pop("prepared", False):
        return plan  # refit_prepare's, in this same data-only session: nothing could change
    h = conn.layout_hash
    if plan is None or plan["hash"] != h:
        targets = _targets(conn)
        if not targets:
            raise GmsfsError(errno.ENOENT, "refit %s: the store has no tensors (publish the model first)"
                             % conn.store)
        plan = conn._refit_plan = {"hash": h, "targets": targets, "dst": {}, "bases": {}, "mapped": False}
    else:
        plan["mapped"] = bool(plan["dst"]) and len(conn.mappings) > 0
    return plan


def _destination(conn, plan, name, device):
    """The store's tensor name, over its mapping: one typed tensor over each allocation (a
    tensor made from a pointer is the costly part), each destination a strided view of it
    (storage_offset counts from its start)."""
    dst = plan["dst"].get(name)
    if dst is not None:
        return dst
    alloc, offset, size, dtype, shape, stride, soff = plan["targets"][name]
    try:
        m = conn.find(alloc)
    except KeyError:  # a refit before wrote other tensors (a next version: only theirs)
        m = conn.import_one(alloc)
    isz = _ITEMSIZE[dtype]
    bases = plan["bases"]
    if offset % isz:  # not at a whole item of its allocation: a view of its own bytes
        dst = _bytes_at(m.ptr + offset, size, device).view(dtype).as_strided(shape, stride, soff)
    else:
        base = bases.get((alloc, dtype))
        if base is None:
            n = m.size
            b = bases.get(alloc)
            if b is None:
                b = bases[alloc] = _bytes_at(m.ptr, n, device)
            base = bases[(alloc, dtype)] = b[:n - n % isz].view(dtype)
        dst = base.as_strided(shape, stride, offset // isz + soff)
    plan["dst"][name] = dst
    return dst


def _contiguous(shape, stride):
    want = 1
    for n, s in reversed(list(zip(shape, stride))):
        if n != 1 and s != want:
            return False
        want *= n
    return True


def _whole(store, targets, sources, allocs):
    """Of allocs, those whose every byte source's tensors write (contiguous tensors whose
    bytes together span the allocation, its size as STORE/allocs says): their next version
    needs no copy of the last commit's bytes."""
    spans = {}
    for name, t in sources.items():
        alloc, offset, _, dtype, shape, stride, soff = targets[name]
        if alloc in allocs and t.numel():
            if not _contiguous(shape, stride):
                spans[alloc] = None  # gaps inside it: not whole
            elif spans.get(alloc, []) is not None:
                start = offset + soff * _ITEMSIZE[dtype]
                spans.setdefault(alloc, []).append((start, start + t.numel() * _ITEMSIZE[dtype]))
    whole = set()
    for alloc, s in spans.items():
        if s is None:
            continue
        end = 0
        for a, b in sorted(s):
            if a > end:
                break
            end = max(end, b)
        if end >= os.stat(os.path.join(store, "allocs", alloc)).st_size:
            whole.add(alloc)
    return whole


def _copy(conn, plan, sources, device, seal):
    """source's tensors into the store's, allocation by allocation: each made writable
    just before its first copy and, with seal "protect" (a commit follows), read-only
    again once its copies have landed; with seal "close" (a commit follows, and the
    connection closes with it) left as they are: the disconnect right after the commit
    unmaps them; seal None leaves them.  On a GPU each access change (cuMemSetAccess,
    about 0.1 ms a GB) then runs while the copies queued after it run: made before and
    after all of them, a 16 GB model's two changes would add 3.7 ms to its 8 ms copy
    (H200).  Unmapped as they land instead, the unmaps would stretch the copies they run
    beside (two H200, 5.77 GB a rank: 3.39 ms against 3.22), where after the commit they
    delay no engine."""
    targets = plan["targets"]
    by_alloc = {}
    for name, t in sources.items():
        if t.numel():
            by_alloc.setdefault(targets[name][0], []).append((name, t))
    cuda = device.type == "cuda"
    landed = []
    with torch.no_grad():
        for alloc, tensors in by_alloc.items():
            first = _destination(conn, plan, tensors[0][0], device)  # mapped (imported) now
            conn.protect(alloc, True)
            first.copy_(tensors[0][1].detach())
            for name, t in tensors[1:]:
                _destination(conn, plan, name, device).copy_(t.detach())
            if seal == "protect":
                done = None
                if cuda:
                    done = torch.cuda.Event()
                    done.record()
                landed.append((alloc, done))
    if cuda and seal:
        conn.commit_soon()  # the daemon is awake for the commit when the copies land
    for alloc, done in landed:
        if done is not None:
            done.synchronize()
        conn.protect(alloc, False)
    if cuda:
        torch.cuda.synchronize()


def _ready(conn, sources, strict):
    """The plan of a writer's connection for sources, checked, with the allocations their
    tensors lie in imported (none again where a refit before, or refit_prepare, did)."""
    plan = _plan(conn)
    _check(conn.store, plan["targets"], sources, strict)
    if plan["mapped"]:
        return plan
    targets = plan["targets"]
    needed = {targets[name][0] for name, t in sources.items() if t.numel()}
    if read_fields(os.path.join(conn.store, "state")).get("beside") == "1":
        # A next version beside the engines: only these are made, and those written whole
        # without a copy of the last commit's bytes (its time is the refit's own).
        whole = _whole(conn.store, targets, sources, needed)
        if whole:
            conn.import_overwrite(sorted(whole))
        rest = needed - whole
        if rest and needed == {a for a, *_ in targets.values()}:
            conn._import_all()  # the rest, copied, in one round trip (those mapped stay)
        else:
            for alloc in sorted(rest):
                conn.import_one(alloc)
    else:
        conn._import_all()  # the committed allocations, writable: from here on, in place
    return plan


def refit_prepare(source, store, strict=True, timeout=None):
    """All a refit does before its copies, done ahead: while a trainer's step computes the
    weights, not after.  The store is taken for writing (a data-only session: timeout as
    refit's), source's names, shapes and dtypes are checked (its values are not read), the
    allocations its tensors lie in are imported (beside the engines of a store with
    versions: the next version's memory, made, or taken from what the daemon made ahead
    once the engines left the version before), and a tensor over each destination is made.
    Returns the connection: gmsfs.torch.refit(source, conn, ...) then copies and commits
    only.  Closed without a refit (or killed), the session rolls back: nothing was written.
    On a store without versions the session waits for every engine to sleep or pause, and
    holds them there until the refit commits: prepare there only as the refit is due."""
    if not isinstance(store, Connection) and read_fields(os.path.join(store, "state")).get("state") == "EMPTY":
        raise GmsfsError(errno.ENOENT, "refit %s: the store has no tensors (publish the model first)" % store)
    conn = store if isinstance(store, Connection) else connect(store, "data", timeout)
    try:
        if conn.lock_mode != "rw" or conn.paused:
            raise GmsfsError(errno.EPERM, "refit_prepare: %s is not held for writing (%s)"
                             % (conn.store, "paused" if conn.paused else conn.lock_mode))
        sources = _sources(source)
        plan = _ready(conn, sources, strict)
        device = _device(conn)
        for name, t in sources.items():
            if t.numel():
                _destination(conn, plan, name, device)
        plan["mapped"] = plan["prepared"] = True
    except BaseException:
        if conn is not store:
            conn.close()
        raise
    return conn


def refit(source, store, strict=True, timeout=None, commit=True, version=None, _name_new=False, _closing=False):
    """Copy source's tensors (a module's parameters and buffers by name, or a dict name ->
    tensor such as a state_dict) into the store's tensors of the same names, in place: the
    store's layout stays as committed, only its bytes change, and no second copy of the
    model is made on the device.  store: a path, taken for writing in a data-only session
    (RW_DATA: nothing of its layout can change; the call waits until every engine sleeps
    or pauses, timeout seconds; None: as long as it takes), or a writer's Connection (one
    refit_prepare made: only the copies and the commit are left); or
    a paused Connection (a trainer that keeps its mappings between refits: resumed as a
    data-only writer, paused again after its commit, nothing mapped again).  Engines see
    the new weights when they wake or resume (at the same addresses).

    Every name, shape and dtype is checked before a byte is written: a KeyError (names)
    or a RuntimeError (shapes, dtypes) names each difference with both sides, and the
    store is unchanged (a paused connection stays paused: it is checked before it
    resumes).  strict: source must name every tensor of the store (otherwise engines
    would serve old and new weights side by side); strict=False refits the ones source
    names.

    The bytes go into the committed allocations: a writer that ends without a commit from
    then on (killed, aborted) leaves the store TORN (gmsfs(5)), refused to every reader
    until a later commit, never served half written.  On a store with versions
    (user.gms.versions 2) the call does not wait for the engines: it builds the next
    version beside them, writing copies of only the allocations source's tensors lie in
    (a killed trainer leaves the last commit whole; an allocation whose every byte they
    write is made for it without a copy of the last commit's bytes:
    Connection.import_overwrite), and engines move to it with flip().
    commit: publish at the end (the connection then holds the read lock, or is paused
    again); False leaves the session open for more.  version: the commit's name (a
    trainer's step; gmsfs(5), NAMED VERSIONS), a store's once: refused (GmsfsError EEXIST)
    before anything is written when the store had a commit of that name.  Returns the
    connection (the caller closes it)."""
    if version is not None and not commit:
        raise ValueError("refit: version names the commit, and commit=False makes none")
    if not isinstance(store, Connection) and read_fields(os.path.join(store, "state")).get("state") == "EMPTY":
        raise GmsfsError(errno.ENOENT, "refit %s: the store has no tensors (publish the model first)" % store)
    conn = store if isinstance(store, Connection) else connect(store, "data", timeout)
    paused = conn.paused
    # A connection a refit paused kept its layout since (only a data-only session passes a
    # paused handle): its plan holds, and source is checked against it before the resume.
    plan = getattr(conn, "_refit_plan", None) if paused else None
    kept = plan is not None and plan.pop("kept", False)
    try:
        sources = _sources(source)
        # (_name_new: the caller, gmsfs.Group, looked already; the commit refuses it anyway)
        if version is not None and not _name_new and any(v[1] == version for v in versions(conn.store)):
            raise GmsfsError(errno.EEXIST, "refit %s: a commit of the store was version %s already (%s/versions)"
                             % (conn.store, version, conn.store))
        if kept:
            _check(conn.store, plan["targets"], sources, strict)
        if paused:  # its mappings kept: no import, no map; each made writable as _copy reaches it
            conn.resume("data", timeout, keep_read_only=True)
        if conn.lock_mode != "rw":
            raise GmsfsError(errno.EPERM, "refit: %s is not held for writing (%s)" % (conn.store, conn.lock_mode))
        if not kept:
            plan = _ready(conn, sources, strict)
        # _closing (gmsfs.Group): the connection closes with the commit (its request gives
        # the lock back), so its mappings are not made read-only (about what their unmap
        # costs again): the close unmaps them once the commit is made (5.77 GB: 0.8-1.1
        # ms on an H200 that delay the trainer, not the engines, which may flip by then).
        closing = _closing and commit and not paused
        _copy(conn, plan, sources, _device(conn), None if not commit else "close" if closing else "protect")
        if closing:
            conn._refit_plan = None  # its tensors are over the mappings that go now
            conn.commit(version=version, close=True)  # the lock given back by the commit's request
        elif commit:
            conn.commit(version=version)
            if paused:
                conn.pause()  # as it came: its mappings kept for the next refit
                plan["kept"] = True
    except BaseException:
        if conn is not store:
            conn.close()  # nothing written: rolled back whole; written: TORN until a commit
        raise
    return conn
