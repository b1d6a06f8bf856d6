#!/usr/bin/env python3
"""Adapter pools on the GPU with peft (TAP, then benchmark lines).

    adapters_gpu.py MOUNT    a small Llama (hidden 2048, 16 layers, bfloat16) and 64
        rank-16 LoRA adapters on q/k/v/o (peft, random, saved with save_pretrained), each
        published to a store of MOUNT by gmsfs.adapters.AdapterPool; the mount's budget
        (max_bytes, set by run.sh) holds about 16 of them, so most wait on the host tier.
        Switch times, in the same run: hot (mapped), prefetched, warm (host tier) and cold
        (from safetensors) through the pool, against peft's own load_adapter and
        set_adapter; every output checked identical to peft's."""
import copy
import os
import random
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
from tap import check, done  # noqa: E402

import torch  # noqa: E402
from gmsfs.adapters import AdapterPool  # noqa: E402

N = 64
mount = sys.argv[1]


def median(xs):
    return sorted(xs)[len(xs) // 2]


def timed(fn):
    torch.cuda.synchronize()
    t = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t


def tier(store):
    with open(os.path.join(store, "tier")) as f:
        return f.read().strip()


def main():
    from peft import LoraConfig, PeftModel, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.zeros(1, device="cuda")
    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=2048, intermediate_size=5632, num_hidden_layers=16, num_attention_heads=32,
                      num_key_value_heads=4, vocab_size=32000, max_position_embeddings=2048)
    with torch.device("cuda"):
        base = LlamaForCausalLM(cfg).to(torch.bfloat16).eval()
    lcfg = LoraConfig(r=16, lora_alpha=32, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
                      lora_dropout=0.0, init_lora_weights=False)
    mine = get_peft_model(copy.deepcopy(base), lcfg).eval()  # the engine: one slot, "default"
    lora = [p for n, p in mine.named_parameters() if "lora_" in n]
    tmp = tempfile.mkdtemp(prefix="gmsfs-lora.", dir="/var/tmp")
    dirs = []
    for i in range(N):
        g = torch.Generator(device="cuda").manual_seed(1000 + i)
        with torch.no_grad():
            for p in lora:
                p.normal_(0, 0.02, generator=g)
        d = os.path.join(tmp, "a%02d" % i)
        mine.save_pretrained(d)
        dirs.append(d)
    size = os.path.getsize(os.path.join(dirs[0], "adapter_model.safetensors"))
    print("# %d adapters of %.1f MB (%d tensors, %s), base %.2f GB" % (
        N, size / 1e6, len(lora), lora[0].dtype, sum(p.numel() * p.element_size() for p in base.parameters()) / 1e9))

    # peft's own way: every adapter loaded into one PeftModel, then switched by name.
    ref = PeftModel.from_pretrained(copy.deepcopy(base), dirs[0], adapter_name="a00").eval()
    loads = [timed(lambda i=i: ref.load_adapter(dirs[i], adapter_name="a%02d" % i)) for i in range(1, N)]
    sets = [timed(lambda i=i: ref.set_adapter("a%02d" % i)) for i in random.Random(1).sample(range(N), 32)]

    # gmsfs: a store per adapter; the budget holds about 16, the rest go to the host tier.
    pool = AdapterPool(mount, mine, keep=8, timeout=60)
    for i in range(N):
        pool.publish("a%02d" % i, dirs[i])
    waiting = [i for i in range(N) if tier(pool.store("a%02d" % i)) == "host"]
    check(len(waiting) >= N // 2, "publishing 64 adapters within a budget of about 16: %d wait on the host tier"
          % len(waiting))

    ids = torch.randint(0, cfg.vocab_size, (1, 64), device="cuda", generator=torch.Generator("cuda").manual_seed(2))
    same = True
    for i in random.Random(3).sample(range(N), 12):
        ref.set_adapter("a%02d" % i)
        pool.use("a%02d" % i)
        with torch.no_grad():
            a, b = ref(ids).logits, mine(ids).logits
        same = same and torch.equal(a, b)
    check(same, "12 adapters switched through the pool: logits identical to peft's set_adapter, bit for bit")
    with torch.no_grad():
        pool.use("a00")
        x = mine(ids).logits
        pool.use("a01")
        y = mine(ids).logits
    check(not torch.equal(x, y), "two adapters give two outputs (the slot really changes)")

    def on_host(known):  # adapters on the host tier, not mapped; known: this process has used them
        return ["a%02d" % i for i in range(N) if "a%02d" % i not in pool.mapped and
                (("a%02d" % i) in pool._known) == known and tier(pool.store("a%02d" % i)) == "host"]

    # Warm, the first use by this process: connected, mapped, its tensors made.
    first = [timed(lambda n=n: pool.use(n)) for n in on_host(False)[:16]]
    for i in range(N):  # every adapter used once: the engine after its first requests
        pool.use("a%02d" % i)
    # Warm: asleep on the host tier (the budget is full: each brings one in, one idle out).
    names = on_host(True)[:16]
    warm = [timed(lambda n=n: pool.use(n)) for n in names]
    check(len(warm) >= 8 and all(tier(pool.store(n)) == "device" for n in names[-pool.keep:]),
          "warm switches: %d sleeping adapters brought back from the host tier by use()" % len(warm))
    # Hot: the pool's mapped adapters, switched among.
    hot = [timed(lambda n=n: pool.use(n)) for _ in range(4) for n in pool.mapped]
    # Prefetched: asked ahead (gmsfs.prefetch), back on the device by the time the request comes.
    pre = []
    for n in on_host(True)[:8]:
        pool.prefetch(n)
        t = time.perf_counter()
        while tier(pool.store(n)) != "device" and time.perf_counter() - t < 30:
            time.sleep(0.001)
        pre.append(timed(lambda n=n: pool.use(n)))
    # Cold: from the safetensors file into a new store, then used.
    cold = []
    for i in range(8):
        n = "cold%02d" % i
        cold.append(timed(lambda n=n, i=i: (pool.publish(n, dirs[i]), pool.use(n))))
    pool.use("a05")
    with torch.no_grad():
        ref.set_adapter("a05")
        check(torch.equal(ref(ids).logits, mine(ids).logits), "after every switch kind: still identical to peft's")

    ms = lambda xs: median(xs) * 1e3  # noqa: E731
    print("bench: adapters (%.1f MB, rank 16, q/k/v/o, 16 layers), medians:" % (size / 1e6))
    print("bench:   peft load_adapter (from safetensors, page cache) %8.3f ms" % ms(loads))
    print("bench:   peft set_adapter (loaded)                         %8.3f ms" % ms(sets))
    print("bench:   gmsfs hot (mapped: the slot rebound)              %8.3f ms" % ms(hot))
    print("bench:   gmsfs prefetched (asleep on the device: remapped) %8.3f ms" % ms(pre))
    print("bench:   gmsfs warm (asleep on the host tier: one in, one idle out) %8.3f ms" % ms(warm))
    print("bench:   gmsfs warm, its first use by this process         %8.3f ms" % ms(first))
    print("bench:   gmsfs cold (gmsfs.load of the file into a store)  %8.3f ms" % ms(cold))
    print("bench: warm %.0fx faster than load_adapter, hot %.0fx faster than set_adapter, cold %.1fx load_adapter"
          % (median(loads) / median(warm), median(sets) / median(hot), median(loads) / median(cold)))
    check(median(loads) / median(warm) >= 100, "a warm switch at least 100x faster than peft's load_adapter")
    pool.close()
    return done()


if __name__ == "__main__":
    sys.exit(main())
