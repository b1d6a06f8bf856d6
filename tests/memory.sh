#!/bin/sh
# The daemon gives memory back: a store of 200,000 entries made, listed and removed five
# times on one mount; its memory after the fifth rmdir within 10 MB of the first
# (bench/scale.py --cycles). A plain build only: a checker's own heap would be measured.
cd "$(dirname "$0")/.." || exit 1
b=${GMSFS_BUILD:-build}
m=$(mktemp -d /tmp/gmsfs-memory.XXXXXX)
"$b/gmsfs" -f -o backend=host,max_bytes=64M "$m" 2>"$m.log" &
pid=$!
for _ in $(seq 200); do grep -q " $m fuse.gmsfs " /proc/mounts && break; sleep 0.05; done
echo "1..1"
if out=$(GMSFS_LIBRARY=$b/libgmsfs.so.0 /usr/bin/python3 bench/scale.py "$m" "$pid" --cycles 200000 5 2>&1); then
	echo "ok 1 - memory across create/rmdir cycles: $(printf '%s\n' "$out" | tail -1 | sed 's/^ *//')"
	rc=0
else
	echo "not ok 1 - memory across create/rmdir cycles"
	printf '%s\n' "$out" "$(cat "$m.log")" | sed 's/^/#   /'
	rc=1
fi
umount "$m" 2>/dev/null || umount -l "$m"
for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.05; done
kill -9 "$pid" 2>/dev/null
rm -rf "$m" "$m.log"
exit $rc
