"""gmsfs.torch on the host backend with PyTorch on the CPU: a module published by one
process and materialized by another, zero-copy; names checked; sleep and wake; private
buffers; load_or_publish.  Every role runs in a process of its own."""
import errno
import json
import os

import pytest

torch = pytest.importorskip("torch")

import gmsfs
import gmsfs.torch as gt
import gmsfs._torch_layout as _tl
import gmsfs._torch_materialize as _tm
from conftest import run_py

MODEL = """
import torch, gmsfs, gmsfs.torch as gt, sys, json
class Net(torch.nn.Module):
    def __init__(self, extra=False):
        super().__init__()
        self.embed = torch.nn.Embedding(50, 16)
        self.layers = torch.nn.ModuleList([torch.nn.Linear(16, 16) for _ in range(3)])
        self.head = torch.nn.Linear(16, 50, bias=False)
        self.head.weight = self.embed.weight          # tied
        self.register_buffer("scale", torch.ones(16))
        self.register_buffer("none", torch.zeros(0))   # empty
        self.wb = torch.nn.Parameter(torch.zeros(4, 4, dtype=torch.bfloat16))
        if extra:
            self.extra = torch.nn.Linear(2, 2)
    def forward(self, x):
        h = self.embed(x) * self.scale
        for l in self.layers:
            h = torch.relu(l(h))
        return self.head(h)
def build(seed=0, extra=False):
    torch.manual_seed(seed)
    return Net(extra)
x = torch.tensor([[1, 2, 3, 49]])
"""


def test_publish_then_materialize_in_another_process_zero_copy(store):
    w = run_py(MODEL + """
m = build(seed=7)
with torch.no_grad():
    m.wb += 3
c = gt.publish(m, sys.argv[1], private=["scale"])
print(json.dumps({"out": m(x).tolist(), "hash": c.layout_hash, "n": len(c.mappings)}))
""", store)
    assert w.returncode == 0, w.stderr
    wrote = json.loads(w.stdout)
    r = run_py(MODEL + """
m = build(seed=99)                     # other values: everything must come from the store
gt.materialize(m, sys.argv[1])
c = m._gmsfs
views = all(c.find_ptr(p.data_ptr()) is not None for n, p in m.named_parameters())
shared = m.head.weight is m.embed.weight
scale = c.meta_get("torch/scale")
print(json.dumps({"out": m(x).tolist(), "hash": c.layout_hash, "views": views, "tied": shared,
                  "wb": m.wb.float().sum().item(), "scale_copy": m.scale.data_ptr() == scale.ptr,
                  "scale_private": scale.private, "none": list(m.none.shape)}))
""", store)
    assert r.returncode == 0, r.stderr
    read = json.loads(r.stdout)
    assert read["out"] == wrote["out"], "identical outputs"
    assert read["hash"] == wrote["hash"] and wrote["n"] == 1  # every tensor packed in one allocation
    assert read["views"], "every parameter is a view of the store's memory"
    assert read["tied"], "tied weights stay one Parameter"
    assert read["wb"] == 48.0 and read["none"] == [0]
    assert read["scale_copy"] and read["scale_private"]


def test_names_are_checked_both_ways(store):
    assert run_py(MODEL + "gt.publish(build(), sys.argv[1])", store).returncode == 0
    r = run_py(MODEL + """
try:
    gt.materialize(build(extra=True), sys.argv[1])
except KeyError as e:
    print(e)
""", store)
    assert "the store lacks ['extra.bias', 'extra.weight']; the module lacks nothing" in r.stdout, r.stderr


class Layers(torch.nn.Module):
    """Six layers of three projections of one shape, a norm and a bias: in the store a
    projection's tensors lie one layer apart, interleaved with the others'."""

    def __init__(self, device=None):
        super().__init__()
        self.layers = torch.nn.ModuleList()
        for _ in range(6):
            layer = torch.nn.Module()
            for n in "qkv":
                setattr(layer, n, torch.nn.Linear(16, 16, bias=False, device=device))
            layer.norm = torch.nn.LayerNorm(16, device=device)
            self.layers.append(layer)


def test_tensors_that_lie_a_layer_apart_are_viewed_by_groups(store):
    """The manifest groups rows of one shape that lie one step apart, however they
    interleave with others (a group's views are made by one call); every tensor comes
    back with its own values."""
    torch.manual_seed(3)
    src = Layers()
    c = gt.publish(src, store)
    man = _tm._manifest(c)
    sizes = sorted(len(g[8]) for g in man.groups)
    # q and v lie 2 KiB apart, layer after layer: one group; k, norm weight, norm bias one each
    assert sizes == [6, 6, 6, 12], sizes
    m = gt.materialize(Layers(device="meta"), store)
    for (n, a), (_, b) in zip(src.named_parameters(), m.named_parameters()):
        assert torch.equal(a, b) and type(b) is torch.nn.Parameter and m._gmsfs.find_ptr(b.data_ptr()), n
    m._gmsfs.close()
    c.close()


def test_materialized_parameters_behave_as_parameters(store):
    """A materialized Parameter is a view of the store under Parameter's class: it is
    listed, copied, converted, saved and trained as any Parameter."""
    import copy
    import io
    import pickle
    torch.manual_seed(5)
    src = Layers()
    gt.publish(src, store).close()
    m = gt.materialize(Layers(device="meta"), store)
    ps = dict(m.named_parameters())
    assert len(ps) == len(dict(src.named_parameters())) and all(type(p) is torch.nn.Parameter for p in ps.values())
    assert all(not p.requires_grad and m._gmsfs.find_ptr(p.data_ptr()) for p in ps.values())
    twin = copy.deepcopy(m)  # a copy of its own, sharing the store's connection (one lock)
    assert twin._gmsfs is m._gmsfs
    with pytest.raises(TypeError, match="cannot be pickled: connect in the other process"):
        pickle.dumps(m._gmsfs)
    assert all(type(p) is torch.nn.Parameter and p.data_ptr() != ps[n].data_ptr() and torch.equal(p, ps[n])
               for n, p in twin.named_parameters())
    f = io.BytesIO()
    torch.save(m.state_dict(), f)
    f.seek(0)
    assert all(torch.equal(t, ps[n]) for n, t in torch.load(f).items() if n in ps)
    twin.double()
    assert all(type(p) is torch.nn.Parameter and p.dtype is torch.float64 for p in twin.parameters())
    w = twin.layers[0].q.weight.requires_grad_()
    twin.layers[0].q(torch.ones(2, w.shape[1], dtype=torch.float64)).sum().backward()
    assert w.grad is not None and w.grad.shape == w.shape
    m._gmsfs.close()


def test_random_layouts_come_back_tensor_by_tensor(store):
    """Groups are found in any layout: modules of random tensors (a few shapes and dtypes,
    parameters and buffers, private ones, empty ones, one tied), published and
    materialized, give every tensor its own values."""
    import random
    shapes = [(4,), (4, 4), (2, 8), (0, 3), (3,)]
    for seed in range(12):
        rnd = random.Random(seed)
        src = torch.nn.Module()
        names = []
        for i in range(rnd.randrange(1, 40)):
            shape, dtype = rnd.choice(shapes), rnd.choice([torch.float32, torch.float32, torch.bfloat16])
            t = torch.randn(shape).to(dtype)
            if rnd.random() < 0.7:
                names.append("p%d" % i)
                src.register_parameter(names[-1], torch.nn.Parameter(t, requires_grad=False))
            else:
                names.append("b%d" % i)
                src.register_buffer(names[-1], t)
        if "p0" in src._parameters:
            src.tied = src.p0
        private = [n for n in names if rnd.random() < 0.2]
        want = {n: t.clone() for n, _, _, t, _ in _tl._tensors(src)}  # publish rebinds src onto the store
        s = "%s-%d" % (store, seed)
        os.mkdir(s)
        gt.publish(src, s, private=private).close()
        dst = torch.nn.Module()
        for n, t in src._parameters.items():
            dst.register_parameter(n, None if t is None else torch.nn.Parameter(torch.empty_like(t, device="meta"),
                                                                               requires_grad=False))
        for n, t in src._buffers.items():
            dst.register_buffer(n, torch.empty_like(t, device="meta"))
        if dst._parameters.get("p0") is not None:
            dst.tied = dst.p0
        gt.materialize(dst, s)
        got = {n: t for n, _, _, t, _ in _tl._tensors(dst)}
        assert got.keys() == want.keys()
        for n, t in want.items():
            assert got[n].dtype == t.dtype and torch.equal(got[n], t), (seed, n)
        assert "p0" not in src._parameters or dst.tied is dst.p0, "a tied tensor stays one"
        for n in want:  # each slot keeps its kind, however its group was bound
            assert type(got[n]) is (torch.nn.Parameter if n in dst._parameters else torch.Tensor), (seed, n)
        dst._gmsfs.close()


def test_a_refused_materialize_leaves_every_tensor_as_it_was(store):
    """materialize changes the module as it goes and puts it back on an error."""
    gt.publish(Layers(), store).close()
    m = Layers(device="meta")
    m.extra = torch.nn.Linear(2, 2, device="meta")
    before = {n: t for n, t in list(m.named_parameters()) + list(m.named_buffers())}
    with pytest.raises(KeyError, match=r"the store lacks \['extra.bias', 'extra.weight'\]"):
        gt.materialize(m, store)
    after = dict(list(m.named_parameters()) + list(m.named_buffers()))
    assert after.keys() == before.keys() and all(after[n] is t for n, t in before.items())


def test_sleep_and_wake_keep_every_data_ptr_and_a_changed_layout_is_stale(store):
    assert run_py(MODEL + "gt.publish(build(3), sys.argv[1])", store).returncode == 0
    ns = {}
    exec(MODEL, ns)
    m = gt.materialize(ns["build"](5), store)
    out = m(ns["x"])
    ptrs = {n: p.data_ptr() for n, p in m.named_parameters()}
    gt.sleep(m)
    assert m._gmsfs.lock_mode is None
    gt.wake(m, timeout=5)
    assert {n: p.data_ptr() for n, p in m.named_parameters()} == ptrs
    assert torch.equal(m(ns["x"]), out)
    gt.sleep(m)
    # A new writer publishes another structure meanwhile.
    assert run_py(MODEL + """
c = gmsfs.connect(sys.argv[1], 'rw', timeout=5)
for mp in c.import_all():
    c.free(mp)
gt.publish(build(3, extra=True), c)
""", store).returncode == 0
    with pytest.raises(gmsfs.StaleLayoutError):
        gt.wake(m, timeout=5)
    m._gmsfs.close()


def test_a_model_of_a_removed_store_sleeps_and_its_memory_goes(store):
    assert run_py(MODEL + "gt.publish(build(3), sys.argv[1])", store).returncode == 0
    ns = {}
    exec(MODEL, ns)
    m = gt.materialize(ns["build"](5), store)
    out = m(ns["x"])
    os.rmdir(store)  # the name goes; the model still computes from the store's memory
    assert torch.equal(m(ns["x"]), out)
    gt.sleep(m)  # and sleeps, giving the memory back
    assert m._gmsfs.lock_mode is None
    with pytest.raises(gmsfs.GmsfsError) as e:
        gt.wake(m, timeout=1)
    assert e.value.errno == errno.ENOENT
    m._gmsfs.close()
    mnt = os.path.dirname(store)
    with open(os.path.join(mnt, "status.json")) as f:
        assert all(s["name"] != os.path.basename(store) for s in json.load(f)["stores"])


def test_private_buffers_are_copies_of_each_process(store):
    assert run_py(MODEL + "gt.publish(build(), sys.argv[1], private=['scale'])", store).returncode == 0
    ns = {}
    exec(MODEL, ns)
    m = gt.materialize(ns["build"](), store)
    m.scale.mul_(4)  # mine
    r = run_py(MODEL + "m = gt.materialize(build(), sys.argv[1]); print(m.scale.sum().item())", store)
    assert r.stdout.strip() == "16.0", r.stderr  # the store still has ones
    assert m.scale.sum().item() == 64.0
    m._gmsfs.close()


def test_load_or_publish_publishes_once_then_materializes(store):
    flow = MODEL + """
loads = []
def load(m):
    loads.append(1)
m = gt.load_or_publish(sys.argv[1], lambda: build(11), load)
print(json.dumps({"mode": m._gmsfs.lock_mode, "loaded": len(loads), "out": m(x).tolist()}))
"""
    first = run_py(flow, store)
    second = run_py(flow, store)
    assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
    a, b = json.loads(first.stdout), json.loads(second.stdout)
    assert a["loaded"] == 1 and b["loaded"] == 0, "the second process built nothing into the store"
    assert a["out"] == b["out"]


def test_read_only_fails_at_once_when_nothing_is_committed(store):
    with pytest.raises(gmsfs.GmsfsError) as e:
        gt.load_or_publish(store, lambda: None, lambda m: None, read_only=True)
    assert e.value.errno == errno.ENOENT and "nothing is committed" in e.value.strerror


def test_sparse_slabs_are_repacked_and_the_module_follows(store):
    """A build that left one slab nearly empty (its tensors a fragment past the others'):
    _repack_sparse_slabs copies that slab's tensors into one allocation of their size,
    rebinds the module (the same Parameter objects, the same values), frees the slab and
    leaves the full one alone; what is published from there reads back the same."""
    w = run_py(MODEL + """
MiB = 1 << 20
c = gmsfs.connect(sys.argv[1], "rw")
full = c.create("torch/slab00000", 4 * MiB, tag="torch")
sparse = c.create("torch/slab00001", 4 * MiB, tag="torch")
def at(m, off, shape):  # a float32 tensor in the store at m.ptr + off, as the C allocator carves them
    n = 4 * int(torch.tensor(shape).prod())
    return torch.frombuffer(c.buffer(m.ptr + off, n, writable=True), dtype=torch.float32).view(shape)
net = torch.nn.Module()
net.a = torch.nn.Parameter(at(full, 0, (896, 1024)), requires_grad=False)    # 3.5 MiB: nearly full
net.b = torch.nn.Parameter(at(sparse, 0, (64, 1024)), requires_grad=False)   # 0.25 MiB of 4
with torch.no_grad():
    net.a.copy_(torch.arange(896 * 1024, dtype=torch.float32).view(896, 1024))
    net.b.copy_(torch.arange(64 * 1024, dtype=torch.float32).view(64, 1024) * -1)
b_obj, a_ptr = net.b, net.a.data_ptr()
freed = gt._repack_sparse_slabs(net, c, {"torch/slab00000", "torch/slab00001"}, 4 * MiB)
names = sorted(m.name for m in c.mappings)
b_at = c.find_ptr(net.b.data_ptr())[0].name
same = bool(net.b.eq(torch.arange(64 * 1024, dtype=torch.float32).view(64, 1024) * -1).all())
b_same_obj, a_kept = net.b is b_obj, net.a.data_ptr() == a_ptr
gt.publish(net, c)
print(json.dumps({"freed": freed, "names": names, "b_at": b_at, "same": same, "b_same_obj": b_same_obj,
                  "a_kept": a_kept}))
""", store)
    assert w.returncode == 0, w.stderr
    out = json.loads(w.stdout)
    assert out["freed"] == ["torch/slab00001"], out
    assert out["names"] == ["torch/packed00000", "torch/slab00000"] and out["b_at"] == "torch/packed00000", out
    assert out["same"] and out["b_same_obj"] and out["a_kept"], out
    r = run_py(MODEL + """
net = torch.nn.Module()
net.a = torch.nn.Parameter(torch.zeros(896, 1024), requires_grad=False)
net.b = torch.nn.Parameter(torch.zeros(64, 1024), requires_grad=False)
gt.materialize(net, sys.argv[1])
print(json.dumps({"a": net.a.sum().item(), "b": net.b.sum().item()}))
""", store)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    n_a, n_b = 896 * 1024, 64 * 1024
    assert got == {"a": float(sum(range(n_a))), "b": -float(sum(range(n_b)))}, got


def test_names_that_json_escapes_come_back(store):
    # The manifest is JSON made by libgmsfs: quotes, backslashes and control characters in
    # a name are escaped, and materialize finds each tensor under its own name.
    code = """
import torch, gmsfs.torch as gt, sys
m = torch.nn.Module()
for i, name in enumerate(['q"uote', 'back\\\\slash', 'tab\\tand\\x01', 'plain']):
    m.register_parameter(name, torch.nn.Parameter(torch.full((3,), float(i + 1))))
m.register_buffer("b", torch.arange(5, dtype=torch.float32))
if sys.argv[2] == "publish":
    gt.publish(m, sys.argv[1])
else:
    gt.materialize(m.to("meta"), sys.argv[1])
    print(sorted((n, t.tolist()) for n, t in list(m.named_parameters()) + list(m.named_buffers())))
"""
    assert run_py(code, store, "publish").returncode == 0
    r = run_py(code, store, "read")
    assert r.returncode == 0, r.stderr
    assert eval(r.stdout) == sorted([('q"uote', [1.0] * 3), ("back\\slash", [2.0] * 3), ("tab\tand\x01", [3.0] * 3),
                                    ("plain", [4.0] * 3), ("b", [0.0, 1.0, 2.0, 3.0, 4.0])])
