#!/usr/bin/env python3
"""Where a refit beside a reader spends its time (user.gms.versions 2), phase by phase.

    refit_beside_probe.py MOUNT [GB [GAP [MODE]]]
        One store of one allocation of GB (default 5.6) holding bf16 tensors of 4096 x 7168
        (as gt.publish makes a model's), a reader in another process mapping it; then, five
        times, a data-only writer in this process: connect, import_all (the daemon's copy
        of the allocation for the next version: memory made, copied by gmsfs-mover), the
        tensors copied in by torch, commit, close; the reader flips.  Beside it, the same
        bytes copied device to device by torch; GAP seconds between refits (a trainer's step:
        the version before is released meanwhile).  MODE copy (default): import_all, the
        daemon's copy made; overwrite: import_overwrite (the writer writes every byte: the
        next version's memory made, not filled).  Prints each phase's milliseconds."""
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))


def main():
    import torch
    import gmsfs
    import gmsfs.torch as gt
    mnt = sys.argv[1]
    gb = float(sys.argv[2]) if len(sys.argv) > 2 else 5.6
    gap = float(sys.argv[3]) if len(sys.argv) > 3 else 0
    mode = sys.argv[4] if len(sys.argv) > 4 else "copy"
    n = max(1, int(gb * 1e9 // (4096 * 7168 * 2)))
    store = os.path.join(mnt, "probe")
    os.mkdir(store)
    os.setxattr(store, "user.gms.versions", b"2")
    m = torch.nn.ParameterList([torch.nn.Parameter(torch.randn(4096, 7168, device="cuda").to(torch.bfloat16))
                                for _ in range(n)])
    c = gt.publish(m, store)
    c.close()
    del m
    torch.cuda.empty_cache()
    reader = subprocess.Popen([sys.executable, "-c", "import gmsfs, sys\nc = gmsfs.connect(sys.argv[1], 'ro')\n"
                               "c.import_all()\nprint('ok', flush=True)\nfor line in sys.stdin:\n"
                               "    c.flip()\n    print('ok', flush=True)\n", store],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                              env=dict(os.environ, PYTHONPATH=os.path.join(HERE, "..", "python")))
    assert reader.stdout.readline().strip() == "ok"
    src = [torch.randn(4096, 7168, device="cuda").to(torch.bfloat16) for _ in range(n)]
    print("# %d tensors, %.2f GB, one allocation; the next version's memory: %s" % (n, n * 4096 * 7168 * 2 / 1e9, mode))
    for k in range(5):
        time.sleep(gap)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        w = gmsfs.connect(store, "data", timeout=10)
        t1 = time.perf_counter()
        w.import_overwrite() if mode == "overwrite" else w.import_all()
        t2 = time.perf_counter()
        ptr = w.mappings[0].ptr
        dst = gt._bytes_at(ptr, n * 4096 * 7168 * 2, torch.device("cuda")).view(torch.bfloat16)
        for i, s in enumerate(src):
            dst[i * 4096 * 7168:(i + 1) * 4096 * 7168].view(4096, 7168).copy_(s)
        torch.cuda.synchronize()
        t3 = time.perf_counter()
        w.commit()
        t4 = time.perf_counter()
        del dst
        w.close()
        t5 = time.perf_counter()
        reader.stdin.write("flip\n")
        reader.stdin.flush()
        reader.stdout.readline()
        t6 = time.perf_counter()
        out = [torch.empty_like(s) for s in src]
        torch.cuda.synchronize()
        f0 = time.perf_counter()
        for o, s in zip(out, src):
            o.copy_(s)
        torch.cuda.synchronize()
        floor = time.perf_counter() - f0
        del out
        print("# refit %d: %.1f ms: connect %.2f, import (the next version's memory) %.2f, copies %.2f, "
              "commit %.2f, close %.2f; the reader's flip %.2f; torch's D2D copy of the same bytes %.2f ms"
              % (k, (t5 - t0) * 1e3, (t1 - t0) * 1e3, (t2 - t1) * 1e3, (t3 - t2) * 1e3, (t4 - t3) * 1e3,
                 (t5 - t4) * 1e3, (t6 - t5) * 1e3, floor * 1e3), flush=True)
    reader.stdin.close()
    reader.wait()


if __name__ == "__main__":
    main()
