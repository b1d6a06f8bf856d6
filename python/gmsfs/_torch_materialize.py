"""gmsfs.torch.materialize: a module's parameters and buffers become views of a store's
memory, with no copy.  gmsfs.torch re-exports it."""
import ctypes
import errno
import json
from collections import deque
from itertools import repeat as _repeat
from operator import attrgetter, is_ as _is, setitem

import torch

from gmsfs import Connection, GmsfsError, connect
from gmsfs._lib import lib as _c
from gmsfs._torch_layout import (
    _bytes_at, _device, _DTYPE_NUMBER, _DTYPES, _ITEMSIZE, _where)


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
