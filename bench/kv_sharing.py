#!/usr/bin/env python3
"""Three engines on one GPU's mount, each with a KV cache driven by a bursty token trace of
its own: elastic caches (gmsfs.Pages, growing and shrinking by pages from the one budget)
against the same memory split into fixed quotas, mapped whole at start as engines do today.

    kv_sharing.py MOUNT [--kv-mib N] [--seconds S] [--page-mib P] [--trace bursty|overloaded]
                        [--model HIDDEN,HEADS,LAYERS,VOCAB]

MOUNT's budget (max_bytes) should be the cache's N MiB: elastic engines share that much.
With --model the engines run a decoder (kv_model.py) over their caches: its weights are one
store of MOUNT that the first process publishes and all three map, and the caches get the
budget less the weights (python3 kv_model.py prints their MiB for the default shape).

Each engine is a process: every step (20 ms) requests arrive (prompt and output lengths
from its trace; its bursts come at other times than the others'), a request gets the blocks
of its prompt (written, as a prefill writes them) or is refused, every running sequence
decodes one token (its K and V written into its last block; on a GPU with torch, the
cache of every running sequence read too, as attention reads it), a sequence that needs a
new block and cannot get one is preempted, finished ones free their blocks, and an elastic
engine gives pages back when the daemon asks (idle pages first, then its newest
sequences).  Every step each sequence's first and newest tokens are read back and checked:
a page lost, shared or mapped twice shows as a wrong byte (with --model: their first
layer's K against what was written), and the run fails.  The engines
start their first step together, once all are ready.  Printed per mode: tokens held in
cache on average and at peak, requests served and refused, tokens generated; then
elastic's ratio to fixed.  An elastic refusal also records the room the daemon had then:
one the free memory could have served counts as "avoidable"."""
import argparse
import ctypes
import importlib.util
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


# Traces: arrivals a step in and out of an engine's burst, output lengths, bursts per run.
# bursty: each engine's peak is most of the whole cache and the three peaks come apart,
# the mean load about 70% of the cache: the day the issue describes, memory reserved for
# peaks idle most of the time.  overloaded: long answers, so that each burst's sequences
# live on into the next engine's; the load is past the cache (137%) most of the run.
TRACES = {"bursty": (0.25, 0.005, (32, 96), 2), "overloaded": (0.2, 0.01, (64, 192), 3)}


def trace(engine, steps, seed, kind="bursty"):
    """Arrivals per step: a low rate, and a burst in this engine's third of each period."""
    on, off, (lo, hi), bursts = TRACES[kind]
    rnd = random.Random(seed * 7919 + engine)
    period = max(steps // bursts, 3)
    out = []
    for k in range(steps):
        burst = (k % period) // (period // 3 or 1) == engine % 3
        n = int(rnd.random() < (on if burst else off))
        out.append([(rnd.randint(32, 128), rnd.randint(lo, hi)) for _ in range(n)])
    return out


def ceiling(steps, seed, kind, blocks, tpb=TOKENS_PER_BLOCK):
    """The trace's own limit: blocks each engine's sequences would hold with no limit and
    no preemption, step by step; then what fixed thirds and one shared cache could hold
    of it at best (any arbiter), in blocks on average."""
    need = []
    for e in range(3):
        running, held = [], []
        for k, arrivals in enumerate(trace(e, steps, seed, kind)):
            running += [[p, p + o] for p, o in arrivals]
            for s in running:
                s[0] += 1
            running = [s for s in running if s[0] < s[1]]
            held.append(sum(-(-s[0] // tpb) for s in running))
        need.append(held)
    fixed = sum(min(x, blocks // 3) for held in need for x in held) / steps
    shared = sum(min(sum(col), blocks) for col in zip(*need)) / steps
    return sum(map(sum, need)) / steps, fixed, shared


class PatternCache:
    """The cache as bytes: each token's K and V a byte that names its sequence and place,
    written by prefill and decode; on a GPU every running sequence's blocks read each step
    (as attention reads them)."""

    def __init__(self, pages, block, tpb, kv):
        self.pages, self.block, self.tpb, self.kv = pages, block, tpb, kv
        self.token_bytes = block // tpb

    def at(self, seq, pos):  # where token pos of a sequence lies in the range
        return seq[1][pos // self.tpb] * self.block + (pos % self.tpb) * self.token_bytes

    @staticmethod
    def value(seq, pos):  # what a token's K and V hold: its sequence's and its place's
        return (seq[3] * 31 + pos) & 0xff

    def write(self, seq, first, end):  # tokens [first, end) of seq
        for pos in range(first, end):
            off = self.at(seq, pos)
            if self.kv is not None:
                self.kv[off:off + self.token_bytes].fill_(self.value(seq, pos))
            else:
                ctypes.memset(self.pages.base + off, self.value(seq, pos), self.token_bytes)

    def prefill(self, seq, prompt):
        self.write(seq, 0, prompt)
        return False  # its first token is decoded in this step, with the rest

    def step(self, prefills, decoding):
        for s in decoding:
            self.write(s, s[0], s[0] + 1)
        if self.kv is not None and decoding:  # attention's read: every block of every running sequence
            import torch
            ids = torch.tensor([b for s in decoding for b in s[1]], dtype=torch.long, device=self.kv.device)
            self.kv.view(-1, self.block)[ids].sum(dtype=torch.int64)

    def check(self, running):  # each sequence's first and newest tokens read back
        offs = [self.at(s, pos) + self.token_bytes - 1 for s in running for pos in (0, s[0] - 1)]
        want = [self.value(s, pos) for s in running for pos in (0, s[0] - 1)]
        if self.kv is not None:
            import torch
            got = self.kv[torch.tensor(offs, dtype=torch.long, device=self.kv.device)].tolist() if offs else []
        else:
            got = [ctypes.string_at(self.pages.base + o, 1)[0] for o in offs]
        return sum(g != w for g, w in zip(got, want))


class ModelCache:
    """The cache of a decoder (kv_model.py) whose weights every engine maps from one store:
    a prompt is prefilled (its K and V written, its first token generated), then each step
    decodes one token of every running sequence, attention reading their whole cache.
    Each sequence's first token's K and its newest's are kept aside and compared with the
    cache every step."""

    def __init__(self, decoder, vocab, seed):
        import torch
        self.torch, self.d, self.vocab = torch, decoder, vocab
        self.rnd = random.Random(seed)
        self.last, self.seen = {}, {}  # per serial: the next input token; [(position, K)]

    def prefill(self, seq, prompt):
        seq.append([self.rnd.randrange(self.vocab) for _ in range(prompt)])
        return True  # its step is the prefill

    def step(self, prefills, decoding):
        batch = [(s.pop(), 0, s[1]) for s in prefills] + [([self.last[s[3]]], s[0], s[1]) for s in decoding]
        if not batch:
            return
        for s, t in zip(prefills + decoding, self.d.step(batch).argmax(-1).tolist()):
            self.last[s[3]] = t
        # Tokens kept aside to be checked from the next step on: a prefill's first, and
        # each decoded sequence's newest (its first stays).
        kept = [(s, 0) for s in prefills] + [(s, s[0]) for s in decoding]
        for (s, pos), k in zip(kept, self.read(kept)):
            self.seen[s[3]] = [(pos, k)] if s in prefills else self.seen[s[3]][:1] + [(pos, k)]

    def read(self, where):
        """The first layer's K of tokens [(seq, position)], as the cache holds them now."""
        slots = [self.d.slot(s[1], pos) for s, pos in where]
        return self.d.kv[self.torch.tensor(slots, dtype=self.torch.long, device=self.d.kv.device), 0, 0]

    def check(self, running):
        where = [(s, pos) for s in running for pos, _ in self.seen.get(s[3], ())]
        if not where:
            return 0
        want = self.torch.stack([k for s in running for _, k in self.seen.get(s[3], ())])
        return int((self.read(where) != want).flatten(1).any(1).sum())

    def forget(self, seq):
        self.last.pop(seq[3], None)
        self.seen.pop(seq[3], None)


def load_model(cfg, check=False):
    """The decoder, from the mount's shared store of weights: published by the first process
    there (load_or_publish), mapped by the others.  check: first hold the paged step to the
    model's own forward (float32, on the CPU), and say how close it came."""
    import torch
    import gmsfs.torch as gt
    import kv_model
    hf = None
    if cfg["hf"]:
        import transformers as hf
    shape = kv_model.Shape(**cfg["model"])
    dtype = torch.float16 if torch.cuda.is_available() else torch.float32
    if not torch.cuda.is_available():
        torch.set_num_threads(1)  # three engines on a CPU's cores, not each on all of them
    if check:
        ref = kv_model.build(shape, torch.float32, hf)
        kv_model.init_weights(ref)
        worst = kv_model.check(ref, shape)
        print("paged step against %s: logits within %.1e of their spread over a prefill and 8 decode steps" % (
            "transformers' LlamaForCausalLM forward" if hf else "the whole sequence recomputed", worst), flush=True)
        if worst > 1e-3:
            raise SystemExit("kv_sharing: the paged step is not the model's forward (%.1e)" % worst)
        del ref
    model = gt.load_or_publish(cfg["weights"], lambda: kv_model.build(shape, dtype, hf), kv_model.init_weights,
                               timeout=120)
    return model, shape, dtype


def model_cache(cfg, pages, block):
    import gmsfs.torch as gt
    import kv_model
    model, shape, dtype = load_model(cfg)
    tpb = block // shape.token_bytes(dtype)
    decoder = kv_model.PagedDecoder(model, shape, gt.pages_tensor(pages), tpb)
    return ModelCache(decoder, shape.vocab, cfg["seed"] + 1000 * cfg["engine"]), tpb


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
    if cfg.get("model"):
        cache, tpb = model_cache(cfg, pages, block)
    else:
        kv = None
        if torch is not None and c.backend == "cuda":  # the cache as one tensor over the range
            import gmsfs.torch as gt
            kv = gt.pages_tensor(pages)
        cache, tpb = PatternCache(pages, block, TOKENS_PER_BLOCK, kv), TOKENS_PER_BLOCK
    steps = cfg["steps"]
    arrivals = trace(idx, steps, cfg["seed"], cfg["trace"])
    running = []  # [tokens in cache, blocks, length at the end, serial]
    log = {"held": [], "served": 0, "refused": 0, "avoidable": 0, "preempted": 0, "generated": 0, "wrong": 0}

    def drop(seq, shrink=True):
        alloc.free(seq[1], shrink=shrink)
        if hasattr(cache, "forget"):
            cache.forget(seq)

    serial = 0
    print("ready", flush=True)  # then the first step's time, the same for every engine
    t0 = float(sys.stdin.readline())
    start = t0
    while time.monotonic() < t0:
        time.sleep(0.001)
    for k in range(steps):
        prefills = []
        for prompt, out in arrivals[k]:
            need = -(-prompt // tpb)
            try:
                serial += 1
                running.append([prompt, alloc.alloc(need), prompt + out, serial])
                if cache.prefill(running[-1], prompt):  # the prefill's K and V
                    prefills.append(running[-1])
                log["served"] += 1
            except gmsfs.GmsfsError:
                log["refused"] += 1
                if mode == "elastic":  # could the room the daemon had have served it?
                    st = json.load(open(os.path.join(cfg["mount"], "status.json")))
                    lack = sum(max(0, x["min"] - x["used"]) for x in st["stores"]
                               if x["name"] != os.path.basename(store))
                    room = st["device"]["total_bytes"] - st["device"]["used_bytes"] - lack
                    log["avoidable"] += room >= need * block + cfg["page"]
        done, decoding = [], []
        for s in running:
            if s in prefills:
                continue
            if s[0] % tpb == 0:
                try:
                    s[1] += alloc.alloc(1)
                except gmsfs.GmsfsError:
                    done.append(s)
                    log["preempted"] += 1
                    continue
            decoding.append(s)
        for s in done:
            running.remove(s)
            drop(s, shrink=(mode == "elastic"))
        cache.step(prefills, decoding)
        log["generated"] += len(prefills) + len(decoding)
        done = []
        for s in decoding:
            s[0] += 1
            if s[0] >= s[2]:
                done.append(s)
        for s in done:
            running.remove(s)
            drop(s, shrink=(mode == "elastic"))
        if mode == "elastic" and pages.reclaim():
            alloc.give_back()
            while pages.reclaim() and running:  # idle pages were not enough: the newest go
                drop(running.pop())
                log["preempted"] += 1
                alloc.give_back()
        log["wrong"] += cache.check(running)
        log["held"].append(sum(s[0] for s in running))
        late = start + (k + 1) * STEP_S - time.monotonic()
        if late > 0:
            time.sleep(late)
    with open(cfg["out"], "w") as f:
        json.dump(log, f)
    pages.free()
    c.close()
    return 0


def run_mode(mode, mount, a, kv_bytes, weights=None):
    page = a.page_mib * MiB
    share = kv_bytes // 3 // page * page
    procs, cfgs, work = [], [], tempfile.mkdtemp(prefix="kv-sharing.")
    for i in range(3):
        store = os.path.join(mount, "kv-%s-%d" % (mode, i))
        os.mkdir(store)
        if mode == "fixed":
            os.setxattr(store, "user.gms.quota", str(share).encode())
        else:  # a floor each (a third of its share), the rest as the load goes
            os.setxattr(store, "user.gms.min", str(share // 3 // page * page).encode())
        cfg = {"store": store, "mode": mode, "engine": i, "mount": mount, "page": page,
               "block_bytes": page // 4, "span": kv_bytes // page * page, "share": share,
               "steps": int(a.seconds / STEP_S), "seed": a.seed, "trace": a.trace,
               "out": os.path.join(work, "%s-%d.json" % (mode, i))}
        if weights:
            cfg.update(weights=weights, model=a.shape, hf=a.hf)
        cfgs.append(cfg)
        procs.append(subprocess.Popen([sys.executable, __file__, "--engine", json.dumps(cfg)],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True))
    # Every engine connected and its cache set up (a GPU's context takes seconds): then
    # all start their first step at the same time.
    ready = [p.stdout.readline().strip() == "ready" for p in procs]
    t0 = time.monotonic() + 0.2
    for p, ok in zip(procs, ready):
        if ok:
            p.stdin.write("%r\n" % t0)
        p.stdin.close()
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
            "generated": sum(l["generated"] for l in logs), "wrong": sum(l["wrong"] for l in logs)}


def publish_weights(mount, a):
    """The decoder's weights in a store of the mount, checked and published by a process of
    its own (the engines map them); returns the store and the bytes it holds."""
    weights = os.path.join(mount, "kv-weights")
    os.mkdir(weights)
    cfg = {"weights": weights, "model": a.shape, "hf": a.hf}
    subprocess.run([sys.executable, __file__, "--publish", json.dumps(cfg)], check=True)
    st = json.load(open(os.path.join(mount, "status.json")))
    return weights, next(x["used"] for x in st["stores"] if x["name"] == "kv-weights"), st["device"]["total_bytes"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mount", nargs="?")
    ap.add_argument("--kv-mib", type=int, default=48)
    ap.add_argument("--page-mib", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--seed", type=int, default=46)
    ap.add_argument("--trace", choices=sorted(TRACES), default="bursty")
    ap.add_argument("--model", metavar="HIDDEN,HEADS,LAYERS,VOCAB",
                    help="engines run a decoder (kv_model.py) over their caches, its weights in one store of the "
                         "mount that all three map; the caches share the mount's budget less the weights "
                         "(--kv-mib is not used); e.g. 1024,8,8,8192")
    ap.add_argument("--engine", help=argparse.SUPPRESS)
    ap.add_argument("--publish", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.engine:
        a.config = a.engine
        return engine_main(a)
    if a.publish:
        load_model(json.loads(a.publish), check=True)[0]._gmsfs.close()
        return 0
    weights, tpb = None, TOKENS_PER_BLOCK
    kv_bytes = a.kv_mib * MiB
    if a.model:
        import torch
        import kv_model
        hidden, heads, layers, vocab = (int(x) for x in a.model.split(","))
        a.shape = {"hidden": hidden, "heads": heads, "layers": layers, "vocab": vocab}
        # transformers' Llama where it is installed, the same arithmetic without it
        a.hf = importlib.util.find_spec("transformers") is not None
        dtype = torch.float16 if torch.cuda.is_available() else torch.float32
        token = kv_model.Shape(**a.shape).token_bytes(dtype)
        block = a.page_mib * MiB // 4
        if block % token:
            raise SystemExit("kv_sharing: a token's K and V (%d bytes) do not divide a block (%d)" % (token, block))
        tpb = block // token
        weights, used, total = publish_weights(a.mount, a)
        kv_bytes = (total - used) // (a.page_mib * MiB) * a.page_mib * MiB
        if kv_bytes <= 0:
            os.rmdir(weights)
            raise SystemExit("kv_sharing: the weights hold %.1f MiB, the mount's budget %.1f: no room for caches"
                             % (used / MiB, total / MiB))
        print("model %s (%s): weights %.1f MiB in one store, mapped by every engine; caches %d MiB; %d tokens a "
              "block" % (a.model, "transformers' Llama" if a.hf else "kv_model.Decoder", used / MiB, kv_bytes // MiB,
                         tpb))
    blocks = kv_bytes // (a.page_mib * MiB // 4)
    load, best_fixed, best_shared = ceiling(int(a.seconds / STEP_S), a.seed, a.trace, blocks, tpb)
    print("trace %s: %d blocks of cache; the load would hold %.0f on average (%.0f%%); at best fixed thirds "
          "hold %.0f, a shared cache %.0f: %.2fx" % (a.trace, blocks, load, 100 * load / blocks, best_fixed,
                                                     best_shared, best_shared / best_fixed))
    res = {m: run_mode(m, a.mount, a, kv_bytes, weights) for m in ("fixed", "elastic")}
    if weights:
        os.rmdir(weights)
    for m, r in res.items():
        print("%-8s tokens in cache: mean %8.0f peak %7d; requests served %5d refused %4d (avoidable %d), "
              "preempted %4d; tokens generated %7d" % (m, r["mean_tokens"], r["peak_tokens"], r["served"],
                                                       r["refused"], r["avoidable"], r["preempted"], r["generated"]))
    f, e = res["fixed"], res["elastic"]
    print("elastic/fixed: concurrent cache %.2fx, tokens generated %.2fx, refusals %d -> %d" % (
        e["mean_tokens"] / max(f["mean_tokens"], 1), e["generated"] / max(f["generated"], 1), f["refused"],
        e["refused"]))
    wrong = f["wrong"] + e["wrong"]
    print("tokens read back: %s" % ("every one as written" if not wrong else "%d wrong" % wrong))
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
