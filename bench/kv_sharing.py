#!/usr/bin/env python3
"""Three engines on one GPU's mount, each with a KV cache driven by a bursty token trace of
its own: elastic caches (gmsfs.Pages, growing and shrinking by pages from the one budget)
against the same memory split into fixed quotas, mapped whole at start as engines do today.

    kv_sharing.py MOUNT [--kv-mib N] [--seconds S] [--page-mib P]

Each engine is a process: every step (20 ms) requests arrive (prompt and output lengths
from its trace; its bursts come at other times than the others'), a request gets the blocks
of its prompt or is refused, every running sequence decodes one token (its K and V written
into its last block: on a GPU with torch, else with memset), a sequence that needs a new
block and cannot get one is preempted, finished ones free their blocks, and an elastic
engine gives pages back when the daemon asks (idle pages first, then its newest
sequences).  Printed per mode: tokens held in cache on average and at peak, requests
served and refused, tokens generated; then elastic's ratio to fixed.  An elastic refusal
also records the room the daemon had then: one the free memory could have served counts as
"avoidable"."""
import argparse
import ctypes
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))

MiB = 1 << 20
STEP_S = 0.02
TOKENS_PER_BLOCK = 16


def trace(engine, steps, seed):
    """Arrivals per step: a low rate, and a burst in this engine's third of each period."""
    rnd = random.Random(seed * 7919 + engine)
    period = max(steps // 3, 3)
    out = []
    for k in range(steps):
        burst = (k % period) // (period // 3 or 1) == engine % 3
        n = int(rnd.random() < (0.2 if burst else 0.01))
        out.append([(rnd.randint(32, 128), rnd.randint(64, 192)) for _ in range(n)])
    return out


def engine_main(args):
    import gmsfs
    cfg = json.loads(args.config)
    store, mode, idx = cfg["store"], cfg["mode"], cfg["engine"]
    block = cfg["block_bytes"]
    torch = None
    try:  # on a GPU, a context before the connection: the pages are mapped into it
        import torch
        if not torch.cuda.is_available():
            torch = None
        else:
            torch.zeros(1, device="cuda")
    except ImportError:
        torch = None
    c = gmsfs.connect(store, "rw")
    pages = gmsfs.Pages(c, cfg["span"], cfg["page"])
    # An elastic engine waits up to a step and a half for pages asked back of the others.
    alloc = gmsfs.PageAllocator(pages, block, timeout_ms=30 if mode == "elastic" else 0)
    if mode == "fixed":  # a fixed cache: its whole share mapped at start, kept to the end
        alloc.free(alloc.alloc(cfg["share"] // block), shrink=False)
    kv = None
    if torch is not None and c.backend == "cuda":  # the cache as one tensor over the range
        import gmsfs.torch as gt
        kv = gt.pages_tensor(pages)
    steps = cfg["steps"]
    arrivals = trace(idx, steps, cfg["seed"])
    running = []  # [tokens, blocks]
    log = {"held": [], "served": 0, "refused": 0, "avoidable": 0, "preempted": 0, "generated": 0}
    token_bytes = block // TOKENS_PER_BLOCK
    start = time.monotonic()
    while time.monotonic() < cfg["t0"]:
        time.sleep(0.001)
    for k in range(steps):
        for prompt, out in arrivals[k]:
            need = -(-prompt // TOKENS_PER_BLOCK)
            try:
                running.append([prompt, alloc.alloc(need), prompt + out])
                log["served"] += 1
            except gmsfs.GmsfsError:
                log["refused"] += 1
                if mode == "elastic":  # could the room the daemon had have served it?
                    st = json.load(open(os.path.join(cfg["mount"], "status.json")))
                    lack = sum(max(0, x["min"] - x["used"]) for x in st["stores"] if x["name"] != os.path.basename(store))
                    room = st["device"]["total_bytes"] - st["device"]["used_bytes"] - lack
                    log["avoidable"] += room >= need * block + cfg["page"]
        done = []
        for s in running:
            if s[0] % TOKENS_PER_BLOCK == 0:
                try:
                    s[1] += alloc.alloc(1)
                except gmsfs.GmsfsError:
                    done.append(s)
                    log["preempted"] += 1
                    continue
            off = s[1][-1] * block + (s[0] % TOKENS_PER_BLOCK) * token_bytes
            if kv is not None:
                kv[off:off + token_bytes].fill_(k & 0xff)
            else:
                ctypes.memset(pages.base + off, k & 0xff, token_bytes)
            s[0] += 1
            log["generated"] += 1
            if s[0] >= s[2]:
                done.append(s)
        for s in done:
            running.remove(s)
            alloc.free(s[1], shrink=(mode == "elastic"))
        if mode == "elastic" and pages.reclaim():
            alloc.give_back()
            while pages.reclaim() and running:  # idle pages were not enough: the newest go
                s = running.pop()
                alloc.free(s[1])
                log["preempted"] += 1
                alloc.give_back()
        if kv is not None:
            torch.cuda.synchronize()
        log["held"].append(sum(s[0] for s in running))
        late = start + (k + 1) * STEP_S - time.monotonic()
        if late > 0:
            time.sleep(late)
    with open(cfg["out"], "w") as f:
        json.dump(log, f)
    pages.free()
    c.close()
    return 0


def run_mode(mode, mount, a):
    total = a.kv_mib * MiB
    page = a.page_mib * MiB
    share = total // 3 // page * page
    procs, cfgs, work = [], [], tempfile.mkdtemp(prefix="kv-sharing.")
    t0 = time.monotonic() + 3.0  # every engine connected and mapped before the first step
    for i in range(3):
        store = os.path.join(mount, "kv-%s-%d" % (mode, i))
        os.mkdir(store)
        if mode == "fixed":
            os.setxattr(store, "user.gms.quota", str(share).encode())
        else:  # a floor each (a third of its share), the rest as the load goes
            os.setxattr(store, "user.gms.min", str(share // 3 // page * page).encode())
        cfg = {"store": store, "mode": mode, "engine": i, "mount": mount, "page": page,
               "block_bytes": page // 4, "span": total, "share": share, "steps": int(a.seconds / STEP_S),
               "seed": a.seed, "t0": t0, "out": os.path.join(work, "%s-%d.json" % (mode, i))}
        cfgs.append(cfg)
        procs.append(subprocess.Popen([sys.executable, __file__, "--engine", json.dumps(cfg)]))
    rc = [p.wait() for p in procs]
    for c in cfgs:
        os.rmdir(c["store"])
    if any(rc):
        raise SystemExit("kv_sharing: an engine failed (%s)" % rc)
    logs = [json.load(open(c["out"])) for c in cfgs]
    shutil.rmtree(work)
    held = [sum(x) for x in zip(*[l["held"] for l in logs])]
    return {"mean_tokens": sum(held) / len(held), "peak_tokens": max(held),
            "served": sum(l["served"] for l in logs), "refused": sum(l["refused"] for l in logs),
            "avoidable": sum(l["avoidable"] for l in logs), "preempted": sum(l["preempted"] for l in logs),
            "generated": sum(l["generated"] for l in logs)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mount", nargs="?")
    ap.add_argument("--kv-mib", type=int, default=48)
    ap.add_argument("--page-mib", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--seed", type=int, default=46)
    ap.add_argument("--engine", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.engine:
        a.config = a.engine
        return engine_main(a)
    res = {m: run_mode(m, a.mount, a) for m in ("fixed", "elastic")}
    for m, r in res.items():
        print("%-8s tokens in cache: mean %8.0f peak %7d; requests served %5d refused %4d (avoidable %d), "
              "preempted %4d; tokens generated %7d" % (m, r["mean_tokens"], r["peak_tokens"], r["served"],
                                                       r["refused"], r["avoidable"], r["preempted"], r["generated"]))
    f, e = res["fixed"], res["elastic"]
    print("elastic/fixed: concurrent cache %.2fx, tokens generated %.2fx, refusals %d -> %d" % (
        e["mean_tokens"] / max(f["mean_tokens"], 1), e["generated"] / max(f["generated"], 1), f["refused"],
        e["refused"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
