#!/bin/sh
# The host benchmarks, each against a baseline measured in the same run (not tests):
#   bench-import    a reader's import against mapping the same memfds directly
#   bench-control   control files against bench-minfs, a minimal low-level FUSE file system
#   bench/scale.py  100,000 allocations and 1,000,000 entries: rates, ls, commit, import,
#                   the write-open, the daemon's memory
#   bench/restart.py a restart (takeover, under a service manager, after SIGKILL) against
#                   loading the model again, until a reader imports
#   bench/group_restore.py  gmsfsctl group restore against its ranks' gmsfs-snapshot restores
#                   started by hand (two mounts of its own)
# Usage: sh scripts/bench.sh [COUNT [BYTES [RUNS]]]   (bench-import's arguments)
set -eu
cd "$(dirname "$0")/.."
mnt=$(mktemp -d)
minfs=$(mktemp -d)
build/gmsfs -f "$mnt" 2>"$mnt.log" &
pid=$!
build/bench-minfs "$minfs" &
minpid=$!
cleanup() {
	for m in "$mnt" "$minfs"; do umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true; done
	wait $pid $minpid 2>/dev/null || true
	rmdir "$mnt" "$minfs"
	rm -f "$mnt.log"
}
trap cleanup EXIT
for m in "$mnt" "$minfs"; do
	for _ in $(seq 100); do grep -q " $m fuse" /proc/mounts && break; sleep 0.05; done
done
mkdir "$mnt/bench"
build/bench-import "$mnt/bench" "${1:-1000}" "${2:-65536}" "${3:-7}"
mkdir "$mnt/control"
(exec 9>"$mnt/control/lock" && truncate -s 4096 "$mnt/control/allocs/a" && echo >"$mnt/control/commit")
build/bench-control "$mnt/control" "$minfs"
GMSFS_LIBRARY=build/libgmsfs.so.0 ${PYTHON:-/usr/bin/python3} bench/scale.py "$mnt" $pid
${PYTHON:-/usr/bin/python3} bench/restart.py build 2
${PYTHON:-/usr/bin/python3} bench/group_restore.py build
