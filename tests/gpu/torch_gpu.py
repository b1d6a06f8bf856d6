#!/usr/bin/env python3
"""gmsfs.torch on the GPU: tests (TAP) and the warm-start benchmark.

    torch_gpu.py test MOUNT BUILD      a transformers Llama of about 1B parameters, built
                                       from a config with a fixed seed: one writer publishes,
                                       readers materialize it zero-copy; TAP lines
    torch_gpu.py bench MOUNT BUILD     a Llama-3-8B-shaped module (291 bf16 tensors): warm
                                       start in fresh processes, three layouts; the writer
    torch_gpu.py role ...              one process of the above (internal)

Every role is a process of its own, as engines are; they take commands on stdin and
answer one JSON line each."""
import hashlib
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from tap import check, done  # noqa: E402

ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "python"))


# ---------------------------------------------------------------- the models

def llama_config():
    from transformers import LlamaConfig
    return LlamaConfig(hidden_size=2048, intermediate_size=5632, num_hidden_layers=16, num_attention_heads=16,
                       num_key_value_heads=4, vocab_size=32000, max_position_embeddings=2048,
                       tie_word_embeddings=False)


def llama(device):
    import torch
    from transformers import LlamaForCausalLM
    torch.set_default_dtype(torch.bfloat16)
    torch.manual_seed(1234)
    with torch.device(device):
        m = LlamaForCausalLM(llama_config())
    torch.set_default_dtype(torch.float32)
    return m.eval()


class Llama8B:
    """The tensors of Llama-3-8B (bf16): embed and lm_head 128256 x 4096; per layer q, k, v,
    o, gate, up, down and two norms; 32 layers; the final norm."""

    @staticmethod
    def make(device):
        import torch

        class Layer(torch.nn.Module):
            def __init__(self):
                super().__init__()
                P = lambda *s: torch.nn.Parameter(torch.empty(*s, dtype=torch.bfloat16, device=device))
                self.q, self.k, self.v, self.o = P(4096, 4096), P(1024, 4096), P(1024, 4096), P(4096, 4096)
                self.gate, self.up, self.down = P(14336, 4096), P(14336, 4096), P(4096, 14336)
                self.norm1, self.norm2 = P(4096), P(4096)

        class Model(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.embed = torch.nn.Parameter(torch.empty(128256, 4096, dtype=torch.bfloat16, device=device))
                self.layers = torch.nn.ModuleList([Layer() for _ in range(32)])
                self.norm = torch.nn.Parameter(torch.empty(4096, dtype=torch.bfloat16, device=device))
                self.lm_head = torch.nn.Parameter(torch.empty(128256, 4096, dtype=torch.bfloat16, device=device))

        return Model()


# ---------------------------------------------------------------- roles

def answer(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def role_llama(kind, store):
    """writer: build on the GPU straight into the store and publish; reader: build on the meta
    device and materialize.  Then serve commands: logits, sleep, wake, poke, quit."""
    import torch
    import gmsfs
    import gmsfs.torch as gt
    import gmsfs._torch_layout as _tl
    torch.cuda.init()
    torch.empty(1, device="cuda")
    t0 = time.perf_counter()
    if kind == "writer":
        conn = gmsfs.connect(store, "rw", timeout=60)
        with gt.allocator(conn):
            model = llama("cuda")
        gt.publish(model, conn, private=[n for n, _ in model.named_buffers()])
    else:
        model = gt.materialize(llama("meta"), store)
    took = time.perf_counter() - t0
    ids = torch.tensor([[1, 306, 4658, 278, 6593, 310, 2834, 338]], device="cuda")
    conn = model._gmsfs

    def ptrs():
        return hashlib.sha256(json.dumps([p.data_ptr() for p in model.parameters()]).encode()).hexdigest()

    def outputs():
        with torch.no_grad():
            logits = model(ids).logits
            tokens = model.generate(ids, max_new_tokens=16, do_sample=False)
        return {"logits": hashlib.sha256(logits.float().cpu().numpy().tobytes()).hexdigest(),
                "tokens": tokens[0].tolist(), "ptrs": ptrs()}

    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    in_store = all(conn.find_ptr(p.data_ptr()) for p in model.parameters())
    answer(dict(outputs(), ready=True, seconds=took, weights=weights, allocations=len(conn.mappings),
                in_store=in_store, pid=os.getpid()))
    for line in sys.stdin:
        cmd = line.strip()
        try:
            if cmd == "logits":
                answer(outputs())
            elif cmd == "sleep":
                gt.sleep(model)
                answer({"slept": True, "lock": conn.lock_mode})
            elif cmd == "wake":
                gt.wake(model, timeout=30)
                answer(dict(outputs(), woke=True))
            elif cmd == "poke":  # a reader writes into a shared weight
                try:
                    with torch.no_grad():
                        next(model.parameters()).add_(1)
                    torch.cuda.synchronize()
                    answer({"poke": "went through"})
                except Exception as e:
                    answer({"poke": "refused", "error": str(e).splitlines()[0]})
            elif cmd == "quit":
                answer({"bye": True})
                return
        except Exception as e:
            answer({"error": "%s: %s" % (type(e).__name__, e)})


def role_writer8b(store_slabs, store_tensors, store_packed):
    """Three stores of the same 8B-shaped model: slabs (built into the store by the C
    allocator), one allocation per tensor, one packed allocation (publish of a CPU
    model); and the writer's times beside model.to("cuda")."""
    import torch
    import gmsfs
    import gmsfs.torch as gt
    import gmsfs._torch_layout as _tl
    torch.cuda.init()
    torch.empty(1, device="cuda")  # a current context: the library maps in it
    out = {}
    c = gmsfs.connect(store_slabs, "rw", timeout=60)
    t0 = time.perf_counter()
    with gt.allocator(c):
        m = Llama8B.make("cuda")
    out["build_into_store_s"] = time.perf_counter() - t0
    for p in m.parameters():
        torch.nn.init.normal_(p, std=0.02)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    gt.publish(m, c)
    out["publish_in_place_s"] = time.perf_counter() - t0
    out["slabs"] = len(c.mappings)
    cpu = Llama8B.make("cpu")
    with torch.no_grad():
        for a, b in zip(cpu.parameters(), m.parameters()):
            a.copy_(b)
    # One allocation per tensor, as a loader that knows no better would make.
    t = gmsfs.connect(store_tensors, "rw", timeout=60)
    entries = []
    for i, (name, p) in enumerate(m.named_parameters()):
        a = t.create("t%03d" % i, p.numel() * 2, tag="torch")
        _tl._bytes_at(a.ptr, a.size, p.device).copy_(_tl._bytes_at(p.data_ptr(), a.size, p.device))
        entries.append({"key": "torch/" + name, "alloc": a.name, "size": a.size, "value": json.dumps(
            {"dtype": "bfloat16", "shape": list(p.shape), "stride": list(p.stride()), "storage_offset": 0,
             "param": True}, separators=(",", ":"))})
    t.meta_put_many(entries)
    t.commit()
    out["tensor_allocations"] = len(t.mappings)
    del m
    torch.cuda.empty_cache()
    t0 = time.perf_counter()
    g = cpu.to("cuda")
    torch.cuda.synchronize()
    out["to_cuda_s"] = time.perf_counter() - t0
    del g
    torch.cuda.empty_cache()
    p = gmsfs.connect(store_packed, "rw", timeout=60)
    t0 = time.perf_counter()
    gt.publish(cpu, p)
    torch.cuda.synchronize()
    out["publish_cpu_model_s"] = time.perf_counter() - t0
    out["weights_bytes"] = sum(x.numel() * 2 for x in cpu.parameters())
    answer(out)
    for line in sys.stdin:  # hold the stores' read locks until told
        if line.strip() == "quit":
            return


def role_reader8b(store):
    """A fresh process's warm start: its CUDA context, then connect + import + materialize."""
    t0 = time.perf_counter()
    import torch
    import gmsfs
    import gmsfs.torch as gt
    import gmsfs._torch_layout as _tl
    import floor  # tests/gpu
    t_import = time.perf_counter() - t0
    t0 = time.perf_counter()
    torch.cuda.init()
    torch.empty(1, device="cuda")
    ctx = time.perf_counter() - t0
    t0 = time.perf_counter()
    with torch.device("meta"):
        m = Llama8B.make("meta")
    build = time.perf_counter() - t0
    t0 = time.perf_counter()
    c = gmsfs.connect(store, "ro", timeout=30)
    c.import_all()
    t1 = time.perf_counter()
    floor.profiled(gt.materialize, m, c)  # profiled with GMSFS_PROFILE
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    ok = all(c.find_ptr(p.data_ptr()) for p in m.parameters()) and str(m.embed.device).startswith("cuda")
    views = floor.views_floor(m)
    answer({"import_torch_s": t_import, "context_ms": ctx * 1e3, "build_meta_ms": build * 1e3,
            "connect_import_ms": (t1 - t0) * 1e3, "materialize_ms": (t2 - t1) * 1e3,
            "views_floor_ms": views * 1e3,
            "total_ms": (t2 - t0) * 1e3, "allocations": len(c.mappings), "zero_copy": ok})


# ---------------------------------------------------------------- the driver

class Proc:
    def __init__(self, *args):
        self.p = subprocess.Popen([sys.executable, __file__, "role", *args], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONUNBUFFERED="1"))

    def read(self):
        line = self.p.stdout.readline()
        if not line:
            raise RuntimeError("the process ended (%s)" % self.p.wait())
        return json.loads(line)

    def ask(self, cmd):
        self.p.stdin.write(cmd + "\n")
        self.p.stdin.flush()
        return self.read()

    def quit(self):
        try:
            self.ask("quit")
        except Exception:
            pass
        self.p.wait()


def gpu_used():
    out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", "0"],
                         capture_output=True, text=True).stdout
    return int(out.split()[0]) << 20


def test(mount):
    store = os.path.join(mount, "llama1b")
    os.mkdir(store)
    base = gpu_used()
    w = Proc("llama", "writer", store)
    wr = w.read()
    after_w = gpu_used()
    check(wr["in_store"] and wr["allocations"] <= 4, "the writer builds into %d slabs of the store, no copy"
          % wr["allocations"], "weights %.2f GB, built and published in %.1f s" % (wr["weights"] / 1e9, wr["seconds"]))
    r1, r2 = Proc("llama", "reader", store), Proc("llama", "reader", store)
    a, b = r1.read(), r2.read()
    after_r = gpu_used()
    check(a["logits"] == b["logits"] == wr["logits"], "two readers at once give the writer's logits, bit for bit")
    check(a["tokens"] == b["tokens"] == wr["tokens"], "and the same greedy generate() tokens",
          "tokens %s" % a["tokens"])
    check(a["in_store"] and b["in_store"], "every reader parameter is a view of the store (zero-copy)")
    grow = after_r - after_w
    check(grow < wr["weights"], "GPU memory grows by the weights once, not once per reader",
          "in use %.2f GB before, %.2f GB with the writer, %.2f GB with two readers (+%.2f GB: their contexts "
          "and caches; the weights are %.2f GB)" % (base / 1e9, after_w / 1e9, after_r / 1e9, grow / 1e9,
                                                    wr["weights"] / 1e9))
    r3 = Proc("llama", "reader", store)
    r3.read()
    poked = r3.ask("poke")
    check(poked.get("poke") == "refused", "a reader's write into a parameter faults in that reader", poked)
    r3.p.kill()
    r3.p.wait()
    again = r1.ask("logits")
    check(again["logits"] == wr["logits"], "the other readers and the store are untouched by it")
    check(r2.ask("sleep").get("lock") is None, "sleep: the reader gives its lock back")
    woke = r2.ask("wake")
    check(woke.get("ptrs") == b["ptrs"] and woke.get("logits") == wr["logits"],
          "wake: every data_ptr is where it was, and the outputs are the same")
    # Shadow failover: the primary dies, a sleeping shadow wakes and serves.
    r2.ask("sleep")
    w.p.kill()
    w.p.wait()
    r1.p.kill()
    r1.p.wait()
    woke = r2.ask("wake")
    check(woke.get("logits") == wr["logits"] and woke.get("tokens") == wr["tokens"],
          "failover: the primary SIGKILLed, a sleeping shadow wakes and serves the same outputs")
    r2.quit()


def bench(mount, build, runs=5):
    stores = [os.path.join(mount, s) for s in ("b8-slabs", "b8-tensors", "b8-packed")]
    for s in stores:
        os.mkdir(s)
    w = Proc("writer8b", *stores)
    wr = w.read()
    gb = wr["weights_bytes"] / 1e9
    print("# bench torch (Llama-3-8B shapes, 291 bf16 tensors, %.2f GB)" % gb)
    print("#   writer: built into the store by the C allocator in %.2f s (%d slabs), publish in place %.1f ms"
          % (wr["build_into_store_s"], wr["slabs"], wr["publish_in_place_s"] * 1e3))
    print("#   writer: publish of a CPU model %.2f s (%.1f GB/s) against model.to('cuda') %.2f s (%.1f GB/s): %.2fx"
          % (wr["publish_cpu_model_s"], gb / wr["publish_cpu_model_s"], wr["to_cuda_s"], gb / wr["to_cuda_s"],
             wr["publish_cpu_model_s"] / wr["to_cuda_s"]))
    for label, s in zip(("slabs (C allocator)", "one allocation per tensor", "one packed allocation"), stores):
        rs = []
        for _ in range(runs):
            p = subprocess.run([sys.executable, __file__, "role", "reader8b", s], capture_output=True, text=True)
            if p.returncode:
                print("# reader failed: " + p.stderr[-2000:])
                check(False, "warm start from %s" % label)
                break
            rs.append(json.loads(p.stdout))
            if os.environ.get("GMSFS_PROFILE") and len(rs) == 1:
                print("\n".join("#     " + line for line in p.stderr.splitlines()[-40:]))
        if not rs:
            continue
        med = lambda k: sorted(r[k] for r in rs)[len(rs) // 2]
        floor = subprocess.run([os.path.join(build, "bench-gpu"), "floor", s, str(runs)], capture_output=True,
                               text=True).stdout.strip()
        print("#   %s: %d allocations; fresh process, median of %d: connect + import %.2f ms (driver floor for the "
              "same allocations %s ms), materialize %.2f ms (PyTorch's own view-making for the same tensors %.2f ms: "
              "%.2fx), total %.2f ms (its CUDA context %.0f ms and meta build %.1f ms apart; import torch %.1f s)"
              % (label, rs[0]["allocations"], len(rs), med("connect_import_ms"), floor, med("materialize_ms"),
                 med("views_floor_ms"), med("materialize_ms") / med("views_floor_ms"), med("total_ms"),
                 med("context_ms"), med("build_meta_ms"), med("import_torch_s")))
        if label.startswith("slabs"):
            check(all(r["zero_copy"] for r in rs), "warm start of an 8B-shaped model: every tensor a view of the store")
            # A figure against the floors of its two parts, measured in this run (a timed
            # check would be a timed test): SPEC's bar for it is 3 ms.
            both = float(floor) + med("views_floor_ms")
            print("#   warm start (slabs): %.2f ms, %.2fx the floors of its parts (%.2f ms: the driver's %s ms and "
                  "PyTorch's view-making %.2f ms); SPEC's bar 3 ms" % (med("total_ms"), med("total_ms") / both, both,
                                                                      floor, med("views_floor_ms")))
    w.quit()
    for s in stores:  # rmdir frees a store nobody holds, and its memory with it
        os.rmdir(s)


if __name__ == "__main__":
    if sys.argv[1] == "role":
        {"llama": lambda: role_llama(sys.argv[3], sys.argv[4]),
         "writer8b": lambda: role_writer8b(*sys.argv[3:6]),
         "reader8b": lambda: role_reader8b(sys.argv[3])}[sys.argv[2]]()
        sys.exit(0)
    os.environ.setdefault("GMSFS_LIBRARY", os.path.join(sys.argv[3], "libgmsfs.so.0"))
    (test if sys.argv[1] == "test" else bench)(sys.argv[2], *([sys.argv[3]] if sys.argv[1] == "bench" else []))
    sys.exit(done())
