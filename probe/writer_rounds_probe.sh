#!/bin/bash
# probe/writer_rounds_probe.sh [LAYOUTS] [RUNS] [OPTIONS...]: bench-gpu's writer rounds for
# each of LAYOUTS (16x1GiB llama3-8b by default; A,B runs A then B on one mount, as the gate
# does), on a fresh mount each, under each of OPTIONS ("" for the defaults, host memory made
# ahead; default: "" and no_host_ahead): the rounds' line, each timing with what the daemon
# was doing then (GMSFS_BENCH_TRACE: its used, host and releasing bytes, the device's free
# memory, gmsfs-mover's pid), and the daemon's own account, each line with its time.  Where
# a late round's creates read slower than the first, this says whether the daemon's work
# beside them is why.  Run from the repository root after tests/gpu/run.sh built it.
set -u
layouts=${1:-16x1GiB llama3-8b}
runs=${2:-2}
shift $(($# < 2 ? $# : 2))
[ $# -gt 0 ] || set -- "" no_host_ahead
for layout in $layouts; do
	for opts in "$@"; do
		mnt=$(mktemp -d /tmp/gmsfs-rounds.XXXXXX)
		build/gmsfs -f ${opts:+-o $opts} "$mnt" 2>&1 | while IFS= read -r l; do
			printf '%s %s\n' "$EPOCHREALTIME" "$l"
		done >"$mnt.log" &
		for _ in $(seq 200); do grep -q " $mnt fuse.gmsfs " /proc/mounts && break; sleep 0.05; done
		pid=$(pgrep -n -f "build/gmsfs -f.* $mnt\$")
		echo "### $layout, options: ${opts:-(default)}, daemon $pid"
		GMSFS_BENCH_TRACE=1 GMSFS_BENCH_ONLY=$layout timeout 400 build/bench-gpu "$mnt" "$runs" 2>&1 |
			grep -E "^#   round|rounds|writer|daemon's host memory|^gate|not gated"
		umount "$mnt" || umount -l "$mnt"
		for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
		kill -9 "$pid" 2>/dev/null
		wait 2>/dev/null
		grep -iE "mover|made ahead|copier|releas|cuMem" "$mnt.log" | cut -c1-220 | sed 's/^/# daemon: /'
		rmdir "$mnt"; rm -f "$mnt.log"
	done
done
