#!/bin/bash
# tests/gpu/run.sh: the GPU tests and the benchmark, on the GPU machine, from a clean
# checkout.  Needs root, /dev/fuse, an NVIDIA driver and cuda.h; the libraries Debian
# has and the machine lacks come as .debs in .debs/ (apt-get download libfuse3-3
# libfuse3-dev libmsgpackc2 libmsgpack-dev libxxhash0 libxxhash-dev), unpacked into a
# private prefix (.gpu/prefix), never into /.  Prints TAP, then the benchmark lines.
#
#   bash tests/gpu/run.sh [gate|tests|bench|torch|load|engines|wheel|restart|graphs|gms|tier|adapters|switch|sharing|multi|tp|refit|snapshot|peer|peer-net|gms-snapshot|kept|digest|group|ahead|pinned|contexts|all] [RUNS]
#   gate: every headline figure beside its floor in one run, exit 1 on a miss (tests/gpu/gate.py;
#     at most 8 minutes; its results in $OUT/gate.json or build/gate.json, for tests/gpu/gate_tables.py)
#   RUNS: benchmark runs per layout (default 5); sharing: tier, adapters and switch;
#   engines: 8 engines at once on an 8B-shaped transformers model, and its warm start;
#   wheel: the same on the wheel (make wheel here, carried in dist/) pip-installed into
#     python3's venv, run from / without PYTHONPATH, GMSFS_LIBRARY or LD_LIBRARY_PATH;
#   restart: takeover and a restart under a service manager, tested, then timed (16 GiB; RESTART_KINDS=big: that store alone);
#   snapshot: gmsfs-snapshot save and restore on tmpfs and on the disk, checked, against
#     pinned copies and dd O_DIRECT (tests/gpu/snapshot_gpu.py);
#   peer: a store copied GPU 0 -> GPU 1 against the driver's peer copy, and snapshots of both
#     GPUs at once against one's (two GPUs; peer_gpu.py, snapshot2_gpu.py; PEER_ONLY=1: the copy;
#     PEER_PROBE=1: probe/grant_probe.py, the peer grants way by way);
#   peer-net: gmsfs-peer over UCX TCP between the GPU's mount and a host-backend one, both
#     ways, against ucx_perftest (peer_net_gpu.py; .debs has UCX: libucx0 libucx-dev ucx-utils
#     libibverbs1 librdmacm1 libnuma1);
#   keeper: stores through gmsfs-keeper and gmsfs-node, as the DaemonSet keeps them;
#   cold: cold from_pretrained loads beside host memory made ahead and with no_host_ahead;
#   kept: a kept KV cache: a paged transformers Llama's engine SIGKILLed mid-decode, a shadow
#     adopts its 16 GiB cache and finishes every sequence (bench/kv_kept.py; KEPT_ARGS);
#   pages: elastic KV caches: bench-pages against the raw driver loop, bench/kv_sharing.py
#          (cache drivers, then engines running a decoder over their caches);
#   group: a model's MLPs over two stores on one GPU as one group (gmsfs.Group): refitted and
#     flipped together, a step on one rank only refused to both, snapshots of the group
#     (tests/gpu/group_gpu.py);
#   tp: a tensor-parallel pair over NCCL on two GPUs (the nvidia-h200-x2 kind), a store on
#     each GPU's mount as one group: trainer ranks refit it, engine ranks flip in lockstep,
#     every step's logits the trainers', a trainer rank killed mid-step (tests/gpu/tp_gpu.py);
#   pinned: what a fresh restore pays before its first byte, its pinned buffers made each way
#     (probe/restore_open_probe.c's modes, fresh processes by turns, 3 rounds; #83 item 3), first
#     with GPU 0 held by a daemon (as a restore meets it), then without; with two GPUs or more,
#     also every GPU's context made by a process each at once, and by one process a thread
#     each (a group's restore in one process; #85), and each process shown one GPU;
#   contexts: a 16 GiB restore and a fresh context under CUDA_DEVICE_MAX_CONNECTIONS unset (the
#     commands' 1), 8 (the driver's) and 2, by turns (probe/context_env_probe.py; temporary);
#   ahead: host memory made ahead (-o host_ahead): 100 fresh readers' imports beside its making and
#     100 on a quiet daemon (probe/ahead_tail_probe.sh), and across a takeover
#     (probe/takeover_standby_probe.sh), a store of an eighth of the device, at most 16 GiB;
#   digest: the content hash of a store on the GPU against the same bytes' on a host mount, and
#     its speed on the GPU against the device-to-device copy of the bytes, read into host
#     memory against the pinned copy (tests/gpu/digest_gpu.py);
#   graphs: CUDA graphs of 8 shapes in gmsfs.torch.GraphPool against PyTorch's pools
#   gms: GMS's client flows on GMS itself, through gmsfs.gms and on gmsfs (bench/gms_flows.py),
#     then GMS's own tests through gmsfs.gms (tests/upstream/run.sh), where .upstream has them,
#     and GMS's vLLM and TRT-LLM model loaders on gmsfs.gms (tests/upstream/integrations_gpu.py), where
#     .upstream/lib has GMS's tree; integrations: that last part alone
#   multi: on a machine with two GPUs or more (the nvidia-h200-x2 kind)
# With $OUT set (the device machine), everything printed is also kept in $OUT/gpu-WHAT.log.
set -u
cd "$(dirname "$0")/../.."
top=$(pwd)
what=${1:-all}
runs=${2:-5}
if [ -n "${OUT:-}" ] && [ -z "${GMSFS_GPU_LOGGED:-}" ]; then
	export GMSFS_GPU_LOGGED=1
	bash "$0" "$@" 2>&1 | tee "$OUT/gpu-$what.log"
	exit "${PIPESTATUS[0]}"
fi

# ---- build against the private prefix ----
prefix=$top/.gpu/prefix
if [ ! -d "$prefix/usr/include/fuse3" ]; then
	mkdir -p "$prefix"
	for deb in .debs/*.deb; do dpkg -x "$deb" "$prefix"; done
fi
libdir=$prefix/usr/lib/x86_64-linux-gnu
export LD_LIBRARY_PATH=$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
make -s -j8 all PKG_CONFIG=true CUDA_INC=${CUDA_INC:-/usr/local/cuda/include} \
	DEPS_CFLAGS="-I$prefix/usr/include/fuse3 -I$prefix/usr/include" \
	DEPS_LIBS="-L$libdir -lfuse3 -lpthread -lxxhash -lmsgpackc" \
	MSGPACK_CFLAGS="-I$prefix/usr/include" MSGPACK_LIBS="-L$libdir -lmsgpackc" XXH_CFLAGS="-I$prefix/usr/include" \
	XXH_LIBS="-L$libdir -lxxhash" UCX_CFLAGS="-I$prefix/usr/include" UCX_LIBS="-L$libdir -lucp -luct -lucs -lucm" \
	>/dev/null || {
	echo "Bail out! build failed"
	exit 1
}

# ---- a daemon per group of tests ----
mnt=
pid=
mount_gmsfs() {
	mnt=$(mktemp -d /tmp/gmsfs-gpu.XXXXXX)
	build/gmsfs -f "$@" "$mnt" 2>"$mnt.log" &
	pid=$!
	for _ in $(seq 200); do
		grep -q " $mnt fuse.gmsfs " /proc/mounts && return 0
		kill -0 "$pid" 2>/dev/null || break
		sleep 0.05
	done
	cat "$mnt.log"
	return 1
}
unmount_gmsfs() {
	umount "$mnt" 2>/dev/null || umount -l "$mnt" 2>/dev/null
	for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.05; done
	kill -9 "$pid" 2>/dev/null
	wait "$pid" 2>/dev/null
	rmdir "$mnt" 2>/dev/null
}

n=0
failed=0
t() { # t NAME CMD...: one TAP line; the command's output as comments
	local name=$1 out rc
	shift
	n=$((n + 1))
	out=$("$@" 2>&1)
	rc=$?
	[ -n "$out" ] && printf '%s\n' "$out" | sed 's/^/# /'
	if [ $rc -eq 0 ]; then
		echo "ok $n - $name"
	else
		echo "not ok $n - $name (exit $rc)"
		failed=$((failed + 1))
	fi
}

export GMSFS_SCENARIO_CUDA=1
scenario() { mkdir "$mnt/$1" && timeout 300 build/gmsfs-scenario "$1" "$mnt/$1"; }

gpu_tests() {
nvidia-smi -L | sed 's/^/# /'
# These tests count device memory: no host memory made ahead, whose copier (gmsfs-mover,
# started a second after the first commit) has a context of its own (about 500 MB) that
# would show in the middle of a count (the tier, switch and cold runs test host_ahead).
mount_gmsfs -o no_host_ahead || { echo "Bail out! no mount"; exit 1; }
sed 's/^/# /' "$mnt/device"
t "the default backend is cuda on this machine" grep -qx 'backend: cuda' "$mnt/device"
t "device= names the GPU by uuid too" bash -c "uuid=\$(sed -n 's/^uuid: //p' $mnt/device); m=\$(mktemp -d); build/gmsfs -f -o device=\$uuid,socket=/tmp/gmsfs-uuid.sock \$m 2>/dev/null & p=\$!; for i in \$(seq 100); do grep -q \" \$m fuse.gmsfs \" /proc/mounts && break; sleep 0.05; done; grep -qx \"uuid: \$uuid\" \$m/device; r=\$?; umount \$m; wait \$p; rmdir \$m; exit \$r"
t "an unknown device is refused with a message, not served from host memory" bash -c "
	m=\$(mktemp -d); out=\$(timeout 10 build/gmsfs -f -o device=GPU-nope \$m 2>&1); rc=\$?; rmdir \$m; echo \"\$out\"
	[ \$rc -ne 0 ] && grep -q 'no such CUDA device' <<<\"\$out\" && ! grep -q 'host' <<<\"\$out\""

# mount.gmsfs by uuid: the daemon forks to the background before CUDA is touched.
bg_check() {
	local uuid m
	uuid=$(sed -n 's/^uuid: //p' "$mnt/device")
	m=$(mktemp -d)
	GMSFS=build/gmsfs tools/mount.gmsfs "$uuid" "$m" -o "socket=$m.sock" || return 1
	mkdir "$m/s"
	timeout 120 build/gmsfs-scenario readers64 "$m/s"
	local rc=$?
	grep -qx "uuid: $uuid" "$m/device" || rc=1
	umount "$m"
	for _ in $(seq 100); do [ -e "$m.sock" ] || break; sleep 0.05; done
	[ ! -e "$m.sock" ] || rc=1
	rmdir "$m"
	return $rc
}
t "mount.gmsfs GPU-uuid: the daemon in the background (forked before CUDA) serves writer and readers" bg_check

# Writer and readers in separate processes on device memory; a reader's write is refused.
t "64 allocations, three bulk readers verify every byte on the device, a reader's write is refused" scenario readers64
for s in commit_publishes abort_on_disconnect rw_or_ro writer_blocks_readers rw_or_ro_timeout \
	reader_after_writer_timeout several_readers reader_rw_calls_fail bad_offset free_removes \
	remap_same remap_changed remap_rebuilt remap_removed reallocate spaces graph_pool requests bulk_meta shared_range unmap_one create_many one_rw_per_session bad_args commit_unmap_all \
	refit_by_name refit_whole pause_resume versions_flip commit_version_unmap commit_disconnect; do
	t "GMS scenario on cuda: $s" scenario "$s"
done
t "a writer killed after creating 4 GiB: device memory comes back, the last commit stands" scenario dead_holder_memory
t "a writer killed after importing the last commit (read-only to it) and creating 4 GiB: COMMITTED, not TORN" scenario importer_killed
t "100 create/abort cycles of 2 x 64 MiB leak nothing" scenario abort_cycles
oom_check() {
	mkdir "$mnt/oom" || return 1
	(
		exec 9>"$mnt/oom/lock"
		# Past the device's size: the daemon's own accounting refuses.
		truncate -s 200G "$mnt/oom/allocs/huge" 2>&1 && exit 1
		grep 'last_error: allocs/huge: 214748364800 bytes' "$mnt/oom/state" || exit 1
		# Within it, until the driver itself runs out (other memory is in use): ENOSPC too.
		# As many 8 GiB files as the device has, and two more.
		local total=$(sed -n 's/^total_bytes: //p' "$mnt/device")
		for i in $(seq $((total / 8589934592 + 2))); do truncate -s 8G "$mnt/oom/allocs/f$i" 2>/tmp/oom.err || break; done
		cat /tmp/oom.err
		grep -q 'No space left' /tmp/oom.err && grep 'last_error' "$mnt/oom/state"
	) || return 1
	for _ in $(seq 100); do grep -q 'state: EMPTY' "$mnt/oom/state" && break; sleep 0.05; done
	grep -q 'backend: cuda' "$mnt/device" && ! ls "$mnt/oom/allocs" | grep -q .
}
t "out of device memory is ENOSPC with a clear last_error, and the daemon lives on" oom_check

# The daemon never makes a context: a client holding one is listed by nvidia-smi, the daemon is not.
ctx_check() {
	local fifo=/tmp/gmsfs-ctx.$$ out=/tmp/gmsfs-ctx.out.$$
	rm -f "$fifo"; mkfifo "$fifo"
	exec 7<>"$fifo"
	build/gmsfs-scenario __hold "$mnt/readers64" 1 5000 7 1 >"$out" &
	local holder=$!
	for _ in $(seq 100); do [ -s "$out" ] && break; sleep 0.05; done
	local apps
	apps=$(nvidia-smi --query-compute-apps=pid --format=csv,noheader)
	echo "compute apps: $(echo $apps) (daemon $pid, client $holder)"
	echo x >&7
	exec 7>&-
	wait "$holder"
	rm -f "$fifo" "$out"
	echo "$apps" | grep -qx "$holder" && ! echo "$apps" | grep -qx "$pid"
}
t "the daemon holds no CUDA context (nvidia-smi lists the client, not the daemon)" ctx_check
unmount_gmsfs

mount_gmsfs
t "a reader keeps reading its mapped weights after the daemon is killed" \
	bash -c "mkdir $mnt/k && GMSFS_DAEMON_PID=$pid timeout 120 build/gmsfs-scenario daemon_killed $mnt/k"
unmount_gmsfs

mount_gmsfs -o no_host_ahead # it counts device memory too
t "gmsfs.torch: a transformers Llama (1B) published once, materialized by two readers at once, zero-copy" \
	timeout 540 python3 tests/gpu/torch_gpu.py test "$mnt" "$top/build"
unmount_gmsfs
}

gpu_bench() {
mount_gmsfs
build/bench-gpu "$mnt" "$runs"
unmount_gmsfs
mount_gmsfs
python3 tests/gpu/torch_gpu.py bench "$mnt" "$top/build"
unmount_gmsfs
}

if [ "$what" = tests ] || [ "$what" = all ]; then
	gpu_tests
	echo "1..$n"
	echo "$((n - failed)) passed, $failed failed"
fi
if [ "$what" = bench ] || [ "$what" = all ]; then
	gpu_bench
fi
# Several GPUs (the two-GPU kind): a mount per GPU by uuid, through mount.gmsfs, and on
# each a writer and readers at once, side by side.
gpu_multi() {
	local uuids i=0 pids=() dirs=()
	export CUDA_DEVICE_ORDER=PCI_BUS_ID # CUDA's ordinals in nvidia-smi's order
	uuids=$(nvidia-smi --query-gpu=uuid --format=csv,noheader)
	nvidia-smi -L | sed 's/^/# /'
	[ "$(echo "$uuids" | wc -l)" -ge 2 ] || { echo "Bail out! fewer than 2 GPUs"; exit 1; }
	for u in $uuids; do
		local d=/tmp/gmsfs-multi/$u
		mkdir -p "$d"
		t "GPU $i: mount.gmsfs $u" env GMSFS=build/gmsfs tools/mount.gmsfs "$u" "$d" -o "socket=$d.sock"
		t "GPU $i: its device file names it" grep -qx "uuid: $u" "$d/device"
		dirs+=("$d")
		i=$((i + 1))
	done
	for i in "${!dirs[@]}"; do
		for s in readers64 several_readers remap_same; do
			mkdir "${dirs[$i]}/$s"
			GMSFS_SCENARIO_DEVICE=$i timeout 300 build/gmsfs-scenario "$s" "${dirs[$i]}/$s" >"/tmp/gmsfs-multi/$i.$s.out" 2>&1 &
			pids+=("$!:$i:$s")
		done
	done
	for p in "${pids[@]}"; do
		local pid=${p%%:*} rest=${p#*:} rc
		wait "$pid" # here: t runs its command in a subshell, which has no children to wait for
		rc=$?
		sed 's/^/# /' "/tmp/gmsfs-multi/${rest%%:*}.${rest#*:}.out"
		t "GPU ${rest%%:*}, side by side with the other: ${rest#*:}" test "$rc" -eq 0
	done
	for i in "${!dirs[@]}"; do
		t "GPU $i: its stores hold its own memory (status.json)" python3 -c '
import json, sys
d = json.load(open(sys.argv[1] + "/status.json"))
assert d["device"]["index"] == int(sys.argv[2]) and d["device"]["uuid"] == sys.argv[3], d["device"]
assert {s["name"] for s in d["stores"]} == {"readers64", "several_readers", "remap_same"}, d["stores"]' \
			"${dirs[$i]}" "$i" "$(basename "${dirs[$i]}")"
		umount "${dirs[$i]}"
	done
	echo "1..$n"
	echo "$((n - failed)) passed, $failed failed"
}
gpu_load() {
mount_gmsfs
if [ -n "${LOAD_PROBE:-}" ]; then # the content hash's cost, kind by kind (probe/load_hash_probe.py)
	python3 probe/load_hash_probe.py "$mnt" "$top/build"
	unmount_gmsfs
	return
fi
t "gmsfs-load and gmsfs-save: a transformers Llama from save_pretrained, the same logits" \
	timeout 300 python3 tests/gpu/load_gpu.py test "$mnt" "$top/build"
python3 tests/gpu/load_gpu.py bench "$mnt" "$top/build"
unmount_gmsfs
}
if [ "$what" = load ]; then # the loader: its GPU test, then its benchmark
	gpu_load
	echo "1..$n"
	echo "$((n - failed)) passed, $failed failed"
fi
if [ "$what" = multi ]; then
	gpu_multi
fi
if [ "$what" = peer ]; then # a store copied GPU 0 -> GPU 1 (two GPUs: the nvidia-h200-x2 kind)
	export CUDA_DEVICE_ORDER=PCI_BUS_ID
	mount_gmsfs -o device=0,socket=/tmp/gmsfs-peer0.sock,no_host_ahead || { echo "Bail out! no mount"; exit 1; }
	mnt0=$mnt pid0=$pid
	mount_gmsfs -o device=1,socket=/tmp/gmsfs-peer1.sock,no_host_ahead || { echo "Bail out! no mount"; exit 1; }
	if [ -n "${PEER_PROBE:-}" ]; then # the peer grants' cost, way by way (probe/grant_probe.py)
		timeout 400 python3 probe/grant_probe.py "$mnt0" -- ${PEER_PROBE_WAYS:-} || failed=$((failed + 1))
	else
		timeout 400 python3 tests/gpu/peer_gpu.py "$mnt0" "$mnt" "$top/build" || failed=$((failed + 1))
	fi
	[ -n "${PEER_ONLY:-}${PEER_PROBE:-}" ] || timeout 400 python3 tests/gpu/snapshot2_gpu.py "$mnt0" "$mnt" "$top/build" || failed=$((failed + 1))
	unmount_gmsfs
	mnt=$mnt0 pid=$pid0
	unmount_gmsfs
fi
if [ "$what" = tp ]; then # a tensor-parallel pair over NCCL, refitted and flipped as a group (two GPUs)
	export CUDA_DEVICE_ORDER=PCI_BUS_ID
	mount_gmsfs -o device=0,socket=/tmp/gmsfs-tp0.sock,no_host_ahead || { echo "Bail out! no mount"; exit 1; }
	mnt0=$mnt pid0=$pid
	mount_gmsfs -o device=1,socket=/tmp/gmsfs-tp1.sock,no_host_ahead || { echo "Bail out! no mount"; exit 1; }
	timeout 500 python3 tests/gpu/tp_gpu.py "$mnt0" "$mnt" "$top/build" || failed=$((failed + 1))
	unmount_gmsfs
	mnt=$mnt0 pid=$pid0
	unmount_gmsfs
fi
if [ "$what" = peer-net ] || [ "$what" = all ]; then # gmsfs-peer: a store pulled over UCX TCP, GPU <-> host mount
	export PATH=$prefix/usr/bin:$PATH # ucx_perftest
	mount_gmsfs -o no_host_ahead || { echo "Bail out! no mount"; exit 1; }
	mnt0=$mnt pid0=$pid
	# The other GPU's mount where there are two (the nvidia-h200-x2 kind), else a second
	# daemon on the same GPU: either way a store pulled from one GPU mount into another.
	gpus=$(nvidia-smi -L | wc -l)
	mount_gmsfs -o no_host_ahead,device=$((gpus > 1 ? 1 : 0)),socket=/tmp/gmsfs-net-gpu2.sock ||
		{ echo "Bail out! no mount"; exit 1; }
	mnt1=$mnt pid1=$pid
	mount_gmsfs -o backend=host,socket=/tmp/gmsfs-net-host.sock || { echo "Bail out! no mount"; exit 1; }
	timeout 500 python3 tests/gpu/peer_net_gpu.py "$mnt0" "$mnt" "$top/build" "$mnt1" || failed=$((failed + 1))
	unmount_gmsfs
	mnt=$mnt1 pid=$pid1
	unmount_gmsfs
	mnt=$mnt0 pid=$pid0
	unmount_gmsfs
fi
if [ "$what" = snapshot ] || [ "$what" = all ]; then # gmsfs-snapshot: checked shards, against pinned copies and dd
	mount_gmsfs -o no_host_ahead
	timeout 540 python3 tests/gpu/snapshot_gpu.py "$mnt" "$top/build" || failed=$((failed + 1))
	unmount_gmsfs
fi
if [ "$what" = tier ] || [ "$what" = sharing ] || [ "$what" = all ]; then # the host tier: its GPU test and benchmark
	mount_gmsfs -o no_host_ahead # the first move out makes its host memory
	timeout 540 python3 tests/gpu/tier_gpu.py "$mnt" || failed=$((failed + 1))
	unmount_gmsfs
	mount_gmsfs # the default: the host memory made before the first move out
	timeout 540 python3 tests/gpu/tier_gpu.py "$mnt" ahead || failed=$((failed + 1))
	sed -n 's/^gmsfs: /# daemon: /p' "$mnt.log" | tail -12
	unmount_gmsfs
fi
if [ "$what" = adapters ] || [ "$what" = sharing ] || [ "$what" = all ]; then # peft adapters, a store each
	mount_gmsfs -o max_bytes=240M # about 16 adapters of 13 MB on the device, the rest on the host tier
	timeout 540 python3 tests/gpu/adapters_gpu.py "$mnt" || failed=$((failed + 1))
	unmount_gmsfs
fi
if [ "$what" = switch ] || [ "$what" = sharing ] || [ "$what" = all ]; then # two 8B models, room for one
	mount_gmsfs -o max_bytes=24G
	timeout 540 python3 tests/gpu/switch_gpu.py "$mnt" || failed=$((failed + 1))
	sed -n 's/^gmsfs: /# daemon: /p' "$mnt.log" | grep -E 'switched in|moved to' | tail -8
	unmount_gmsfs
	mount_gmsfs -o max_bytes=24G # four models of 10 GB, room for two
	timeout 300 python3 tests/gpu/switch_gpu.py "$mnt" rotation || failed=$((failed + 1))
	sed -n 's/^gmsfs: /# daemon: /p' "$mnt.log" | grep -E 'switched in|gave way' | tail -6
	unmount_gmsfs
fi
if [ "$what" = engines ] || [ "$what" = all ]; then # many engines on one store, an 8B transformers model
	mount_gmsfs
	timeout 590 python3 tests/gpu/engines_gpu.py "$mnt" || failed=$((failed + 1))
	unmount_gmsfs
fi
if [ "$what" = wheel ]; then # the engines test on the wheel pip-installed into python3's venv, from outside the tree
	whl=$(ls dist/gmsfs-*.whl 2>/dev/null | tail -1)
	if [ -z "$whl" ] || ! python3 -m pip install -q --no-index --force-reinstall "$whl"; then
		echo "not ok - the wheel (make wheel, carried in dist/) installs into $(python3 -c 'import sys; print(sys.prefix)')"
		failed=$((failed + 1))
	else
		echo "# installed $whl into $(python3 -c 'import sys; print(sys.prefix)')"
		mount_gmsfs
		(cd / && env -u PYTHONPATH -u GMSFS_LIBRARY -u GMSFS_LOAD_LIBRARY -u LD_LIBRARY_PATH GMSFS_FROM_INSTALL=1 \
			timeout 590 python3 "$top/tests/gpu/engines_gpu.py" "$mnt") || failed=$((failed + 1))
		unmount_gmsfs
	fi
fi
if [ "$what" = restart ] || [ "$what" = all ]; then # a daemon replaced or restarted: tests, then the bench
	mount_gmsfs
	timeout 400 python3 tests/gpu/restart_gpu.py "$mnt" "$top/build" || failed=$((failed + 1))
	unmount_gmsfs
	timeout 500 python3 bench/restart.py build "${RESTART_GIB:-16}" cuda "${RESTART_KINDS:-big,many}" || failed=$((failed + 1))
fi
if [ "$what" = pages ]; then # elastic KV caches (issue 46): page maps against the raw driver loop, then three engines
	mount_gmsfs
	mkdir "$mnt/kv" && build/bench-pages "$mnt/kv" 256 || failed=$((failed + 1))
	rmdir "$mnt/kv"
	unmount_gmsfs
	mount_gmsfs -o max_bytes=512M # as 70-libgmsfs mounts it: the room the scenario sets up is its own
	t "pages on cuda: 64 placed in one request, each its own memory; within a minimum made at reserve and held; a minimum holds room; pages asked back" scenario pages
	unmount_gmsfs
	mount_gmsfs -o max_bytes=96M # the KV budget of the sharing run: 192 blocks of 512 KiB
	for trace in bursty overloaded; do
		timeout 200 python3 bench/kv_sharing.py "$mnt" --kv-mib 96 --page-mib 2 --seconds 12 --trace $trace ||
			failed=$((failed + 1))
	done
	unmount_gmsfs
	# The same with engines that run a decoder (1024 wide, 8 layers: 32 KiB of K and V a
	# token, 16 a block) over their caches, its weights one store all three map: the
	# budget is the weights' and the same 96 MiB of cache.
	mount_gmsfs -o max_bytes=$(($(python3 bench/kv_model.py) + 98))M
	for trace in bursty overloaded; do
		timeout 300 python3 bench/kv_sharing.py "$mnt" --model 1024,8,8,8192 --page-mib 2 --seconds 12 \
			--trace $trace || failed=$((failed + 1))
	done
	unmount_gmsfs
fi
if [ "$what" = kept ]; then # a kept KV cache (issue 62): an engine killed mid-decode, a shadow adopts
	mount_gmsfs
	t "kept on cuda: a dead engine's pages adopted at the same indices with their bytes and records, never TORN; dropped, they come back" scenario kept
	timeout 500 python3 bench/kv_kept.py "$mnt" ${KEPT_ARGS:-} || failed=$((failed + 1))
	unmount_gmsfs
fi
if [ "$what" = cold ]; then # cold loads beside host memory made ahead, and without it: the same times
	for opt in "" "-o no_host_ahead"; do
		mount_gmsfs $opt
		timeout 200 python3 tests/gpu/cold_probe.py "$mnt" 2>&1 | grep '^cold:' || failed=$((failed + 1))
		grep 'made ahead' "$mnt.log" | sed 's/^/# /' | tail -3
		unmount_gmsfs
	done
fi
if [ "$what" = keeper ]; then # stores through gmsfs-keeper, as the DaemonSet keeps them (issue 47)
	timeout 300 python3 tests/gpu/restart_gpu.py keeper "$top/build" || failed=$((failed + 1))
fi
if [ "$what" = scenarios ]; then # SCENARIOS="a b ...": GMS scenarios on cuda, alone
	mount_gmsfs
	for s in ${SCENARIOS:-spaces graph_pool}; do
		t "GMS scenario on cuda: $s" scenario "$s"
	done
	unmount_gmsfs
	echo "1..$n"
	echo "$((n - failed)) passed, $failed failed"
fi
if [ "$what" = graphs ] || [ "$what" = all ]; then # CUDA graphs of 8 shapes in the memory of the largest
	mount_gmsfs
	timeout 400 python3 tests/gpu/graph_gpu.py "$mnt" || failed=$((failed + 1))
	unmount_gmsfs
fi
if [ "$what" = gms ] || [ "$what" = all ]; then # GMS's client flows: GMS itself, gmsfs.gms, gmsfs (issue 28)
	# GMS's source in .upstream/lib (git-ignored; see bench/gms_flows.py), else GMS is left out.
	mount_gmsfs
	timeout 500 python3 bench/gms_flows.py "$mnt" "$([ -d .upstream/lib/gpu_memory_service ] && echo .upstream/lib || echo -)" "$runs" ||
		failed=$((failed + 1))
	unmount_gmsfs
	if [ -f .upstream/gms/test_runtime_flows.py ]; then # GMS's own tests through gmsfs.gms, on the GPU
		GMSFS_BACKEND=cuda PYTHON=python3 timeout 300 bash tests/upstream/run.sh || failed=$((failed + 1))
	fi
fi
if [ "$what" = gms ] || [ "$what" = integrations ]; then # GMS's vLLM and TRT-LLM model loaders on gmsfs.gms
	if [ -d .upstream/lib/gpu_memory_service/integrations ]; then
		mount_gmsfs
		timeout 400 python3 tests/upstream/integrations_gpu.py "$mnt" .upstream/lib || failed=$((failed + 1))
		unmount_gmsfs
	else
		echo "not ok - integrations: .upstream/lib has no GMS tree (see tests/upstream/integrations_gpu.py)"
		failed=$((failed + 1))
	fi
fi
if [ "$what" = gms ] || [ "$what" = gms-snapshot ]; then # GMS's storage client and gmsfs-snapshot, both ways
	# GMS's lib/gpu_memory_service/snapshot in .upstream/gms/snapshot (git-ignored: git -C dynamo show
	# HEAD:lib/gpu_memory_service/snapshot/F >.upstream/gms/snapshot/F), else left out.
	if [ -f .upstream/gms/snapshot/storage_client.py ]; then
		mount_gmsfs -o no_host_ahead
		timeout 300 python3 tests/gpu/gms_snapshot_gpu.py "$mnt" "$top/build" "$top/.upstream/gms/snapshot" ||
			failed=$((failed + 1))
		unmount_gmsfs
	fi
fi
if [ "$what" = gate ]; then # every headline figure beside its floor; a miss fails (gate.py; gate.json in $OUT or build/)
	timeout 590 python3 tests/gpu/gate.py "$top/build" "${OUT:-$top/build}" || failed=$((failed + 1))
fi
if [ "$what" = refit ] || [ "$what" = all ]; then # a trainer refits 4 engines' 8B-shaped Llama in place (refit_gpu.py)
	mount_gmsfs
	timeout 400 python3 tests/gpu/refit_gpu.py "$mnt" || failed=$((failed + 1))
	unmount_gmsfs
fi
if [ "$what" = group ] || [ "$what" = all ]; then # a model over two stores as one group, flipped together (group_gpu.py)
	mount_gmsfs -o no_host_ahead
	timeout 400 python3 tests/gpu/group_gpu.py "$mnt" "$top/build" || failed=$((failed + 1))
	unmount_gmsfs
	rm -f "$mnt.group" "$mnt.restored.group"
fi
if [ "$what" = pinned ]; then # the pinned buffers of a fresh restore, each way, by turns
	gcc -O2 -Icommon -Iloader -I${CUDA_INC:-/usr/local/cuda/include} probe/restore_open_probe.c \
		-o build/restore_open_probe -ldl -pthread || failed=$((failed + 1))
	gpus=$(nvidia-smi -L | wc -l)
	# as a restore meets it: the GPU held by its daemon (without one, each process's cuInit
	# sets the device up again: 230-330 ms on two H200 against 120 ms shown one)
	mount_gmsfs || failed=$((failed + 1))
	echo "GPU 0 held by a daemon:"
	for round in 1 2 3; do
		build/restore_open_probe 0 hugethreads || failed=$((failed + 1))
		CUDA_VISIBLE_DEVICES=0 build/restore_open_probe 0 hugethreads || failed=$((failed + 1))
	done
	unmount_gmsfs
	echo "no daemon:"
	for round in 1 2 3; do
		for mode in one threads huge hugethreads; do
			build/restore_open_probe 0 "$mode" || failed=$((failed + 1))
		done
		if [ "$gpus" -gt 1 ]; then # the contexts of a group's restore: a process a GPU, or one for all
			echo "a process a GPU, at once:"
			for g in $(seq 0 $((gpus - 1))); do build/restore_open_probe "$g" hugethreads & done
			wait
			build/restore_open_probe all || failed=$((failed + 1))
			# the same with each process shown only its own GPU (CUDA_VISIBLE_DEVICES): its
			# cuInit then sets up one device, not all of them
			echo "one GPU visible, alone:"
			CUDA_VISIBLE_DEVICES=0 build/restore_open_probe 0 hugethreads || failed=$((failed + 1))
			echo "one GPU visible to each, a process a GPU, at once:"
			for g in $(seq 0 $((gpus - 1))); do CUDA_VISIBLE_DEVICES=$g build/restore_open_probe 0 hugethreads & done
			wait
		fi
	done
fi
if [ "$what" = contexts ]; then # a fresh process's context with fewer work queues (temporary probe)
	gcc -O2 -Icommon -Iloader -I${CUDA_INC:-/usr/local/cuda/include} probe/restore_open_probe.c \
		-o build/restore_open_probe -ldl -pthread || failed=$((failed + 1))
	mount_gmsfs
	timeout 300 python3 probe/context_env_probe.py "$mnt" "$top/build" || failed=$((failed + 1))
	unmount_gmsfs
fi
if [ "$what" = ahead ]; then # host memory made ahead: fresh readers beside it, and across a takeover
	gib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits -i 0 | awk '{g = int($1 / 1024 / 8); print (g > 16 ? 16 : (g < 1 ? 1 : g))}')
	timeout 300 bash probe/ahead_tail_probe.sh "$gib" 100 || failed=$((failed + 1))
	timeout 200 bash probe/takeover_standby_probe.sh "$gib" 2>&1 | grep -v Warning || failed=$((failed + 1))
fi
if [ "$what" = digest ] || [ "$what" = all ]; then # the content hash: the GPU's against the host's, and its speed
	timeout 400 python3 tests/gpu/digest_gpu.py "$top/build" || failed=$((failed + 1))
fi
if [ "$what" = torch ]; then # the PyTorch warm-start benchmark alone
	mount_gmsfs
	python3 tests/gpu/torch_gpu.py bench "$mnt" "$top/build"
	unmount_gmsfs
fi
exit $((failed > 0))
