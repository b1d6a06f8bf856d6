"""gmsfs-load of a 16 GiB checkpoint from the page cache, fresh processes, by turns:
--no-digest against the content hash with each kind of piece_hash (GMSFS_PIECE_HASH).
Medians of the time after the CUDA context.  (2026-11-29, H200: no hash 0.375 s; SSE2
1.025x, AVX2 1.019x, AVX-512 1.028x, each hashing 256 KiB slices as they land; hashed
whole after each 2 MiB read 1.067-1.071x, whichever kind: the host's memory, not the hash.)  python3 probe/load_hash_probe.py MOUNT BUILD"""
import os, re, subprocess, sys
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "gpu"))
mount, build = sys.argv[1], sys.argv[2]
sys.argv = ["load_gpu.py", "bench", mount, build]
import load_gpu as lg  # noqa: E402

path = lg.checkpoint(16, 128)
subprocess.run(["cat", path], stdout=subprocess.DEVNULL, check=True)
variants = [("no-digest", {}, ["--no-digest"])]
for kind in ("sse2", "avx2", "avx512"):
    variants.append((kind, {"GMSFS_PIECE_HASH": kind}, []))
times = {v[0]: [] for v in variants}
for i in range(int(os.environ.get("RUNS", "5"))):
    for name, env, flags in variants:
        old = dict(os.environ)
        os.environ.update(env)
        r = lg.fresh_load(path, os.path.join(mount, "p%d" % i), *flags)
        os.environ.clear()
        os.environ.update(old)
        times[name].append(r[1] - r[2])
base = lg.median(times["no-digest"])
for name, _, _ in variants:
    m = lg.median(times[name])
    print("%-16s %.3f s  %.3fx  %s" % (name, m, m / base, " ".join("%.3f" % t for t in times[name])))
os.unlink(path)
