#!/bin/bash
# The images as a cluster runs them (issue 45), with podman and no registry: the daemon
# image (deploy/container/Containerfile) and the example engine image (Containerfile.engine,
# the wheel on a Python base) built from bases made here (scripts/container-base.sh); the
# daemon container privileged with /dev/fuse and the node's folder shared
# (mountPropagation Bidirectional), its mounts seen on the host; engine containers that are
# not privileged, have no capability and no /dev/fuse, and see only that folder
# (HostToContainer), write, commit and import a store through the wheel's package; SIGTERM
# to the daemon container ends every daemon, lifts every mount, and the container ends 0.
# As the DaemonSet's pod runs them (issue 47): the keeper in a container of its own, the
# metrics served over HTTP from another; a daemon SIGKILLed, every process of the daemon
# container SIGKILLed, and the daemon container replaced by one of a new image tag lose no
# store.  The host backend stands in for GPUs (a stub nvidia-smi lists two).  TAP.
set -u
cd "$(dirname "$0")/.." || exit 1
b=${GMSFS_BUILD:-build}
. tests/helpers/tap.sh
. scripts/podman-env.sh
tmp=$(mktemp -d /tmp/gmsfs-container.XXXXXX)
run=$tmp/run # the node's /run/gmsfs
node=gmsfs-test-node-$$
keeper=gmsfs-test-keeper-$$
metrics=gmsfs-test-metrics-$$
peer=gmsfs-test-peer-$$
podman_env "$tmp/containers.conf"
version=$("$b/gmsfs" --version | awk '$1 == "gmsfs" { print $2 }')
image=localhost/gmsfs:$version
engine_image=localhost/gmsfs-engine:$version
cleanup() {
	for c in "$peer" "$node" "$metrics" "$keeper"; do # the daemons first: the keeper outlives them
		if podman container exists "$c" 2>/dev/null; then
			podman stop -t 30 "$c" >/dev/null 2>&1
			podman rm -f "$c" >/dev/null 2>&1
		fi
	done
	podman rmi "localhost/gmsfs:next-$$" >/dev/null 2>&1
	for m in $(awk -v r="$run/" 'index($2, r) == 1 { print $2 }' /proc/mounts); do umount -l "$m"; done
	grep -q " $run " /proc/mounts && umount -l "$run"
	rm -rf "$tmp"
}
trap cleanup EXIT

t "podman answers (podman info)" podman info
t "scripts/container-base.sh: Debian 12 from the archive, the CUDA header, a Python base" \
	sh -c "sh scripts/container-base.sh daemon >'$tmp/daemon.args' && sh scripts/container-base.sh engine >'$tmp/engine.args'"
t "the daemon image: one podman build of deploy/container/Containerfile" sh -c "
	podman build --network host \$(cat '$tmp/daemon.args') -f deploy/container/Containerfile -t '$image' . >'$tmp/build.log' 2>&1 ||
	{ tail -30 '$tmp/build.log'; exit 1; }"
t "the daemon image holds the node script, the keeper, the daemon, the mover, gmsfsctl, the CSI plugin, gmsfs-peer and libgmsfs-peer, and no engine's part" \
	podman run --rm --network none "$image" sh -c '
	test -x /usr/sbin/gmsfs-node && test -x /usr/sbin/gmsfs-keeper && test -x /usr/bin/gmsfs && test -x /usr/lib/gmsfs/gmsfs-mover &&
	gmsfsctl --help >/dev/null && gmsfs-csi --version >/dev/null && python3 -c "import grpc" && ! test -e /usr/bin/gmsfs-load && ! test -e /usr/include/gmsfs &&
	{ gmsfs-peer 2>&1 | grep -q "gmsfs-peer serve"; } && python3 -c "import gmsfs._lib as l; l.peer_lib()"'
t "make wheel, then the engine image: one podman build of deploy/container/Containerfile.engine" sh -c "
	make -s wheel >/dev/null && podman build --network host \$(cat '$tmp/engine.args') \
	-f deploy/container/Containerfile.engine -t '$engine_image' . >'$tmp/build-engine.log' 2>&1 ||
	{ tail -30 '$tmp/build-engine.log'; exit 1; }"

# ---- the node: its /run/gmsfs shared, so mounts made in the container appear on it ----
mkdir -p "$run"
mount --bind "$run" "$run" && mount --make-shared "$run"
printf '#!/bin/sh\necho host-gpu-a\necho host-gpu-b\n' >"$tmp/nvidia-smi"
chmod +x "$tmp/nvidia-smi"
mounted() { [ "$(grep -c " $run/host-gpu-[ab] fuse.gmsfs " /proc/mounts)" = 2 ]; }
t "the keeper's container (no privilege): it serves the pod's keep folder" sh -c "
	mkdir -p '$tmp/keep' &&
	podman run -d --name '$keeper' --network none -v '$tmp/keep:/run/gmsfs-keep' '$image' gmsfs-keeper /run/gmsfs-keep >/dev/null &&
	for _ in \$(seq 100); do [ -S '$tmp/keep/keeper.sock' ] && exit 0; sleep 0.1; done
	podman logs '$keeper'; exit 1"
# node [IMAGE]: the daemon container, its daemons started through the keeper.
node() {
	podman run -d --name "$node" --privileged --pid host --network none --device /dev/fuse \
		-v "$run:/run/gmsfs:rshared" -v "$tmp/keep:/run/gmsfs-keep" -e GMSFS_KEEP=/run/gmsfs-keep \
		-v "$tmp/nvidia-smi:/usr/local/bin/nvidia-smi:ro" "${1:-$image}" >/dev/null || return 1
	for _ in $(seq 100); do mounted && return 0; sleep 0.1; done
	podman logs "$node"
	return 1
}
daemon_pid() { sed -n 's/^pid: //p' "$run/$1/device" 2>/dev/null; }
# back GPU OLDPID HASH: another daemon serves GPU, its store llama (if HASH) with that hash.
back() {
	for _ in $(seq 100); do
		p=$(daemon_pid "$1")
		if [ -n "$p" ] && [ "$p" != "$2" ]; then
			[ -z "${3:-}" ] && return 0
			[ "$(cat "$run/$1/llama/layout_hash" 2>/dev/null)" = "$3" ] && return 0
		fi
		sleep 0.1
	done
	podman logs "$node" 2>&1 | tail -20
	return 1
}
t "the daemon container (privileged, /dev/fuse, host pids, GMSFS_KEEP): both mounts appear on the host" node
t "its probe: podman exec gmsfs-node --check" podman exec "$node" gmsfs-node --check

# An engine's container: not privileged, no capability, no /dev/fuse, only the node's folder.
engine() {
	podman run --rm -i --network none --cap-drop all --security-opt no-new-privileges \
		-v "$run:/run/gmsfs:rslave" "$engine_image" "$@"
}
t "an engine container writes and commits a store with the wheel's gmsfs (its own libgmsfs)" engine sh -c '
	set -e
	test ! -e /dev/fuse
	grep -q "^CapEff:[[:space:]]*0*$" /proc/self/status
	mkdir /run/gmsfs/host-gpu-b/llama
	python3 -c "
import ctypes, gmsfs, gmsfs._lib as l
assert \"/site-packages/gmsfs/_native/\" in l.path, l.path
with gmsfs.connect(\"/run/gmsfs/host-gpu-b/llama\", \"rw\") as c:
    a = c.create(\"w0\", 1 << 20)
    ctypes.memmove(a.ptr, b\"written in a container\", 22)
    c.meta_put(\"layer0\", \"w0\", 0, b\"v1\")
    c.commit()
"
	gmsfsctl list /run/gmsfs/host-gpu-b | grep -q " llama  *COMMITTED "'
t "the node sees the store the engine committed" sh -c "
	grep -q '^state: COMMITTED$' '$run/host-gpu-b/llama/state' && test -n \"\$(cat '$run/host-gpu-b/llama/layout_hash')\""
t "another engine container imports it: the bytes and the entry" engine python3 -c '
import ctypes, gmsfs
with gmsfs.connect("/run/gmsfs/host-gpu-b/llama", "ro") as c:
    c.import_all()
    assert ctypes.string_at(c.find("w0").ptr, 22) == b"written in a container"
    assert c.meta_get("layer0").value == b"v1"'
hash=$(cat "$run/host-gpu-b/llama/layout_hash")
a=$(daemon_pid host-gpu-a) b=$(daemon_pid host-gpu-b)
one_killed() {
	kill -9 "$b" && podman exec "$node" gmsfs-node --live && back host-gpu-b "$b" "$hash" &&
		[ "$(daemon_pid host-gpu-a)" = "$a" ]
}
t "a daemon SIGKILLed: gmsfs-node starts it again alone, its store back (hash); the other GPU's untouched" one_killed
t "an engine container imports it again: the same bytes" engine python3 -c '
import ctypes, gmsfs
with gmsfs.connect("/run/gmsfs/host-gpu-b/llama", "ro") as c:
    c.import_all()
    assert ctypes.string_at(c.find("w0").ptr, 22) == b"written in a container"'
all_killed() { # the container's processes, all at once: gmsfs-node and both daemons
	b=$(daemon_pid host-gpu-b)
	kill -9 "$(podman inspect "$node" --format '{{.State.Pid}}')" "$(daemon_pid host-gpu-a)" "$b" &&
		podman wait "$node" >/dev/null && podman start "$node" >/dev/null && back host-gpu-b "$b" "$hash"
}
t "every process of the daemon container SIGKILLed, the container started again: the store back" all_killed
new_image() { # what the kubelet does for kubectl set image on the pod's gmsfs container
	b=$(daemon_pid host-gpu-b)
	podman tag "$image" "localhost/gmsfs:next-$$" && podman stop -t 30 "$node" >/dev/null &&
		podman rm "$node" >/dev/null && node "localhost/gmsfs:next-$$" && back host-gpu-b "$b" "$hash" &&
		[ "$(podman inspect "$node" --format '{{.ImageName}}')" = "localhost/gmsfs:next-$$" ] &&
		podman logs "$keeper" 2>&1 | grep -q 'host-gpu-b: 2 descriptors handed' # the store's, the daemon's mark
}
t "a new image for the daemons: the container replaced by one of the next tag; the store back, the keeper untouched" new_image
served_metrics() {
	local port=
	podman run -d --name "$metrics" --network host -v "$run:/run/gmsfs:rslave" "$image" \
		gmsfsctl metrics --listen 127.0.0.1:0 --root /run/gmsfs >/dev/null || return 1
	for _ in $(seq 100); do
		port=$(podman logs "$metrics" 2>&1 | sed -n 's|.*http://127.0.0.1:\([0-9]*\)/metrics|\1|p')
		[ -n "$port" ] && break
		sleep 0.1
	done
	python3 - "$port" <<'PY'
import sys, urllib.request
text = urllib.request.urlopen("http://127.0.0.1:%s/metrics" % sys.argv[1], timeout=10).read().decode()
for i, gpu in enumerate(("host-gpu-a", "host-gpu-b")):  # gpu: its place in nvidia-smi's list (gpu=)
    want = 'gmsfs_up{device="%s",gpu="%d",UUID="%s",mount="/run/gmsfs/%s"} 1' % (gpu, i, gpu, gpu)
    assert want in text, text
assert 'store="llama"' in text, text
PY
}
t "the metrics container: gmsfsctl metrics --listen serves both GPUs over HTTP, up 1, with dcgm-exporter's labels" served_metrics
# As gmsfs-peer.yaml serves a node's stores and engine-pod-pull.yaml pulls one: a server
# container (no privilege) over the node's folder of mounts, a token file of mode 400 (a
# Secret's); gmsfsctl pull in another container fills a store of the other GPU's mount.
peer_pulled() {
	local port=$((17000 + $$ % 1000)) tok=$tmp/peer-token
	head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$tok" && chmod 400 "$tok" || return 1
	podman run -d --name "$peer" --network host --cap-drop all --security-opt no-new-privileges \
		-e UCX_TLS=tcp -e UCX_NET_DEVICES=lo -v "$run:/run/gmsfs:rslave" -v "$tok:/etc/gmsfs-peer/token:ro" "$image" \
		gmsfs-peer serve /run/gmsfs --listen "127.0.0.1:$port" --token /etc/gmsfs-peer/token --allow llama >/dev/null ||
		return 1
	for _ in $(seq 100); do podman logs "$peer" 2>&1 | grep -q serving && break; sleep 0.1; done
	podman run --rm --network host --cap-drop all --security-opt no-new-privileges -e UCX_TLS=tcp -e UCX_NET_DEVICES=lo \
		-v "$run:/run/gmsfs:rslave" -v "$tok:/etc/gmsfs-peer/token:ro" "$image" sh -c "
		mkdir /run/gmsfs/host-gpu-a/llama &&
		gmsfsctl pull gmsfs://127.0.0.1:$port/llama /run/gmsfs/host-gpu-a/llama --token /etc/gmsfs-peer/token" || {
		podman logs "$peer" 2>&1 | tail -5
		return 1
	}
	[ "$(cat "$run/host-gpu-a/llama/layout_hash")" = "$hash" ] &&
		cmp "$run/host-gpu-a/llama/allocs/w0" "$run/host-gpu-b/llama/allocs/w0" || return 1
	for _ in $(seq 50); do # the server's thread logs once its last send is gone
		podman logs "$peer" 2>&1 | grep -q "sent llama (1 allocations" && break
		sleep 0.1
	done
	podman logs "$peer" 2>&1 | grep -q "sent llama (1 allocations" && podman rm -f "$peer" >/dev/null
}
t "gmsfs-peer serve in a container over the node's mounts; gmsfsctl pull in another fills the other GPU's store: the same hash and bytes" peer_pulled
stopped_clean() { # each condition says itself when it fails (one failed once in CI, 2026-11-29)
	podman stop -t 30 "$node" >/dev/null || { echo "podman stop failed"; return 1; }
	local code
	code=$(podman inspect "$node" --format '{{.State.ExitCode}}')
	[ "$code" = 0 ] || { echo "the container ended $code"; podman logs "$node" 2>&1 | tail -20; return 1; }
	! grep " $run/" /proc/mounts || { echo "mounts left (above)"; return 1; }
	[ ! -e "$run/host-gpu-a.sock" ] && [ ! -e "$run/host-gpu-b.sock" ] || { echo "a socket left"; return 1; }
	! pgrep -af 'socket=/run/gmsfs/host-gpu-[ab].sock' || { echo "daemons left (above)"; return 1; }
	podman logs "$node" 2>&1 | grep -q 'a daemon for each of 2 GPUs' || { echo "no start said in its log"; return 1; }
}
t "SIGTERM to the daemon container: it ends 0, every mount and socket gone, no daemon left" stopped_clean
t "the keeper's end (the pod deleted) lets the stores' memory go" sh -c "
	podman stop -t 30 '$keeper' >/dev/null && podman logs '$keeper' 2>&1 | grep -q 'ending: [1-9][0-9]* descriptors let go'"

echo "1..$n"
[ "$failed" -eq 0 ]
