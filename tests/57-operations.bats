#!/usr/bin/env bats
# What an operator runs: mount.gmsfs (mount -t fuse.gmsfs, fstab), the daemon in the
# background, systemd's readiness, the unit files, and the mount propagation a
# Kubernetes DaemonSet relies on (Bidirectional for the daemon, HostToContainer for pods).

load helpers

setup() { T=$(mktemp -d "$BATS_TEST_TMPDIR/ops.XXXXXX"); }

# end_daemon MOUNT SOCKET: unmount; the daemon ends by itself (its socket goes with it).
end_daemon() {
	local pid
	pid=$(pgrep -f -- "socket=$2" || true) # the unique socket path names this test's daemon
	umount "$1" 2>/dev/null || umount -l "$1"
	for _ in $(seq 100); do [ -e "$2" ] || return 0; sleep 0.05; done
	[ -z "$pid" ] || kill -9 $pid
	echo "the daemon of $1 did not end after the unmount" >&2
	return 1
}

@test "mount.gmsfs: mount(8)'s options dropped, the rest to gmsfs, in the background, serving the socket" {
	mkdir "$T/m"
	GMSFS=$GMSFS run "$ROOT/tools/mount.gmsfs" none "$T/m" -o "rw,defaults,nofail,_netdev,x-systemd.after=a,max_bytes=64M,socket=$T/s.sock"
	assert_success
	grep -q " $T/m fuse.gmsfs " /proc/mounts # live when the helper returns
	assert_equal "$(sed -n 's/^total_bytes: //p' "$T/m/device")" 67108864
	mkdir "$T/m/w"
	"$BUILD/gmsfs-example" write "$T/m/w" >/dev/null
	run "$BUILD/gmsfs-example" read "$T/m/w" # through the socket: its thread lives in the background daemon
	assert_success
	assert_output --partial 'imported 8 allocations'
	end_daemon "$T/m" "$T/s.sock"
}

@test "mount.gmsfs: SOURCE is the device; bad arguments and bad options fail and mount nothing" {
	mkdir "$T/m"
	GMSFS=$GMSFS run "$ROOT/tools/mount.gmsfs" 0 "$T/m" -o "socket=$T/s.sock"
	assert_success
	assert_equal "$(sed -n 's/^index: //p' "$T/m/device")" 0
	end_daemon "$T/m" "$T/s.sock"
	GMSFS=$GMSFS run "$ROOT/tools/mount.gmsfs" none
	assert_failure
	assert_output --partial usage
	GMSFS=$GMSFS run "$ROOT/tools/mount.gmsfs" none "$T/m" --bogus
	assert_failure
	assert_output --partial 'unknown argument: --bogus'
	GMSFS=$GMSFS run "$ROOT/tools/mount.gmsfs" none "$T/m" -o "max_bytes=lots,socket=$T/s.sock"
	assert_failure
	! grep -q " $T/m " /proc/mounts
}

@test "Type=notify: READY=1 comes once the mount is live, STOPPING=1 at the unmount" {
	mkdir "$T/m"
	"$PYTHON" - "$T" "$GMSFS" <<'PY'
import os, socket, subprocess, sys
t, gmsfs = sys.argv[1:]
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind(t + "/notify")
s.settimeout(10)
d = subprocess.Popen([gmsfs, "-f", "-o", "socket=%s/s.sock" % t, t + "/m"], env=dict(os.environ, NOTIFY_SOCKET=t + "/notify"),
                     stderr=subprocess.DEVNULL)
msg = s.recv(4096).decode()
live = " %s/m fuse.gmsfs " % t in open("/proc/mounts").read()
assert msg.startswith("READY=1\n") and live, (msg, live)
subprocess.run(["umount", t + "/m"], check=True)
msg = s.recv(4096).decode()
assert msg == "STOPPING=1", msg
assert d.wait(10) == 0
PY
}

@test "the unit files verify (systemd-analyze), instanced by a GPU uuid" {
	command -v systemd-analyze
	for f in "$ROOT"/systemd/*; do
		sed -e "s|/usr/bin/gmsfs|$GMSFS|; s|/usr/sbin/gmsfs-mount-all|$ROOT/tools/gmsfs-mount-all|" "$f" >"$T/${f##*/}"
	done
	cd "$T"
	run systemd-analyze verify --man=no ./gmsfs@GPU-0f3c1a2b-1111-2222-3333-444455556666.service ./gmsfs.target \
		./gmsfs-mount-all.service
	assert_success
	assert_output '' # warnings are printed, not failed: none
	grep -q '^Type=notify$' gmsfs@.service
	grep -q '^ExecStart=.* -f -o device=%i,' gmsfs@.service # %i, not %I: a uuid's dashes stay dashes
}

@test "propagation: the daemon mounts in its own namespace on an rshared directory; a pod-like consumer (slave, own pid namespace) imports" {
	mkdir -p "$T/host/gpu0"
	mount --bind "$T/host" "$T/host"
	mount --make-rshared "$T/host"
	# The consumer first, as a pod that was there before the daemon (re)started.
	unshare --mount --propagation slave --pid --fork --mount-proc bash -c "
		'$ROOT/tests/helpers/drop-copied-mounts' '$(readlink /proc/self/ns/mnt)' '$T' || exit 1
		for i in \$(seq 400); do [ -s '$T/host/gpu0/w/layout_hash' ] && break; sleep 0.05; done
		echo pid \$\$
		exec '$BUILD/gmsfs-example' read '$T/host/gpu0/w'" >"$T/consumer.out" 2>&1 3>&- &
	local consumer=$!
	unshare --mount --propagation unchanged bash -c '"$1" "$4" "$2" && exec "$3" -f -o "socket=$2/host/gpu0.sock" "$2/host/gpu0"' \
		- "$ROOT/tests/helpers/drop-copied-mounts" "$T" "$GMSFS" "$(readlink /proc/self/ns/mnt)" 2>"$T/daemon.log" 3>&- &
	local daemon=$!
	for _ in $(seq 200); do grep -q " $T/host/gpu0 fuse.gmsfs " /proc/mounts && break; sleep 0.05; done
	run grep -c " $T/host/gpu0 fuse.gmsfs " /proc/mounts # Bidirectional: back in the host's namespace
	assert_output 1
	mkdir "$T/host/gpu0/w"
	"$BUILD/gmsfs-example" write "$T/host/gpu0/w" >/dev/null
	wait $consumer
	run cat "$T/consumer.out"
	assert_line 'pid 1' # its own pid namespace: the daemon still knows it (the host's sees all)
	assert_output --partial 'imported 8 allocations'
	umount "$T/host/gpu0"
	for _ in $(seq 100); do kill -0 $daemon 2>/dev/null || break; sleep 0.05; done
	kill -9 $daemon 2>/dev/null || true
	umount -l "$T/host"
}

@test "one daemon per mount point: a second start (gmsfs DIR, mount.gmsfs, mount -a of its fstab line) is refused and changes nothing" {
	mkdir "$T/m" "$T/m2"
	GMSFS=$GMSFS run "$ROOT/tools/mount.gmsfs" host-node "$T/m" -o "socket=$T/s.sock"
	assert_success
	grep -q "^host-node $T/m fuse.gmsfs " /proc/mounts # fsname: the fstab line's source
	mkdir "$T/m/w"
	"$BUILD/gmsfs-example" write "$T/m/w" >/dev/null
	run "$GMSFS" -f -o "socket=$T/other.sock" "$T/m"
	assert_failure
	assert_output --partial "$T/m is a gmsfs mount (host-node) served by a live daemon already: one daemon per mount point"
	GMSFS=$GMSFS run "$ROOT/tools/mount.gmsfs" host-node "$T/m" -o "socket=$T/s2.sock"
	assert_failure
	run "$GMSFS" -f -o "socket=$T/s.sock" "$T/m2" # another point, the live one's socket
	assert_failure
	assert_output --partial "socket $T/s.sock is served by a live daemon already"
	! grep -q " $T/m2 " /proc/mounts
	# mount -a sees the line mounted: it runs no helper (there is none installed here).
	echo "host-node $T/m fuse.gmsfs socket=$T/s.sock 0 0" >"$T/fstab"
	run mount -a -v -T "$T/fstab"
	assert_success
	assert_output --partial "already mounted"
	assert_equal "$(grep -c " $T/m fuse.gmsfs " /proc/mounts)" 1 # nothing stacked
	run "$BUILD/gmsfs-example" read "$T/m/w" # the first daemon serves on, socket and all
	assert_success
	assert_output --partial 'imported 8 allocations'
	end_daemon "$T/m" "$T/s.sock"
}

@test "a dead daemon's mount is lifted by the next one, though stat answers from the cache; a stopped one's is not, and nobody hangs" {
	mkdir "$T/m"
	"$GMSFS" -f -o "backend=host,socket=$T/s.sock" "$T/m" 2>"$T/d1.log" 3>&- &
	local first=$!
	wait_until grep -q " $T/m fuse.gmsfs " /proc/mounts
	mkdir "$T/m/a"
	stat "$T/m" >/dev/null # the root's attributes, cached for an hour
	kill -STOP $first # stopped, not dead: its mount stays, and the next start does not wait for it
	local t0=$SECONDS
	run timeout 20 "$GMSFS" -f -o "backend=host,socket=$T/s2.sock" "$T/m"
	local took=$((SECONDS - t0))
	kill -CONT $first # first, whatever the checks say: a stopped daemon left behind holds the test
	kill -9 $first
	wait $first 2>/dev/null || true
	assert_failure
	assert_output --partial "served by a live daemon already"
	[ "$took" -le 5 ]
	"$GMSFS" -f -o "backend=host,socket=$T/s.sock" "$T/m" 2>"$T/d2.log" 3>&- &
	local second=$!
	wait_until grep -q "lifting a stale mount" "$T/d2.log"
	wait_until test -e "$T/m/device"
	assert_equal "$(grep -c " $T/m fuse.gmsfs " /proc/mounts)" 1
	umount "$T/m"
	wait $second
}

@test "a daemon that read the next one's statfs and never answers it: the next one says it is live within 5 s, and nobody hangs" {
	mkdir "$T/m"
	GMSFS_FAULT=statfs.reply:hang "$GMSFS" -f -o "backend=host,socket=$T/s.sock" "$T/m" 2>"$T/d1.log" 3>&- &
	local first=$!
	wait_until grep -q " $T/m fuse.gmsfs " /proc/mounts
	local t0=$SECONDS
	# Its probe's statfs is read and never answered: a SIGKILL does not end it (the
	# request is the daemon's now), so the probe is left behind, holding nothing of ours.
	run timeout 20 "$GMSFS" -f -o "backend=host,socket=$T/s2.sock" "$T/m"
	local took=$((SECONDS - t0))
	kill -9 $first # first: the probe left behind ends with it
	wait $first 2>/dev/null || true
	umount -l "$T/m" 2>/dev/null || true
	assert_failure
	assert_output --partial "served by a live daemon already"
	[ "$took" -le 5 ]
	grep -q "GMSFS_FAULT: hung at statfs.reply" "$T/d1.log"
}

@test "a release that never returns (the driver stuck freeing) holds no create that the device has room for: the next allocation is made at once" {
	mkdir "$T/m"
	GMSFS_FAULT=release.buf:hang "$GMSFS" -f -o "backend=host,max_bytes=64M,socket=$T/s.sock" "$T/m" 2>"$T/d.log" 3>&- &
	local d=$!
	wait_until grep -q " $T/m fuse.gmsfs " /proc/mounts
	mkdir "$T/m/w"
	# The first allocation's memory, freed, goes to the releaser, which hangs in it; the
	# next create has room beside it (16 + 16 of 64 MiB) and waits for nothing.
	run timeout 20 "$PYTHON" - "$ROOT/python" "$T/m/w" <<'PY'
import sys
sys.path.insert(0, sys.argv[1])
import gmsfs
with gmsfs.connect(sys.argv[2], "rw") as c:
    c.create("a", 16 << 20)
    c.free("a")
    c.create("b", 16 << 20)
    c.commit()
print("made")
PY
	local allocs=$(ls "$T/m/w/allocs" 2>&1)
	kill -9 $d # its releaser never returns: no clean end
	wait $d 2>/dev/null || true
	umount -l "$T/m" 2>/dev/null || true
	assert_success
	assert_output "made"
	grep -q "GMSFS_FAULT: hung at release.buf" "$T/d.log"
	[ "$allocs" = b ]
}

@test "default sockets of dead daemons do not pile up: the next daemon removes those nobody listens on, not a live one's" {
	mkdir -p /run/gmsfs "$T/m"
	local dead=/run/gmsfs/gmsfs-test-dead-$$.sock live=/run/gmsfs/gmsfs-test-live-$$.sock
	"$PYTHON" -c 'import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET); s.bind(sys.argv[1])' "$dead" # bound, never served: dead
	# Live, but it never accepts, and its backlog is full (stopped, or stuck): a connect
	# that blocks would hold the next daemon's start until it went.
	"$PYTHON" -c 'import os, socket, sys, time
s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET); s.bind(sys.argv[1]); s.listen(0)
queued = []
while True:
    c = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET); c.setblocking(False)
    try:
        c.connect(sys.argv[1])
    except BlockingIOError:
        break
    queued.append(c)
open(sys.argv[2], "w").close(); time.sleep(30)' "$live" "$T/listening" 3>&- &
	local holder=$!
	wait_until test -e "$T/listening"
	"$GMSFS" -f "$T/m" 2>"$T/d.log" 3>&- &
	local d=$!
	wait_until grep -q " $T/m fuse.gmsfs " /proc/mounts || { kill -9 $d $holder; umount -l "$T/m"; false; }
	[ ! -e "$dead" ] && [ -S "$live" ] && [ -S "/run/gmsfs/gmsfs-$d.sock" ]
	umount "$T/m"
	wait $d
	kill $holder; wait $holder 2>/dev/null || true
	rm -f "$live"
	[ ! -e "/run/gmsfs/gmsfs-$d.sock" ]
}

@test "SIGTERM, SIGINT and SIGHUP: the daemon unmounts and exits 0, as gmsfs(8) says; its helper threads never take them" {
	"$PYTHON" - "$T" "$GMSFS" <<'PY'
import os, signal, subprocess, sys, time
t, gmsfs = sys.argv[1:]
for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
    m = "%s/m%d" % (t, sig)
    os.mkdir(m)
    d = subprocess.Popen([gmsfs, "-f", "-o", "socket=%s.sock" % m, m], stderr=subprocess.PIPE, text=True,
                         preexec_fn=lambda: [signal.signal(s, signal.SIG_DFL) for s in (2, 1, 15)])
    for _ in range(200):
        if " %s fuse.gmsfs " % m in open("/proc/mounts").read():
            break
        time.sleep(0.05)
    # A stop taken by a helper thread ended nothing (1 in ~40 stops hung): only the main
    # thread, where libfuse's loop waits, may take one.  The main thread lets them in just
    # before that loop, a little after the mount shows (a stop sent before waits for it).
    stops = (1 << (signal.SIGTERM - 1)) | (1 << (signal.SIGINT - 1)) | (1 << (signal.SIGHUP - 1))
    for _ in range(200):
        masks = {}
        for tid in os.listdir("/proc/%d/task" % d.pid):
            status = open("/proc/%d/task/%s/status" % (d.pid, tid)).read()
            masks[int(tid)] = int(status.split("SigBlk:")[1].split()[0], 16) & stops
        if masks[d.pid] == 0:
            break
        time.sleep(0.05)
    if len(masks) < 4 or any((blk == stops) != (tid != d.pid) for tid, blk in masks.items()):
        d.kill()
        d.wait()
        subprocess.run(["umount", "-l", m])
        sys.exit("the stop signals each thread blocks: %s (main %d)" % (masks, d.pid))
    d.send_signal(sig)
    rc = d.wait(10)
    err = d.stderr.read()
    assert rc == 0, (sig, rc, err)
    assert " %s " % m not in open("/proc/mounts").read(), sig
    assert "unmounting" in err, err
    print(signal.Signals(sig).name, "exit", rc)
PY
}

@test "detached (mount.gmsfs, fstab), the daemon's messages go to syslog" {
	mkdir "$T/m"
	"$PYTHON" - "$T" "$GMSFS" "$ROOT/tools/mount.gmsfs" <<'PY'
import os, socket, subprocess, sys, time
t, gmsfs, helper = sys.argv[1:]
# /dev/log: ours for this test (a private bind over a real one, or made and removed).
log = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
log.bind(t + "/log")
log.settimeout(10)
made = not os.path.exists("/dev/log")
script = "%s/../tests/helpers/drop-copied-mounts '%s' %s && mount --bind %s/log /dev/log && " % (
    os.path.dirname(helper), os.readlink("/proc/self/ns/mnt"), t, t) if not made else ""
if made:
    os.symlink(t + "/log", "/dev/log")
try:
    cmd = script + "GMSFS=%s %s host-syslog %s/m -o socket=%s/s.sock" % (gmsfs, helper, t, t)
    wrap = ["sh", "-c", cmd] if made else ["unshare", "--mount", "--propagation", "unchanged", "sh", "-c", cmd]
    subprocess.run(wrap, check=True)
    got = []
    subprocess.run(["umount", t + "/m"], check=True)  # the daemon says so as it ends
    deadline = time.time() + 10
    while time.time() < deadline and not any("unmount" in g or "Terminated" in g for g in got):
        try:
            got.append(log.recv(4096).decode())
        except socket.timeout:
            break
    text = "\n".join(got)
    assert "gmsfs[" in text and "on %s/m (backend host" % t in text, text
    assert "unmounted, ending" in text, text  # its last line too: sent before it exits
    print(text)
finally:
    if made:
        os.unlink("/dev/log")
PY
}

# A stub nvidia-smi that lists two "GPUs" the host backend serves (device=host-...).
stub_gpus() {
	NODE_PID=
	mkdir -p "$T/bin"
	printf '#!/bin/sh\necho host-gpu-a\necho host-gpu-b\n' >"$T/bin/nvidia-smi"
	chmod +x "$T/bin/nvidia-smi"
}
node_mounts() { grep -c " $T/run/host-gpu-[ab] fuse.gmsfs " /proc/mounts; }
two_node_mounts() { [ "$(node_mounts)" = 2 ]; }

# A gmsfs-node a failed test left: ended (its daemons unmount), then the usual teardown.
teardown() {
	if [ -n "${NODE_PID:-}" ] && kill -0 "$NODE_PID" 2>/dev/null; then
		kill -TERM "$NODE_PID"
		wait "$NODE_PID" 2>/dev/null || true
	fi
	touch "$BATS_TEST_TMPDIR/all.go"
	wait 2>/dev/null || true
}

@test "the DaemonSet's process, gmsfs-node, under dash: a daemon per GPU, served, every mount gone at SIGTERM" {
	stub_gpus
	PATH=$T/bin:$PATH GMSFS=$GMSFS GMSFS_ROOT=$T/run dash "$ROOT/tools/gmsfs-node" 2>"$T/node.log" 3>&- &
	local node=$!
	NODE_PID=$node
	wait_until two_node_mounts
	grep -q "^host-gpu-a $T/run/host-gpu-a fuse.gmsfs " /proc/mounts
	run env PATH="$T/bin:$PATH" GMSFS_ROOT="$T/run" dash "$ROOT/tools/gmsfs-node" --check
	assert_success
	# One daemon stopped (stuck): readiness names its GPU within its time; liveness, which
	# must not restart the node's other GPUs for it, stays 0.  Neither asks nvidia-smi.
	local stuck t0
	stuck=$(pgrep -f -- "socket=$T/run/host-gpu-a.sock")
	kill -STOP "$stuck"
	rm "$T/bin/nvidia-smi"
	t0=$(date +%s%N)
	run env GMSFS_ROOT="$T/run" dash "$ROOT/tools/gmsfs-node" --check
	assert_failure
	assert_output "gmsfs-node: not ready: host-gpu-a"
	[ $((($(date +%s%N) - t0) / 1000000)) -lt 1500 ]
	run env GMSFS_ROOT="$T/run" dash "$ROOT/tools/gmsfs-node" --live
	assert_success
	kill -CONT "$stuck"
	stub_gpus
	run env GMSFS_ROOT="$T/run" dash "$ROOT/tools/gmsfs-node" --check
	assert_success
	mkdir "$T/run/host-gpu-b/w"
	"$BUILD/gmsfs-example" write "$T/run/host-gpu-b/w" >/dev/null
	run "$BUILD/gmsfs-example" read "$T/run/host-gpu-b/w"
	assert_output --partial 'imported 8 allocations'
	kill -TERM $node
	wait $node # the script's own status: 0 after a SIGTERM
	! grep -q " $T/run/" /proc/mounts
	[ ! -e "$T/run/host-gpu-a.sock" ] && [ ! -e "$T/run/host-gpu-b.sock" ]
	run env PATH="$T/bin:$PATH" GMSFS_ROOT="$T/run" dash "$ROOT/tools/gmsfs-node" --check
	assert_failure
	run env GMSFS_ROOT="$T/run" dash "$ROOT/tools/gmsfs-node" --live
	assert_failure
	# Its GPUs stay listed (the metrics say each down, gmsfs_up 0): none of them mounted.
	assert_output --partial "not live: no GPU's mount is mounted: host-gpu-a host-gpu-b"
}

@test "gmsfs-node without a keeper: a daemon that dies is started again alone (its stores lost); the other GPU untouched" {
	stub_gpus
	PATH=$T/bin:$PATH GMSFS=$GMSFS GMSFS_ROOT=$T/run dash "$ROOT/tools/gmsfs-node" 2>"$T/node.log" 3>&- &
	local node=$!
	NODE_PID=$node
	wait_until two_node_mounts
	mkdir "$T/run/host-gpu-a/gone" "$T/run/host-gpu-b/kept"
	local a b
	a=$(pgrep -f -- "socket=$T/run/host-gpu-a.sock") b=$(pgrep -f -- "socket=$T/run/host-gpu-b.sock")
	kill -9 "$a"
	wait_until bash -c "sed -n 's/^pid: //p' $T/run/host-gpu-a/device | grep -q . && ! grep -qx 'pid: $a' $T/run/host-gpu-a/device"
	kill -0 $node
	assert_equal "$(pgrep -f -- "socket=$T/run/host-gpu-b.sock")" "$b"
	[ -d "$T/run/host-gpu-b/kept" ] && [ ! -e "$T/run/host-gpu-a/gone" ]
	grep -q "the daemon of host-gpu-a (pid $a) ended (137): starting it again in 1s" "$T/node.log"
	kill -TERM $node
	wait $node
	! grep -q " $T/run/" /proc/mounts
}

@test "the Kubernetes manifests: gmsfs-node through the keeper, the GPU taint tolerated, requests, probes, OnDelete, metrics over HTTP with a Service and a ServiceMonitor; the engine finds its store by GPU; stores served to peers and pulled from them; the images are the Containerfiles'" {
	local version
	version=$("$GMSFS" --version | awk '$1 == "gmsfs" { print $2 }')
	"$PYTHON" - "$ROOT/deploy/kubernetes" "$ROOT/deploy/container" "$version" <<'PY'
import sys, yaml
d = yaml.safe_load(open(sys.argv[1] + "/gmsfs-daemonset.yaml"))
spec = d["spec"]["template"]["spec"]
by = {c["name"]: c for c in spec["containers"]}
c, keeper, metrics = by["gmsfs"], by["keeper"], by["metrics"]
# The keeper outlives the gmsfs container: its own container, the same emptyDir as the
# daemons' GMSFS_KEEP; not privileged.
env = {e["name"]: e["value"] for e in c["env"]}
assert keeper["command"] == ["/usr/sbin/gmsfs-keeper", env["GMSFS_KEEP"]], (keeper["command"], env)
mounts = lambda x: {m["name"]: m["mountPath"] for m in x["volumeMounts"]}
assert mounts(keeper)["keep"] == mounts(c)["keep"] == env["GMSFS_KEEP"]
assert {"name": "keep", "emptyDir": {}} in spec["volumes"]
# Neither the keeper nor the metrics server needs a capability or the API server's token;
# the keeper has a probe (a keeper that stops answering is restarted, and the daemons hand
# it every store again).
assert spec["automountServiceAccountToken"] is False
for x in (keeper, metrics):
    sc = x["securityContext"]
    assert sc["capabilities"] == {"drop": ["ALL"]} and sc["allowPrivilegeEscalation"] is False and \
        sc["readOnlyRootFilesystem"] is True and "privileged" not in sc, (x["name"], sc)
assert keeper["livenessProbe"]["exec"]["command"] == ["/usr/sbin/gmsfs-keeper", "--check", env["GMSFS_KEEP"]]
# The engine pods: no token; the CSI one as restricted as its comment says.
for f in ("/engine-pod.yaml", "/engine-pod-csi.yaml"):
    assert yaml.safe_load(open(sys.argv[1] + f))["spec"]["automountServiceAccountToken"] is False, f
csi_pod = yaml.safe_load(open(sys.argv[1] + "/engine-pod-csi.yaml"))["spec"]
assert csi_pod["securityContext"]["runAsNonRoot"] is True and csi_pod["securityContext"]["seccompProfile"] == \
    {"type": "RuntimeDefault"}, csi_pod["securityContext"]
csi_c = csi_pod["containers"][0]["securityContext"]
assert csi_c["allowPrivilegeEscalation"] is False and csi_c["capabilities"] == {"drop": ["ALL"]}
assert "hostPath" not in str(csi_pod["volumes"])
# Metrics over HTTP: the port the Service targets, and the ServiceMonitor selects that Service.
assert metrics["command"][:3] == ["/usr/bin/gmsfsctl", "metrics", "--listen"], metrics["command"]
port = int(metrics["command"][3].rsplit(":", 1)[1])
assert metrics["ports"] == [{"name": "metrics", "containerPort": port}]
svc, mon = yaml.safe_load_all(open(sys.argv[1] + "/gmsfs-metrics.yaml"))
assert svc["kind"] == "Service" and svc["spec"]["selector"] == d["spec"]["template"]["metadata"]["labels"]
assert svc["spec"]["ports"][0]["targetPort"] == "metrics" and svc["spec"]["ports"][0]["name"] == "metrics"
assert mon["kind"] == "ServiceMonitor" and mon["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
assert mon["spec"]["endpoints"][0]["port"] == "metrics"
assert {"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "Hostname"} in mon["spec"]["endpoints"][0]["relabelings"]
assert c["command"] == ["/usr/sbin/gmsfs-node"], c["command"]  # no inline shell
assert d["spec"]["updateStrategy"]["type"] == "OnDelete"
assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
assert c["resources"]["requests"]["cpu"] and c["resources"]["requests"]["memory"]
assert c["livenessProbe"]["exec"]["command"] == ["/usr/sbin/gmsfs-node", "--live"]
assert c["readinessProbe"]["exec"]["command"] == ["/usr/sbin/gmsfs-node", "--check"]
assert c["livenessProbe"]["timeoutSeconds"] >= 2 and c["readinessProbe"]["timeoutSeconds"] >= 2
assert spec["runtimeClassName"] and spec["hostPID"] and c["securityContext"]["privileged"]
assert any(m["mountPropagation"] == "Bidirectional" for m in c["volumeMounts"])
e = yaml.safe_load(open(sys.argv[1] + "/engine-pod.yaml"))
ec = e["spec"]["containers"][0]
assert "gmsfsctl path llama" in " ".join(ec["args"]) and "GPU-" not in " ".join(ec["args"])
assert ec["volumeMounts"][0]["mountPropagation"] == "HostToContainer"
# The images are what deploy/container builds (tests/container.sh runs them), this version's.
version = sys.argv[3]
assert all(x["image"].endswith("/gmsfs:" + version) for x in (c, keeper, metrics)), c["image"]
assert ec["image"].endswith("/gmsfs-engine:" + version), ec["image"]
daemon = open(sys.argv[2] + "/Containerfile").read()
assert 'CMD ["/usr/sbin/gmsfs-node"]' in daemon and "install-node" in daemon
assert "pip install" in open(sys.argv[2] + "/Containerfile.engine").read()
for f in ("/gmsfs-daemonset.yaml", "/engine-pod.yaml"):
    assert "deploy/container/Containerfile" in open(sys.argv[1] + f).read(), f
# gmsfs-peer.yaml: the node's folder of mounts served on the port the headless Service
# names, the token a Secret of mode 0400 where --token reads it, no privilege, the image's;
# engine-pod-pull.yaml pulls through that Service and port with that token.
ds, svc = yaml.safe_load_all(open(sys.argv[1] + "/gmsfs-peer.yaml"))
assert ds["kind"] == "DaemonSet" and svc["kind"] == "Service"
ps = ds["spec"]["template"]["spec"]
pc = ps["containers"][0]
cmd = pc["command"]
assert cmd[:3] == ["/usr/bin/gmsfs-peer", "serve", "/run/gmsfs"], cmd
port = int(cmd[cmd.index("--listen") + 1].rsplit(":", 1)[1])
token = cmd[cmd.index("--token") + 1]
assert pc["ports"] == [{"name": "peer", "containerPort": port}]
assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["selector"] == ds["spec"]["template"]["metadata"]["labels"]
assert svc["spec"]["ports"] == [{"name": "peer", "port": port, "targetPort": "peer"}]
secret = [v for v in ps["volumes"] if "secret" in v][0]
assert secret["secret"]["defaultMode"] == 0o400
assert {m["name"]: m["mountPath"] for m in pc["volumeMounts"]}[secret["name"]] + "/token" == token
assert pc["securityContext"] == {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
assert ps["automountServiceAccountToken"] is False and ps["runtimeClassName"] and "hostPID" not in ps
assert pc["image"].endswith("/gmsfs:" + version)
pp = yaml.safe_load(open(sys.argv[1] + "/engine-pod-pull.yaml"))["spec"]
init = pp["initContainers"][0]
script = init["args"][0]
url = "gmsfs://%s.%s.svc.cluster.local:%d/" % (svc["metadata"]["name"], svc["metadata"]["namespace"], port)
assert url in script and "--token " + token in script and "gmsfsctl path llama" in script, script
assert init["image"].endswith("/gmsfs:" + version) and pp["automountServiceAccountToken"] is False
assert [v["secret"]["secretName"] for v in pp["volumes"] if "secret" in v] == [secret["secret"]["secretName"]]
PY
}
