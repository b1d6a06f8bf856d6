#!/usr/bin/env python3
"""A tensor-parallel pair over two GPUs (torch.distributed, NCCL) as one group: trainer ranks
refit it, engine ranks flip it in lockstep (TAP, then bench lines; the nvidia-h200-x2 kind).

    tp_gpu.py MOUNT0 MOUNT1 BUILD [LAYERS]
        MOUNT0 serves GPU 0, MOUNT1 GPU 1.  The model: LAYERS (of 32, fewer on a small
        device) of an 8B-shaped Llama's MLPs (transformers' LlamaMLP, bfloat16) with a
        residual and a norm, then an LM head of 32000: rank r holds half of each MLP (rows of gate and
        up, columns of down; the partial outputs summed by all_reduce) and half of the LM
        head's rows (the logits gathered by all_gather), in a store on its GPU's mount
        (user.gms.versions 2), the two grouped by a group file.  Four processes: two trainer
        ranks (one NCCL group) that own the weights, take steps and refit each its rank's
        store (gmsfs.Group.refit, every commit named), and two engine ranks (another NCCL
        group) that serve from the stores (gmsfs.Group.connect, gmsfs.torch.materialize) and
        flip in lockstep: each rank's gmsfs.Group.flip, then an all_reduce of whether it
        flipped, and a rank that flipped where another could not flips back.  Checked: every
        step's logits of both engines equal the trainers' own logits of that step, bit for
        bit; trainer rank 1 SIGKILLed after rank 0 refitted step 4: both engines' flips
        refused (EAGAIN), both serving step 3's logits; the trainers started again (a new
        NCCL group, their weights replayed to step 3), whose step 4 completes the group
        (rank 0's refit skipped), and the engines flip to it.  Timed: each group refit
        (the slowest rank's, from a barrier to its commit) beside the slowest rank's
        device-to-device copy of its shard after a barrier (the issue's goal: 1.2x), plain
        and prepared (Group.prepare during the step); each rank's flip and the lockstep flip
        beside the engine's step (the goal: 2 ms a rank), in place for steps 1-4 and mapped
        ahead (gmsfs.Group.flip_ahead) for steps 5-7; gmsfsctl group snapshot and
        restore of both GPUs' ranks on /dev/shm beside one rank's gmsfs-snapshot alone, and the
        group's restore by turns with both ranks in one gmsfs-snapshot, a gmsfs-snapshot a rank
        at once (what the command runs), and one alone."""
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "python"))
from refit_trace import watch_versions  # noqa: E402
from tap import check, done  # noqa: E402

# TP_SMALL=1: a model of toy sizes on the CPU (gloo, the host backend), to try the flow here.
SMALL = bool(os.environ.get("TP_SMALL"))
HIDDEN, INTER, VOCAB = (64, 256, 512) if SMALL else (4096, 14336, 32000)

# Both kinds of rank: the model's shard, its input, and the tensor-parallel forward.
COMMON = r"""
import json, os, sys, time, torch
import torch.distributed as dist
import gmsfs, gmsfs.torch as gt
HIDDEN, INTER, VOCAB = %d, %d, %d
DEV = "cpu" if os.environ.get("TP_SMALL") else "cuda"
DTYPE = torch.bfloat16 if DEV == "cuda" else torch.float32  # gloo sums no bfloat16
def sync():
    if DEV == "cuda":
        torch.cuda.synchronize()
if DEV == "cuda":
    import transformers
    from transformers.models.llama.modeling_llama import LlamaMLP
    def mlp():
        return LlamaMLP(transformers.LlamaConfig(hidden_size=HIDDEN, intermediate_size=INTER // 2, hidden_act="silu"))
else:  # LlamaMLP's shape and forward, where transformers is not installed
    class mlp(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.gate_proj = torch.nn.Linear(HIDDEN, INTER // 2, bias=False)
            self.up_proj = torch.nn.Linear(HIDDEN, INTER // 2, bias=False)
            self.down_proj = torch.nn.Linear(INTER // 2, HIDDEN, bias=False)
        def forward(self, x):
            return self.down_proj(torch.nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))
def shard_model(layers, device="meta"):
    def build():
        m = torch.nn.Module()
        m.layers = torch.nn.ModuleList([mlp() for _ in range(layers)])
        m.lm_head = torch.nn.Linear(HIDDEN, VOCAB // 2, bias=False)
        return m
    if DEV == "cuda":
        with torch.device(device):
            m = build()
    else:
        m = build().to(device)
    return m.to(DTYPE).eval()
def logits(m):
    # The logits, and where they came from (to say where an engine's first differ).
    g = torch.Generator(DEV).manual_seed(7)
    x = torch.randn(8, HIDDEN, device=DEV, generator=g).to(DTYPE)
    trace = {"weights": torch.stack([p.detach().view(-1).float().sum() for p in m.parameters()]).cpu()}
    with torch.no_grad():
        for i, mlp in enumerate(m.layers):
            p = mlp(x)
            if i == 0:
                trace["layer 0's partial output"] = p.cpu()
            dist.all_reduce(p)
            if i == 0:
                trace["layer 0's output summed over the ranks"] = p.cpu()
            x = x + p
            x = x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6).to(x.dtype)  # RMSNorm's
        part = m.lm_head(x)
        trace["the LM head's input"], trace["this rank's logits"] = x.cpu(), part.cpu()
        parts = [torch.empty_like(part) for _ in range(2)]
        dist.all_gather(parts, part)
        return {"logits": torch.cat(parts, -1).float().cpu(), "trace": trace}
rank, port, group, layers, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), sys.argv[5]
if DEV == "cuda":
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method="tcp://127.0.0.1:%%d" %% port, world_size=2, rank=rank,
                            device_id=torch.device("cuda", rank))
else:
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%%d" %% port, world_size=2, rank=rank)
g = gmsfs.Group.open(group)
def say(**kw):
    print(json.dumps(kw), flush=True)
""" % (HIDDEN, INTER, VOCAB)

# A trainer's rank: its weights from a seed, a step adds noise from the step's seed (so a
# trainer started again replays them); refits its rank's store with each step.
TRAINER = COMMON + r"""
replay = int(sys.argv[6])
m = shard_model(layers, DEV)
with torch.no_grad():
    gen = torch.Generator(DEV).manual_seed(1000 + rank)
    for p in m.parameters():
        p.copy_(torch.randn(p.shape, device=DEV, generator=gen) * 0.02)
def update(k):
    gen = torch.Generator(DEV).manual_seed(100 * k + rank)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(torch.randn(p.shape, device=DEV, generator=gen).to(p.dtype) * 1e-3)
for k in range(1, replay + 1):
    update(k)
sd = {n: p.detach() for n, p in m.state_dict().items()}
TRACE = []  # GMSFS_BENCH_TRACE=1: the refit's phases, (name, start, end), said with the step
if os.environ.get("GMSFS_BENCH_TRACE"):
    from refit_trace import trace_refit  # tests/gpu, on PYTHONPATH
    trace_refit(lambda name, a, b: TRACE.append((name, a, b)), clock=time.time)
say(ready=1)
for line in sys.stdin:
    w = line.split()
    if w[0] == "publish":
        c = gt.publish(m, g.stores[rank], commit=False)
        c.commit(version="step-0")
        c.close()
        torch.save(logits(m), out % 0)
        say(published=1)
        continue
    k, how = int(w[1]), w[2]
    if how == "solo":  # the other rank is gone: this rank's refit only, no collective
        update(k)
        say(did=g.refit(rank, sd, "step-%d" % k, timeout=60))
        continue
    prep = None
    if how == "prepared":  # at the step's start, before the weights are known
        prep = g.prepare(rank, {n: torch.empty_like(t, device="meta") for n, t in sd.items()}, "step-%d" % k,
                         timeout=60)
    update(k)
    time.sleep(0.3)  # the trainer's step: the version before goes meanwhile, as in an RL loop
    sync()
    dist.barrier()
    del TRACE[:]
    t0 = time.time()
    did = g.refit(rank, sd, "step-%d" % k, timeout=60, prepared=prep)
    sync()
    t1 = time.time()
    # The floor: this rank's shard copied device to device into tensors of its shapes.
    dst = [torch.empty_like(t) for t in sd.values()]
    sync()
    dist.barrier()
    f0 = time.time()
    for d, s in zip(dst, sd.values()):
        d.copy_(s)
    sync()
    f1 = time.time()
    del dst
    torch.save(logits(m), out % k)
    say(did=did, refit=[t0, t1], copy=[f0, f1], trace=[(n, a, b) for n, a, b in TRACE if a < t1])
"""

# An engine's rank: serves the group's version; flips in lockstep with the other rank.
ENGINE = COMMON + r"""
m = shard_model(layers)
gt.materialize(m, g.connect(rank, timeout=120))
LOOKS = []  # GMSFS_BENCH_TRACE=1: the group's look at every rank before each flip (ms)
if os.environ.get("GMSFS_BENCH_TRACE"):
    look = g._committed_last
    def timed(name):
        t = time.perf_counter()
        try:
            return look(name)
        finally:
            LOOKS.append((time.perf_counter() - t) * 1e3)
    g._committed_last = timed
def step():
    sync()
    t = time.perf_counter()
    y = logits(m)
    sync()
    ms = (time.perf_counter() - t) * 1e3
    torch.save(y, out)
    return ms
step()
say(version=m._gmsfs.version, step_ms=step())
ahead = None
for line in sys.stdin:
    w = line.split()
    v, was = w[1], m._gmsfs.version
    if w[0] == "ahead":  # the version mapped beside the one served (gmsfs.Group.flip_ahead), timed
        t = time.perf_counter()
        try:
            ahead, err = g.flip_ahead(rank, m, v, timeout=60), 0
        except gmsfs.GmsfsError as e:
            ahead, err = None, e.errno
        say(errno=err, ahead_ms=(time.perf_counter() - t) * 1e3, **({"look_ms": LOOKS.pop()} if LOOKS else {}))
        continue
    sync()
    t = time.perf_counter()
    try:
        if ahead is not None:
            ahead.flip()  # the tensors pointed at the version mapped ahead
        else:
            g.flip(rank, m, v)  # in place: mapped again at the same addresses
        ok, err = 1, 0
    except gmsfs.GmsfsError as e:
        ok, err = 0, e.errno
    flip_ms = (time.perf_counter() - t) * 1e3
    both = torch.tensor([ok], device=DEV)
    dist.all_reduce(both, op=dist.ReduceOp.MIN)
    if ok and not both.item():  # the other rank could not: back, so both serve one version
        ahead.back() if ahead is not None else g.flip(rank, m, was)
    sync()
    lockstep_ms = (time.perf_counter() - t) * 1e3
    more = {"look_ms": LOOKS.pop()} if LOOKS else {}
    step_ms = step()  # the step after the flip, then the version not served let go
    if ahead is not None:
        t = time.perf_counter()
        ahead.close()
        more["close_ms"], ahead = (time.perf_counter() - t) * 1e3, None
    say(errno=err, flip_ms=flip_ms, lockstep_ms=lockstep_ms, version=m._gmsfs.version, step_ms=step_ms, **more)
"""


def phases(snapshot, env, pairs, verb):
    """gmsfs-snapshot VERB -v for each (store, dir) at once: each one's phases printed."""
    t = time.perf_counter()
    ps = [subprocess.Popen([snapshot, verb, s, d, "-v", "-q"], stderr=subprocess.PIPE, text=True, env=env)
          for s, d in pairs]
    outs = [p.communicate()[1] for p in ps]
    took = time.perf_counter() - t
    for (s, _), o in zip(pairs, outs):
        print("#   phases: %s of %s (%d at once, %.3f s in all): %s" % (
            verb, s, len(pairs), took, "; ".join(l.replace("gmsfs-snapshot: ", "") for l in o.splitlines())))


def read_by_threads(paths, chunk=8 << 20):
    """Seconds to read every file of paths into memory, a thread a file (what a restore's
    copying threads read before their copies: the storage's own rate)."""
    import threading

    def read(path):
        buf = bytearray(chunk)
        fd = os.open(path, os.O_RDONLY)
        try:
            while os.readv(fd, [buf]) == chunk:
                pass
        finally:
            os.close(fd)
    ts = [threading.Thread(target=read, args=(p,)) for p in paths]
    t = time.perf_counter()
    for x in ts:
        x.start()
    for x in ts:
        x.join()
    return time.perf_counter() - t


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    m0, m1, build = sys.argv[1:4]
    import torch
    import gmsfs
    total = 1 << 30 if SMALL else min(torch.cuda.get_device_properties(i).total_memory for i in range(2))
    per_layer = 3 * HIDDEN * INTER  # a rank's half, bfloat16
    layers = int(sys.argv[4]) if len(sys.argv) > 4 else max(2, min(32, int(total * 0.04) // per_layer))
    gb = (layers * per_layer + HIDDEN * VOCAB // 2 * 2) / 1e9
    print("# %d layers' MLPs and an LM head over 2 GPUs: %.2f GB a rank" % (layers, gb))
    stores = [os.path.join(m0, "tp"), os.path.join(m1, "tp")]
    group = os.path.join("/dev/shm", "gmsfs-tp.group")
    with open(group, "w") as f:
        f.write("# an MLP stack and its LM head, tensor parallel over GPU 0 and GPU 1\n%s\n" % "\n".join(stores))
    for s in stores:
        os.mkdir(s)
        os.setxattr(s, "user.gms.versions", b"2")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join((os.path.join(ROOT, "python"), os.path.dirname(__file__))),
               CUDA_DEVICE_ORDER="PCI_BUS_ID")
    tout = ["/dev/shm/gmsfs-tp-trainer-%d-%%d.pt" % r for r in range(2)]
    eout = ["/dev/shm/gmsfs-tp-engine-%d.pt" % r for r in range(2)]

    def start(script, port, out, *more):
        return [subprocess.Popen([sys.executable, "-c", script, str(r), str(port), group, str(layers),
                                  out if isinstance(out, str) else out[r]] + list(more),
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
                for r in range(2)]

    def tell(procs, what):
        for p in procs:
            p.stdin.write(what + "\n")
            p.stdin.flush()
        return [json.loads(p.stdout.readline()) for p in procs]

    trainers = start(TRAINER, free_port(), tout, "0")
    [json.loads(p.stdout.readline()) for p in trainers]
    tell(trainers, "publish")
    g = gmsfs.Group.open(group)
    check(g.version() == "step-0", "a store on each GPU's mount, grouped, published as step-0 by the trainer ranks",
          g.status())
    engines = start(ENGINE, free_port(), eout)
    first = [json.loads(p.stdout.readline()) for p in engines]
    steps_ms = [x["step_ms"] for x in first]

    def same(k):
        """Every engine rank's logits of step k are the trainers', bit for bit; where not,
        says where they first differ."""
        ok = True
        for r in range(2):
            want, got = torch.load(tout[r] % k), torch.load(eout[r])
            if not torch.isfinite(want["logits"]).all():  # bit for bit, but of nothing
                print("# the trainers' logits of step %d are not all finite" % k)
                ok = False
            if not torch.equal(got["logits"], want["logits"]):
                ok = False
                where = [n for n in want["trace"] if not torch.equal(got["trace"][n], want["trace"][n])]
                print("# engine rank %d, step %d: logits differ by %.3g at most; first differ: %s" % (
                    r, k, (got["logits"] - want["logits"]).abs().max().item(), where))
        return ok

    check(same(0) and all(x["version"] == "step-0" for x in first),
          "both engine ranks serve step-0: their logits (all_reduce, all_gather over NCCL) equal the trainers'", first)

    def refit(k, how):
        th, seen = watch_versions(stores, "step-%d" % k, clock=time.time)
        got = tell(trainers, "step %d %s" % (k, how))
        th.join()
        wall = max(x["refit"][1] - x["refit"][0] for x in got)  # the slowest rank's, as its copy is
        floor = max(x["copy"][1] - x["copy"][0] for x in got)
        # To the group's version: each rank's commit seen, from its barrier (a rank skipped: none)
        seen_wall = max((s - x["refit"][0] for s, x in zip(seen, got) if s), default=0)
        return got, wall, floor, seen_wall

    def flip(k):
        got = tell(engines, "flip step-%d" % k)
        steps_ms.extend(x["step_ms"] for x in got)
        return got

    def flip_ahead(k):  # each engine rank maps step k ahead while it serves, then flips
        got = tell(engines, "ahead step-%d" % k)
        check(all(x["errno"] == 0 for x in got), "both engine ranks map step %d ahead (Group.flip_ahead)" % k, got)
        aheads.extend(x["ahead_ms"] for x in got)
        return flip(k)

    refits, flips, lockstep = {"plain": [], "prepared": []}, {"in place": [], "ahead": []}, []
    seens = {"plain": [], "prepared": []}
    aheads, closes = [], []
    for k, how in ((1, "plain"), (2, "plain"), (3, "plain"), (5, "prepared"), (6, "prepared"), (7, "prepared")):
        if k == 5:  # trainer rank 1 killed after rank 0 refitted step 4, then both started again
            trainers[1].send_signal(signal.SIGKILL)
            trainers[1].wait()
            trainers[0].stdin.write("step 4 solo\n")
            trainers[0].stdin.flush()
            did = json.loads(trainers[0].stdout.readline())
            trainers[0].kill()
            trainers[0].wait()
            got = flip(4)
            check(did["did"] and g.committed("step-4") == [0] and same(3) and
                  all(x["errno"] == 11 and x["version"] == "step-3" for x in got),
                  "trainer rank 1 killed after rank 0 refitted step 4: both engine ranks' flips refused (EAGAIN), "
                  "both serve step 3's logits bit for bit", got)
            trainers = start(TRAINER, free_port(), tout, "3")
            [json.loads(p.stdout.readline()) for p in trainers]
            got, _, _, _ = refit(4, "plain")
            check([x["did"] for x in got] == [False, True] and g.ready("step-4"),
                  "trainers started again (a new NCCL group, weights replayed): step 4 completed by rank 1's refit, "
                  "rank 0's skipped", got)
            got = flip(4)
            check(same(4) and all(x["errno"] == 0 and x["version"] == "step-4" for x in got),
                  "both engine ranks flip to step 4 in lockstep: logits equal the trainers' bit for bit", got)
        got, wall, floor, seen_wall = refit(k, how)
        refits[how].append((wall, floor))
        seens[how].append((seen_wall, floor))
        t0 = min(x["refit"][0] for x in got)
        for r, x in enumerate(got):
            for n, a, b in x.pop("trace", []):
                print("#   trace step %d rank %d %-14s %7.2f .. %7.2f ms" % (k, r, n, (a - t0) * 1e3, (b - t0) * 1e3))
            print("#   trace step %d rank %d refit  %7.2f .. %7.2f ms, its copy alone %.2f ms" % (
                k, r, (x["refit"][0] - t0) * 1e3, (x["refit"][1] - t0) * 1e3, (x["copy"][1] - x["copy"][0]) * 1e3))
        check(all(x["did"] for x in got) and g.ready("step-%d" % k),
              "step %d refitted by both trainer ranks (%s), each into its GPU's store" % (k, how), got)
        how = "ahead" if how == "prepared" else "in place"
        got = flip_ahead(k) if how == "ahead" else flip(k)
        flips[how].extend(x["flip_ms"] for x in got)
        lockstep.extend(x["lockstep_ms"] for x in got)
        closes.extend(x["close_ms"] for x in got if "close_ms" in x)
        check(same(k) and all(x["errno"] == 0 and x["version"] == "step-%d" % k for x in got),
              "both engine ranks flipped to step %d (%s) in lockstep: logits equal the trainers' bit for bit"
              % (k, how), got)
    for p in trainers + engines:
        p.stdin.close()
    for p in trainers + engines:
        p.wait(60)
    # Snapshots: both GPUs' ranks at once, beside one rank alone.
    snap, one, one_back = "/dev/shm/gmsfs-tp-snap", "/dev/shm/gmsfs-tp-one", os.path.join(m0, "one")
    for d in (snap, one):
        shutil.rmtree(d, ignore_errors=True)
    ctl = [sys.executable, os.path.join(ROOT, "tools", "gmsfsctl"), "group"]
    envb = dict(env, PATH=build + ":" + os.environ.get("PATH", ""))
    snapshot = os.path.join(build, "gmsfs-snapshot")
    t = time.perf_counter()
    r1 = subprocess.run([snapshot, "save", stores[0], one, "-q"], capture_output=True, text=True, env=envb)
    t_one = time.perf_counter() - t
    t = time.perf_counter()
    r2 = subprocess.run(ctl + ["snapshot", group, snap], capture_output=True, text=True, env=envb)
    t_group = time.perf_counter() - t
    check(r1.returncode == 0 and r2.returncode == 0, "gmsfsctl group snapshot of both GPUs' ranks under one manifest",
          r1.stderr + r2.stderr + r2.stdout)
    os.mkdir(one_back)
    t = time.perf_counter()
    r1 = subprocess.run([snapshot, "restore", one_back, one, "-q"], capture_output=True, text=True, env=envb)
    t_one_back = time.perf_counter() - t
    restored = [os.path.join(m, "re") for m in (m0, m1)]
    other = "/dev/shm/gmsfs-tp-restored.group"
    with open(other, "w") as f:
        f.write("\n".join(restored) + "\n")
    for s in restored:
        os.mkdir(s)
    t = time.perf_counter()
    r3 = subprocess.run(ctl + ["restore", other, snap], capture_output=True, text=True, env=envb)
    t_restore = time.perf_counter() - t
    check(r1.returncode == 0 and r3.returncode == 0 and gmsfs.Group.open(other).version() == "step-7",
          "gmsfsctl group restore onto both GPUs: both ranks, named step-7 (the last)", r1.stderr + r3.stderr + r3.stdout)
    if os.environ.get("GMSFS_BENCH_TRACE"):  # where the group's time goes: each rank's phases, alone and at once
        phases(snapshot, envb, [(stores[0], os.path.join("/dev/shm", "gmsfs-tp-ph-a"))], "save")
        phases(snapshot, envb, [(s, os.path.join("/dev/shm", "gmsfs-tp-ph%d" % r)) for r, s in enumerate(stores)], "save")
        for m in (m0, m1):
            os.mkdir(os.path.join(m, "ph"))
        os.mkdir(os.path.join(m0, "ph-a"))
        phases(snapshot, envb, [(os.path.join(m0, "ph-a"), os.path.join(snap, "rank-0"))], "restore")
        phases(snapshot, envb, [(os.path.join(m, "ph"), os.path.join(snap, "rank-%d" % r)) for r, m in enumerate((m0, m1))],
               "restore")
        for d in ("-a", "0", "1"):
            shutil.rmtree("/dev/shm/gmsfs-tp-ph" + d, ignore_errors=True)
    # The group's restore, by turns with both ranks' restores in one gmsfs-snapshot (a thread
    # each), a gmsfs-snapshot a rank at once (what the command runs), and one alone.
    rr = [os.path.join(m, "rr") for m in (m0, m1)]
    with open(other, "w") as f:
        f.write("\n".join(rr) + "\n")
    took = {"gmsfsctl group restore": [], "both in one gmsfs-snapshot restore": [],
            "both gmsfs-snapshot restore at once": [], "one alone": [],
            "both at once, all GPUs shown": [], "one alone, all GPUs shown": []}
    # gmsfs-snapshot shows the driver only its stores' GPUs where CUDA_VISIBLE_DEVICES is
    # unset; set to every GPU, its cuInit sets them all up (what it did before)
    every = "0,1"  # the pair's two GPUs

    def fresh():
        for x in rr:
            if os.path.isdir(x):
                os.rmdir(x)
            os.mkdir(x)
    for _ in range(3):
        for what in took:
            fresh()
            t = time.perf_counter()
            if what.startswith("gmsfsctl"):
                subprocess.run(ctl + ["restore", other, snap], capture_output=True, env=envb, check=True)
            elif what.startswith("both in one"):
                subprocess.run([snapshot, "restore"] + [y for r, x in enumerate(rr) for y in
                                                        (x, os.path.join(snap, "rank-%d" % r))] + ["-q"],
                               env=envb, check=True)
            else:
                ps = [subprocess.Popen([snapshot, "restore", x, os.path.join(snap, "rank-%d" % r), "-q"],
                                       env=dict(envb, CUDA_VISIBLE_DEVICES=every) if "all GPUs" in what else envb)
                      for r, x in enumerate(rr[:1] if what.startswith("one alone") else rr)]
                if any([p.wait() for p in ps]):
                    raise RuntimeError("a restore failed")
            took[what].append(time.perf_counter() - t)
    for x in rr:
        os.rmdir(x)
    shards = [[os.path.join(snap, "rank-%d" % r, f) for f in sorted(os.listdir(os.path.join(snap, "rank-%d" % r)))
               if f.startswith("shard-")] for r in range(2)]
    storage = {"one rank's": [], "both ranks'": []}
    for _ in range(3):
        storage["one rank's"].append(read_by_threads(shards[0]))
        storage["both ranks'"].append(read_by_threads(shards[0] + shards[1]))
    for d in (snap, one):
        shutil.rmtree(d, ignore_errors=True)
    for f in [group, other] + eout + [t % k for t in tout for k in range(8)]:
        if os.path.exists(f):
            os.unlink(f)

    def ratios(pairs):
        return "%s s against %s s: %s" % (", ".join("%.4f" % w for w, _ in pairs), ", ".join("%.4f" % f for _, f in pairs),
                                          ", ".join("%.2fx" % (w / f) for w, f in pairs))
    print("# bench: group refit of %.2f GB a rank over 2 GPUs (a trainer process a rank, each from a barrier to its "
          "commit; the slowest rank's), beside the slowest rank's device-to-device copy of its shard: %s (the goal: "
          "1.2x)"
          % (gb, ratios(refits["plain"])))
    print("# bench: the same, prepared during the trainer's step (Group.prepare): %s" % ratios(refits["prepared"]))
    print("# bench: to the group's version (plain, then prepared): each rank's commit as an engine waiting for it sees "
          "it (poll(2) on STORE/version), from that rank's barrier, the slowest rank's: %s; %s (the trainers close "
          "their connections after it)" % (ratios(seens["plain"]), ratios(seens["prepared"])))
    print("# bench: each engine rank's flip to the group's version, in place (mapped again at the same "
          "addresses): %s ms; mapped ahead (Group.flip_ahead, %s ms beside serving; the old version let go after "
          "the next step in %s ms): %s ms; with the lockstep all_reduce: %s ms (the goal: 2 ms a rank); the "
          "engine's step (its forward, NCCL included) %.2f-%.2f ms"
          % (", ".join("%.2f" % x for x in flips["in place"]), ", ".join("%.2f" % x for x in aheads),
             ", ".join("%.2f" % x for x in closes), ", ".join("%.2f" % x for x in flips["ahead"]),
             ", ".join("%.2f" % x for x in lockstep), min(steps_ms), max(steps_ms)))
    print("# bench: gmsfsctl group snapshot of both GPUs' ranks (%.2f GB) %.2f s, restore %.2f s; one rank alone: "
          "save %.2f s, restore %.2f s (the first of each)" % (2 * gb, t_group, t_restore, t_one, t_one_back))
    med = {w: sorted(v)[len(v) // 2] for w, v in took.items()}
    print("# bench: restores by turns, 3 each: %s; medians: the group's restore at %.2fx one rank's rate, both "
          "ranks in one process %.2fx, a process a rank at once %.2fx (the goal: 2x where the storage allows)"
          % ("; ".join("%s %s s" % (w, ", ".join("%.3f" % x for x in v)) for w, v in took.items()),
             2 * med["one alone"] / med["gmsfsctl group restore"],
             2 * med["one alone"] / med["both in one gmsfs-snapshot restore"],
             2 * med["one alone"] / med["both gmsfs-snapshot restore at once"]))
    print("# bench: every GPU shown to each (CUDA_VISIBLE_DEVICES=%s): one alone %.3f s, both at once %.3f s: %.2fx "
          "one rank's rate; each shown its own GPU (gmsfs-snapshot's default): %.3f s, %.3f s: %.2fx"
          % (every, med["one alone, all GPUs shown"], med["both at once, all GPUs shown"],
             2 * med["one alone, all GPUs shown"] / med["both at once, all GPUs shown"], med["one alone"],
             med["both gmsfs-snapshot restore at once"],
             2 * med["one alone"] / med["both gmsfs-snapshot restore at once"]))
    best = {w: min(v) for w, v in storage.items()}
    print("# bench: what the storage (/dev/shm) gives, its shard files read into memory by a thread each, best of 3: "
          "one rank's %.3f s, both ranks' at once %.3f s (%.2fx one rank's rate): of a restore alone, %.0f%%"
          % (best["one rank's"], best["both ranks'"], 2 * best["one rank's"] / best["both ranks'"],
             100 * best["one rank's"] / med["one alone"]))
    return done()


if __name__ == "__main__":
    sys.exit(main())
