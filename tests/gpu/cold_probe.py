"""Cold loads beside host memory made ahead (bash tests/gpu/run.sh cold): an 8 GB
Llama-shaped checkpoint loaded with gmsfs.transformers.from_pretrained three times in one
process, each into a new store (the budget holds all), each followed by gmsfs.load alone
into another, with transformers' load and pinned copies between the second and third as
an engine's process has them.  Run on a mount with host memory made ahead (the default)
and on one with -o no_host_ahead: the two should give the same times.

    python3 tests/gpu/cold_probe.py MOUNT"""
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import torch  # noqa: E402
import gmsfs  # noqa: E402
import gmsfs.transformers as gtf  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

mount = sys.argv[1]
torch.zeros(1, device="cuda")
cfg = LlamaConfig(hidden_size=4096, intermediate_size=14336, num_hidden_layers=14, num_attention_heads=32,
                  num_key_value_heads=8, vocab_size=128256, tie_word_embeddings=False)
folder = tempfile.mkdtemp(prefix="gmsfs-cold.", dir="/var/tmp")
torch.set_default_dtype(torch.bfloat16)
with torch.device("cuda"):
    m = LlamaForCausalLM(cfg)
torch.set_default_dtype(torch.float32)
m.save_pretrained(folder, max_shard_size="5GB")
del m
torch.cuda.empty_cache()
gb = sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder)) / 1e9


def cold(name):
    store = os.path.join(mount, name)
    os.mkdir(store)
    t = time.perf_counter()
    model = gtf.from_pretrained(store, folder)
    took = time.perf_counter() - t
    os.mkdir(store + "-load")
    c = gmsfs.connect(store + "-load", "rw", 10)
    t = time.perf_counter()
    gmsfs.load(c, folder)
    alone = time.perf_counter() - t
    c.close()
    model._gmsfs.close()
    print("cold: %-18s from_pretrained %.3f s (%.1f GB/s), gmsfs.load alone %.3f s" % (name, took, gb / took, alone),
          flush=True)


print("cold: a checkpoint of %.2f GB, host memory made ahead: %s" % (gb, "no" if "no_host_ahead" in
      open(os.path.join(mount, "device")).read() else "yes"))
cold("first")
cold("second")
r = LlamaForCausalLM.from_pretrained(folder, dtype=torch.bfloat16).cuda()
pins = [torch.empty(p.shape, dtype=p.dtype, pin_memory=True).copy_(p.data) for p in r.parameters()]
del r, pins
torch.cuda.empty_cache()
cold("after_transformers")
shutil.rmtree(folder)
