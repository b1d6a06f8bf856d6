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


def _tensors(module, prefix=""):
    """(name, owner, attribute, tensor, is_parameter) of every parameter and buffer; a
    module or tensor reached by two paths is listed under both names (tied weights)."""
    for attr, t in module._parameters.items():
        if t is not None:
            yield prefix + attr, module, attr, t, True
    for attr, t in module._buffers.items():
        if t is not None:
            yield prefix + attr, module, attr, t, False
    for mname, child in module._modules.items():
        if child is not None:
            yield from _tensors(child, prefix + mname + ".")


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
    device, is_private = _device(conn), _private(private)
    items = list(_tensors(module))
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
    conn.meta_put_many(entries)
    if commit:
        conn.commit()
        materialize(module, conn)
    return conn


# ---- materialize ----

def materialize(module, store, strict=True):
    """Make every parameter and buffer of module a view of the store's memory (a path, or a
    Connection): no copy, no extra memory; private entries point at this process's copy.
    The module may be on the meta device.  Names are checked both ways: a name the
    store lacks or a name the module lacks is an error that lists them (strict)."""
    conn = store if isinstance(store, Connection) else connect(store, "ro")
    conn.import_all()  # maps what is not mapped yet, loads the entries
    entries = {e.key[len(PREFIX):]: e for e in conn.meta_items(PREFIX)}
    items = list(_tensors(module))
    names = {i[0] for i in items}
    missing, extra = sorted(names - entries.keys()), sorted(entries.keys() - names)
    if strict and (missing or extra):
        raise KeyError("materialize %s: the store lacks %s; the module lacks %s"
                       % (conn.store, missing or "nothing", extra or "nothing"))
    items = [i for i in items if i[0] in entries]
    # One JSON parse for every value, one tensor per allocation and dtype to view into:
    # the per-tensor work is one as_strided (a model has hundreds of tensors).
    values = json.loads(b"[%s]" % b",".join(entries[i[0]].value for i in items)) if items else []
    device = _device(conn)
    slabs = {m.name: m for m in conn.mappings}
    typed, made = {}, {}
    for (name, owner, attr, _, is_param), d in zip(items, values):
        e = entries[name]
        dtype = _DTYPES[d["dtype"]]
        shape, stride, soff = tuple(d["shape"]), tuple(d["stride"]), d["storage_offset"]
        key = (e.ptr, d["dtype"], shape, stride, soff, is_param)
        obj = made.get(key)
        if obj is None:
            if 0 in shape:
                view = torch.empty(shape, dtype=dtype, device=device)
            elif e.ptr is None:
                raise GmsfsError(errno.ENOENT, "materialize: %s's allocation %s is not mapped" % (name, e.alloc))
            else:
                # Shared entries view their allocation's mapping; a private one (its own
                # copy) or an odd offset views its own bytes.
                m, size = slabs.get(e.alloc), _ITEMSIZE[dtype]
                shared = m is not None and not e.private and m.ptr + e.offset == e.ptr and e.offset % size == 0
                where = (e.alloc, dtype) if shared else (e.ptr, dtype)
                base = typed.get(where)
                if base is None:
                    raw = _bytes_at(m.ptr, m.size - m.size % size, device) if shared else _bytes_at(e.ptr, e.size, device)
                    base = typed[where] = raw.view(dtype)
                view = base.as_strided(shape, stride, (e.offset // size if shared else 0) + soff)
            obj = torch.nn.Parameter(view, requires_grad=False) if is_param else view
            made[key] = obj
        (owner._parameters if is_param else owner._buffers)[attr] = obj
    module._gmsfs = conn
    return module


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


def load_or_publish(store, build, load_weights, read_only=False, timeout=None, private=(), slab_bytes=0):
    """GMS's RW_OR_RO flow.  The first process on the store (nothing committed) builds the
    module, loads its weights and publishes them; every later one builds it on the meta
    device and materializes it.  read_only: never write, and fail at once (ENOENT) when
    nothing is committed.  Returns the module: its connection is module._gmsfs, and
    module._gmsfs_published says whether this process published or materialized."""
    try:
        conn = connect(store, "ro" if read_only else "auto", 0 if read_only else timeout)
    except GmsfsError as e:
        if read_only and e.errno == errno.EAGAIN and _empty(store):
            raise GmsfsError(errno.ENOENT, "load_or_publish %s: nothing is committed (read_only)" % store) from e
        raise
    if conn.lock_mode == "rw":
        ctx = allocator(conn, slab_bytes) if conn.backend == "cuda" else contextlib.nullcontext()
        with ctx:
            module = build()
            load_weights(module)
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
