"""gmsfs.torch: share a PyTorch module's parameters and buffers through a gmsfs store.

The first process builds the module, loads its weights and publishes; every later
process builds the same module (on the meta device where it can) and materializes it:
each parameter and buffer becomes a view of the store's memory, with no copy and no
extra memory.  GMS's RW_OR_RO flow is load_or_publish:

    model = gmsfs.torch.load_or_publish("/run/gmsfs/GPU-.../llama", build, load_weights)

On a GPU the writer allocates straight into the store (allocator(): libgmsfs's C
allocator behind torch.cuda.MemPool), so publishing copies nothing.  Entries are
"torch/NAME": the tensor's extent in its allocation, and as value JSON with dtype,
shape, stride, storage_offset.  Entries named private get a copy of their own in
every process (buffers an engine changes after load); the rest is read-only.
"""
import contextlib
import ctypes
import errno
import json
import os
from collections import deque
from itertools import repeat as _repeat
from operator import attrgetter, is_ as _is, setitem

import torch

from . import Connection, GmsfsError, _lib, connect
from ._lib import lib as _c

# The layout of include/gmsfs/torch.h (gmsfs(5), "Tensors"); tests check these against it.
PREFIX = "torch/"
TAG = "torch"
ALIGN = 512
SLAB_BYTES = 1 << 30

_DTYPES = {str(d).replace("torch.", ""): d for d in (
    torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int16,
    torch.int8, torch.uint8, torch.bool, torch.complex64, torch.complex128)}
for _name in ("float8_e4m3fn", "float8_e5m2", "uint16", "uint32", "uint64"):
    if hasattr(torch, _name):
        _DTYPES[_name] = getattr(torch, _name)
_ITEMSIZE = {d: torch.empty(0, dtype=d).element_size() for d in _DTYPES.values()}
_DTYPE_NUMBER = {d: i for i, d in enumerate(_DTYPES.values())}  # in a typed base's key


def _where(module, prefix=""):
    """{name: (dict, attribute, tensor, is_parameter, owner)} of every parameter and buffer
    of module, each module's parameters then its buffers, module by module in order; a
    module or tensor reached by two paths is there under both names (tied weights).
    materialize's one pass over a module of hundreds: the least Python per module (its
    __dict__ read once, a call per module rather than a stack) and per tensor."""
    out = {}

    def visit(pre, m):
        md = m.__dict__
        d = md["_parameters"]
        if d:
            for attr, t in d.items():
                if t is not None:
                    out[pre + attr] = (d, attr, t, True, m)
        d = md["_buffers"]
        if d:
            for attr, t in d.items():
                if t is not None:
                    out[pre + attr] = (d, attr, t, False, m)
        for n, c in md["_modules"].items():
            if c is not None:
                visit(pre + n + ".", c)
    visit(prefix, module)
    return out


def _tensors(module, prefix=""):
    """[(name, owner, attribute, tensor, is_parameter)] of _where."""
    return [(name, m, attr, t, p) for name, (_, attr, t, p, m) in _where(module, prefix).items()]


def _storage(t):
    """(pointer, bytes) of a tensor's storage."""
    s = t.untyped_storage() if hasattr(t, "untyped_storage") else t.storage()
    return s.data_ptr(), s.nbytes()


def _private(private):
    if callable(private):
        return private
    names = set(private or ())
    return lambda name: name in names


class _CudaBytes:
    """n bytes of device memory at ptr, for torch.as_tensor (no copy)."""

    def __init__(self, ptr, n):
        self.__cuda_array_interface__ = {"shape": (n,), "typestr": "|u1", "data": (ptr, False), "version": 3}


def _bytes_at(ptr, n, device):
    """A uint8 tensor over n bytes at ptr, on device, sharing the memory."""
    if device.type == "cuda":
        return torch.as_tensor(_CudaBytes(ptr, n), device=device)
    return torch.frombuffer((ctypes.c_uint8 * n).from_address(ptr), dtype=torch.uint8)


def _device(conn):
    if conn.backend == "cuda":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


# ---- the allocator ----

_allocator = None
_pools = []  # PyTorch keeps a pool's segments until the pool goes: keep them as long as we live


@contextlib.contextmanager
def allocator(conn, slab_bytes=0):
    """Within this block, CUDA allocations of this thread are carved out of slabs of the
    store (a writer's connection): parameters made here are published with no copy."""
    global _allocator
    if conn.backend != "cuda":
        raise GmsfsError(errno.EINVAL, "allocator: the store is in host memory (publish copies instead)")
    if _allocator is None:
        _allocator = torch.cuda.memory.CUDAPluggableAllocator(_lib.path, "gmsfs_torch_alloc", "gmsfs_torch_free")
    e = _c.gmsfs_torch_use(conn._handle(), slab_bytes)
    if e:
        conn._check(e, "allocator")
    pool = torch.cuda.MemPool(_allocator.allocator())
    _pools.append(pool)
    try:
        with torch.cuda.use_mem_pool(pool):
            yield pool
    finally:
        _c.gmsfs_torch_use(None, 0)


class GraphPool:
    """CUDA graphs of many shapes in the memory of the largest (xLLM's multi-shape graph
    memory, on gmsfs's virtual spaces).  An engine replays one graph per step, so graphs
    captured for different batch sizes may share memory: each capture gets an address
    range of its own over the same chunks of store (a writer's connection, or a store
    path: connected RW, kept uncommitted as scratch memory), so N captures cost the
    largest one, captured in any order, and each graph keeps its addresses for its life.

        pool = gmsfs.torch.GraphPool("/run/gmsfs/GPU-.../graphs")
        for bs in (1, 2, 4, 8):
            with pool.capture(graphs[bs]):        # torch.cuda.graph(graphs[bs], pool=...)
                out[bs] = model(static_in[bs])
        graphs[8].replay()                        # out[8] holds until another graph runs

    A graph's outputs are valid until another graph of the pool is replayed (they share
    memory): read or copy them first.  Run the model once before capturing (as vLLM and
    SGLang do), so that lazily made buffers come from PyTorch's own memory, not from one
    capture's.  One pool per process (gmsfs_graph_*: the allocator has no context)."""

    def __init__(self, store, chunk_bytes=64 << 20, span_bytes=0):
        self.conn = store if isinstance(store, Connection) else connect(store, "rw")
        self.conn._check(_c.gmsfs_graph_use(self.conn._handle(), chunk_bytes, span_bytes), "graph pool")
        self._alloc = None
        self.pools = []  # one MemPool per capture, kept with its graph

    @contextlib.contextmanager
    def capture(self, graph, **kwargs):
        """torch.cuda.graph(graph, pool=...) with this capture's memory in a space of its own."""
        if self._alloc is None:
            self._alloc = torch.cuda.memory.CUDAPluggableAllocator(_lib.path, "gmsfs_graph_alloc",
                                                                    "gmsfs_graph_free")
        self.conn._check(_c.gmsfs_graph_begin(), "graph pool: begin")
        pool = torch.cuda.MemPool(self._alloc.allocator())
        self.pools.append(pool)
        with torch.cuda.graph(graph, pool=pool.id, **kwargs):
            yield graph

    @property
    def nbytes(self):
        """The memory the pool holds: the largest capture's, in chunks."""
        return int(_c.gmsfs_graph_bytes())

    def close(self):
        _c.gmsfs_graph_use(None, 0, 0)
        self.conn.close()


# ---- publish ----

def _pack(conn, storages, device):
    """Copy storages that are not in the store into one new allocation: {ptr: (alloc, offset)}."""
    total = sum((n + ALIGN - 1) // ALIGN * ALIGN for n, _ in storages.values())
    have = {m.name for m in conn.mappings}
    i = 0
    while PREFIX + "packed%05d" % i in have:
        i += 1
    m = conn.create(PREFIX + "packed%05d" % i, max(total, 1), tag=TAG)
    where, off = {}, 0
    for ptr, (n, dev) in storages.items():
        dst = _bytes_at(m.ptr + off, n, device)
        dst.copy_(_bytes_at(ptr, n, dev))
        where[ptr] = (m.name, off)
        off += (n + ALIGN - 1) // ALIGN * ALIGN
    if device.type == "cuda":
        torch.cuda.synchronize()
    return where


def _entries(conn, items, is_private):
    """The entries that record items (name, owner, attr, tensor, is_param) where their
    memory is in the store; tensors that are not in it are copied into one new
    allocation first."""
    device = _device(conn)
    foreign = {}
    for _, _, _, t, _ in items:
        ptr, n = _storage(t)
        if t.numel() and conn.find_ptr(ptr) is None:
            foreign[ptr] = (n, t.device)
    placed = _pack(conn, foreign, device) if foreign else {}
    if not conn.mappings:
        conn.create(PREFIX + "empty", ALIGN, tag=TAG)  # empty tensors still name an allocation
    anchor = conn.mappings[0].name
    entries = []
    for name, _, _, t, is_param in items:
        ptr, n = _storage(t)
        if not t.numel():
            alloc, off, n = anchor, 0, 0
        elif ptr in placed:
            alloc, off = placed[ptr]
        else:
            m, off = conn.find_ptr(ptr)
            alloc = m.name
        value = {"dtype": str(t.dtype).replace("torch.", ""), "shape": list(t.shape), "stride": list(t.stride()),
                 "storage_offset": t.storage_offset(), "param": is_param}
        entries.append({"key": PREFIX + name, "alloc": alloc, "offset": off, "size": n,
                        "value": json.dumps(value, separators=(",", ":")), "private": bool(is_private(name))})
    return entries


def publish(module, store, private=(), commit=True):
    """Record every parameter and buffer of module as an entry of the store (a path, or a
    writer's Connection), commit, and rebind the module onto the store's memory.

    Tensors already in the store (allocated under allocator()) are recorded where they
    are; others are copied into one new allocation first.  private: names (or a test
    name -> bool) of tensors every process gets a copy of.  Returns the connection,
    which the module keeps (module._gmsfs): it holds the read lock after the commit."""
    conn = store if isinstance(store, Connection) else connect(store, "rw")
    if conn.lock_mode != "rw":
        raise GmsfsError(errno.EPERM, "publish: %s is not held for writing (%s)" % (conn.store, conn.lock_mode))
    conn.meta_put_many(_entries(conn, list(_tensors(module)), _private(private)))
    if commit:
        conn.commit()
        materialize(module, conn)
    return conn


# ---- materialize ----

_DTYPE_NAMES = {d: n for n, d in _DTYPES.items()}


class _Manifest:
    """The store's tensor entries, from one library call (gmsfs_torch_manifest) and one
    JSON parse:
      groups:  [[region, value, offset, gap, private, size, ptr, alloc, [name...]]]: rows
               that lie side by side, gap bytes apart, in one region (a range of this
               process's address space that mappings fill side by side: an index in
               regions), offset bytes into it, with the same value (an index in values)
               and extent; a model's layers, layer after layer.  region -1: a row with
               memory of its own (a private copy, at ptr), or none mapped (ptr null);
               alloc (an index in allocs, -1: none) and ptr are the first row's;
      regions: [[ptr, bytes]];
      values:  [(dtype, shape, stride, storage_offset, item size, dtype number,
               empty)], one per distinct value (a model's layers repeat their shapes;
               whether a tensor is a Parameter is the module's slot's to say);
      allocs:  [allocation name].
    A group's views are made by one call (_group_tensors)."""
    __slots__ = ("groups", "regions", "values", "allocs")

    def __init__(self, doc):
        self.groups, self.regions, self.allocs = doc["groups"], doc["regions"], doc["allocs"]
        self.values = [(_DTYPES[d["dtype"]], tuple(d["shape"]), tuple(d["stride"]), d["storage_offset"],
                        _ITEMSIZE[_DTYPES[d["dtype"]]], _DTYPE_NUMBER[_DTYPES[d["dtype"]]], 0 in d["shape"])
                       for d in doc["values"]]

    def places(self):
        """(name, region, value, byte offset in the region, ptr, alloc) of every row."""
        for region, vi, off, gap, _, _, ptr, alloc, names in self.groups:
            for i, name in enumerate(names):
                yield name, region, vi, off + i * gap, None if ptr is None else ptr + i * gap, alloc


_KEYS = 64  # > dtype numbers: a typed base's key is region * _KEYS + dtype number


def _manifest(conn):
    p, n = ctypes.c_void_p(), ctypes.c_size_t()
    conn._check(_c.gmsfs_torch_manifest(conn._handle(), ctypes.byref(p), ctypes.byref(n)), "materialize")
    try:
        return _Manifest(json.loads(ctypes.string_at(p, n.value)))
    finally:
        _c.gmsfs_text_free(p)


def _persistent(owner, attr, is_param):
    """In state_dict: parameters and persistent buffers (what a checkpoint holds)."""
    return is_param or attr not in owner._non_persistent_buffers_set


def _names_differ(what, store, missing, extra):
    return "%s %s: the store lacks %s; the module lacks %s" % (what, store, missing or "nothing", extra or "nothing")


def _lacking_buffers(module, items, device, init, store):
    """Non-persistent buffers the store lacks (a checkpoint never holds them): {owner:
    [attr]} of those still on the meta device, which the module's own code must make.
    Checked before the module is touched: who makes them, or an error that says what to
    call."""
    owners = {}
    for name, owner, attr, t, is_param in items:
        if not _persistent(owner, attr, is_param) and t.device.type == "meta":
            owners.setdefault(owner, []).append((name, attr))
    if not owners:
        return owners, None
    init = init or getattr(module, "_init_weights", None)  # a transformers model's own code
    names = sorted(n for v in owners.values() for n, _ in v)
    if init is None:
        raise RuntimeError("materialize %s: the store lacks the non-persistent buffers %s (no checkpoint holds "
                           "them) and they are on the meta device: pass init=FN (called as FN(owner) for each "
                           "module that owns some, once they are allocated on %s) to compute them, or publish "
                           "the module with gmsfs.torch.publish, which stores every buffer" % (store, names, device))
    with_params = [n for o, v in owners.items() if any(True for _ in o.parameters(recurse=False)) for n, _ in v]
    if with_params:
        raise RuntimeError("materialize %s: %s belong to modules with parameters of their own, which their init "
                           "would overwrite in the store: compute them yourself after materialize(strict=False)"
                           % (store, with_params))
    return owners, init


def _make_buffers(owners, init, device):
    """Allocate the lacking buffers, let the module's code fill them, and put them on the
    store's device.  They are made on the CPU where the module's code allows it: a few
    small tensors, and no GPU kernel (a fresh process's first kernels cost it tens of ms
    to load)."""
    cpu = torch.device("cpu")
    for owner, v in owners.items():
        try:
            left = _fill(owner, v, init, cpu)
        except RuntimeError:  # the module's code wants its device (its other tensors are there)
            left = _fill(owner, v, init, device)
        if left:
            raise RuntimeError("materialize: %s were left unset by %s: compute them after materialize(strict=False)"
                               % (left, getattr(init, "__qualname__", init)))
        for _, attr in v:
            owner._buffers[attr] = owner._buffers[attr].to(device)


def _fill(owner, v, init, device):
    """The buffers v of owner on device, filled by init: the names of those it left unset,
    neither writing to them (a tensor's version counter counts its writes) nor replacing
    them.  (Not a fill and a NaN check: each is one of a fresh process's first
    operations, which cost more than all of materialize's views.)"""
    made = {}
    for _, attr in v:
        b = owner._buffers[attr]
        t = owner._buffers[attr] = torch.empty(b.shape, dtype=b.dtype, device=device)
        made[attr] = (t, t._version)
    with torch.no_grad():
        init(owner)
    return [n for n, attr in v if owner._buffers[attr].device.type == "meta" or
            (owner._buffers[attr] is made[attr][0] and made[attr][0]._version == made[attr][1])]


def _mismatch(name, obj, t):
    """What differs between the store's tensor obj and the module's t, as load_state_dict says it."""
    if obj.shape != t.shape:
        return "size mismatch for %s: the store has shape %s, the module has shape %s" % (name, list(obj.shape),
                                                                                          list(t.shape))
    return "dtype mismatch for %s: the store has %s, the module has %s" % (
        name, _DTYPE_NAMES.get(obj.dtype, obj.dtype), _DTYPE_NAMES.get(t.dtype, t.dtype))


_Param = torch.nn.Parameter
_SHAPE, _DTYPE = attrgetter("shape"), attrgetter("dtype")


def _own_view(name, man, vi, ptr, size, alloc, device):
    """The tensor of a row that shares no base: empty, a private copy, or not at a whole
    item of its region: a view of its own bytes."""
    dtype, shape, stride, soff = man.values[vi][:4]
    if 0 in shape:
        return torch.empty(shape, dtype=dtype, device=device)
    if ptr is None:
        raise GmsfsError(errno.ENOENT, "materialize: %s's allocation %s is not mapped"
                         % (name, man.allocs[alloc] if alloc >= 0 else "(none)"))
    return _bytes_at(ptr, size, device).view(dtype).as_strided(shape, stride, soff)


def _group_tensors(man, group, bases, device):
    """A new plain tensor for each row of group, so that the work per tensor is in C, not
    in Python's bytecode: views of its region's typed base (one strided view of the group,
    unbound, or as_strided each in map's loop), or each of its own bytes (_own_view).
    bases keeps the typed bases (key region * _KEYS + dtype number) and the regions' bytes
    (key -1 - region): a tensor made from a pointer costs the most, so one per region.
    (gmsfs-load places a file's tensors kind by kind: an 8B model's 293 make 24 groups.)"""
    region, vi, off, gap, _, size, ptr, alloc, names = group
    dtype, shape, stride, soff, isz, number, empty = man.values[vi]
    if region < 0 or empty or off % isz or gap % isz:
        return [_own_view(name, man, vi, None if ptr is None else ptr + i * gap, size, alloc, device)
                for i, name in enumerate(names)]
    base = bases.get(region * _KEYS + number)
    if base is None:
        b = bases.get(-1 - region)
        if b is None:
            b = bases[-1 - region] = _bytes_at(*man.regions[region], device)
        n = b.shape[0]
        base = bases[region * _KEYS + number] = (b[:n - n % isz] if n % isz else b).view(dtype)
    k, first, step = len(names), off // isz + soff, gap // isz
    if k == 1:
        return (base.as_strided(shape, stride, first),)
    if k >= 4:  # one view of the group, unbound: cheaper per tensor than as_strided each
        return base.as_strided((k,) + shape, (step,) + stride, first).unbind(0)
    return tuple(map(base.as_strided, _repeat(shape, k), _repeat(stride, k), range(first, first + k * step, step)))


def _as_params(views):
    """The new plain tensors views made Parameters (not requiring grad), in place.  A
    Parameter of a plain tensor is that tensor under Parameter's class, with nothing of
    its own; Parameter(t) makes it a second tensor (a detached alias of t), which costs
    as much as the view itself.  So a view made for the purpose takes Parameter's class
    instead: the same Parameter, but still a view of its region (_base is the region's)."""
    for v in views:
        v.__class__ = _Param
    return views


def materialize(module, store, strict=True, init=None, own_buffers=False):
    """Make every parameter and buffer of module a view of the store's memory (a path, or a
    Connection): no copy, no extra memory; private entries point at this process's copy.
    The module may be on the meta device.  A parameter stays a Parameter (not requiring
    grad) and a buffer a plain tensor; each is a view of its region (its _base).
    module._gmsfs is the connection: it holds the read lock; copy.deepcopy(module) shares
    it.

    strict: the module's persistent state (its state_dict) and the store's tensors must
    name the same tensors, both ways (a tied name, the same tensor as one the store has,
    needs no entry); a KeyError lists what differs.  Shapes and dtypes are checked for
    every tensor (a RuntimeError names each mismatch with both sides).  Non-persistent
    buffers the store lacks (never in a checkpoint: a transformers model's rotary
    inv_freq) are allocated on the store's device and made by the module's own code:
    init(owner), by default the model's _init_weights (transformers); a module with
    neither is refused with what to call.  own_buffers: those are made so even where the
    store has them (the store's were made for another config).  On any of these errors
    the module is left as it was."""
    conn = store if isinstance(store, Connection) else connect(store, "ro")
    conn._import_all()  # maps what is not mapped yet, loads the entries
    device = _device(conn)
    where = _where(module)
    kept = {n: s for n, s in where.items() if not s[3] and s[1] in s[4]._non_persistent_buffers_set} \
        if own_buffers else {}
    for name in kept:
        del where[name]
    binds, made, bad, extra = _bind(_manifest(conn), where, device, kept)
    where.update(kept)  # now the module's tensors that the store does not bind
    lacking, tied = _leftover(where, made)
    if strict:
        missing = _missing(lacking)
        if missing or extra:
            raise KeyError(_names_differ("materialize", conn.store, missing, sorted(extra)))
    owners, init = _lacking_buffers(module, lacking, device, init, conn.store)
    if bad:  # every tensor checked, as load_state_dict names them
        raise RuntimeError("materialize %s: %d tensor(s) do not match, the module is unchanged:\n  %s"
                           % (conn.store, len(bad), "\n  ".join(bad)))
    binds += tied
    _assign(binds, 2)
    try:
        _make_buffers(owners, init, device)
    except BaseException:  # every tensor as it was, the buffers it was making too
        binds += [((o._buffers,), (a,), None, (t,)) for _, o, a, t, p in lacking if not p]
        _assign(binds, 3)
        raise
    module._gmsfs = conn
    return module


def _leftover(where, made):
    """The module's tensors left in where after _bind: [(name, owner, attribute, tensor,
    is_param)] of those the store lacks, and the binds of the tied ones (the same tensor
    as one the store binds, under another name: its view)."""
    lacking, tied = [], []
    for name, (d, attr, t, is_param, owner) in where.items():
        if id(t) in made:
            tied.append(((d,), (attr,), (made[id(t)],), (t,)))
        else:
            lacking.append((name, owner, attr, t, is_param))
    return lacking, tied


def _missing(lacking):
    """The names of lacking (_leftover's) that the store should have: the module's
    persistent state (what a checkpoint holds)."""
    return sorted(n for n, o, a, t, p in lacking if _persistent(o, a, p))


def _assign(binds, which):
    """Set each bind's tensors: which=2 its views, 3 the tensors it had before."""
    for b in binds:
        deque(map(setitem, b[0], b[1], b[which]), 0)


def _bind(man, where, device, keep):
    """Pair the store's rows with the module's slots of the same names (popped from where;
    keep: names the module keeps, bound to nothing), each row's tensor made anew and
    checked against the slot's.  Returns ([(dicts, attributes, views, tensors before)] to
    assign, {id(tensor before): its view}, the mismatches, the names the module lacks).
    Nothing is assigned yet.  A group whose rows all agree with their slots is paired by
    C's loops (map, zip), any other one row by row (_bind_rows)."""
    bases, acc, values, pop = {}, ([], {}, [], []), man.values, where.pop
    binds, made = acc[0], acc[1]
    for g in man.groups:
        names, value = g[8], values[g[1]]
        views = _group_tensors(man, g, bases, device)
        slots = list(map(pop, names, _repeat(None)))
        if None not in slots:
            ds, attrs, ts, kinds, _ = zip(*slots)
            by_id = dict(zip(map(id, ts), views))  # as many as ts: no tensor twice in the group
            if (all(map(value[1].__eq__, map(_SHAPE, ts))) and all(map(_is, _repeat(value[0]), map(_DTYPE, ts)))
                    and (all(kinds) or not any(kinds)) and len(by_id) == len(ts) and made.keys().isdisjoint(by_id)):
                if kinds[0]:
                    _as_params(views)
                made.update(by_id)
                binds.append((ds, attrs, views, ts))
                continue
        _bind_rows(names, slots, views, keep, acc)
    return acc


def _bind_rows(names, slots, views, keep, acc):
    """_bind's rows one by one, into acc (its four results): a name the module lacks, a
    tensor bound already (tied: one view), a mismatch."""
    binds, made, bad, extra = acc
    for name, slot, obj in zip(names, slots, views):
        if slot is None:
            if name not in keep:
                extra.append(name)
            continue
        d, attr, t, is_param, _ = slot
        o = made.get(id(t))
        if o is not None:  # the same tensor under another name: one view
            obj = o
        elif obj.shape != t.shape or obj.dtype is not t.dtype:
            bad.append(_mismatch(name, obj, t))
            made[id(t)] = None  # in the store all the same (its tied names are not missing)
            continue
        else:
            obj = made[id(t)] = _as_params((obj,))[0] if is_param else obj
        binds.append(((d,), (attr,), (obj,), (t,)))


# ---- GMS's flows ----

def _empty(store):
    try:
        with open(os.path.join(store, "state")) as f:
            return "state: EMPTY\n" in f.read()
    except OSError:
        return False


def _build_meta(build):
    """build() with parameters on the meta device where this PyTorch can (no memory)."""
    if hasattr(torch.device("meta"), "__enter__"):
        with torch.device("meta"):
            return build()
    return build()


def _slabs(conn):
    return {m.name for m in conn.mappings if m.name.startswith(PREFIX + "slab")}


def _drop_unused_slabs(module, conn, made):
    """Slabs the allocator made (made) that hold no tensor of module: the build's freed
    temporaries, which no reader could ever use, leave the store before it is published."""
    used = {conn.find_ptr(_storage(t)[0])[0].name for _, _, _, t, _ in _tensors(module)
            if t.numel() and conn.find_ptr(_storage(t)[0]) is not None}
    for name in sorted(made - used):
        conn.free(name)


def _repack_sparse_slabs(module, conn, made, slab_bytes):
    """The fragments the build left in its slabs (each slab's tail past what fit, PyTorch's
    segments' rounding) add up: the emptiest slabs of made, until what the others leave
    empty is under half a slab, have their tensors copied into one allocation of their
    exact size (a device-to-device copy of at most those slabs), the module's tensors
    rebound there (the same Parameter objects), and are freed.  Returns the slabs freed."""
    device = _device(conn)
    by_slab = {n: {} for n in made}  # slab -> {storage ptr: (bytes, device)}
    size = {m.name: m.size for m in conn.mappings if m.name in made}
    items = _tensors(module)
    for _, _, _, t, _ in items:
        ptr, n = _storage(t)
        f = conn.find_ptr(ptr) if t.numel() else None
        if f is not None and f[0].name in by_slab:
            by_slab[f[0].name][ptr] = (n, t.device)
    waste = {name: size[name] - sum(n for n, _ in st.values()) for name, st in by_slab.items() if name in size}
    left, picked = sum(waste.values()), []
    for name in sorted(waste, key=waste.get, reverse=True):
        if left < slab_bytes // 2:
            break
        picked.append(name)
        left -= waste[name]
    moving = {ptr: v for name in picked for ptr, v in by_slab[name].items()}
    if moving:
        where = _pack(conn, moving, device)
        maps = {m.name: m for m in conn.mappings}
        with torch.no_grad():
            for _, _, _, t, _ in items:
                ptr, n = _storage(t)
                if ptr in where and t.numel():
                    alloc, off = where[ptr]
                    base = _bytes_at(maps[alloc].ptr + off, n, device).view(t.dtype)
                    t.data = base.as_strided(t.shape, t.stride(), t.storage_offset())
    for name in picked:
        conn.free(name)
    return picked


def load_or_publish(store, build, load_weights, read_only=False, timeout=None, private=(), slab_bytes=0):
    """GMS's RW_OR_RO flow.  The first process on the store (nothing committed) builds the
    module, loads its weights and publishes them; every later one builds it on the meta
    device and materializes it.  read_only: never write, and fail at once (ENOENT) when
    nothing is committed.  Returns the module: its connection is module._gmsfs, and
    module._gmsfs_published says whether this process published or materialized.

    On a GPU, build() runs under the store's allocator: its parameters and buffers are made
    in the store's slabs, and publishing copies nothing.  load_weights(module) runs outside
    it: whatever it reads or makes on the way (a checkpoint loaded to the GPU, then copied
    into the parameters) comes from PyTorch's own memory, not the store's; slabs the build
    left empty are given back before the commit, and the emptiest ones are repacked
    (_repack_sparse_slabs).  The store holds the model and less than one slab more, not
    its loader's temporaries."""
    try:
        conn = connect(store, "ro" if read_only else "auto", 0 if read_only else timeout)
    except GmsfsError as e:
        if read_only and e.errno == errno.EAGAIN and _empty(store):
            raise GmsfsError(errno.ENOENT, "load_or_publish %s: nothing is committed (read_only)" % store) from e
        raise
    if conn.lock_mode == "rw":
        before = _slabs(conn)
        ctx = allocator(conn, slab_bytes) if conn.backend == "cuda" else contextlib.nullcontext()
        with ctx:
            module = build()
        load_weights(module)
        if conn.backend == "cuda":
            torch.cuda.synchronize()
            made = _slabs(conn) - before
            _drop_unused_slabs(module, conn, made)
            _repack_sparse_slabs(module, conn, made & _slabs(conn), slab_bytes or SLAB_BYTES)
        publish(module, conn, private=private)
        module._gmsfs_published = True
        return module
    module = materialize(_build_meta(build), conn)
    module._gmsfs_published = False
    return module


def sleep(module):
    """Unmap the module's memory and give the lock back; every address stays reserved."""
    module._gmsfs.unmap_all()


def wake(module, timeout=None):
    """Lock and map again at the same addresses: every data_ptr is what it was.
    StaleLayoutError if the committed structure changed meanwhile."""
    module._gmsfs.remap_all(timeout)
