#!/bin/sh
# Mount a host-backend daemon on a temporary directory, run the import benchmark, unmount.
# Usage: sh scripts/bench.sh [COUNT [BYTES [RUNS]]]
set -eu
cd "$(dirname "$0")/.."
mnt=$(mktemp -d)
build/gmsfs -f "$mnt" 2>"$mnt.log" &
pid=$!
trap 'umount "$mnt" 2>/dev/null || umount -l "$mnt" 2>/dev/null; wait $pid 2>/dev/null; rmdir "$mnt"; rm -f "$mnt.log"' EXIT
for _ in $(seq 100); do grep -q " $mnt fuse.gmsfs " /proc/mounts && break; sleep 0.05; done
mkdir "$mnt/bench"
build/bench-import "$mnt/bench" "${1:-1000}" "${2:-65536}" "${3:-7}"
