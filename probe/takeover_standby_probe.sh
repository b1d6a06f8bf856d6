#!/bin/bash
# probe/takeover_standby_probe.sh GIB: the host memory made ahead of a store's first move
# out, across a takeover (cuda backend).  A store of GIB GiB published by gmsfs.torch (random
# bf16), its host memory made ahead; a takeover; the new daemon's host_standby_bytes at once;
# the first move out after it and one later (into the memory its move in left), timed; the
# content hash before and after.  Run from the repository root after tests/gpu/run.sh built it.
set -u
gib=${1:-16}
mnt=$(mktemp -d /tmp/gmsfs-ho.XXXXXX)
build/gmsfs -f "$mnt" 2>"$mnt.log" &
first=$!
for _ in $(seq 200); do grep -q " $mnt fuse.gmsfs " /proc/mounts && break; sleep 0.05; done
field() { sed -n "s/^$1: //p" "$mnt/device"; }
export PYTHONPATH=python GMSFS_LIBRARY=build/libgmsfs.so.0
mkdir "$mnt/s"
python3 - "$mnt/s" "$gib" <<'PY'
import sys, torch, gmsfs.torch as gt
m = torch.nn.Module()
for i in range(int(sys.argv[2])):
    m.register_parameter("p%d" % i, torch.nn.Parameter(torch.randn(1 << 29, dtype=torch.bfloat16, device="cuda"),
                                                       requires_grad=False))
gt.publish(m, sys.argv[1])
PY
want=$((gib << 30))
t=$(date +%s.%N)
for _ in $(seq 600); do [ "$(field host_standby_bytes)" -ge "$want" ] && break; sleep 0.05; done
echo "host memory made ahead after $(awk "BEGIN{print $(date +%s.%N) - $t}") s: $(field host_standby_bytes) bytes"
digest() { python3 -c "import gmsfs, sys; print(gmsfs.digest(sys.argv[1], record=False))" "$mnt/s"; }
h1=$(digest)
old=$(field pid)
t=$(date +%s.%N)
build/gmsfs -f -o takeover "$mnt" 2>>"$mnt.log" &
second=$!
for _ in $(seq 3000); do p=$(field pid 2>/dev/null); [ -n "$p" ] && [ "$p" != "$old" ] && break; sleep 0.01; done
echo "takeover in $(awk "BEGIN{print $(date +%s.%N) - $t}") s; host_standby_bytes at once: $(field host_standby_bytes)"
for _ in $(seq 100); do grep -q "from the daemon before, first used" "$mnt.log" && break; sleep 0.1; done
grep "from the daemon before\|not kept" "$mnt.log"
move() { # move TIER: the seconds it took
	local t0
	t0=$(date +%s.%N)
	echo "$1" >"$mnt/s/tier"
	for _ in $(seq 30000); do [ "$(cat "$mnt/s/tier")" = "$1" ] && break; sleep 0.001; done
	awk "BEGIN{print $(date +%s.%N) - $t0}"
}
echo "first move out after the takeover: $(move host) s; host_standby_bytes $(field host_standby_bytes)"
echo "move in: $(move device) s"
echo "a later move out: $(move host) s"
move device >/dev/null
h2=$(digest)
echo "content hash before $h1, after $h2: $([ "$h1" = "$h2" ] && echo same || echo DIFFERENT)"
umount "$mnt"
wait "$first" "$second"
rmdir "$mnt"; rm -f "$mnt.log"
