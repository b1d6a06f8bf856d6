#!/bin/bash
# The shell and Python blocks of the README and of the guides (docs/*.md), run as written on the host
# backend, as TAP: one test per file.  Each file runs in a mount namespace of its own, with
# tmpfs on /mnt and /tmp (its /mnt/gpu0 and its files are its own), the build's programs
# on PATH, its blocks in order in one shell (set -e), as a reader of that page would type
# them.  A guide starts where the README's tour ends: a mount on /mnt/gpu0 with the store
# llama committed, and a small model.safetensors beside it; the README's tour sets its own
# PATH and PYTHONPATH, as a reader does (its folders build, tools and python are the
# tree's), and its Python blocks run in python3 fed on stdin.  A block marked
# <!-- not run by tests/docs.sh: WHY --> (the fresh machine's own commands, systemd, a
# GPU) is listed with its reason; any other reason fails.  Every daemon a file started is
# unmounted and waited for by its pid.
cd "$(dirname "$0")/.." || exit 1
ROOT=$(pwd)
PYTHON=${PYTHON:-/usr/bin/python3}
files=(README.md docs/*.md)
echo "1..${#files[@]}"
n=0
failed=0

# FILE -> the script of its blocks; the blocks it does not run, on stderr, with why.
blocks() {
	"$PYTHON" - "$1" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
allowed = ("the commands that run this test", "needs systemd", "needs a GPU", "needs a Kubernetes cluster",
           "tests/debs.sh, tests/wheel.sh and tests/container.sh run these", "tests/container.sh builds and runs",
           "an outline", "needs the model's files", "needs two nodes (tests/62-peer.bats")
out = []
# The README's Python blocks too (the guides' are fragments of an engine's code).
langs = "sh|python" if sys.argv[1] == "README.md" else "sh"
for m in re.finditer(r"(<!-- not run by tests/docs.sh: ([^>]*?) -->\n)?```(%s)\n(.*?)```" % langs, text, re.S):
    why, lang, body = m.group(2), m.group(3), m.group(4)
    if lang == "python":  # run as a reader pastes it into python3, in the shell of the blocks before
        body = '"$PYTHON" - <<\'PYTHON_BLOCK\'\n%sPYTHON_BLOCK\n' % body
    line = text[:m.start(4)].count("\n") + 1
    if why:
        if not why.startswith(allowed):
            print("FAIL %s:%d: a block is not run for no known reason: %s" % (sys.argv[1], line, why))
            sys.exit(0)
        print("# %s:%d not run: %s" % (sys.argv[1], line, why), file=sys.stderr)
        continue
    out.append("echo '# %s:%d' >&2\n%s" % (sys.argv[1], line, body))
print("\n".join(out))
PY
}

# The state a guide starts from: the README's tour, done.
PRELUDE='
mkdir -p /mnt/gpu0
gmsfs -o max_bytes=1G,host_bytes=1G /mnt/gpu0
mkdir /mnt/gpu0/llama
(exec 9>/mnt/gpu0/llama/lock
 truncate -s 1M /mnt/gpu0/llama/allocs/w
 echo "{}" > /mnt/gpu0/llama/meta/w
 setfattr -n user.gms.alloc -v w /mnt/gpu0/llama/meta/w
 echo > /mnt/gpu0/llama/commit)
"$PYTHON" - <<EOF
import json, struct
header = json.dumps({"w": {"dtype": "F32", "shape": [4, 4], "data_offsets": [0, 64]}}).encode()
with open("model.safetensors", "wb") as f:
    f.write(struct.pack("<Q", len(header)) + header + bytes(range(64)))
EOF
'

# Run inside the namespace: the blocks, then every gmsfs mount of it unmounted and its
# daemon waited for.
RUNNER='
# The FUSE mounts this namespace copied from outside are not its own: gone here.
"$ROOT/tests/helpers/drop-copied-mounts" "$OUTSIDE" || exit 1
# The tree is seen at /mnt/src (a clone under /tmp would be hidden by the tmpfs).
mount -t tmpfs tmpfs /mnt && mkdir /mnt/src /mnt/work && mount --bind "$ROOT" /mnt/src || exit 1
ROOT=/mnt/src BUILD=/mnt/src/$BUILD_REL
mount -t tmpfs tmpfs /tmp && cd /mnt/work || exit 1
if [ -n "$PRELUDE_ON" ]; then
	export PATH=$BUILD:$ROOT/tools:$PATH PYTHONPATH=$ROOT/python GMSFS_LIBRARY=$BUILD/libgmsfs.so.0
else # the README, pasted in the tree as it says: its own exports, through the tree'"'"'s folders
	for d in python tools; do ln -s "$ROOT/$d" "$d"; done
	ln -s "$BUILD" build
fi
cleanup() {
	set +e
	exec 9>&-
	for m in $(awk "\$3 == \"fuse.gmsfs\" {print \$2}" /proc/self/mounts | sort -r); do
		umount "$m" 2>/dev/null || umount -l "$m"
	done
	# The daemons started here (each would keep this namespace, and so its mount, alive):
	# the gmsfs processes of this mount namespace, by pid; unmounted, they end.
	local ns pids="" p
	ns=$(readlink /proc/self/ns/mnt)
	for p in $(pgrep -x gmsfs); do [ "$(readlink /proc/$p/ns/mnt)" = "$ns" ] && pids="$pids $p"; done
	for _ in $(seq 100); do
		[ -n "$(for p in $pids; do kill -0 "$p" 2>/dev/null && echo "$p"; done)" ] || return 0
		sleep 0.05
	done
	echo "daemons that did not end on their unmount:$pids" >&2
	for p in $pids; do kill -9 "$p" 2>/dev/null; done
	return 1
}
trap "rc=\$?; cleanup || rc=1; exit \$rc" EXIT
set -xeo pipefail
[ -z "$PRELUDE_ON" ] || eval "$PRELUDE" || { echo "the guides'"'"' starting point failed" >&2; exit 1; }
eval "$SCRIPT"
'

for f in "${files[@]}"; do
	n=$((n + 1))
	skipped=$(mktemp)
	script=$(blocks "$f" 2>"$skipped")
	if [ "${script#FAIL }" != "$script" ]; then
		echo "not ok $n - $f: ${script#FAIL }"
		failed=$((failed + 1))
		continue
	fi
	prelude_on=1
	[ "$f" = README.md ] && prelude_on=
	out=$(SCRIPT="$script" PRELUDE="$PRELUDE" PRELUDE_ON=$prelude_on BUILD_REL=${GMSFS_BUILD:-build} ROOT=$ROOT PYTHON=$PYTHON OUTSIDE=$(readlink /proc/self/ns/mnt) \
		unshare -m --propagation private bash -c "$RUNNER" 2>&1 3>&-)
	rc=$?
	if [ $rc = 0 ]; then
		echo "ok $n - $f: its shell and Python blocks run as written"
		cat "$skipped"
	else
		echo "not ok $n - $f: its shell and Python blocks failed (status $rc)"
		printf '%s\n' "$out" | tail -40 | sed 's/^/#   /'
		failed=$((failed + 1))
	fi
	rm -f "$skipped"
done
[ "$failed" = 0 ]
