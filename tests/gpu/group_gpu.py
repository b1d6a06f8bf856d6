#!/usr/bin/env python3
"""A model over two stores as one group, on one GPU (TAP, then bench lines).

    group_gpu.py MOUNT BUILD [LAYERS]
        The MLPs of an 8B-shaped Llama (transformers' LlamaMLP, bfloat16; LAYERS of 32, fewer
        on a small device) in tensor parallel over 2 ranks: rank r holds half of each
        layer's gate and up projections (rows) and of its down projection (columns), a
        store each on MOUNT, user.gms.versions 2, grouped by a group file.  An engine per
        rank, a process of its own, connects to the group's version (gmsfs.Group.connect)
        and computes its rank's partial outputs of every layer; the trainer (this process)
        holds the full weights, takes steps, and refits both ranks at once
        (gmsfs.Group.refit, one thread a rank), every commit named.  Checked: every step's
        partial outputs of each engine equal the trainer's own of its shard, bit for bit;
        a step refitted on rank 0 only (rank 1's trainer gone) is refused to both engines'
        flips (EAGAIN) and both keep serving the step before, until rank 1's refit
        completes it; then three steps prepared during the trainer's step (Group.prepare)
        and refitted through their connections, checked the same way; then two more, which
        each engine maps ahead beside serving (Group.flip_ahead) before it flips.  Timed:
        the group refit, plain and prepared, beside the device-to-device copy of the same
        tensors in the same run (its floor), each engine's flip, in place and made ahead
        (the issue's goal: 2 ms a rank), and
        gmsfsctl group snapshot / restore of both ranks on /dev/shm beside one rank's
        gmsfs-snapshot save alone.  GMSFS_BENCH_TRACE=1: the prepared refits' phases."""
import json
import os
import shutil
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "python"))
from refit_trace import watch_versions  # noqa: E402
from tap import check, done  # noqa: E402

RANKS = 2
HIDDEN, INTER = 4096, 14336
SHARD = INTER // RANKS

MODEL = r"""
import torch, transformers
from transformers.models.llama.modeling_llama import LlamaMLP
def shard_model(layers, device="meta"):
    cfg = transformers.LlamaConfig(hidden_size=%d, intermediate_size=%d, hidden_act="silu")
    with torch.device(device):
        return torch.nn.ModuleList([LlamaMLP(cfg) for _ in range(layers)]).to(torch.bfloat16).eval()
def inputs():
    g = torch.Generator("cuda").manual_seed(7)
    return torch.randn(8, %d, device="cuda", generator=g).to(torch.bfloat16)
""" % (HIDDEN, SHARD, HIDDEN)

ENGINE = MODEL + r"""
import gmsfs, gmsfs.torch as gt, json, sys, time
group, rank, layers, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
torch.zeros(1, device="cuda")
g = gmsfs.Group.open(group)
model = shard_model(layers)
gt.materialize(model, g.connect(rank, timeout=120))
x = inputs()
def step():
    with torch.no_grad():
        y = torch.stack([mlp(x) for mlp in model])
    torch.save(y.cpu(), out)
    return model._gmsfs.version
print(json.dumps({"version": step()}), flush=True)
ahead = None
for line in sys.stdin:
    w = line.split()
    try:
        if w[0] == "ahead":  # mapped beside the version served (Group.flip_ahead), the next flip's
            t = time.perf_counter()
            ahead = g.flip_ahead(rank, model, w[1], timeout=60)
            print(json.dumps({"ahead_ms": (time.perf_counter() - t) * 1e3, "version": step()}), flush=True)
        elif w[0] == "flip":
            torch.cuda.synchronize()
            t = time.perf_counter()
            n = ahead.flip() if ahead is not None else g.flip(rank, model, w[1])
            torch.cuda.synchronize()
            ms = (time.perf_counter() - t) * 1e3
            version = step()
            if ahead is not None:
                ahead.close()  # after the step: the version before let go
                ahead = None
            print(json.dumps({"ms": ms, "changed": n, "version": version}), flush=True)
        else:
            print(json.dumps({"version": step()}), flush=True)
    except gmsfs.GmsfsError as e:
        print(json.dumps({"errno": e.errno, "error": str(e), "version": step()}), flush=True)
"""


FLOORS = []  # each refit's ranks' copies at once (a thread a rank), beside the one loop's
TRACE = []  # GMSFS_BENCH_TRACE=1: (thread, phase, start, end) of the prepared refits, printed


def traced():
    """GMSFS_BENCH_TRACE: the refit's phases timed where they run (refit_trace.py, and
    torch.cuda.synchronize), to see where a group refit's time beyond its copy goes."""
    import torch
    from refit_trace import trace_refit
    trace_refit(lambda name, a, b: TRACE.append((threading.current_thread().name, name, a, b)),
                more=[(torch.cuda, "synchronize")])


def main():
    mnt, build = sys.argv[1], sys.argv[2]
    import torch
    import gmsfs
    import gmsfs.torch as gt
    ns = {}
    exec(MODEL, ns)
    total = torch.cuda.get_device_properties(0).total_memory
    per_layer = 3 * HIDDEN * INTER * 2
    layers = int(sys.argv[3]) if len(sys.argv) > 3 else max(2, min(32, int(total * 0.08) // per_layer))
    gb = layers * per_layer / 1e9
    print("# %d layers' MLPs, %.1f GB, over %d ranks of %.1f GB" % (layers, gb, RANKS, gb / RANKS))
    torch.manual_seed(0)
    full = [[torch.randn(INTER, HIDDEN, device="cuda").to(torch.bfloat16) * 0.02 for _ in range(3)]
            for _ in range(layers)]  # gate, up, down^T

    def shard(rank):
        """Rank's state dict: its rows of gate and up, its columns of down."""
        lo, hi = rank * SHARD, (rank + 1) * SHARD
        sd = {}
        for i, (gate, up, down_t) in enumerate(full):
            sd["%d.gate_proj.weight" % i] = gate[lo:hi].contiguous()
            sd["%d.up_proj.weight" % i] = up[lo:hi].contiguous()
            sd["%d.down_proj.weight" % i] = down_t[lo:hi].t().contiguous()
        return sd

    def expected(rank):
        m = ns["shard_model"](layers, "cuda")
        m.load_state_dict(shard(rank))
        with torch.no_grad():
            y = torch.stack([mlp(ns["inputs"]()) for mlp in m]).cpu()
        del m
        return y

    stores = [os.path.join(mnt, "tp%d" % r) for r in range(RANKS)]
    group = os.path.join(mnt + ".group")
    with open(group, "w") as f:
        f.write("# an MLP stack over %d ranks\n%s\n" % (RANKS, "\n".join(stores)))
    for r, s in enumerate(stores):
        os.mkdir(s)
        os.setxattr(s, "user.gms.versions", b"2")
        m = ns["shard_model"](layers, "cuda")
        m.load_state_dict(shard(r))
        c = gt.publish(m, s, commit=False)
        c.commit(version="step-0")
        c.close()
        del m
    torch.cuda.empty_cache()
    g = gmsfs.Group.open(group)
    check(g.version() == "step-0", "two stores grouped, each published as step-0", g.status())
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
    outs = ["/dev/shm/gmsfs-group-%d.pt" % r for r in range(RANKS)]
    engines = [subprocess.Popen([sys.executable, "-c", ENGINE, group, str(r), str(layers), outs[r]],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
               for r in range(RANKS)]

    def ask(what):
        for e in engines:
            e.stdin.write(what + "\n")
            e.stdin.flush()
        return [json.loads(e.stdout.readline()) for e in engines]

    def serve(step):
        return all(torch.equal(torch.load(outs[r]), expected(r)) for r in range(RANKS)), step

    first = [json.loads(e.stdout.readline()) for e in engines]
    ok, _ = serve(0)
    check(ok and all(f["version"] == "step-0" for f in first),
          "both engines serve step-0, each its shard's outputs bit for bit", first)

    def step_weights(k):
        gen = torch.Generator("cuda").manual_seed(100 + k)
        for layer in full:
            for w in layer:
                w.add_(torch.randn(w.shape, device="cuda", generator=gen).to(torch.bfloat16) * 1e-3)

    def at_once(fn, ranks, started=None):
        """fn(rank) for every rank at once, a thread a rank, as a trainer's ranks run (each
        started, waiting at a barrier, before the clock starts): {rank: its result}, the
        wall seconds until the GPU is done too, [(rank, error)]; the clock's start appended
        to started."""
        out, errs = {}, []
        ready = threading.Barrier(len(ranks) + 1)

        def one(r):
            ready.wait()
            try:
                out[r] = fn(r)
            except Exception as e:
                errs.append((r, e))
        ts = [threading.Thread(target=one, args=(r,)) for r in ranks]
        for th in ts:
            th.start()
        ready.wait()
        t = time.perf_counter()
        if started is not None:
            started.append(t)
        for th in ts:
            th.join()
        torch.cuda.synchronize()
        return out, time.perf_counter() - t, errs

    def refit_all(k, ranks=range(RANKS), prepared=None, started=None):
        sds = {r: shard(r) for r in ranks}
        torch.cuda.synchronize()
        _, wall, errs = at_once(lambda r: g.refit(r, sds[r], "step-%d" % k, timeout=60,
                                                  prepared=prepared[r] if prepared else None), ranks, started)
        # The floor: the same tensors copied device to device into tensors of their shapes.
        src = [v for r in ranks for v in sds[r].values()]
        dst = [torch.empty_like(v) for v in src]
        torch.cuda.synchronize()
        t = time.perf_counter()
        for d, s in zip(dst, src):
            d.copy_(s)
        torch.cuda.synchronize()
        floor = time.perf_counter() - t
        # The ranks' own copies, as the refit runs them: a thread a rank, each its shard.
        mine = {r: [(d, s) for d, s in zip(dst, src) if any(s is v for v in sds[r].values())] for r in ranks}
        _, at_once_floor, _ = at_once(lambda r: [d.copy_(s) for d, s in mine[r]], ranks)
        FLOORS.append(at_once_floor)
        del dst
        sds.clear()  # the shards go (a dict the threads' lambda holds)
        return wall, floor, errs

    refits, flips = [], []
    for k in (1, 2, 3):
        step_weights(k)
        time.sleep(0.3)  # the trainer's step: the version before goes meanwhile, as in an RL loop
        wall, floor, errs = refit_all(k)
        refits.append((wall, floor))
        check(not errs and g.ready("step-%d" % k), "step %d refitted on both ranks beside the serving engines" % k,
              errs)
        got = ask("flip step-%d" % k)
        flips += [x.get("ms", float("nan")) for x in got]
        ok, _ = serve(k)
        check(ok and all(x.get("version") == "step-%d" % k for x in got),
              "both engines flipped to step %d together: each shard's outputs bit for bit" % k, got)
    # Rank 1's trainer gone for step 4: nobody flips, both serve step 3.
    step3 = [expected(r) for r in range(RANKS)]
    step_weights(4)
    _, _, errs = refit_all(4, ranks=[0])
    got = ask("flip step-4")
    same = all(torch.equal(torch.load(outs[r]), step3[r]) for r in range(RANKS))
    check(not errs and same and all(x.get("errno") == 11 and x["version"] == "step-3" for x in got),
          "step 4 on rank 0 only: both engines' flips refused (EAGAIN), both serve step 3 bit for bit", got)
    _, _, errs = refit_all(4, ranks=[1])  # the trainer of rank 1 comes back
    check(not errs and g.ready("step-4") and g.committed("step-4") == [0, 1], "rank 1's refit completes step 4", errs)
    got = ask("flip step-4")
    flips += [x.get("ms", float("nan")) for x in got]
    ok, _ = serve(4)
    check(ok and all(x.get("version") == "step-4" for x in got),
          "both engines flip to step 4 together: each shard's outputs bit for bit", got)
    # Prepared: each rank's look, session and imports made while the trainer's step
    # computes the weights (Group.prepare, given their shapes), timed apart; the refit
    # then copies and commits only.
    def prepare_all(k):
        shapes = {r: {n: torch.empty_like(t, device="meta") for n, t in shard(r).items()} for r in range(RANKS)}
        torch.cuda.synchronize()
        return at_once(lambda r: g.prepare(r, shapes[r], "step-%d" % k, timeout=60), range(RANKS))

    prepared_refits, prepares, to_version = [], [], []
    if os.environ.get("GMSFS_BENCH_TRACE"):
        traced()
    for k in (5, 6, 7):
        prep, took, perrs = prepare_all(k)  # at the step's start: the refit's work before its copies
        prepares.append(took)
        step_weights(k)
        time.sleep(0.3)
        del TRACE[:]
        t0 = time.perf_counter()
        th, seen = watch_versions(g.stores, "step-%d" % k)
        started = []
        wall, floor, errs = refit_all(k, prepared=prep, started=started)
        th.join()
        prepared_refits.append((wall, floor))
        if None not in seen:  # the group's version as a waiting engine sees it
            to_version.append((max(seen) - started[0], floor))
        for who, what, a, b in sorted((x for x in TRACE if x[2] >= t0), key=lambda x: x[2]):
            print("#   trace step %d %-10s %-9s %7.2f .. %7.2f ms" % (k, who, what, (a - t0) * 1e3, (b - t0) * 1e3))
        check(not perrs and not errs and g.ready("step-%d" % k),
              "step %d prepared during the trainer's step, then refitted on both ranks" % k, perrs + errs)
        got = ask("flip step-%d" % k)
        flips += [x.get("ms", float("nan")) for x in got]
        ok, _ = serve(k)
        check(ok and all(x.get("version") == "step-%d" % k for x in got),
              "both engines flipped to step %d (prepared): each shard's outputs bit for bit" % k, got)
    ranks_floor = FLOORS[-len(prepared_refits):]  # the prepared refits' (steps 5-7)
    # Flips made ahead: each engine maps the step beside the one it serves (Group.flip_ahead)
    # once it is refitted, then its flip only points the model's tensors.
    ahead_flips, aheads = [], []
    for k in (8, 9):
        prep, _, perrs = prepare_all(k)
        step_weights(k)
        time.sleep(0.3)
        _, _, errs = refit_all(k, prepared=prep)
        got = ask("ahead step-%d" % k)
        aheads += [x.get("ahead_ms", float("nan")) for x in got]
        check(not perrs and not errs and all("ahead_ms" in x for x in got),
              "step %d refitted, then mapped ahead by both engines beside serving" % k, perrs + errs + got)
        got = ask("flip step-%d" % k)
        ahead_flips += [x.get("ms", float("nan")) for x in got]
        ok, _ = serve(k)
        check(ok and all(x.get("version") == "step-%d" % k for x in got),
              "both engines flipped to step %d made ahead: each shard's outputs bit for bit" % k, got)
    if os.environ.get("GMSFS_BENCH_TRACE"):  # the copy alone, into the store's memory and into PyTorch's
        prep, _, _ = prepare_all(10)
        sds = {r: shard(r) for r in range(RANKS)}
        pairs = [(prep[r]._refit_plan["dst"][n], t) for r in range(RANKS) for n, t in sds[r].items()]
        ours = [torch.empty_like(t) for _, t in pairs]
        for _ in range(2):
            for where, dst in (("the store's", [d for d, _ in pairs]), ("PyTorch's", ours)):
                torch.cuda.synchronize()
                t = time.perf_counter()
                for d, (_, s) in zip(dst, pairs):
                    d.copy_(s)
                torch.cuda.synchronize()
                print("#   trace: one loop of copies into %s memory: %.2f ms" % (where, (time.perf_counter() - t) * 1e3))
        del pairs, ours
        for c in prep.values():
            c.close()  # nothing committed: the session rolls back
    for e in engines:
        e.stdin.close()
        e.wait(60)
    # Snapshots: the group at once, beside one rank alone.
    snap = "/dev/shm/gmsfs-group-snap"
    one = "/dev/shm/gmsfs-group-one"
    for d in (snap, one):
        shutil.rmtree(d, ignore_errors=True)
    ctl = [sys.executable, os.path.join(ROOT, "tools", "gmsfsctl"), "group"]
    envb = dict(env, PATH=build + ":" + os.environ.get("PATH", ""))
    t = time.perf_counter()
    r1 = subprocess.run([os.path.join(build, "gmsfs-snapshot"), "save", stores[0], one, "-q"], capture_output=True,
                        text=True)
    t_one = time.perf_counter() - t
    t = time.perf_counter()
    r2 = subprocess.run(ctl + ["snapshot", group, snap], capture_output=True, text=True, env=envb)
    t_group = time.perf_counter() - t
    check(r1.returncode == 0 and r2.returncode == 0, "gmsfsctl group snapshot of both ranks under one manifest",
          r1.stderr + r2.stderr + r2.stdout)
    restored = [os.path.join(mnt, "re%d" % r) for r in range(RANKS)]
    other = mnt + ".restored.group"
    with open(other, "w") as f:
        f.write("\n".join(restored) + "\n")
    for s in restored:
        os.mkdir(s)
    t = time.perf_counter()
    r3 = subprocess.run(ctl + ["restore", other, snap], capture_output=True, text=True, env=envb)
    t_restore = time.perf_counter() - t
    check(r3.returncode == 0 and gmsfs.Group.open(other).version() == "step-9",
          "gmsfsctl group restore: both ranks, named step-9 (the last)", r3.stderr + r3.stdout)
    for d in (snap, one):
        shutil.rmtree(d, ignore_errors=True)
    print("# bench: group refit of %.1f GB over %d ranks (a thread a rank): %s s, the device-to-device copy of the "
          "same tensors %s s: %s the copy (a trainer's step of 0.3 s before each; the issue's goal: 1.2x the slowest "
          "rank's copy)"
          % (gb, RANKS, ", ".join("%.4f" % w for w, _ in refits), ", ".join("%.4f" % f for _, f in refits),
             ", ".join("%.2fx" % (w / f) for w, f in refits)))
    print("# bench: group refit prepared during the trainer's step (Group.prepare, %s s each, off the refit's "
          "path): %s s, the copy %s s: %s the copy"
          % (", ".join("%.4f" % p for p in prepares), ", ".join("%.4f" % w for w, _ in prepared_refits),
             ", ".join("%.4f" % f for _, f in prepared_refits),
             ", ".join("%.2fx" % (w / f) for w, f in prepared_refits)))
    print("# bench: the same prepared refits to the group's version (both ranks' commits seen as an engine waiting "
          "on STORE/version sees them; the trainer's connections close after): %s s, the copy %s s: %s the copy"
          % (", ".join("%.4f" % w for w, _ in to_version), ", ".join("%.4f" % f for _, f in to_version),
             ", ".join("%.2fx" % (w / f) for w, f in to_version)))
    print("# bench: the same prepared refits beside the ranks' own copies at once (a thread a rank, each its "
          "shard, as the refit runs them): %s s: %s"
          % (", ".join("%.4f" % f for f in ranks_floor),
             ", ".join("%.2fx" % (w / f) for (w, _), f in zip(prepared_refits, ranks_floor))))
    print("# bench: flips to a group version, each engine: %s ms; made ahead (Group.flip_ahead, %s ms beside "
          "serving): %s ms (the goal: 2 ms a rank)"
          % (", ".join("%.2f" % x for x in flips), ", ".join("%.2f" % x for x in aheads),
             ", ".join("%.2f" % x for x in ahead_flips)))
    print("# bench: gmsfsctl group snapshot of %d ranks (%.1f GB) %.2f s (%.1f GB/s), restore %.2f s; one rank's "
          "gmsfs-snapshot save alone %.2f s (%.1f GB/s): the group at %.2fx one rank's rate on one GPU"
          % (RANKS, gb, t_group, gb / t_group, t_restore, t_one, gb / RANKS / t_one,
             (gb / t_group) / (gb / RANKS / t_one)))
    return done()


if __name__ == "__main__":
    sys.exit(main())
