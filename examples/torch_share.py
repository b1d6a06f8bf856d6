#!/usr/bin/env python3
"""torch_share.py STORE: share a PyTorch model through a gmsfs store.

Run it twice.  The first run finds nothing committed: it builds the model, loads its
weights and publishes them.  Every later run builds the model without memory (on the
meta device where PyTorch can) and maps the published weights: no copy.  Both print
the same output.  On a GPU mount (cuda backend) the model lives in GPU memory and the
writer allocates straight into the store.
"""
import sys
import time

import torch

import gmsfs.torch as gt


def build():
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Embedding(1000, 256), torch.nn.Linear(256, 256), torch.nn.GELU(),
                               torch.nn.Linear(256, 1000)).to(device)


def load_weights(model):
    with torch.no_grad():  # stands for reading a checkpoint
        for p in model.parameters():
            p.mul_(0.5)


t0 = time.perf_counter()
model = gt.load_or_publish(sys.argv[1], build, load_weights)
ms = (time.perf_counter() - t0) * 1e3
c = model._gmsfs
x = torch.arange(8, device=next(model.parameters()).device).unsqueeze(0)
print("%s in %.1f ms: %d tensors in %d allocations, layout %s; output sum %.6f" % (
    "published" if model._gmsfs_published else "materialized", ms, len(c.meta_list("torch/")),
    len(c.mappings), c.layout_hash, model(x).sum().item()))
