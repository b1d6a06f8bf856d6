"""gmsfs-load and gmsfs-save on the GPU machine.

  python3 tests/gpu/load_gpu.py test MOUNT BUILD    TAP: a transformers Llama saved with
      save_pretrained (sharded), loaded with gmsfs-load, materialized: the same logits as
      from_pretrained from the same files; gmsfs-save writes the same tensors back.
  python3 tests/gpu/load_gpu.py bench MOUNT BUILD   an 8 GiB checkpoint from the page cache:
      gmsfs-load's GB/s against pinned host-to-device copies and against safetensors'
      load_file(device="cuda"), measured in the same run."""
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tap import check, done  # noqa: E402

import torch

mount, build = sys.argv[2], sys.argv[3]
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
os.environ.setdefault("GMSFS_LIBRARY", os.path.join(build, "libgmsfs.so.0"))
import gmsfs.torch as gt  # noqa: E402

LOAD, SAVE = os.path.join(build, "gmsfs-load"), os.path.join(build, "gmsfs-save")


def test():
    from safetensors.torch import load_file
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=512, intermediate_size=1408, num_hidden_layers=4, num_attention_heads=8,
                      num_key_value_heads=2, vocab_size=4096, max_position_embeddings=512, tie_word_embeddings=False)
    src = tempfile.mkdtemp(prefix="gmsfs-llama.")
    LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained(src, max_shard_size="20MB")
    shards = sorted(f for f in os.listdir(src) if f.endswith(".safetensors"))
    store = os.path.join(mount, "loaded")
    os.mkdir(store)
    r = subprocess.run([LOAD, store, src], capture_output=True, text=True)
    check(r.returncode == 0 and len(shards) > 1, "gmsfs-load of a sharded save_pretrained (%d shards)" % len(shards),
          r.stderr.strip())
    ref = LlamaForCausalLM.from_pretrained(src, torch_dtype=torch.bfloat16).cuda().eval()
    # Built as from_pretrained builds it (non-persistent buffers such as the rotary
    # frequencies are made here, in float32); every parameter then becomes a store view.
    mine = LlamaForCausalLM(cfg).cuda().eval()
    persistent = set(mine.state_dict())
    gt.materialize(mine, store, strict=False)
    c = mine._gmsfs
    stored = {k[len("torch/"):] for k in c.meta_list("torch/")}
    ok = all(c.find_ptr(p.data_ptr()) for p in mine.parameters()) and stored == persistent
    check(ok, "every parameter is a view of the store; the store has every persistent name",
          sorted(stored ^ persistent)[:5])
    ids = torch.randint(0, cfg.vocab_size, (2, 32), device="cuda", generator=torch.Generator("cuda").manual_seed(1))
    with torch.no_grad():
        a, b = ref(ids).logits, mine(ids).logits
    check(torch.equal(a, b), "the same logits as from_pretrained from the same files, bit for bit")
    out = tempfile.mkdtemp(prefix="gmsfs-saved.")
    r = subprocess.run([SAVE, store, out], capture_output=True, text=True)
    saved = load_file(os.path.join(out, "model.safetensors"))
    orig = {}
    for f in shards:
        orig.update(load_file(os.path.join(src, f)))
    same = r.returncode == 0 and saved.keys() == orig.keys() and all(
        saved[k].dtype == orig[k].dtype and torch.equal(saved[k], orig[k]) for k in orig)
    check(same, "gmsfs-save writes the same names, dtypes, shapes and bytes back", r.stderr.strip())
    snap = tempfile.mkdtemp(prefix="gmsfs-snap.")
    copy = os.path.join(mount, "restored")
    os.mkdir(copy)
    r1 = subprocess.run([os.path.join(build, "gmsfs-snapshot"), "save", store, snap], capture_output=True, text=True)
    r2 = subprocess.run([os.path.join(build, "gmsfs-snapshot"), "restore", copy, snap], capture_output=True, text=True)
    h = lambda s: open(os.path.join(s, "layout_hash")).read()
    again = LlamaForCausalLM(cfg).cuda().eval()
    gt.materialize(again, copy, strict=False)
    with torch.no_grad():
        d = again(ids).logits
    check(r1.returncode == 0 and r2.returncode == 0 and h(copy) == h(store) and torch.equal(d, a),
          "gmsfs-snapshot save and restore on the GPU: the same layout hash and the same logits",
          (r1.stderr + r2.stderr).strip())
    again._gmsfs.close()
    c.close()
    os.rmdir(store)
    os.rmdir(copy)


def gbps(nbytes, seconds):
    return nbytes / seconds / 1e9


def bench():
    from safetensors.torch import load_file, save_file
    gib, tensors = 8, 64
    each = (gib << 30) // tensors // 2  # bf16 elements
    d = tempfile.mkdtemp(prefix="gmsfs-bench.", dir="/var/tmp")
    path = os.path.join(d, "model.safetensors")
    save_file({"t%03d" % i: torch.empty(each, dtype=torch.bfloat16) for i in range(tensors)}, path)
    size = os.path.getsize(path)
    subprocess.run(["cat", path], stdout=subprocess.DEVNULL, check=True)  # in the page cache
    # Pinned host-to-device, the copy engine's own rate.
    host = torch.empty(1 << 30, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dev.copy_(host, non_blocking=True)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(8):
        dev.copy_(host, non_blocking=True)
    torch.cuda.synchronize()
    pinned = gbps(8 << 30, time.perf_counter() - t)
    del host, dev
    torch.cuda.empty_cache()
    # safetensors' own loader to the GPU.
    t = time.perf_counter()
    x = load_file(path, device="cuda")
    torch.cuda.synchronize()
    st = gbps(size, time.perf_counter() - t)
    del x
    torch.cuda.empty_cache()
    rates = []
    for i in range(3):
        store = os.path.join(mount, "bench%d" % i)
        os.mkdir(store)
        t = time.perf_counter()
        r = subprocess.run([LOAD, "-q", "-v", store, path], capture_output=True, text=True)
        rates.append(gbps(size, time.perf_counter() - t))
        if r.returncode:
            print("# gmsfs-load failed: " + r.stderr)
        elif i == 1:
            print("\n".join("#     " + line for line in r.stderr.splitlines()))
        os.rmdir(store)
    mine = sorted(rates)[1]
    print("# load: %.2f GB checkpoint (%d tensors) from the page cache, median of 3 fresh gmsfs-load processes"
          % (size / 1e9, tensors))
    print("#   pinned host-to-device copies       %6.2f GB/s" % pinned)
    print("#   safetensors load_file to cuda      %6.2f GB/s" % st)
    print("#   gmsfs-load (a fresh process)       %6.2f GB/s   %.2fx pinned, %.2fx load_file" % (mine, mine / pinned,
                                                                                              mine / st))
    check(all(rates), "gmsfs-load of an 8 GiB checkpoint", "rates %s" % ["%.2f" % x for x in rates])
    # Cold: the page cache dropped, against the disk's own O_DIRECT rate measured beside it.
    def drop():
        return subprocess.run(["sh", "-c", "sync && echo 3 > /proc/sys/vm/drop_caches"]).returncode == 0
    if drop():
        t = time.perf_counter()
        subprocess.run(["dd", "if=" + path, "of=/dev/null", "bs=64M", "iflag=direct", "status=none"], check=True)
        direct = gbps(size, time.perf_counter() - t)
        drop()
        store = os.path.join(mount, "cold")
        os.mkdir(store)
        t = time.perf_counter()
        r = subprocess.run([LOAD, "-q", store, path], capture_output=True, text=True)
        cold = gbps(size, time.perf_counter() - t)
        os.rmdir(store)
        print("#   cold (page cache dropped): dd iflag=direct %.2f GB/s, gmsfs-load %.2f GB/s: %.2fx"
              % (direct, cold, cold / direct))
        check(r.returncode == 0, "gmsfs-load with the page cache dropped", r.stderr.strip())
    else:
        print("#   cold: could not drop the page cache here")
    os.unlink(path)
    os.rmdir(d)


if __name__ == "__main__":
    torch.cuda.init()
    torch.empty(1, device="cuda")
    (test if sys.argv[1] == "test" else bench)()
    sys.exit(done())
