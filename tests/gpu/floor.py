"""PyTorch's own floor for gmsfs.torch.materialize, for the GPU benchmarks, and
materialize itself, profiled on demand."""
import os
import sys
import time

import torch
import gmsfs._torch_layout as _tl
import gmsfs._torch_materialize as _tm


def views_floor(m):
    """Seconds PyTorch takes to give m's tensors (already on their memory) a view of a
    ready base each, one Parameter (or buffer) and one assignment: what materialize does,
    with the walk of the module and the bases prepared beforehand."""
    items = [(owner, attr, t) for _, owner, attr, t, _ in _tl._tensors(m)]
    bases = {}  # by storage and dtype (one region's storage holds tensors of several dtypes)
    for _, _, t in items:
        s = t.untyped_storage()
        bases.setdefault((s.data_ptr(), t.dtype), torch.empty(0, dtype=t.dtype, device=t.device).set_(s))
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for owner, attr, t in items:
        v = bases[t.untyped_storage().data_ptr(), t.dtype].as_strided(t.shape, t.stride(), t.storage_offset())
        if isinstance(owner._parameters.get(attr), torch.nn.Parameter):
            owner._parameters[attr] = torch.nn.Parameter(v, requires_grad=False)
        else:
            owner._buffers[attr] = v
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def _bases(conn):
    """{name: (typed base, value, element)} of every row that views a region, the bases
    made as materialize makes them (one per region and dtype); and the seconds that
    making the bases took (a tensor over each region from its pointer, then one of each
    dtype: PyTorch's own work too, for views of memory it did not allocate)."""
    man, dev = _tm._manifest(conn), _tl._device(conn)
    rows, keys = {}, {}
    for name, region, vi, off, _, _ in man.places():
        v = man.values[vi]
        if region < 0 or v[6] or off % v[4]:
            continue
        keys.setdefault((region, v[0]), v[4])
        rows[name] = ((region, v[0]), v, off // v[4] + v[3])
    t0 = time.perf_counter()
    bytes_of, bases = {}, {}
    for (region, dtype), isz in keys.items():
        if region not in bytes_of:
            bytes_of[region] = _tl._bytes_at(*man.regions[region], dev)
        b = bytes_of[region]
        n = b.shape[0]
        bases[region, dtype] = (b[:n - n % isz] if n % isz else b).view(dtype)  # as materialize
    made_s = time.perf_counter() - t0
    return {name: (bases[k], v, e) for name, (k, v, e) in rows.items()}, dev, made_s


def views_floor_fresh(m, conn):
    """The same work as views_floor, timed where materialize is: in a fresh process, the
    first views it makes (an engine materializes once, at its start).  The bases are
    prepared beforehand from the store's manifest (where each tensor lies) and are not
    timed.  (seconds, tensors, seconds making the bases took); m (on the meta device)
    gets the views."""
    rows, dev, bases_s = _bases(conn)
    items = [(owner, attr) + (rows[name][0], rows[name][1][1], rows[name][1][2], rows[name][2])
             for name, owner, attr, t, is_param in _tl._tensors(m) if name in rows]
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    sync()
    t0 = time.perf_counter()
    for owner, attr, base, shape, stride, offset in items:
        v = base.as_strided(shape, stride, offset)
        if isinstance(owner._parameters.get(attr), torch.nn.Parameter):
            owner._parameters[attr] = torch.nn.Parameter(v, requires_grad=False)
        else:
            owner._buffers[attr] = v
    sync()
    return time.perf_counter() - t0, len(items), bases_s


def load_state_dict_fresh(m, conn):
    """PyTorch's own binding of a module to given tensors, with its own name matching and
    shape checks: load_state_dict(views, assign=True), timed in a fresh
    process, the views made beforehand (as views_floor_fresh's bases).  Seconds."""
    rows, dev, _ = _bases(conn)
    views = {name: base.as_strided(v[1], v[2], element) for name, (base, v, element) in rows.items()}
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    sync()
    t0 = time.perf_counter()
    m.load_state_dict(views, strict=False, assign=True)  # it matches both ways all the same; a tied name is no error
    sync()
    return time.perf_counter() - t0


def profiled(fn, *args):
    """fn(*args) (a materialize); with GMSFS_PROFILE set, under cProfile, where its time
    goes printed on stderr."""
    if not os.environ.get("GMSFS_PROFILE"):
        return fn(*args)
    import cProfile
    import pstats
    prof = cProfile.Profile()
    out = prof.runcall(fn, *args)
    pstats.Stats(prof, stream=sys.stderr).sort_stats("cumtime").print_stats(30)
    return out
