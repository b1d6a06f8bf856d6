#!/usr/bin/env python3
"""GMS's own snapshot client against gmsfs, both ways (issue 60), on the GPU (TAP).

    gms_snapshot_gpu.py MOUNT BUILD UPSTREAM
        UPSTREAM: GMS's lib/gpu_memory_service/snapshot of NVIDIA Dynamo (the public fork
        zinuga/dynamo; git-ignored .upstream/gms/snapshot, never committed), run here as
        GMS users run it, its client through gmsfs.gms:
      - a store written through GMS's API (gmsfs.gms), saved by GMS's GMSStorageClient,
        restored by gmsfs-snapshot: the same allocations, bytes, entries, layout hash;
      - the same store saved by gmsfs-snapshot save --gms, loaded by GMSStorageClient's
        load_to_gms into an empty store: the same again."""
import os
import subprocess
import sys
import tempfile
import types

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
from tap import check, done  # noqa: E402

import torch  # noqa: E402
import gmsfs  # noqa: E402
import gmsfs.gms as gms  # noqa: E402
from gmsfs._torch_layout import _bytes_at  # noqa: E402

mount, build, upstream = sys.argv[1:4]
SNAP = os.path.join(build, "gmsfs-snapshot")
gms.install()
pkg = types.ModuleType("gpu_memory_service.snapshot")  # GMS's snapshot package, under gmsfs.gms's alias
pkg.__path__ = [upstream]
sys.modules["gpu_memory_service.snapshot"] = pkg
from gpu_memory_service.client.memory_manager import GMSClientMemoryManager  # noqa: E402
from gpu_memory_service.client.torch.tensor import _tensor_from_pointer  # noqa: E402
from gpu_memory_service.common.locks import RequestedLockType  # noqa: E402
from gpu_memory_service.snapshot.storage_client import GMSStorageClient  # noqa: E402

MiB = 1 << 20


def sums(store):
    with gmsfs.connect(store, "ro") as c:
        c.import_all()
        out = {}
        for m in c.mappings:
            t = _bytes_at(m.ptr, m.size, torch.device("cuda", 0)).view(torch.uint8)
            out[m.name] = (m.tag, m.size, int(t.to(torch.int64).sum()), int(t[::4097].to(torch.int64).sum()))
        return out, c.layout_hash


def main():
    torch.zeros(1, device="cuda")
    a = os.path.join(mount, "gms-a")
    os.mkdir(a)
    mm = GMSClientMemoryManager(a, device=0)
    mm.connect(RequestedLockType.RW)
    g = torch.Generator(device="cuda").manual_seed(3)
    for i in range(4):
        size = 64 * MiB + i * 4096
        va = mm.create_mapping(size=size, tag="weights" if i < 3 else "extra")
        _tensor_from_pointer(va, [size], [1], torch.uint8, 0).random_(0, 256, generator=g)
        aid = mm.mappings[va].allocation_id
        mm.metadata_put("model.layers.%d.weight" % i, aid, 128 * i, b'{"dtype": "bf16", "i": %d}' % i)
    mm.metadata_put("a key with spaces/and//slashes", aid, 0, b"\x00\xff")
    torch.cuda.synchronize()
    mm.commit()
    mm.close()
    want, h = sums(a)
    d1 = tempfile.mkdtemp(prefix="gms-snap.")
    GMSStorageClient(output_dir=d1, socket_path=a, device=0).save()
    check(os.path.exists(os.path.join(d1, "gms_metadata.json")), "GMS's storage client saved a gmsfs store",
          str(os.listdir(d1)))
    b = os.path.join(mount, "gms-b")
    os.mkdir(b)
    r = subprocess.run([SNAP, "restore", b, d1], capture_output=True, text=True)
    got, hb = sums(b) if r.returncode == 0 else ({}, "")
    check(r.returncode == 0 and got == want and hb == h,
          "GMS's snapshot restored by gmsfs-snapshot: the same allocations, bytes and layout hash", r.stderr)
    d2 = tempfile.mkdtemp(prefix="gmsfs-gms.")
    os.rmdir(d2)
    r = subprocess.run([SNAP, "save", "--gms", a, d2], capture_output=True, text=True)
    check(r.returncode == 0, "gmsfs-snapshot save --gms", r.stderr)
    c = os.path.join(mount, "gms-c")
    os.mkdir(c)
    GMSStorageClient(socket_path=c, device=0).load_to_gms(d2)
    got, hc = sums(c)
    check(got == want and hc == h, "gmsfs's GMS-format snapshot loaded by GMS's storage client: the same again")
    for s in (a, b, c):
        os.rmdir(s)
    subprocess.run(["rm", "-rf", d1, d2])
    return done()


if __name__ == "__main__":
    sys.exit(main())
