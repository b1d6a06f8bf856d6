#!/usr/bin/env python3
"""Many engines on one store, as an inference server starts them (TAP, then bench lines).

    engines_gpu.py MOUNT    an 8B-shaped transformers Llama (bfloat16, save_pretrained in
        5 GB shards, in the page cache), then, every engine a freshly started process:
      - transformers' own from_pretrained(device_map="cuda") of the folder: the reference
        logits, and its time to a ready model;
      - 8 engines started together on an empty store, each calling
        gmsfs.transformers.from_pretrained(store, folder): exactly one loads, all give the
        reference logits bit for bit, none is ready later than the loader + 1 s;
      - a fresh engine on the committed store: time to a ready model (meta build, connect,
        import, materialize) against from_pretrained's (goal >= 30x), and materialize
        against PyTorch's own making of the same views (goal <= 1.5x);
      - gmsfs.torch.load_or_publish with a load_weights that reads the checkpoint to the
        GPU (safetensors load_file(device="cuda"), load_state_dict): the store holds the
        model and at most one slab more, not the loader's temporaries.
    Every time is taken after the process's imports, its CUDA context and a first
    synchronize, which come first in every engine alike (imports and context printed apart).
    GMSFS_FROM_INSTALL=1: the gmsfs package is the one installed (a pip-installed wheel),
    never the tree's python/, in this process and in every engine (tests/gpu/run.sh wheel)."""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
INSTALLED = os.environ.get("GMSFS_FROM_INSTALL") == "1"
PY = os.path.join(HERE, "..", "..", "python")
if not INSTALLED:
    sys.path.insert(0, PY)
from tap import check, done  # noqa: E402

ENGINES = 8

# One engine: imports and context first, then "ready" on stdout; it starts on a line
# on stdin (all at once), and answers one JSON line.
ENGINE = r"""
import hashlib, json, os, sys, time
kind, store, folder = sys.argv[1], sys.argv[2], sys.argv[3]
t0 = time.perf_counter()
import torch, transformers
import gmsfs, gmsfs.torch as gt, gmsfs.transformers as gtf
import gmsfs._torch_layout as _tl, gmsfs._torch_materialize as _tm
import floor  # tests/gpu
# The model's class too (transformers imports its module lazily, ~6 s), as an engine
# resolves its architectures at start: from_pretrained pays it as well.
getattr(transformers, transformers.AutoConfig.from_pretrained(folder).architectures[0])
imports = time.perf_counter() - t0
t0 = time.perf_counter()
torch.zeros(1, device="cuda")
ctx = time.perf_counter() - t0
ids = torch.randint(0, 128256, (1, 32), device="cuda", generator=torch.Generator("cuda").manual_seed(1))
# Nothing left running on the GPU and the process's first synchronize made (it costs
# ~0.1 ms more than later ones): as the floor's process has it before it times.
torch.cuda.synchronize()
out = {"imports_s": imports, "context_s": ctx, "package": gmsfs.__file__, "library": gmsfs._lib.path}
print("ready", flush=True)
sys.stdin.readline()
t0 = time.perf_counter()
if kind == "hf":
    kw = {"dtype" if int(transformers.__version__.split(".")[0]) >= 5 else "torch_dtype": torch.bfloat16}
    m = transformers.AutoModelForCausalLM.from_pretrained(folder, device_map="cuda", **kw).eval()
elif kind == "gmsfs":
    m = gtf.from_pretrained(store, folder)
    out["published"] = m._gmsfs_published
elif kind == "parts":  # the same as gmsfs, step by step, with PyTorch's own views beside
    cfg = transformers.AutoConfig.from_pretrained(folder)
    m = gtf.build_meta(cfg)
    made_from = gtf.recipe(folder, m)  # as from_pretrained: with the build, before it connects
    t1 = time.perf_counter()
    c = gmsfs.connect(store, "ro", timeout=60)
    c.import_all()
    t2 = time.perf_counter()
    floor.profiled(gtf.materialize, m, c, made_from)  # from_pretrained's reader; GMSFS_PROFILE profiles it
    torch.cuda.synchronize()
    t3 = time.perf_counter()
    m.eval()
    out.update(build_meta_s=t1 - t0, connect_import_s=t2 - t1, materialize_s=t3 - t2)
    out["zero_copy"] = all(c.find_ptr(p.data_ptr()) for p in m.parameters())
    out["stored_buffers"] = all(c.find_ptr(b.data_ptr()) for b in m.buffers())
    out["groups"], out["tensors"] = len(_tm._manifest(c).groups), len(list(m.parameters())) + len(list(m.buffers()))
    out["views_floor_s"] = floor.views_floor(m)
elif kind == "override":  # another rope theta than the loader's: this engine makes its own inv_freq
    cfg = transformers.AutoConfig.from_pretrained(folder)
    if isinstance(getattr(cfg, "rope_parameters", None), dict):  # transformers 5
        kw = {"rope_parameters": dict(cfg.rope_parameters, rope_theta=250000.0)}
    else:
        kw = {"rope_theta": 250000.0}
    m = gtf.from_pretrained(store, folder, **kw)
    rotary = m.model.rotary_emb
    inv = rotary.inv_freq
    stored = m._gmsfs.meta_get("torch/model.rotary_emb.inv_freq")
    own = type(rotary)(config=m.config, device="cpu").inv_freq  # transformers' own, for this config
    out["own_buffers"] = m._gmsfs.find_ptr(inv.data_ptr()) is None
    out["inv_freq_ok"] = torch.equal(inv.cpu(), own) and not torch.equal(inv.cpu(), _tl._bytes_at(
        stored.ptr, stored.size, inv.device).view(torch.float32).cpu())
    print(json.dumps(out), flush=True)
    sys.exit(0)
elif kind == "floor":  # PyTorch's own view-making for the same tensors, in a fresh process as materialize
    m = gtf.build_meta(transformers.AutoConfig.from_pretrained(folder))
    c = gmsfs.connect(store, "ro", timeout=60)
    c.import_all()
    out["fresh_floor_s"], out["tensors"], out["bases_s"] = floor.views_floor_fresh(m, c)
    print(json.dumps(out), flush=True)
    sys.exit(0)
elif kind == "lsd":  # PyTorch's load_state_dict(assign=True) of the same views, in a fresh process
    m = gtf.build_meta(transformers.AutoConfig.from_pretrained(folder))
    c = gmsfs.connect(store, "ro", timeout=60)
    c.import_all()
    out["lsd_s"] = floor.load_state_dict_fresh(m, c)
    print(json.dumps(out), flush=True)
    sys.exit(0)
torch.cuda.synchronize()
out["ready_s"] = time.perf_counter() - t0
with torch.no_grad():
    lg = m(ids).logits
out["logits"] = hashlib.sha256(lg.float().cpu().numpy().tobytes()).hexdigest()
print(json.dumps(out), flush=True)
"""

# load_or_publish with a loader that reads the checkpoint to the GPU first.
GARBAGE = r"""
import json, os, sys
import torch, transformers
from safetensors.torch import load_file
import gmsfs.torch as gt, gmsfs.transformers as gtf
store, folder = sys.argv[1], sys.argv[2]
cfg = transformers.AutoConfig.from_pretrained(folder)
def build():
    kw = {"dtype" if int(transformers.__version__.split(".")[0]) >= 5 else "torch_dtype": torch.bfloat16}
    torch.set_default_dtype(torch.bfloat16)
    with torch.device("cuda"):
        m = transformers.AutoModelForCausalLM.from_config(cfg, **kw)
    torch.set_default_dtype(torch.float32)
    return m
def load_weights(m):
    for f in sorted(os.listdir(folder)):
        if f.endswith(".safetensors"):
            sd = load_file(os.path.join(folder, f), device="cuda")
            m.load_state_dict(sd, strict=False)
            del sd
m = gt.load_or_publish(store, build, load_weights)
tensors = sum(t.numel() * t.element_size() for t in list(m.parameters()) + list(m.buffers()))
print(json.dumps({"published": m._gmsfs_published, "tensor_bytes": tensors,
                  "allocations": len(m._gmsfs.mappings),
                  "store_bytes": sum(x.size for x in m._gmsfs.mappings)}), flush=True)
"""


def env():
    return dict(os.environ, PYTHONPATH=HERE if INSTALLED else PY + os.pathsep + HERE, PYTHONUNBUFFERED="1")


def launch(kind, store, folder, **extra_env):
    """An engine's process, started: its imports and context under way (ready() waits)."""
    return subprocess.Popen([sys.executable, "-c", ENGINE, kind, store, folder], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(env(), **extra_env))


def ready(p):
    """p once it says it is ready (its imports and context done, waiting for go)."""
    line = p.stdout.readline().strip()
    if line != "ready":
        raise RuntimeError("engine did not start: %s" % p.stderr.read()[-3000:])
    return p


def start(kind, store, folder, **extra_env):
    return ready(launch(kind, store, folder, **extra_env))


def go(procs):
    for p in procs:
        p.stdin.write("go\n")
        p.stdin.flush()
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=500)
        if p.returncode:
            raise RuntimeError("engine failed: %s" % err[-3000:])
        outs.append(json.loads(out.strip().splitlines()[-1]))
    return outs


def one(kind, store, folder):
    return go([start(kind, store, folder)])[0]


def median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2]


def checkpoint():
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                      num_key_value_heads=8, vocab_size=128256, max_position_embeddings=8192, rope_theta=500000.0,
                      tie_word_embeddings=False)
    folder = tempfile.mkdtemp(prefix="gmsfs-engines.", dir="/var/tmp")
    t = time.perf_counter()
    torch.set_default_dtype(torch.bfloat16)
    torch.manual_seed(0)
    with torch.device("cuda"):
        m = LlamaForCausalLM(cfg)
    torch.set_default_dtype(torch.float32)
    m.save_pretrained(folder, max_shard_size="5GB")
    nbytes = sum(p.numel() * p.element_size() for p in m.parameters())
    del m
    torch.cuda.empty_cache()
    os.sync()  # written out before anything is timed: no writeback of 16 GB beside the fresh processes
    for f in os.listdir(folder):  # into the page cache, as a served model's files are
        with open(os.path.join(folder, f), "rb") as fh:
            while fh.read(1 << 26):
                pass
    print("# an 8B-shaped checkpoint of %.2f GB written and read in %.0f s" % (nbytes / 1e9, time.perf_counter() - t))
    return folder, nbytes


def main():
    mount = sys.argv[1]
    gate = sys.argv[2:] == ["gate"]  # the 8 engines alone (tests/gpu/gate.py)
    folder, nbytes = checkpoint()
    hf = None if gate else one("hf", "-", folder)
    if hf:
        print("# from_pretrained(device_map=cuda), fresh process: ready in %.3f s (imports %.1f s, context %.2f s "
              "apart)" % (hf["ready_s"], hf["imports_s"], hf["context_s"]))

    store = os.path.join(mount, "llama8b")
    os.mkdir(store)
    # Their starts (imports, contexts: 15-20 s each) at once, not one after another: what is
    # timed begins at go, with every engine ready.
    procs = [ready(p) for p in [launch("gmsfs", store, folder) for _ in range(ENGINES)]]
    outs = go(procs)
    loaders = [o for o in outs if o.get("published")]
    if INSTALLED:
        tree = os.path.realpath(os.path.join(HERE, "..", ".."))
        where = sorted({(o["package"], o["library"]) for o in outs})
        check(all(not os.path.realpath(p).startswith(tree + os.sep) and "/_native/" in lib for p, lib in where),
              "every engine runs the installed wheel, its own libgmsfs (no PYTHONPATH, GMSFS_LIBRARY, "
              "LD_LIBRARY_PATH)", "from: %s" % where)
        print("# the package and library: %s" % where[0][1] if where else "# none")
    check(len(loaders) == 1, "%d engines started together on an empty store: exactly one loads" % ENGINES,
          "loaders: %d" % len(loaders))
    check(all(o["logits"] == (hf or outs[0])["logits"] for o in outs),
          "every engine gives %s logits, bit for bit" % ("from_pretrained's" if hf else "the same"))
    if loaders:
        limit = loaders[0]["ready_s"] + 1.0
        waits = sorted(o["ready_s"] for o in outs if not o.get("published"))
        check(max(waits) <= limit, "none is ready later than the loader (%.2f s) + 1 s" % loaders[0]["ready_s"],
              "the others ready after %s s" % ", ".join("%.2f" % w for w in waits))
        # For tests/gpu/gate.py: the last engine ready within the publisher + 1 s.
        print("gate: engines-ready %.4f %.4f 1.0 %d engines started together on an empty store: the last one ready, "
              "against the publisher's time + 1 s (s)" % (max(waits), limit, ENGINES))
        print("# bench: %d engines at once: the loader ready in %.2f s (gmsfs.load from the page cache + commit + "
              "materialize: %.1f GB/s), the others %.2f-%.2f s; from_pretrained alone %.2f s"
              % (ENGINES, loaders[0]["ready_s"], nbytes / 1e9 / loaders[0]["ready_s"], min(waits), max(waits),
                 hf["ready_s"] if hf else float("nan")))
    if gate:
        shutil.rmtree(folder, ignore_errors=True)
        return done()

    runs, floors = [], []
    for _ in range(5):  # materialize and the floor by turns: what drifts on the machine falls on both
        runs.append(one("parts", store, folder))
        floors.append(one("floor", store, folder))
    check(all(r["zero_copy"] and r["stored_buffers"] for r in runs) and all(r["logits"] == hf["logits"] for r in runs),
          "a fresh engine on the committed store: every parameter and buffer (its rotary inv_freq, stored by the "
          "loader with its recipe) a view of it, from_pretrained's logits",
          json.dumps([{k: r[k] for k in ("zero_copy", "stored_buffers")} for r in runs]))
    o = one("override", store, folder)
    check(o["own_buffers"] and o["inv_freq_ok"], "an engine with another rope theta makes its own inv_freq, "
          "transformers' for its config, not the store's", json.dumps(o))
    if os.environ.get("GMSFS_PROFILE"):  # one more, under cProfile: its profile as comments
        p = start("parts", store, folder, GMSFS_PROFILE="1")
        p.stdin.write("go\n")
        p.stdin.flush()
        print("".join("# " + line for line in p.communicate(timeout=500)[1].splitlines(True)[:60]), end="")
    warm = [one("gmsfs", store, folder) for _ in range(5)]
    check(all(r["logits"] == hf["logits"] and not r["published"] for r in warm),
          "gmsfs.transformers.from_pretrained on the committed store: from_pretrained's logits")
    warm_ready = median(r["ready_s"] for r in warm)
    lsd = min(one("lsd", store, folder)["lsd_s"] for _ in range(2))  # the faster of two (a run must stay within its limit)
    mat, floor = median(r["materialize_s"] for r in runs), median(r["fresh_floor_s"] for r in floors)
    warm_floor = median(r["views_floor_s"] for r in runs)
    print("# bench: fresh engine, committed store, median of 5: gmsfs.transformers.from_pretrained ready in "
          "%.1f ms = %.0fx faster than from_pretrained (%.3f s; goal >= 30x)" % (
              warm_ready * 1e3, hf["ready_s"] / warm_ready, hf["ready_s"]))
    print("# bench:   its parts: build on meta %.1f ms, connect + import %.1f ms, materialize %.2f ms against "
          "PyTorch's own view-making for the same tensors in a fresh process %.2f ms: %.2fx (goal <= 1.5x); "
          "against the same made again in a warm process (%.2f ms): %.2fx; %d tensors in %d groups"
          % (median(r["build_meta_s"] for r in runs) * 1e3, median(r["connect_import_s"] for r in runs) * 1e3,
             mat * 1e3, floor * 1e3, mat / floor, warm_floor * 1e3, mat / warm_floor, runs[0]["tensors"],
             runs[0]["groups"]))
    print("# bench:   materialize each run: %s ms; the floor each run, taken by turns with it: %s ms; their "
          "ratios run by run: %s (median %.2fx)"
          % (", ".join("%.2f" % (r["materialize_s"] * 1e3) for r in runs),
             ", ".join("%.2f" % (r["fresh_floor_s"] * 1e3) for r in floors),
             ", ".join("%.2f" % (r["materialize_s"] / f["fresh_floor_s"]) for r, f in zip(runs, floors)),
             median(r["materialize_s"] / f["fresh_floor_s"] for r, f in zip(runs, floors))))
    with_bases = median(f["fresh_floor_s"] + f["bases_s"] for f in floors)
    print("# bench:   the floor with its bases made too (a tensor over each region from its pointer, one per "
          "dtype: %.2f ms of it), as materialize must: %.2f ms: materialize %.2fx"
          % (median(f["bases_s"] for f in floors) * 1e3, with_bases * 1e3, mat / with_bases))
    print("# bench:   and against PyTorch's load_state_dict(views, assign=True) of the same views, "
          "which matches names and checks shapes as materialize does (views made beforehand, fresh process): "
          "%.2f ms: %.2fx" % (lsd * 1e3, mat / lsd))
    os.rmdir(store)

    store = os.path.join(mount, "garbage")
    os.mkdir(store)
    r = subprocess.run([sys.executable, "-c", GARBAGE, store, folder], capture_output=True, text=True, env=env())
    if r.returncode:
        check(False, "load_or_publish with a loader that reads to the GPU", r.stderr[-3000:])
    else:
        g = json.loads(r.stdout.strip().splitlines()[-1])
        slab = 1 << 30
        check(g["published"] and g["store_bytes"] <= g["tensor_bytes"] + slab,
              "load_or_publish, load_weights reading the checkpoint to the GPU: the store holds the model and at "
              "most one slab more",
              "store %.2f GB in %d allocations for %.2f GB of tensors" % (g["store_bytes"] / 1e9, g["allocations"],
                                                                          g["tensor_bytes"] / 1e9))
    os.rmdir(store)
    for f in os.listdir(folder):
        os.unlink(os.path.join(folder, f))
    os.rmdir(folder)
    return done()


if __name__ == "__main__":
    sys.exit(main())
