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

A trainer on the same GPU refits in place (RL loops): while the engines sleep,

    gmsfs.torch.refit(trainer_model, store)    # every tensor copied in by name, committed
    gmsfs.torch.wake(model)                    # each engine: the new weights, same addresses

or with the refit's work before its copies done while the trainer's step computes:

    conn = gmsfs.torch.refit_prepare(trainer_model, store)   # the step's start
    gmsfs.torch.refit(trainer_model, conn).close()           # its end: copies, commit

or, on a store with versions, engines that keep serving while it writes, then flip (in
place, or with the next version mapped ahead: its flip only points the tensors):

    gmsfs.torch.flip(model)                    # each engine, between two steps
    ahead = gmsfs.torch.flip_ahead(model)      # or: mapped while the engine serves ...
    ahead.flip(); ahead.close()                # ... then pointed at, the old version let go

or, an engine that waits for the trainer's next commit on its own:

    gmsfs.torch.follow(model)                  # sleep, the next whole commit, wake at it
"""
import contextlib
import errno
import json
import os
import time

import torch

from . import Connection, GmsfsError, connect
from gmsfs._fields import wait_generation

# The public names of its parts (its own private helpers import from those modules).
from gmsfs._torch_layout import ALIGN, PREFIX, SLAB_BYTES, TAG  # noqa: F401
from gmsfs._torch_layout import _bytes_at, _device, _private, _storage, _tensors
from gmsfs._torch_alloc import allocator, GraphPool  # noqa: F401
from gmsfs._torch_refit import refit, refit_prepare  # noqa: F401
from gmsfs._torch_materialize import materialize  # noqa: F401
from gmsfs._torch_ahead import Ahead, flip_ahead  # noqa: F401


# ---- publish ----

def _pack(conn, storages, device):
    """Copy storages that are not in the store into new allocations of at most SLAB_BYTES
    each (one larger storage alone in its own), made in one request: {ptr: (alloc,
    offset)}.  A refit that closes after its commit then unmaps each slab as its copies
    land, while the next slabs' run, not the whole model after the last copy."""
    have = {m.name for m in conn.mappings}
    slabs, i = [], 0  # [[name, bytes, [(ptr, offset, n, device)]]]
    for ptr, (n, dev) in storages.items():
        step = (n + ALIGN - 1) // ALIGN * ALIGN
        if not slabs or (slabs[-1][1] and slabs[-1][1] + step > SLAB_BYTES):
            while PREFIX + "packed%05d" % i in have:
                i += 1
            slabs.append([PREFIX + "packed%05d" % i, 0, []])
            i += 1
        slabs[-1][2].append((ptr, slabs[-1][1], n, dev))
        slabs[-1][1] += step
    made = conn.create_many([(name, max(size, 1), TAG) for name, size, _ in slabs])
    where = {}
    for m, (_, _, parts) in zip(made, slabs):
        for ptr, off, n, dev in parts:
            _bytes_at(m.ptr + off, n, device).copy_(_bytes_at(ptr, n, dev))
            where[ptr] = (m.name, off)
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
    are; others are copied into new allocations of at most 1 GiB first.  private: names
    (or a test name -> bool) of tensors every process gets a copy of.  Returns the connection,
    which the module keeps (module._gmsfs): it holds the read lock after the commit."""
    conn = store if isinstance(store, Connection) else connect(store, "rw")
    if conn.lock_mode != "rw":
        raise GmsfsError(errno.EPERM, "publish: %s is not held for writing (%s)" % (conn.store, conn.lock_mode))
    conn.meta_put_many(_entries(conn, list(_tensors(module)), _private(private)))
    if commit:
        conn.commit()
        materialize(module, conn)
    return conn


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


def follow(module, timeout=None):
    """An engine that serves what a trainer refits (gmsfs.torch.refit): sleep, wait for a
    commit newer than the generation the module served (whole: a refit whose trainer died
    leaves the store TORN, and the next one that commits is waited for), then wake at
    it, at the same addresses.  Returns the generation now served.  TimeoutError when
    none comes within timeout seconds (the module is left asleep: wake() or follow()
    again); StaleLayoutError if the store's layout changed rather than its bytes."""
    conn = module._gmsfs
    served = conn.generation
    if conn.lock_mode is not None:
        sleep(module)
    t0 = time.monotonic()
    wait_generation(conn.store, served, timeout)
    wake(module, None if timeout is None else max(0.001, timeout - (time.monotonic() - t0)))
    return conn.generation


def pause(module):
    """An engine stops reading and keeps its mappings (no unmap): a trainer's in-place
    refit (gmsfs.torch.refit) may then write them; resume() maps nothing again."""
    module._gmsfs.pause()


def resume(module, timeout=None):
    """After pause(): the lock again, every data_ptr as it was, the trainer's bytes in them.
    EUCLEAN if the trainer died mid-refit (the store is TORN): still paused."""
    module._gmsfs.resume("ro", timeout)


def flip(module, version=None):
    """An engine of a store with versions (user.gms.versions 2; gmsfs(5) VERSIONS) that
    kept serving while a trainer built the next version (gmsfs.torch.refit): move to the
    last commit between two steps, with no sleep: the tensors whose allocations changed
    see the new bytes at the same addresses (the work queued on the old ones is waited
    for first), the rest are untouched.  Returns how many allocations changed (0: it
    served the last commit already).  version: only to the commit of that name (gmsfs(5),
    NAMED VERSIONS), or nothing changes (GmsfsError ESTALE: another is the last commit;
    ENOENT: none had the name)."""
    return module._gmsfs.flip(version)


def switch(module, to, timeout=None):
    """One model for another on the GPU: sleep module, wake to (a model slept before).
    Where the budget holds one of them, the daemon moves to's store in while module's
    goes out, both at once (a switch).  Returns to."""
    sleep(module)
    wake(to, timeout)
    return to


def pages_tensor(pages, dtype=torch.uint8, shape=None):
    """A tensor over the whole address range of gmsfs.Pages (an engine's KV cache): its
    pages come and go as the cache grows and shrinks, the tensor stays.  Only the bytes of
    mapped pages may be touched (elsewhere a kernel faults, as with any cache of this kind).
    shape: the cache's own view (e.g. blocks x block bytes), of dtype."""
    dev = torch.device("cuda", torch.cuda.current_device()) if pages._conn.backend == "cuda" else torch.device("cpu")
    t = _bytes_at(pages.base, pages.count * pages.page_size, dev)
    if dtype != torch.uint8:
        t = t.view(dtype)
    return t.view(shape) if shape is not None else t
