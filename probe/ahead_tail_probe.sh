#!/bin/bash
# probe/ahead_tail_probe.sh GIB N [MOUNT-OPTIONS]: a reader's import while the daemon makes
# host memory ahead.  On a fresh mount, a store of GIB x 1 GiB is committed; N fresh readers
# (bench-gpu __import: a process, its context, connect, import_all, the remap cycle) run one
# after another from its commit, then, once the daemon says the store's host memory is made,
# N more on the quiet daemon.  Prints each group's import_all percentiles (ms) and when the
# daemon made the memory.  Run from the repository root after tests/gpu/run.sh built it.
set -u
gib=${1:-16}
n=${2:-100}
opts=${3:-}
mnt=$(mktemp -d /tmp/gmsfs-tail.XXXXXX)
build/gmsfs -f ${opts:+-o $opts} "$mnt" 2>"$mnt.log" &
pid=$!
for _ in $(seq 200); do grep -q " $mnt fuse.gmsfs " /proc/mounts && break; sleep 0.05; done
mkdir "$mnt/s"
PYTHONPATH=python GMSFS_LIBRARY=build/libgmsfs.so.0 python3 - "$mnt/s" "$gib" <<'PY'
import sys, torch, gmsfs
torch.zeros(1, device="cuda")
c = gmsfs.connect(sys.argv[1], "rw")
c.create_many([("t%02d" % i, 1 << 30) for i in range(int(sys.argv[2]))])
c.commit()
c.close()
PY
t0=$(date +%s.%N)
readers() { # readers N FILE: N fresh readers' import_all ms, one a line "SECONDS-SINCE-COMMIT MS"
	for _ in $(seq "$1"); do
		r=$(build/bench-gpu __import "$mnt/s" | sed -n 's/.* a=\([0-9.]*\) .*/\1/p')
		echo "$(awk "BEGIN{print $(date +%s.%N) - $t0}") $r $(sed -n 's/^host_standby_bytes: //p' "$mnt/device")"
	done >"$2"
}
readers "$n" "$mnt.during"
want=$((gib << 30))
for _ in $(seq 600); do [ "$(sed -n 's/^host_standby_bytes: //p' "$mnt/device")" = "$want" ] && break; sleep 0.1; done
readers "$n" "$mnt.quiet"
grep "made ahead" "$mnt.log"; sed -n "s/^host_standby_bytes: /standby now: /p" "$mnt/device"
python3 - "$mnt.during" "$mnt.quiet" <<'PY'
import sys
for f in sys.argv[1:]:
    rows = [l.split() for l in open(f) if len(l.split()) >= 2]
    v = sorted(float(r[1]) for r in rows)
    pct = lambda p: v[min(len(v) - 1, int(p / 100 * len(v)))]
    print("%s: %d readers in %.1f s, import_all ms p50 %.2f p90 %.2f p99 %.2f max %.2f" % (
        f.rsplit(".", 1)[1], len(v), float(rows[-1][0]) - float(rows[0][0]), pct(50), pct(90), pct(99), v[-1]))
    slow = [r for r in rows if float(r[1]) > 2 * pct(50)]
    print("  slower than 2x p50: " + " ".join("%s@%.1fs(%s)" % (r[1], float(r[0]), r[2] if len(r) > 2 else "?") for r in slow[:20]))
PY
umount "$mnt"; wait "$pid"; rmdir "$mnt"; rm -f "$mnt".*
