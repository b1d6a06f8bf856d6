"""gmsfs-load of a 16 GiB checkpoint from the page cache, fresh processes, by turns:
--no-digest against the content hash with each kind of piece_hash (GMSFS_PIECE_HASH) and
each piece hashed whole after its read (GMSFS_COPY_NO_SLICES) or in slices as they land.  Medians of the
time after the CUDA context.  python3 probe/load_hash_probe.py MOUNT BUILD"""
import os, re, subprocess, sys
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "gpu"))
mount, build = sys.argv[1], sys.argv[2]
sys.argv = ["load_gpu.py", "bench", mount, build]
import load_gpu as lg  # noqa: E402

path = lg.checkpoint(16, 128)
subprocess.run(["cat", path], stdout=subprocess.DEVNULL, check=True)
variants = [("no-digest", {}, ["--no-digest"])]
for kind in ("sse2", "avx2", "avx512"):
    for whole in (0, 1):
        env = {"GMSFS_PIECE_HASH": kind}
        if whole:
            env["GMSFS_COPY_NO_SLICES"] = "1"
        variants.append(("%s %s" % (kind, "whole" if whole else "sliced"), env, []))
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
