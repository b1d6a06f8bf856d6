#!/usr/bin/env python3
"""In-place refit on one GPU, as an RL loop does it (TAP, then bench lines).

    refit_gpu.py MOUNT [LAYERS]    a transformers Llama, 8B-shaped (bfloat16; LAYERS of its
        32, fewer on a small device), served by 4 rollout engines, each a process of its
        own (the first publishes it with gmsfs.torch.load_or_publish, the others map it);
        a trainer (this process) builds the same model, takes a real SGD step, then:
      - refit: every engine sleeps, gmsfs.torch.refit(trainer, store) copies the trainer's
        tensors in by name and commits, every engine wakes and generates (a forward):
        timed from the first sleep until the last engine is awake (its forward said apart), against the
        device-to-device copy of the same tensors in the same run (the floor), and said
        in parts; every engine's logits equal the trainer's own forward, bit for bit; the
        store's allocations and bytes are what they were (no second copy);
      - paused refit: the engines are told to pause and the trainer calls refit at once
        with its own connection, paused between refits (its resume waits for the engines;
        nothing mapped again, each allocation made writable as its copies begin and
        read-only as they land); said in parts, beside the raw copy into the store's own
        memory, with a profile of one refit's Python;
      - a writer killed after importing the store writable (in place) leaves it TORN: an
        engine's wake is refused (EUCLEAN); the trainer's next refit heals it.
    Not a gate: the issue's goal (1.5x the copy) is said beside the figure."""
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
from tap import check, done  # noqa: E402

ENGINES = 4
CONFIG = r"""
import torch, transformers
def config(layers):
    return transformers.LlamaConfig(hidden_size=4096, intermediate_size=14336, num_hidden_layers=layers,
                                    num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
                                    max_position_embeddings=8192, rope_theta=500000.0, torch_dtype=torch.bfloat16)
def build(layers):
    # The same weights in every process: made on the GPU from one seed; on the meta device
    # where load_or_publish builds a model to map (no memory of its own).
    torch.manual_seed(0)
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    meta = torch.get_default_device().type == "meta"
    try:
        with torch.device("meta" if meta else "cuda"):
            return transformers.LlamaForCausalLM(config(layers)).eval()
    finally:
        torch.set_default_dtype(before)
def ids():
    return torch.randint(0, 128256, (1, 64), device="cuda", generator=torch.Generator("cuda").manual_seed(1))
def digest(logits):
    return __import__("hashlib").sha256(logits.detach().float().cpu().numpy().tobytes()).hexdigest()
"""

ENGINE = CONFIG + r"""
import gmsfs, gmsfs.torch as gt, json, os, sys, time
store, layers = sys.argv[1], int(sys.argv[2])
torch.zeros(1, device="cuda")
model = gt.load_or_publish(store, lambda: build(layers), lambda m: None)
x = ids()
def generate():
    with torch.no_grad():
        d = digest(model(x).logits)
    torch.cuda.synchronize()
    return d
print(json.dumps({"published": model._gmsfs_published, "logits": generate()}), flush=True)
for line in sys.stdin:
    what = line.strip()
    try:
        if what == "sleep":
            gt.sleep(model)
            print(json.dumps({"t": time.time()}), flush=True)
        elif what.startswith("serve"):
            # Generate step after step for a while; between two steps, when the store's
            # generation moved, flip to it (a store with versions): each step's and each
            # flip's time said.
            gfd = os.open(os.path.join(store, "generation"), os.O_RDONLY)
            seen = int(os.pread(gfd, 32, 0))
            steps, flips, starts = [], [], []
            end = time.time() + float(what.split()[1])
            while time.time() < end:
                g = int(os.pread(gfd, 32, 0))
                if g != seen:
                    t = time.perf_counter()
                    n = gt.flip(model)
                    flips.append([time.perf_counter() - t, n, g])
                    seen = g
                t = time.perf_counter()
                t_wall = time.time()
                generate()
                steps.append(time.perf_counter() - t)
                starts.append(t_wall)
            os.close(gfd)
            print(json.dumps({"steps": steps, "starts": starts, "flips": flips, "logits": generate()}), flush=True)
        elif what == "pause":
            gt.pause(model)
            print(json.dumps({"t": time.time()}), flush=True)
        elif what == "resume":
            gt.resume(model, 30)
            woke = time.time()
            d = generate()
            print(json.dumps({"woke": woke, "t": time.time(), "logits": d}), flush=True)
        elif what == "wake":
            gt.wake(model, 30)
            woke = time.time()
            d = generate()
            print(json.dumps({"woke": woke, "t": time.time(), "logits": d}), flush=True)
    except gmsfs.GmsfsError as e:
        print(json.dumps({"errno": e.errno, "error": str(e)}), flush=True)
"""


class Engine:
    def __init__(self, store, layers):
        env = dict(os.environ, PYTHONPATH=os.path.join(HERE, "..", "..", "python"))
        self.p = subprocess.Popen([sys.executable, "-c", ENGINE, store, str(layers)], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True, env=env)

    def read(self):
        line = self.p.stdout.readline()
        if not line:
            raise RuntimeError("an engine ended (exit %s)" % self.p.wait())
        return json.loads(line)

    def send(self, what):
        self.p.stdin.write(what + "\n")
        self.p.stdin.flush()

    def close(self):
        self.p.stdin.close()
        return self.p.wait(60)


def ask_all(engines, what):
    for e in engines:
        e.send(what)
    return [e.read() for e in engines]


def state(store):
    with open(os.path.join(store, "state")) as f:
        return dict(line.split(": ", 1) for line in f.read().splitlines() if ": " in line)


def versions(store, engines, trainer, ns, x):
    """user.gms.versions 2: the engines serve (a forward after another) while the trainer
    refits beside them, then once more with one tensor; each engine flips between two
    steps when the generation moves.  Checks the logits; says the engines' longest step
    against their median, each flip's time, what was copied."""
    import torch
    import gmsfs.torch as gt
    os.setxattr(store, "user.gms.versions", b"2")
    trainer.train()
    opt = torch.optim.SGD(trainer.parameters(), lr=1e-2)
    trainer(x, labels=x).loss.backward()
    opt.step()
    trainer.zero_grad(set_to_none=True)
    del opt
    trainer.eval()
    norm = trainer.model.norm.weight
    with torch.no_grad():
        kept = norm.detach().clone()
        norm.mul_(1.5)
        want3 = ns["digest"](trainer(x).logits)
        norm.copy_(kept)
    nallocs = int(state(store)["allocations"])
    for e in engines:
        e.send("serve 6")
    time.sleep(1.0)
    copies0 = int(state(store)["version_copies"])
    t0_wall = time.time()
    t = time.perf_counter()
    gt.refit(trainer, store, timeout=0).close()  # at once, beside the serving engines
    full = time.perf_counter() - t
    copies1 = int(state(store)["version_copies"])
    with torch.no_grad():
        norm.mul_(1.5)
    t = time.perf_counter()
    gt.refit({"model.norm.weight": norm}, store, strict=False, timeout=10).close()  # once all flipped
    one = time.perf_counter() - t
    t1_wall = time.time()
    copies2 = int(state(store)["version_copies"])
    served = [e.read() for e in engines]
    check(copies1 - copies0 == nallocs and copies2 - copies1 == 1,
          "versions: the whole refit copies every allocation, the one of one tensor copies one",
          (copies0, copies1, copies2, nallocs))
    check(all(s["logits"] == want3 for s in served),
          "versions: every engine, flipped twice while serving, gives the trainer's logits bit for bit")
    check(all(len(s["flips"]) == 2 for s in served), "versions: each engine flipped twice",
          [s["flips"] for s in served])
    flips = [f[0] for s in served for f in s["flips"]]
    pauses, when = [], []
    for s in served:
        steps = sorted(s["steps"])
        pauses.append(max(s["steps"]) / steps[len(steps) // 2])
        k = s["steps"].index(max(s["steps"]))
        when.append("%.0f" % ((s["starts"][k] - t0_wall) * 1e3))
    st = state(store)
    check(st["prev_handles"] == "0" and st["torn"] == "0", "versions: the version before went with its last reader")
    return ("whole refit beside 4 serving engines %.1f ms (%d allocations copied), one tensor %.1f ms (1 copied); "
            "flips %.2f-%.2f ms (goal 10 ms); longest step over the median step %.2f-%.2fx (goal 2x); "
            "steps per engine %s, median step %.1f ms; each engine's longest began at %s ms after the first refit "
            "began (the second ended at %.0f ms)" % (
                full * 1e3, nallocs, one * 1e3, min(flips) * 1e3, max(flips) * 1e3, min(pauses), max(pauses),
                [len(s["steps"]) for s in served], sorted(served[0]["steps"])[len(served[0]["steps"]) // 2] * 1e3,
                ", ".join(when), (t1_wall - t0_wall) * 1e3))


def todays_ways(trainer, ns, layers):
    """Beside: an engine's own copy of the weights refreshed by load_state_dict (what
    trainers colocated with vLLM do), and reloaded by from_pretrained of a checkpoint the
    trainer saved (page cache warm: the best case of a disk)."""
    import shutil
    import tempfile
    import torch
    import transformers
    engine = ns["build"](layers)
    sd = trainer.state_dict()
    times = []
    for _ in range(3):
        torch.cuda.synchronize()
        t = time.perf_counter()
        engine.load_state_dict(sd)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    del engine
    torch.cuda.empty_cache()
    d = tempfile.mkdtemp(prefix="refit-ckpt.", dir="/var/tmp")
    try:
        trainer.save_pretrained(d)
        torch.cuda.synchronize()
        t = time.perf_counter()
        m = transformers.LlamaForCausalLM.from_pretrained(d, torch_dtype=torch.bfloat16, device_map="cuda")
        torch.cuda.synchronize()
        fp = time.perf_counter() - t
        del m
    finally:
        shutil.rmtree(d)
    torch.cuda.empty_cache()
    return "load_state_dict %.1f ms (median of 3), from_pretrained of a saved checkpoint %.0f ms" % (
        sorted(times)[1] * 1e3, fp * 1e3)


def main():
    mnt = sys.argv[1]
    import torch
    total = torch.cuda.get_device_properties(0).total_memory
    # store + trainer + its gradients + the floor's copy: four models and room to spare.
    layers = int(sys.argv[2]) if len(sys.argv) > 2 else max(2, min(32, int(32 * total / (6 * 16e9))))
    ns = {}
    exec(CONFIG, ns)
    import gmsfs
    import gmsfs.torch as gt
    store = os.path.join(mnt, "policy")
    os.mkdir(store)
    t0 = time.time()
    first = Engine(store, layers)
    said = first.read()
    engines = [first] + [Engine(store, layers) for _ in range(ENGINES - 1)]
    ready = [said] + [e.read() for e in engines[1:]]
    print("# %d engines ready in %.1f s (%d layers; the first published: %s)" % (
        ENGINES, time.time() - t0, layers, said["published"]), flush=True)
    check(all(r["logits"] == said["logits"] for r in ready), "every engine gives the same logits before the refit")
    before = state(store)

    # The trainer: the same model, one real SGD step on a batch.
    trainer = ns["build"](layers).train()
    x = ns["ids"]()
    check(ns["digest"](trainer.eval()(x).logits) == said["logits"], "the trainer starts from the engines' weights")
    trainer.train()
    opt = torch.optim.SGD(trainer.parameters(), lr=1e-2)
    loss = trainer(x, labels=x).loss
    loss.backward()
    opt.step()
    trainer.zero_grad(set_to_none=True)
    del opt
    trainer.eval()
    with torch.no_grad():
        want = ns["digest"](trainer(x).logits)
    check(want != said["logits"], "the step changed the trainer's logits")
    nbytes = sum(t.numel() * t.element_size() for t in trainer.state_dict().values())

    # The floor: the same tensors copied device to device, into tensors of their own.
    src = [t for t in trainer.state_dict().values()]
    dst = [torch.empty_like(t) for t in src]
    floors = []
    for _ in range(5):
        torch.cuda.synchronize()
        t = time.perf_counter()
        for d, s in zip(dst, src):
            d.copy_(s)
        torch.cuda.synchronize()
        floors.append(time.perf_counter() - t)
    del dst
    torch.cuda.empty_cache()
    floor = sorted(floors)[2]

    # Refit, twice (the first, then a warm one): sleep, refit, wake and generate.
    runs = []
    for i in range(3):  # the same weights each time: the refit's work is the same
        t = time.time()
        slept = ask_all(engines, "sleep")
        t_sleep = max(s["t"] for s in slept)
        c = gt.refit(trainer, store, timeout=30)
        c.close()
        t_refit = time.time()
        woke = ask_all(engines, "wake")
        t_woke = max(w.get("woke", 0) for w in woke)
        t_gen = max(w.get("t", 0) for w in woke)
        runs.append((t_woke - t, t_sleep - t, t_refit - t_sleep, t_woke - t_refit, t_gen - t))
        check(all(w.get("logits") == want for w in woke),
              "refit %d: every engine's logits after it are the trainer's, bit for bit" % (i + 1),
              "" if all(w.get("logits") == want for w in woke) else woke)
    # The same with no unmap and no map: the engines pause, the trainer's own connection,
    # paused between refits, resumes as the writer (its mappings and tensors kept).
    conn = gmsfs.connect(store, "ro", 30)
    conn.pause()
    spent = {}  # where the trainer's refit goes: its connection's calls, timed
    for name in ("resume", "commit", "pause"):
        def timed(*a, _f=getattr(conn, name), _n=name, **k):
            t = time.perf_counter()
            try:
                return _f(*a, **k)
            finally:
                spent.setdefault(_n, []).append(time.perf_counter() - t)
                marks[_n + "d"] = time.perf_counter()
        setattr(conn, name, timed)
    # Marks inside each paused refit: its resume's end, its first copy's launch, its wait
    # for the copies (what the GPU still had to do).
    import gmsfs._torch_refit as refit_module
    marks = {}
    sync, dest = torch.cuda.synchronize, refit_module._destination

    def timed_sync(*a, **k):
        marks["sync"] = time.perf_counter()
        try:
            return sync(*a, **k)
        finally:
            marks["synced"] = time.perf_counter()

    def first_dest(*a, **k):
        marks.setdefault("first", time.perf_counter())
        return dest(*a, **k)
    paused, inside = [], []
    for i in range(4):  # the first maps the trainer's connection once; the rest none
        t = time.time()
        for e in engines:  # and the trainer's call at once, as an RL loop's: its resume waits for them
            e.send("pause")
        marks.clear()
        torch.cuda.synchronize, refit_module._destination = timed_sync, first_dest
        t_call = time.perf_counter()
        try:
            gt.refit(trainer, conn, timeout=30)
        finally:
            torch.cuda.synchronize, refit_module._destination = sync, dest
        t_back = time.perf_counter()
        # from the call: resumed; the first copy launched; every copy queued (and each
        # allocation sealed as its copies landed); the GPU's tail; the rest (commit, pause)
        inside.append((marks["resumed"] - t_call, marks["first"] - marks["resumed"], marks["sync"] - marks["first"],
                       marks["synced"] - marks["sync"], t_back - marks["synced"]))
        t_refit = time.time()
        t_sleep = max(e.read()["t"] for e in engines)
        woke = ask_all(engines, "resume")
        t_woke = max(w.get("woke", 0) for w in woke)
        t_gen = max(w.get("t", 0) for w in woke)
        paused.append((t_woke - t, t_sleep - t, t_refit - t_sleep, t_woke - t_refit, t_gen - t))
        check(all(w.get("logits") == want for w in woke),
              "paused refit %d: every engine's logits after it are the trainer's, bit for bit" % (i + 1))
    # The floor again, into the store's own memory (the trainer's destinations, in a data-only
    # session it commits): what the copy costs there, without the refit's calls.
    check(conn.paused and conn.mappings and not any(m.writable for m in conn.mappings),
          "after the paused refits the trainer's mappings are read-only (sealed allocation by allocation)")
    ask_all(engines, "pause")
    import cProfile
    import pstats
    prof = cProfile.Profile()  # where a refit's Python goes (printed at the end)
    prof.enable()
    gt.refit(trainer, conn, timeout=30, commit=False)
    prof.disable()
    plan = conn._refit_plan
    pairs = [(plan["dst"][n], t.detach()) for n, t in trainer.state_dict().items() if n in plan["dst"]]
    into = []
    for _ in range(5):
        torch.cuda.synchronize()
        t = time.perf_counter()
        for d, s in pairs:
            d.copy_(s)
        torch.cuda.synchronize()
        into.append(time.perf_counter() - t)
    # The refit's own copy (its loop, each allocation made writable as its copies begin and
    # read-only as they land), and the same loop with the access left as it is.
    sources = refit_module._sources(trainer)
    cuda = torch.device("cuda", torch.cuda.current_device())
    own = {True: [], False: []}
    for seal in (True, False) * 5:
        for m in conn.mappings:
            conn.protect(m.name, not seal)
        torch.cuda.synchronize()
        t = time.perf_counter()
        refit_module._copy(conn, plan, sources, cuda, seal)  # it ends with a synchronize
        own[seal].append(time.perf_counter() - t)
    own = {k: sorted(v)[2] for k, v in own.items()}
    conn.commit()
    conn.close()
    into = sorted(into)[2]
    check(all(w.get("logits") == want for w in ask_all(engines, "resume")),
          "after the floor into the store's memory, every engine's logits are the trainer's still")
    parts = " ".join("%s %.2f ms" % (n, sorted(v[1:])[len(v[1:]) // 2] * 1e3) for n, v in spent.items())
    after = state(store)
    check((after["allocations"], after["bytes"], after["layout_hash"], after["torn"], after["peak"]) ==
          (before["allocations"], before["bytes"], before["layout_hash"], "0", before["peak"]),
          "in place: the store's allocations, bytes, layout and peak of memory as before (no second copy, ever)",
          "%s -> %s" % ({k: before[k] for k in ("allocations", "bytes", "peak")},
                        {k: after[k] for k in ("allocations", "bytes", "peak")}))
    check(int(after["generation"]) == int(before["generation"]) + 8,
          "eight commits (seven refits and the floor into the store), eight generations")

    # A writer killed with the store's memory writable: TORN, refused, healed by a refit.
    ask_all(engines, "sleep")
    k = subprocess.run([sys.executable, "-c", "import gmsfs, os, signal, sys\n"
                        "c = gmsfs.connect(sys.argv[1], 'rw', 30); c.import_all()\n"
                        "[c.protect(m.name, True) for m in c.mappings]\n"
                        "os.kill(os.getpid(), signal.SIGKILL)", store],
                       env=dict(os.environ, PYTHONPATH=os.path.join(HERE, "..", "..", "python")))
    st = state(store)
    check(k.returncode == -9 and (st["state"], st["torn"]) == ("TORN", "1"),
          "a writer killed holding the committed memory writable leaves the store TORN", st.get("last_error"))
    refused = engines[0]
    refused.send("wake")
    r = refused.read()
    check(r.get("errno") == 117, "an engine's wake on the torn store is refused (EUCLEAN)", r)
    c = gt.refit(trainer, store, timeout=30)
    c.close()
    woke = ask_all(engines[1:], "wake")
    refused.send("wake")
    woke.append(refused.read())
    check(state(store)["torn"] == "0" and all(w.get("logits") == want for w in woke),
          "the next refit heals it: every engine wakes to the trainer's logits")
    versioned = versions(store, engines, trainer, ns, x)
    for e in engines:
        e.close()
    today = todays_ways(trainer, ns, layers)

    gb = nbytes / 1e9
    total_s = sorted(r[0] for r in runs)[1]
    med = sorted(runs, key=lambda r: r[0])[1]
    print("# refit of %.1f GB (%d layers), %d engines, median of 3: from the first sleep until every engine is "
          "awake %.1f ms (engines asleep %.1f ms, refit %.1f ms, every engine awake %.1f ms) against the "
          "device-to-device copy of the same tensors %.1f ms: %.2fx (goal 1.5x); until every engine's first forward "
          "is done %.1f ms" % (gb, layers, ENGINES, total_s * 1e3, med[1] * 1e3, med[2] * 1e3, med[3] * 1e3,
                                floor * 1e3, total_s / floor, med[4] * 1e3))
    print("# every run (s): %s" % " ".join("%.4f" % r[0] for r in runs))
    pm = sorted(paused[1:], key=lambda r: r[0])[1]
    print("# paused refit (engines pause and resume, the trainer's connection kept, its call made as the engines "
          "are told to pause), median of the 3 after the first: %.1f ms (every engine paused after %.1f ms, the "
          "refit done %.1f ms after that, every engine resumed %.1f ms later) against the copy "
          "%.1f ms: %.2fx (goal 1.5x); the first %.1f ms; until every engine's first forward is done %.1f ms" % (
              pm[0] * 1e3, pm[1] * 1e3, pm[2] * 1e3, pm[3] * 1e3, floor * 1e3, pm[0] / floor, paused[0][0] * 1e3,
              pm[4] * 1e3))
    print("# of the paused refit, the trainer's connection (medians after the first): %s" % parts)
    med = [sorted(r[k] for r in inside[1:])[1] * 1e3 for k in range(5)]
    print("# of the paused refit, from its call (medians after the first): resumed %.2f ms, then its first copy "
          "launched %.2f ms, every copy queued and landed (each allocation read-only again once its copies had) "
          "%.2f ms, what the GPU still had to do %.2f ms, commit and pause %.2f ms; the raw "
          "copy loop into the store's own memory %.1f ms (%.2fx the floor); the refit's copy alone %.1f ms, without its "
          "access changes %.1f ms" % (*med, into * 1e3, into / floor, own[True] * 1e3, own[False] * 1e3))
    print("# one refit's Python, by its own time (cProfile):")
    stats = pstats.Stats(prof, stream=sys.stdout)
    stats.sort_stats("tottime").print_stats(10)
    print("# versions: %s" % versioned)
    print("# what trainers do today, for one engine: %s" % today)
    return done()


if __name__ == "__main__":
    sys.exit(main())
