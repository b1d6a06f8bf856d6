"""gmsfs.adapters (host backend): LoRA-style adapters, a store each, switched into one
slot of a model with peft's names; the pool keeps its mapped adapters to `keep`, idle
ones move to the host tier when the mount's budget needs room, prefetch brings one
back; bad adapters are refused with the slot unchanged.  A mount of its own: 20 MiB of
"device", two adapters of 8 MiB."""
import errno
import os
import time

import numpy as np
import pytest
import torch

from conftest import mounted, remove_stores
from test_loader import write_st

import gmsfs
from gmsfs.adapters import AdapterPool, slot_name
from gmsfs.ctl import read_fields

MiB = 1 << 20


class Lora(torch.nn.Module):
    """A linear layer with one adapter slot, named as peft names it."""

    def __init__(self, n, r):
        super().__init__()
        self.base_layer = torch.nn.Linear(n, n, bias=False)
        self.lora_A = torch.nn.ModuleDict({"default": torch.nn.Linear(n, r, bias=False)})
        self.lora_B = torch.nn.ModuleDict({"default": torch.nn.Linear(r, n, bias=False)})

    def forward(self, x):
        return self.base_layer(x) + self.lora_B["default"](self.lora_A["default"](x))


def model(n=1024, r=512):
    return torch.nn.ModuleDict({"q_proj": Lora(n, r), "v_proj": Lora(n, r)}).eval()


def adapter(tmp, name, seed, n=1024, r=512):
    """An adapter's folder as peft saves it: names without the slot, 8 MiB of float32."""
    rng = np.random.default_rng(seed)
    t = {"%s.lora_%s.weight" % (m, ab): rng.standard_normal(shape).astype(np.float32)
         for m in ("q_proj", "v_proj") for ab, shape in (("A", (r, n)), ("B", (n, r)))}
    d = os.path.join(tmp, name)
    os.makedirs(d, exist_ok=True)
    write_st(os.path.join(d, "adapter_model.safetensors"), {k: ("F32", a) for k, a in t.items()})
    return d, t


def slot(m):
    return {k: v.detach().numpy() for k, v in m.state_dict().items() if ".default." in k}


def tier(store):
    with open(os.path.join(store, "tier")) as f:
        return f.read().strip()


def wait_tier(store, where, timeout=10):
    t = time.time()
    while tier(store) != where:
        assert time.time() - t < timeout, "%s is %s, not %s" % (store, tier(store), where)
        time.sleep(0.01)


def readers(store):
    return int(read_fields(os.path.join(store, "state"))["readers"])


@pytest.fixture(scope="module")
def small():
    yield from mounted("backend=host", "max_bytes=20M", "host_bytes=64M")


@pytest.fixture
def pool_dir(small):
    """The mount itself holds the adapters' stores; emptied after each test."""
    yield small
    remove_stores(small)


def test_slot_names_are_peft_names():
    assert slot_name("base_model.model.layers.0.q_proj.lora_A.default.weight", "default") == \
        "base_model.model.layers.0.q_proj.lora_A.weight"
    assert slot_name("x.lora_embedding_A.default", "default") == "x.lora_embedding_A"
    assert slot_name("x.q_proj.base_layer.weight", "default") is None
    assert slot_name("x.lora_A.other.weight", "default") is None


def test_switching_rebinds_the_slot_and_the_pool_keeps_keep(pool_dir, tmp_path):
    m = model()
    base = m["q_proj"].base_layer.weight.clone()
    ads = {n: adapter(str(tmp_path), n, i) for i, n in enumerate(("a", "b"))}
    with AdapterPool(pool_dir, m, keep=1) as pool:
        for n, (d, _) in ads.items():
            pool.publish(n, d)
        x = torch.randn(4, 1024)
        for n in ("a", "b", "a"):
            pool.use(n)
            got = slot(m)
            want = ads[n][1]
            assert {slot_name(k, "default") for k in got} == set(want)
            assert all(np.array_equal(got[k], want[slot_name(k, "default")]) for k in got)
            lora = m["q_proj"]
            ref = x @ base.T + (x @ torch.from_numpy(want["q_proj.lora_A.weight"]).T) @ \
                torch.from_numpy(want["q_proj.lora_B.weight"]).T
            with torch.no_grad():
                assert torch.allclose(lora(x), ref, rtol=1e-4, atol=1e-3)
            assert pool.mapped == [n]  # keep=1: the other one was released
            other = "b" if n == "a" else "a"
            assert readers(pool.store(n)) == 1 and readers(pool.store(other)) == 0
        assert torch.equal(m["q_proj"].base_layer.weight, base)  # the base is not the slot
        # The slot's tensors are views of the store's memory: no copy.
        c = pool._known["a"][0]
        assert all(c.find_ptr(p.data_ptr()) for k, p in m.named_parameters() if ".default." in k)
        with pytest.raises(gmsfs.GmsfsError) as e:
            pool.release("a")
        assert e.value.errno == errno.EBUSY


def test_idle_adapters_go_to_the_host_tier_and_come_back(pool_dir, tmp_path):
    # 20 MiB of device: two 8 MiB adapters fit, the third sends the least recently used out.
    m = model()
    ads = {n: adapter(str(tmp_path), n, i + 10) for i, n in enumerate(("a", "b", "c"))}
    with AdapterPool(pool_dir, m, keep=1) as pool:
        pool.publish("a", ads["a"][0])
        pool.publish("b", ads["b"][0])
        pool.use("b")
        pool.publish("c", ads["c"][0])  # b is held: a gives way
        assert tier(pool.store("a")) == "host" and tier(pool.store("b")) == "device"
        pool.use("a")  # back from the host tier; b released (keep=1) and c idle: c is older
        assert tier(pool.store("a")) == "device" and tier(pool.store("c")) == "host"
        assert all(np.array_equal(v, ads["a"][1][slot_name(k, "default")]) for k, v in slot(m).items())
        pool.use("b")  # a released: a and b fit
        assert tier(pool.store("a")) == "device"
        pool.prefetch("c")  # c back, a (released, least recently used) out
        wait_tier(pool.store("c"), "device")
        wait_tier(pool.store("a"), "host")
        pool.use("c")
        assert all(np.array_equal(v, ads["c"][1][slot_name(k, "default")]) for k, v in slot(m).items())


def test_bad_adapters_are_refused_and_the_slot_is_unchanged(pool_dir, tmp_path):
    m = model()
    with AdapterPool(pool_dir, m, keep=2) as pool:
        pool.publish("good", adapter(str(tmp_path), "good", 1)[0])
        pool.use("good")
        before = slot(m)
        pool.publish("narrow", adapter(str(tmp_path), "narrow", 2, r=256)[0])  # another rank
        with pytest.raises(RuntimeError) as e:
            pool.use("narrow")
        assert "size mismatch for q_proj.lora_A.weight" in str(e.value) and "[256, 1024]" in str(e.value)
        assert pool.active == "good" and pool.mapped == ["good"] and readers(pool.store("narrow")) == 0
        assert all(np.array_equal(before[k], v) for k, v in slot(m).items())
        d, t = adapter(str(tmp_path), "q_only", 3)
        write_st(os.path.join(d, "adapter_model.safetensors"),
                 {k: ("F32", a) for k, a in t.items() if k.startswith("q_proj.")})
        pool.publish("q_only", d)  # v_proj's tensors lacking: refused by name
        with pytest.raises(KeyError) as e:
            pool.use("q_only")
        assert "adapter (slot 'default')" in str(e.value) and "v_proj.lora_A.weight" in str(e.value)
        assert pool.active == "good" and readers(pool.store("q_only")) == 0
        with pytest.raises(FileExistsError):
            pool.publish("good", adapter(str(tmp_path), "good", 1)[0])
        with pytest.raises((gmsfs.GmsfsError, OSError)) as e:
            pool.use("absent")
        assert e.value.errno == errno.ENOENT
        for bad in ("", "a/b", ".."):
            with pytest.raises(ValueError):
                pool.use(bad)
    with pytest.raises(ValueError):
        AdapterPool(pool_dir, torch.nn.Linear(2, 2))
    with pytest.raises(ValueError):
        AdapterPool(pool_dir, m, keep=0)


def test_a_sleeping_adapter_wakes_at_its_addresses_and_a_republished_one_is_mapped_anew(pool_dir, tmp_path):
    m = model()
    a, b = adapter(str(tmp_path), "a", 21), adapter(str(tmp_path), "b", 22)
    with AdapterPool(pool_dir, m, keep=1) as pool:
        pool.publish("a", a[0])
        pool.publish("b", b[0])
        pool.use("a")
        ptrs = [p.data_ptr() for k, p in m.named_parameters() if ".default." in k]
        pool.use("b")  # a sleeps: no lock, its addresses kept
        assert readers(pool.store("a")) == 0 and pool.mapped == ["b"]
        pool.use("a")
        assert [p.data_ptr() for k, p in m.named_parameters() if ".default." in k] == ptrs
        assert all(np.array_equal(v, a[1][slot_name(k, "default")]) for k, v in slot(m).items())
        pool.use("b")
        pool.forget("b")  # closed: it may give way for the new "a" (the budget holds two)
        assert pool.active is None and pool.mapped == []
        # "a" published again under its name while it sleeps: its layout changed.
        a2 = adapter(str(tmp_path), "a2", 23)
        with gmsfs.connect(pool.store("a"), "rw") as c:
            c.import_all()
            for mp in c.mappings:
                c.free(mp)
            gmsfs.load(c, os.path.join(a2[0], "adapter_model.safetensors"))
            c.commit()
        pool.use("a")
        assert all(np.array_equal(v, a2[1][slot_name(k, "default")]) for k, v in slot(m).items())
