#!/usr/bin/env python3
"""Model switching on one GPU (TAP, then benchmark lines).

    switch_gpu.py MOUNT    two 8B-shaped transformers Llamas (bfloat16, save_pretrained,
        B's weights A's negated) on a mount whose budget (max_bytes, set by run.sh) holds
        one: engine A sleeps, B wakes, and back (gmsfs.torch.switch: the daemon moves B in
        while A goes out, both at once).  Each switch is timed from the sleep to the woken
        model: warm (the other store on the host tier; the first one too, once the host
        memory made in the background after commit is there), one with gmsfs-mover
        SIGKILLed mid-way, and cold (gmsfs.transformers.from_pretrained of a store not
        loaded yet), against the copy engines' limit (bench-duplex: a fresh process
        copying the same bytes both ways at once with the driver alone), a pinned
        host-to-device copy, the way an engine does it alone (vLLM's sleep mode level 1:
        the tensors copied to new pinned memory and back by the engine, with PyTorch) and
        transformers' from_pretrained, all in this run.  Then a rotation of four smaller
        models on the same budget, which holds two: the one with a priority never goes,
        the others go least recently used first.  Every woken model's logits checked."""
import ctypes
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
from tap import check, done  # noqa: E402

import torch  # noqa: E402
import gmsfs  # noqa: E402
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


def fields(path):
    with open(path) as f:
        return dict(line.split(": ", 1) for line in f.read().splitlines() if ": " in line)


def wait_kept(mount, nbytes, timeout=120):
    """Until the daemon keeps nbytes of host memory made ahead: the background's work after
    a commit.  Seconds waited."""
    t = time.perf_counter()
    while int(fields(os.path.join(mount, "device"))["host_standby_bytes"]) < nbytes:
        if time.perf_counter() - t > timeout:
            break
        time.sleep(0.05)
    return time.perf_counter() - t


def in_page_cache(folder):
    """The share of folder's safetensors in the page cache (mincore), 0..1: a 'from the page
    cache' figure is one only when it is near 1."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    pages = cached = 0
    for name in os.listdir(folder):
        if not name.endswith(".safetensors"):
            continue
        fd = os.open(os.path.join(folder, name), os.O_RDONLY)
        size = os.fstat(fd).st_size
        p = libc.mmap(None, size, 1, 1, fd, 0)  # PROT_READ, MAP_SHARED
        os.close(fd)
        if p is None or p == ctypes.c_void_p(-1).value:
            continue
        vec = ctypes.create_string_buffer((size + 4095) // 4096)
        if libc.mincore(p, size, vec) == 0:
            pages += len(vec.raw)
            cached += sum(b & 1 for b in vec.raw)
        libc.munmap(p, size)
    return cached / pages if pages else 0.0


def kill_mover_soon(mount, delay):
    """SIGKILL the daemon's gmsfs-mover (its child, by pid) delay seconds from now."""
    def run():
        time.sleep(delay)
        daemon = fields(os.path.join(mount, "device"))["pid"]
        for task in os.listdir("/proc/%s/task" % daemon):
            with open("/proc/%s/task/%s/children" % (daemon, task)) as f:
                for pid in f.read().split():
                    with open("/proc/%s/comm" % pid) as c:
                        if c.read().strip() == "gmsfs-mover":
                            os.kill(int(pid), signal.SIGKILL)
                            killed.append(int(pid))
    killed = []
    t = threading.Thread(target=run)
    t.start()
    return t, killed


def engine_alone(dirs, ids, ref, kw):
    """vLLM's sleep mode level 1, by the engine itself: at sleep every tensor is copied
    to new pinned memory and its device memory freed; at wake, device memory again and
    the bytes copied back.  Both models live in this process; the switch is timed from
    A's sleep to B's wake.  Times of four switches."""
    from transformers import LlamaForCausalLM
    models = {n: LlamaForCausalLM.from_pretrained(dirs[n], **kw).cuda().eval() for n in ("A",)}

    def sleep(m):
        backup = []
        for t in list(m.parameters()) + list(m.buffers()):
            cpu = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
            cpu.copy_(t.data)
            backup.append((t, cpu))
            t.data = torch.empty(0, dtype=t.dtype, device="cuda")
        torch.cuda.empty_cache()
        return backup

    def wake(backup):
        for t, cpu in backup:
            t.data = cpu.to("cuda", non_blocking=True)
        torch.cuda.synchronize()
    b = LlamaForCausalLM.from_pretrained(dirs["B"], **kw).cuda().eval()
    slept = {"B": sleep(b)}
    models["B"] = b
    times, cur, ok = [], "A", True
    for _ in range(4):
        other = "B" if cur == "A" else "A"
        t = now()
        slept[cur] = sleep(models[cur])
        wake(slept.pop(other))
        times.append(now() - t)
        ok = ok and torch.equal(logits(models[other], ids), ref[other])
        cur = other
    del models, slept, b
    torch.cuda.empty_cache()
    if hasattr(torch._C, "_host_emptyCache"):  # the pinned memory PyTorch keeps cached: not for what follows
        torch._C._host_emptyCache()
    return times, ok


def rotation(mount, ids, cfg_kw):
    """Four models of about 10 GB on the budget of 24 GB (two fit): A has priority 1,
    the others 0.  Each step switches the engine's model for the next one (B C D A B C
    D A B C D); A never goes to the host tier, and of the others the least recently used
    goes.  Times, and whether every tier and logits were as they should be."""
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(**cfg_kw)
    ref, live, ok = {}, {}, True
    for i, n in enumerate("ABCD"):
        store = os.path.join(mount, "rot-" + n)
        os.mkdir(store)
        torch.manual_seed(10 + i)
        with torch.device("cuda"):
            m = LlamaForCausalLM(cfg).to(torch.bfloat16).eval()
        ref[n] = logits(m, ids)
        gt.publish(m, store).close()
        del m
        torch.cuda.empty_cache()
        if n == "A":
            os.setxattr(store, "user.gms.priority", b"1")
    for n in "ABCD":
        with torch.device("meta"):
            live[n] = LlamaForCausalLM(cfg).to(torch.bfloat16).eval()
        gt.materialize(live[n], gmsfs.connect(os.path.join(mount, "rot-" + n), "ro", timeout=120))
        ok = ok and torch.equal(logits(live[n], ids), ref[n])
        gt.sleep(live[n])
    gt.wake(live["A"], timeout=120)
    times, used, cur = [], ["A"], "A"
    for n in "BCDABCDABCD":
        t = now()
        gt.switch(live[cur], live[n], timeout=120)
        times.append(now() - t)
        ok = ok and torch.equal(logits(live[n], ids), ref[n])
        used.append(n)
        on = {m for m in "ABCD" if tier(os.path.join(mount, "rot-" + m)) == "device"}
        # A stays; the other on the device is the most recently used of B, C, D but n.
        last = [m for m in used[:-1] if m not in ("A", n)]
        want = {"A", n} | ({last[-1]} if n == "A" and last else set())
        ok = ok and on == want if n == "A" else ok and "A" in on and n in on and len(on) == 2
        cur = n
    gt.sleep(live[cur])
    for n in "ABCD":
        live[n]._gmsfs.close()
        os.rmdir(os.path.join(mount, "rot-" + n))
    return times, ok


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
    # The copy engines' limit: the same bytes both ways at once, the driver alone.
    r = subprocess.run(["build/bench-duplex", str(nbytes)], capture_output=True, text=True)
    check(r.returncode == 0, "bench-duplex: the driver's copies, one way and both", r.stderr.strip())
    d2h, h2d_raw, duplex, fresh = (float(x) for x in r.stdout.split()) if r.returncode == 0 else (1, 1, 1, 1)
    # The engine alone (vLLM's sleep mode level 1): its own copies to pinned memory and back.
    alone, alone_ok = engine_alone(dirs, ids, ref, kw)
    check(alone_ok, "the engine alone (copies to pinned memory and back): each woken model has its logits")

    stores = {n: os.path.join(mount, "llama-" + n) for n in ("A", "B")}
    for s in stores.values():
        os.mkdir(s)
    # Cold: A into an empty budget; then B while A sleeps (A's first move out: it makes
    # its pinned host memory).
    cached_first = in_page_cache(dirs["A"])
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

    # Warm: gmsfs.torch.switch (sleep one, wake the other, its store on the host tier), six
    # times; the first once B's host memory, made in the background after its commit, is there.
    ahead_wait = wait_kept(mount, nbytes)
    warm, ok, cur = [], True, "B"
    for _ in range(6):
        other = "A" if cur == "B" else "B"
        t = now()
        gt.switch(models[cur], models[other], timeout=120)
        warm.append(now() - t)
        ok = ok and torch.equal(logits(models[other], ids), ref[other]) and tier(stores[cur]) == "host"
        cur = other
    check(ok, "six warm switches: each woken model has its logits, the other sleeps on the host tier")
    log = open(mount + ".log").read()
    check(log.count("switched in") >= 6, "the daemon switched (both ways at once), not a move out then in")
    # gmsfs-mover SIGKILLed mid-switch: the daemon starts another and copies again.
    other = "A" if cur == "B" else "B"
    killer, killed = kill_mover_soon(mount, 0.1)
    t = now()
    gt.switch(models[cur], models[other], timeout=120)
    killed_switch = now() - t
    killer.join()
    check(bool(killed) and torch.equal(logits(models[other], ids), ref[other]) and tier(stores[cur]) == "host",
          "a switch with gmsfs-mover SIGKILLed mid-way: the woken model has its logits, the other is on the host tier",
          "killed %s" % killed)
    gt.switch(models[other], models[cur], timeout=120)  # and back: B on the device, A asleep

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
    cached_kept = in_page_cache(dirs["A"])
    cold_kept = cold("A2", "B out into its kept host memory")
    cold_disk = None  # the page cache dropped, the budget empty (A2 removed)
    if subprocess.run(["sh", "-c", "sync && echo 3 > /proc/sys/vm/drop_caches"]).returncode == 0:
        cold_disk = cold("A3", "from the disk (page cache dropped)")

    gb = nbytes / 1e9
    later = sorted(warm[1:])[len(warm[1:]) // 2]
    floor = min(h2d)
    alone_med = sorted(alone)[len(alone) // 2]
    print("bench: switching between two 8B-shaped models (%.2f GB each) on a budget that holds one, in-process:" % gb)
    print("bench:   the copy engines (bench-duplex, fresh process): D2H %.3f s, H2D %.3f s, both at once %.3f s, "
          "into device memory made just before %.3f s" % (d2h, h2d_raw, duplex, fresh))
    print("bench:   pinned host-to-device copy of the same bytes (PyTorch) %7.3f s" % floor)
    print("bench:   warm: gmsfs.torch.switch A to B (B on the host tier), median %7.3f s  (%.2fx both ways at once into new "
          "memory; goal 1.2x)" % (later, later / fresh))
    print("bench:   warm, the first (host memory made %.1f s after commit) %7.3f s  (%.2fx the median; goal 1.2x)"
          % (ahead_wait, warm[0], warm[0] / later))
    print("bench:   warm, gmsfs-mover SIGKILLed mid-way                %7.3f s" % killed_switch)
    print("bench:   the engine alone (vLLM sleep level 1: its copies to new pinned memory and back), "
          "median %.3f s, first %.3f s: gmsfs %.1fx faster" % (alone_med, alone[0], alone_med / later))

    print("bench:   cold: gmsfs.transformers.from_pretrained, the budget empty %7.3f s  (%.0f%% of the checkpoint "
          "in the page cache)" % (cold_first, 100 * cached_first))
    print("bench:   cold, the sleeping model's first move out too       %7.3f s" % cold_evict)
    print("bench:   cold, the sleeping model out into kept host memory  %7.3f s  (%.0f%% in the page cache)"
          % (cold_kept, 100 * cached_kept))
    if cold_disk is not None:
        print("bench:   cold from the disk (page cache dropped), the budget empty %7.3f s" % cold_disk)
    print("bench:   transformers from_pretrained (%s)  %7.3f s, %7.3f s"
          % ("device_map=cuda" if "device_map" in kw else "then .cuda()", hf[0], hf[1]))
    print("bench: a warm switch is %.1fx faster than from_pretrained, %.1fx faster than a cold gmsfs load"
          % (min(hf) / later, cold_kept / later))
    print("bench: warm switches: %s" % " ".join("%.3f" % w for w in warm))
    shutil.rmtree(tmp)
    return done()


def main_rotation():
    """switch_gpu.py MOUNT rotation: four models of about 10 GB on a budget (24 GB) that
    holds two, in a fresh process and mount."""
    torch.zeros(1, device="cuda")
    ids = torch.randint(0, 128256, (1, 32), device="cuda", generator=torch.Generator("cuda").manual_seed(1))
    cfg_kw = dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=18, num_attention_heads=32,
                  num_key_value_heads=8, vocab_size=128256, max_position_embeddings=8192, rope_theta=500000.0,
                  tie_word_embeddings=False)
    torch.set_default_dtype(torch.bfloat16)
    rot, ok = rotation(mount, ids, cfg_kw)
    check(ok, "a rotation of four models on a budget for two: the one with a priority stays, the others go "
          "least recently used first, every woken model has its logits")
    print("bench: rotation of four 10 GB models on a budget for two, gmsfs.torch.switch: median %.3f s, all: %s"
          % (sorted(rot)[len(rot) // 2], " ".join("%.3f" % x for x in rot)))
    return done()


if __name__ == "__main__":
    sys.exit(main_rotation() if sys.argv[2:] == ["rotation"] else main())
