"""What the GPU tests of whole stores share (a module, so a fresh reader imports it): the
checksum of a connection's mappings, and pinned copies as a floor."""
import time

import torch
from gmsfs._torch_layout import _bytes_at


def sums(conn, device=None):
    """{allocation: checksum} of conn's mappings (on device; None: GPU 0)."""
    device = device or torch.device("cuda", 0)
    out = {}
    for m in conn.mappings:
        t = _bytes_at(m.ptr, m.size, device).view(torch.int64)
        out[m.name] = int(t.sum()) ^ int(t[::4097].sum())
    return out


def pinned_floor(dev, host):
    """Seconds of the best of 3 pinned copies of a device tensor and a host one of the same
    size, each way: {"d2h", "h2d"}."""
    out = {}
    for what, dst, src in (("d2h", host, dev), ("h2d", dev, host)):
        best = 1e9
        for _ in range(3):
            torch.cuda.synchronize()
            t = time.perf_counter()
            dst.copy_(src, non_blocking=True)
            torch.cuda.synchronize()
            best = min(best, time.perf_counter() - t)
        out[what] = best
    return out
