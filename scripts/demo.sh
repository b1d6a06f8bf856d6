#!/bin/sh
# The main job on the host backend: mount, publish a layout from a shell writer,
# read it back from another process, show what a user sees, unmount.
set -eu
cd "$(dirname "$0")/.."
top=$(pwd)
mnt=$(mktemp -d /tmp/gmsfs-demo.XXXXXX)
log=$mnt.log
./build/gmsfs -f "$mnt" 2>"$log" &
pid=$!
cleanup() {
	cd /
	umount "$mnt" 2>/dev/null || { umount -l "$mnt" 2>/dev/null; kill "$pid" 2>/dev/null; } || true
	wait "$pid" 2>/dev/null || true
	rmdir "$mnt" 2>/dev/null || true
	rm -f "$log"
}
trap cleanup EXIT INT TERM
i=0
until grep -q " $mnt fuse.gmsfs " /proc/mounts; do
	i=$((i + 1)); [ $i -lt 100 ] || { cat "$log"; exit 1; }
	sleep 0.05
done
cd "$mnt"
say() { printf '\n$ %s\n' "$*"; sh -c "$*"; }

say "cat device"
say "mkdir llama"
echo
echo "# a writer: take the lock, create allocations, write bytes and metadata, commit"
writer='exec 9>llama/lock
mkdir -p llama/allocs/layers/0 llama/meta/layers/0
truncate -s 4M llama/allocs/layers/0/weight
echo "weights of layer 0" | dd of=llama/allocs/layers/0/weight conv=notrunc status=none
echo "fp16 [1024,2048]" > llama/meta/layers/0/weight
setfattr -n user.gms.alloc -v layers/0/weight llama/meta/layers/0/weight
setfattr -n user.gms.offset -v 0 llama/meta/layers/0/weight
echo > llama/commit'
printf '%s\n' "$writer"
sh -ec "$writer"
echo
echo "# readers: any process, plain tools"
say "cat llama/state"
say "cat llama/layout_hash"
say "ls -lR llama/allocs llama/meta"
say "getfattr -d llama/meta/layers/0/weight"
say "head -c 19 llama/allocs/layers/0/weight"
say "cat llama/meta/layers/0/weight"
say "df -h ."
echo
echo "# engines: libgmsfs maps the allocations (examples/weights.c)"
say "mkdir qwen"
say "$top/build/gmsfs-example write qwen 16 1048576"
say "$top/build/gmsfs-example read qwen"
say "cat qwen/state"
echo
echo "# Python and PyTorch: the first run publishes a model, the second maps it (no copy)"
say "mkdir tiny"
say "PYTHONPATH=$top/python /usr/bin/python3 $top/examples/torch_share.py tiny"
say "PYTHONPATH=$top/python /usr/bin/python3 $top/examples/torch_share.py tiny"
echo
echo "# a safetensors checkpoint in with one command, and back out (gmsfs-load(1))"
/usr/bin/python3 - "$mnt.st" <<'PY'
import json, struct, sys
data = bytes(range(256)) * 16
h = json.dumps({"embed.weight": {"dtype": "F16", "shape": [64, 32], "data_offsets": [0, 4096]}},
               separators=(",", ":")).encode()
h += b" " * (-len(h) % 8)  # as safetensors pads its header
open(sys.argv[1], "wb").write(struct.pack("<Q", len(h)) + h + data)
PY
say "mkdir ckpt"
say "$top/build/gmsfs-load ckpt $mnt.st"
say "cat ckpt/meta/torch/embed.weight; echo"
say "mkdir $mnt.out && $top/build/gmsfs-save ckpt $mnt.out && cmp $mnt.st $mnt.out/model.safetensors && echo identical"
rm -rf "$mnt.st" "$mnt.out"
echo
echo "# operators: every store at a glance, as JSON, as Prometheus metrics"
say "/usr/bin/python3 $top/tools/gmsfsctl list $mnt"
say "grep -E '^gmsfs_store_(state|bytes)' metrics | grep -v ' 0\$'"
echo
echo "demo: ok (unmounting $mnt)"
