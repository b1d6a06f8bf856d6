#!/usr/bin/env python3
"""Model switching on one GPU (TAP, then benchmark lines).

    switch_gpu.py MOUNT    two 8B-shaped transformers Llamas (bfloat16, save_pretrained,
        B's weights A's negated) on a mount whose budget (max_bytes, set by run.sh) holds
        one: engine A sleeps, B wakes, and back.  Each switch is timed from the sleep to
        the woken model (gmsfs.torch.sleep, wake): warm (the other store on the host
        tier), and cold (gmsfs.transformers.from_pretrained of a store not loaded yet:
        gmsfs-load from the page cache, and from the disk, and materialize), against transformers'
        from_pretrained of the same folder and a pinned host-to-device copy of the same
        bytes, all in this run; every woken model's logits checked against
        from_pretrained's."""
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
from tap import check, done  # noqa: E402

import torch  # noqa: E402
import gmsfs.torch as gt  # noqa: E402
import gmsfs.transformers as gtf  # noqa: E402

mount = sys.argv[1]


def now():
    torch.cuda.synchronize()
    return time.perf_counter()


def logits(model, ids):
    with torch.no_grad():
        return model(ids).logits[:, -4:].float()


def tier(store):
    with open(os.path.join(store, "tier")) as f:
        return f.read().strip()


def main():
    import transformers
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.zeros(1, device="cuda")
    cfg = LlamaConfig(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                      num_key_value_heads=8, vocab_size=128256, max_position_embeddings=8192, rope_theta=500000.0,
                      tie_word_embeddings=False)
    tmp = tempfile.mkdtemp(prefix="gmsfs-switch.", dir="/var/tmp")
    dirs = {"A": os.path.join(tmp, "A"), "B": os.path.join(tmp, "B")}
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    torch.manual_seed(0)
    t = time.perf_counter()
    with torch.device("cuda"):
        m = LlamaForCausalLM(cfg)
    torch.set_default_dtype(default)
    m.save_pretrained(dirs["A"], max_shard_size="5GB")
    with torch.no_grad():
        for p in m.parameters():
            p.neg_()
    m.save_pretrained(dirs["B"], max_shard_size="5GB")
    nbytes = sum(p.numel() * p.element_size() for p in m.parameters())
    del m
    torch.cuda.empty_cache()
    print("# two 8B-shaped checkpoints of %.2f GB written in %.0f s" % (nbytes / 1e9, time.perf_counter() - t))
    ids = torch.randint(0, cfg.vocab_size, (1, 32), device="cuda", generator=torch.Generator("cuda").manual_seed(1))

    # transformers' own load of each folder (the page cache holds them): the reference logits.
    major = int(transformers.__version__.split(".")[0])
    kw = {"dtype" if major >= 5 else "torch_dtype": torch.bfloat16}
    try:
        import accelerate  # noqa: F401  device_map needs it
        kw["device_map"] = "cuda"
    except ImportError:
        pass
    ref, hf = {}, []
    for name in ("A", "B"):
        t = now()
        m = LlamaForCausalLM.from_pretrained(dirs[name], **kw)
        m = m.cuda().eval()
        hf.append(now() - t)
        ref[name] = logits(m, ids)
        del m
        torch.cuda.empty_cache()
    check(not torch.equal(ref["A"], ref["B"]), "the two models give different logits")

    # The floor: a pinned host-to-device copy of the same bytes.
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    h2d = []
    for _ in range(2):
        t = now()
        dev.copy_(host, non_blocking=True)
        h2d.append(now() - t)
    del host, dev
    torch.cuda.empty_cache()

    stores = {n: os.path.join(mount, "llama-" + n) for n in ("A", "B")}
    for s in stores.values():
        os.mkdir(s)
    # Cold: A into an empty budget; then B while A sleeps (A's first move out: it makes
    # its pinned host memory).
    t = now()
    models = {"A": gtf.from_pretrained(stores["A"], dirs["A"])}
    cold_first = now() - t
    check(torch.equal(logits(models["A"], ids), ref["A"]), "A loaded cold: from_pretrained's logits")
    t = now()
    gt.sleep(models["A"])
    models["B"] = gtf.from_pretrained(stores["B"], dirs["B"])
    cold_evict = now() - t
    check(torch.equal(logits(models["B"], ids), ref["B"]) and tier(stores["A"]) == "host",
          "B loaded cold while A sleeps: A went to the host tier, B has from_pretrained's logits")

    # Warm: sleep one, wake the other (its store on the host tier), six times.
    warm, ok, cur = [], True, "B"
    for _ in range(6):
        other = "A" if cur == "B" else "B"
        t = now()
        gt.sleep(models[cur])
        gt.wake(models[other], timeout=120)
        warm.append(now() - t)
        ok = ok and torch.equal(logits(models[other], ids), ref[other]) and tier(stores[cur]) == "host"
        cur = other
    check(ok, "six warm switches: each woken model has its logits, the other sleeps on the host tier")

    # Cold again, the sleeping one's host memory kept: A loaded into a new store while B sleeps.
    gt.sleep(models[cur])
    for m in models.values():
        m._gmsfs.close()
    os.rmdir(stores["A"])

    def cold(name, what):  # A from its folder into a new store: seconds, and the store removed
        store = os.path.join(mount, "llama-" + name)
        os.mkdir(store)
        t = now()
        m = gtf.from_pretrained(store, dirs["A"])
        took = now() - t
        check(torch.equal(logits(m, ids), ref["A"]), "A loaded cold again: " + what)
        m._gmsfs.close()
        os.rmdir(store)
        return took
    cold_kept = cold("A2", "B out into its kept host memory")
    cold_disk = None  # the page cache dropped, the budget empty (A2 removed)
    if subprocess.run(["sh", "-c", "sync && echo 3 > /proc/sys/vm/drop_caches"]).returncode == 0:
        cold_disk = cold("A3", "from the disk (page cache dropped)")

    gb = nbytes / 1e9
    later = sorted(warm[1:])[len(warm[1:]) // 2]
    floor = min(h2d)
    print("bench: switching between two 8B-shaped models (%.2f GB each) on a budget that holds one, in-process:" % gb)
    print("bench:   pinned host-to-device copy of the same bytes        %7.3f s" % floor)
    print("bench:   warm: sleep A, wake B (B on the host tier), median   %7.3f s  (%.2fx the pinned copy)"
          % (later, floor / later))
    print("bench:   warm, the first (B's first move out makes its pinned memory) %7.3f s" % warm[0])
    print("bench:   cold: gmsfs-load from the page cache + materialize %7.3f s  (the budget empty)" % cold_first)
    print("bench:   cold, the sleeping model's first move out too       %7.3f s" % cold_evict)
    print("bench:   cold, the sleeping model out into kept host memory  %7.3f s" % cold_kept)
    if cold_disk is not None:
        print("bench:   cold from the disk (page cache dropped), the budget empty %7.3f s" % cold_disk)
    print("bench:   transformers from_pretrained (%s)  %7.3f s, %7.3f s"
          % ("device_map=cuda" if "device_map" in kw else "then .cuda()", hf[0], hf[1]))
    print("bench: a warm switch is %.1fx faster than from_pretrained, %.1fx faster than a cold gmsfs load"
          % (min(hf) / later, cold_kept / later))
    print("bench: warm switches: %s" % " ".join("%.3f" % w for w in warm))
    shutil.rmtree(tmp)
    return done()


if __name__ == "__main__":
    sys.exit(main())
