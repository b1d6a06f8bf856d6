#!/usr/bin/env python3
"""CUDA graphs of 8 shapes in the memory of the largest (TAP, then bench lines).

    graph_gpu.py MOUNT    4 decoder layers of the Llama-3-8B shape (transformers'
        LlamaDecoderLayer, bfloat16), captured for batch sizes 1-128 at sequence 256:
        with PyTorch's separate pools, PyTorch's one shared pool captured largest first
        (vLLM's and SGLang's way), and gmsfs.torch.GraphPool (a space per capture over
        the same chunks) captured smallest first and in a random order.  Every replay's
        output is checked against eager; memory and capture time are printed beside the
        largest shape's own eager peak, all in this run."""
import os
import random
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
from tap import check, done  # noqa: E402

import torch  # noqa: E402
import gmsfs.torch as gt  # noqa: E402

SIZES = [1, 2, 4, 8, 16, 32, 64, 128]
SEQ = 256
GiB = 1 << 30


def build():
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding
    cfg = LlamaConfig(hidden_size=4096, intermediate_size=14336, num_hidden_layers=4, num_attention_heads=32,
                      num_key_value_heads=8, vocab_size=128256, max_position_embeddings=8192, rope_theta=500000.0)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    with torch.device("cuda"):
        layers = torch.nn.ModuleList([LlamaDecoderLayer(cfg, i) for i in range(4)]).to(torch.bfloat16).eval()
        rope = LlamaRotaryEmbedding(cfg)
    for p in layers.parameters():
        torch.nn.init.normal_(p, std=0.02)
    pos = torch.arange(SEQ, device="cuda")[None]
    x = torch.zeros(1, SEQ, 4096, device="cuda", dtype=torch.bfloat16)
    cos, sin = rope(x, pos)

    def forward(h):
        for layer in layers:
            out = layer(h, attention_mask=None, position_ids=pos, position_embeddings=(cos, sin))
            h = out[0] if isinstance(out, tuple) else out
        return h
    return forward


def capture_all(forward, inputs, order, pool_of):
    """A graph per size, in order; pool_of(size, graph) gives the context to capture in.
    Memory: what PyTorch reserved for it (its cache emptied before and after, so that
    only the graphs' pools are counted)."""
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    before = torch.cuda.memory_reserved()
    t = time.perf_counter()
    graphs, outs = {}, {}
    with torch.no_grad():
        for bs in order:
            g = torch.cuda.CUDAGraph()
            with pool_of(bs, g):
                outs[bs] = forward(inputs[bs])
            graphs[bs] = g
    torch.cuda.synchronize()
    secs = time.perf_counter() - t
    torch.cuda.empty_cache()
    return graphs, outs, secs, torch.cuda.memory_reserved() - before


def replays_match(graphs, outs, eager):
    """Each graph replayed alone, its output read before the next runs."""
    ok = True
    for bs in sorted(graphs, key=lambda _: random.random()):
        graphs[bs].replay()
        torch.cuda.synchronize()
        ok &= torch.equal(outs[bs], eager[bs])
    return ok


def main():
    mount = sys.argv[1]
    forward = build()
    inputs = {bs: torch.randn(bs, SEQ, 4096, device="cuda", dtype=torch.bfloat16) for bs in SIZES}
    with torch.no_grad():  # warm: lazy buffers come from PyTorch's memory, not a capture's
        eager = {bs: forward(inputs[bs]).clone() for bs in SIZES}
    # The largest shape alone, eager: what PyTorch reserves to run it (its segments), and
    # what its tensors take at the peak.
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    base, base_r = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
    with torch.no_grad():
        forward(inputs[SIZES[-1]])
    torch.cuda.synchronize()
    largest_allocated = torch.cuda.max_memory_allocated() - base
    largest = torch.cuda.max_memory_reserved() - base_r
    rows = []

    graphs, outs, secs, mem = capture_all(forward, inputs, SIZES[::-1], lambda bs, g: torch.cuda.graph(g))
    check(replays_match(graphs, outs, eager), "PyTorch, a pool per graph: every replay equals eager")
    rows.append(("PyTorch, a pool per graph", mem, secs))
    del graphs, outs
    torch.cuda.empty_cache()

    shared = torch.cuda.graph_pool_handle()
    graphs, outs, secs, mem = capture_all(forward, inputs, SIZES[::-1],
                                          lambda bs, g: torch.cuda.graph(g, pool=shared))
    # In a shared pool a later graph may take a block an earlier one's output holds: the
    # comparison reads each output right after its own replay.
    check(replays_match(graphs, outs, eager), "PyTorch, one shared pool (largest first): every replay equals eager")
    rows.append(("PyTorch, one shared pool, largest first", mem, secs))
    del graphs, outs, shared
    torch.cuda.empty_cache()

    rng = random.Random(3)
    for label, order in (("smallest first", SIZES), ("random order", rng.sample(SIZES, len(SIZES)))):
        store = os.path.join(mount, "graphs-" + label.split()[0])
        os.mkdir(store)
        pool = gt.GraphPool(store, chunk_bytes=32 << 20)
        graphs, outs, secs, mem = capture_all(forward, inputs, order, lambda bs, g: pool.capture(g))
        check(replays_match(graphs, outs, eager), "gmsfs GraphPool, %s: every replay equals eager" % label)
        addrs = {bs: outs[bs].data_ptr() for bs in SIZES}
        check(len(set(addrs.values())) == len(SIZES), "each graph has addresses of its own")
        rows.append(("gmsfs GraphPool, " + label, pool.nbytes, secs))
        # For tests/gpu/gate.py: at most the largest shape alone.
        print("gate: graphs-%s %.0f %.0f 1.0 8 CUDA graphs in a GraphPool captured %s, against the largest shape "
              "alone (bytes)" % (label.split()[0], pool.nbytes, largest, label))
        check(pool.nbytes <= 1.1 * largest, "gmsfs GraphPool, %s: %.2f GiB, within 1.1x of the largest shape "
              "alone (%.2f GiB reserved, %.2f GiB allocated at its peak)" % (label, pool.nbytes / GiB, largest / GiB,
                                                                            largest_allocated / GiB),
              "PyTorch counts the captures' segments, address ranges over the same memory: %.2f GiB" % (mem / GiB))
        del graphs, outs
        pool.close()
        torch.cuda.empty_cache()
        os.rmdir(store)

    print("# bench: CUDA graphs of 4 Llama-3-8B decoder layers, batch 1-128 x sequence 256, bfloat16")
    print("#   the largest shape alone, eager: %.2f GiB reserved at its peak (%.2f GiB allocated)"
          % (largest / GiB, largest_allocated / GiB))
    for label, mem, secs in rows:
        print("#   %-44s %6.2f GiB (%.2fx the largest alone), capture %.2f s" % (label, mem / GiB, mem / largest,
                                                                               secs))
    return done()


if __name__ == "__main__":
    sys.exit(main())
