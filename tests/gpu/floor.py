"""PyTorch's own floor for gmsfs.torch.materialize, for the GPU benchmarks, and
materialize itself, profiled on demand."""
import os
import sys
import time

import torch
import gmsfs.torch as gt


def views_floor(m):
    """Seconds PyTorch takes to give m's tensors (already on their memory) a view of a
    ready base each, one Parameter (or buffer) and one assignment: what materialize does,
    with the walk of the module and the bases prepared beforehand."""
    items = [(owner, attr, t) for _, owner, attr, t, _ in gt._tensors(m)]
    bases = {}
    for _, _, t in items:
        s = t.untyped_storage()
        bases.setdefault(s.data_ptr(), torch.empty(0, dtype=t.dtype, device=t.device).set_(s))
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for owner, attr, t in items:
        v = bases[t.untyped_storage().data_ptr()].as_strided(t.shape, t.stride(), t.storage_offset())
        if isinstance(owner._parameters.get(attr), torch.nn.Parameter):
            owner._parameters[attr] = torch.nn.Parameter(v, requires_grad=False)
        else:
            owner._buffers[attr] = v
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def views_floor_fresh(m, conn):
    """The same work as views_floor, timed where materialize is: in a fresh process, the
    first views it makes (an engine materializes once, at its start).  The bases are
    prepared beforehand from the store's manifest (where each tensor lies) and are not
    timed.  (seconds, tensors); m (on the meta device) gets the views."""
    man, dev = gt._manifest(conn), gt._device(conn)
    slabs = {x.name: x for x in conn.mappings}
    bases, items = {}, []
    for name, owner, attr, t, is_param in gt._tensors(m):
        r = man.rows.get(name)
        key, element = man.base(r) if r is not None else (None, 0)
        if key is None:
            continue
        v = man.values[r[5]]
        if key not in bases:
            s, isz = slabs[man.allocs[r[0]]], v[5]
            bases[key] = gt._bytes_at(s.ptr, s.size - s.size % isz, dev).view(v[0])
        items.append((owner, attr, bases[key], v[1], v[2], element))
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
    return time.perf_counter() - t0, len(items)


def load_state_dict_fresh(m, conn):
    """PyTorch's own binding of a module to given tensors, with its own name matching and
    shape checks: load_state_dict(views, assign=True), timed in a fresh
    process, the views made beforehand (as views_floor_fresh's bases).  Seconds."""
    man, dev = gt._manifest(conn), gt._device(conn)
    slabs = {x.name: x for x in conn.mappings}
    bases, views = {}, {}
    for name, r in man.rows.items():
        key, element = man.base(r)
        v = man.values[r[5]]
        if key is None:
            continue
        if key not in bases:
            s, isz = slabs[man.allocs[r[0]]], v[5]
            bases[key] = gt._bytes_at(s.ptr, s.size - s.size % isz, dev).view(v[0])
        views[name] = bases[key].as_strided(v[1], v[2], element)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    sync()
    t0 = time.perf_counter()
    m.load_state_dict(views, strict=False, assign=True)  # it matches both ways all the same; a tied name is no error
    sync()
    return time.perf_counter() - t0


def materialize(m, c):
    """gt.materialize(m, c); with GMSFS_PROFILE set, under cProfile, where its time goes
    printed on stderr."""
    if not os.environ.get("GMSFS_PROFILE"):
        return gt.materialize(m, c)
    import cProfile
    import pstats
    prof = cProfile.Profile()
    out = prof.runcall(gt.materialize, m, c)
    pstats.Stats(prof, stream=sys.stderr).sort_stats("cumtime").print_stats(30)
    return out
