#!/bin/bash
# probe/refit_modes_probe.sh [GB] [GAP]: probe/refit_beside_probe.py on a fresh mount for each
# way a refit beside a reader gets its next version's memory: copy (import_all: the daemon
# makes it and copies the last commit into it) and overwrite (import_overwrite: made, not
# filled), GAP seconds between refits (MODES: those of them to run).  With GMSFS_TRACE_IMPORT
# and GMSFS_TRACE_RPC set, the writer's and the daemon's traces are printed too.  Run from the
# repository root after tests/gpu/run.sh built it (LD_LIBRARY_PATH as it sets it).
set -u
gb=${1:-5.6}
gap=${2:-0.3}
for mode in ${MODES:-copy overwrite}; do
	mnt=$(mktemp -d /tmp/gmsfs-refit.XXXXXX)
	build/gmsfs -f "$mnt" 2>"$mnt.log" &
	pid=$!
	for _ in $(seq 200); do grep -q " $mnt fuse.gmsfs " /proc/mounts && break; sleep 0.05; done
	PYTHONPATH=python GMSFS_LIBRARY=build/libgmsfs.so.0 timeout 120 python3 probe/refit_beside_probe.py \
		"$mnt" "$gb" "$gap" "$mode"
	umount "$mnt" || umount -l "$mnt"
	for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
	kill -9 "$pid" 2>/dev/null
	wait "$pid" 2>/dev/null
	rmdir "$mnt"
	[ -z "${GMSFS_TRACE_RPC:-}" ] || sed 's/^/# daemon: /' "$mnt.log"
	rm -f "$mnt.log"
done
