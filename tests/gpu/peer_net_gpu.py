#!/usr/bin/env python3
"""gmsfs-peer on the GPU machine, UCX over TCP on the loopback (TAP, then benchmark lines).

    peer_net_gpu.py GPU_MOUNT HOST_MOUNT BUILD   a store of 4 GiB in 256 MiB allocations of
        random bytes on the GPU's mount, served by gmsfs-peer (its bytes out of the GPU
        through pinned memory) and pulled into an empty store of a host-backend mount; then
        a store of the host mount served and pulled into the GPU's mount (into the GPU
        through pinned memory).  Each checked (the pull's own xxh3 of every allocation, the
        layout hash, and on the GPU a checksum of every allocation against the source's),
        each timed in a fresh process against ucx_perftest's stream_bw over the same
        transport with messages of the same size, in this run (the issue's goal: 0.9x)."""
import os
import re
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
from tap import check, done  # noqa: E402

import torch  # noqa: E402
import gmsfs  # noqa: E402
from gmsfs._torch_layout import _bytes_at  # noqa: E402

MiB = 1 << 20
SIZE, N = 256 * MiB, 16
gpu_mnt, host_mnt, build = sys.argv[1:4]
PEER = os.path.join(build, "gmsfs-peer")
ENV = dict(os.environ, UCX_TLS="tcp,self", UCX_NET_DEVICES="lo")
PORT = 17470


def fill(store, device):
    """N allocations of random bytes; their checksums (sum of int64 words)."""
    sums = []
    with gmsfs.connect(store, "rw", 30) as c:
        for i in range(N):
            m = c.create("layers/%d" % i, SIZE)
            t = _bytes_at(m.ptr, SIZE, device)
            if device.type == "cuda":
                t.view(torch.int64).random_(generator=torch.Generator(device=device).manual_seed(i))
                torch.cuda.synchronize()
            else:
                t[:] = torch.randint(0, 256, (SIZE,), dtype=torch.uint8, generator=torch.Generator().manual_seed(i))
            sums.append(int(t.view(torch.int64).sum()))
        c.meta_put("config", "layers/0", value=b'{"made": "peer_net_gpu"}')
        c.commit()
    return sums


def sums_of(store, device):
    with gmsfs.connect(store, "ro", 30) as c:
        c.import_all()
        return [int(_bytes_at(c.find("layers/%d" % i).ptr, SIZE, device).view(torch.int64).sum()) for i in range(N)]


def perftest(size, port):
    """ucx_perftest stream_bw, SIZE-byte messages, N of them (MB/s, as it says)."""
    server = subprocess.Popen(["ucx_perftest", "-p", str(port)], env=ENV, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    time.sleep(0.5)
    out = subprocess.run(["ucx_perftest", "127.0.0.1", "-p", str(port), "-t", "stream_bw", "-s", str(size), "-n",
                          str(N * 2)], env=ENV, capture_output=True, text=True, timeout=120).stdout
    server.wait(30)
    m = re.search(r"Final:\s+\d+\s+[\d.]+\s+[\d.]+\s+[\d.]+\s+([\d.]+)", out)
    return float(m.group(1)) * MiB if m else 0.0  # bytes/s (ucx_perftest counts MB of 2^20 bytes)


def pull(src_mnt, name, dst, token, port):
    server = subprocess.Popen([PEER, "serve", src_mnt, "--listen", "127.0.0.1:%d" % port, "--token", token, "--allow",
                               name, "-t", "20"], env=ENV, stderr=subprocess.PIPE, text=True)
    time.sleep(0.5)
    t = time.perf_counter()
    r = subprocess.run([PEER, "pull", "gmsfs://127.0.0.1:%d/%s" % (port, name), dst, "--token", token, "-t", "20"],
                       env=ENV, capture_output=True, text=True, timeout=300)
    secs = time.perf_counter() - t
    server.kill()
    server.wait()
    return r, secs


def main():
    token = os.path.join(build, "peer-token")
    with open(token, "w") as f:
        f.write(os.urandom(24).hex())
    os.chmod(token, 0o600)
    gpu = torch.device("cuda", 0)
    total = SIZE * N
    rate_base = perftest(SIZE, PORT + 10)
    # GPU -> host: out of the GPU through pinned memory.
    src, dst = os.path.join(gpu_mnt, "net-src"), os.path.join(host_mnt, "net-dst")
    os.mkdir(src)
    os.mkdir(dst)
    want = fill(src, gpu)
    r, secs = pull(gpu_mnt, "net-src", dst, token, PORT)
    check(r.returncode == 0, "a GPU store pulled into a host mount", r.stderr[-500:])
    check(open(os.path.join(src, "layout_hash")).read() == open(os.path.join(dst, "layout_hash")).read(),
          "the same layout hash")
    check(sums_of(dst, torch.device("cpu")) == want, "every allocation's bytes, as the GPU's")
    out_rate = total / secs
    # host -> GPU: into the GPU through pinned memory.
    src2, dst2 = os.path.join(host_mnt, "net-src2"), os.path.join(gpu_mnt, "net-dst2")
    os.mkdir(src2)
    os.mkdir(dst2)
    want2 = fill(src2, torch.device("cpu"))
    r, secs2 = pull(host_mnt, "net-src2", dst2, token, PORT + 1)
    check(r.returncode == 0, "a host store pulled into the GPU's mount", r.stderr[-500:])
    check(sums_of(dst2, gpu) == want2, "every allocation's bytes on the GPU, as the host's")
    in_rate = total / secs2
    print("# bench: %d x %d MiB over UCX TCP (loopback); ucx_perftest stream_bw with %d MiB messages: %.2f GB/s"
          % (N, SIZE // MiB, SIZE // MiB, rate_base / 1e9))
    print("#   GPU store pulled into a host mount: %.2f s, %.2f GB/s, %.2fx ucx_perftest (goal 0.9x)"
          % (secs, out_rate / 1e9, out_rate / rate_base if rate_base else 0))
    print("#   host store pulled into the GPU's mount: %.2f s, %.2f GB/s, %.2fx ucx_perftest (goal 0.9x)"
          % (secs2, in_rate / 1e9, in_rate / rate_base if rate_base else 0))
    return done()


if __name__ == "__main__":
    sys.exit(main())
