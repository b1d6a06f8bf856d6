#!/bin/bash
# probe/writer_rounds_probe.sh [LAYOUTS] [RUNS]: bench-gpu's writer rounds for each layout
# (16x1GiB llama3-8b by default), on a fresh mount each, with the daemon's host memory made
# ahead (the default) and with -o no_host_ahead: the rounds' line and the daemon's own
# account (host memory made ahead, gmsfs-mover's start and end).  Where a third round's
# creates read slower than the first two, this says whether the host tier's work beside
# them is why.  Run from the repository root after tests/gpu/run.sh built it.
set -u
for layout in ${1:-16x1GiB llama3-8b}; do
	for opts in "" no_host_ahead; do
		mnt=$(mktemp -d /tmp/gmsfs-rounds.XXXXXX)
		build/gmsfs -f ${opts:+-o $opts} "$mnt" 2>"$mnt.log" &
		pid=$!
		for _ in $(seq 200); do grep -q " $mnt fuse.gmsfs " /proc/mounts && break; sleep 0.05; done
		echo "### $layout, options: ${opts:-(default)}"
		GMSFS_BENCH_ONLY=$layout timeout 200 build/bench-gpu "$mnt" "${2:-2}" 2>&1 |
			grep -E "rounds|writer|daemon's host memory"
		umount "$mnt" || umount -l "$mnt"
		for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
		kill -9 "$pid" 2>/dev/null
		wait "$pid" 2>/dev/null
		grep -iE "mover|made ahead|copier" "$mnt.log" | cut -c1-200 | sed 's/^/# daemon: /'
		rmdir "$mnt"; rm -f "$mnt.log"
	done
done
