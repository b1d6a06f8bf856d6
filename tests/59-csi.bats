#!/usr/bin/env bats
# gmsfs-csi, the CSI node plugin for engine pods without a hostPath (issue 47): spoken to as
# the kubelet does (gRPC on its unix socket, CSI v1 messages), it binds the node's gmsfs
# folder onto a pod's target path as a slave of it, so that a daemon that mounts again
# later appears in the volume; it refuses what it should; and an engine that sees the
# mount at another path than the daemon's reaches the daemon's socket beside it.

load helpers

setup() {
	T=$(mktemp -d "$BATS_TEST_TMPDIR/csi.XXXXXX")
	mkdir -p "$T/run" "$T/kubelet/pods"
	mount --bind "$T/run" "$T/run" && mount --make-rshared "$T/run" # the node's /run/gmsfs
	DAEMONS=() PLUGIN=
}

teardown() {
	[ -z "$PLUGIN" ] || kill -TERM "$PLUGIN" 2>/dev/null || true
	for m in $(awk -v r="$T/" 'index($2, r) == 1 { print $2 }' /proc/mounts | sort -r); do umount -l "$m" 2>/dev/null || true; done
	for p in "${DAEMONS[@]}"; do kill -9 "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
}

daemon() { # daemon GPU: a gmsfs mount under the node's folder, socket beside it
	mkdir -p "$T/run/$1"
	"$GMSFS" -f -o "backend=host,device=$1,socket=$T/run/$1.sock" "$T/run/$1" 2>>"$T/daemon.log" 3>&- &
	DAEMONS+=($!)
	wait_until grep -q " $T/run/$1 fuse.gmsfs " /proc/mounts
}

# csi METHOD [ARG...]: one call, as the kubelet makes it; prints the reply's fields or
# "error CODE: DETAILS".  The messages are built here by hand, as the spec numbers them.
csi() {
	"$PYTHON" - "$T/csi.sock" "$@" <<'PY'
import sys, grpc
sys.path.insert(0, sys.argv[0] and "")
def varint(n):
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)
def s(field, v):
    v = v.encode()
    return varint(field << 3 | 2) + varint(len(v)) + v
def entry(field, k, v):
    e = s(1, k) + s(2, v)
    return varint(field << 3 | 2) + varint(len(e)) + e
sock, method, args = sys.argv[1], sys.argv[2], sys.argv[3:]
service = "Identity" if method in ("GetPluginInfo", "GetPluginCapabilities", "Probe") else "Node"
if method == "NodePublishVolume":
    body = s(1, "csi-vol-1") + s(4, args[0]) + entry(8, "csi.storage.k8s.io/ephemeral", "true")
    for extra in args[1:]:
        if extra == "readonly":
            body += varint(6 << 3) + varint(1)
        elif extra == "garbage":
            body = b"\x0a\xff\xff"
        else:
            k, v = extra.split("=", 1)
            body += entry(8, k, v)
elif method == "NodeUnpublishVolume":
    body = s(1, "csi-vol-1") + s(2, args[0])
else:
    body = b""
call = grpc.insecure_channel("unix://" + sock).unary_unary("/csi.v1.%s/%s" % (service, method))
try:
    reply = call(body, timeout=20)
except grpc.RpcError as e:
    print("error %s: %s" % (e.code().name, e.details()))
    sys.exit(1)
i, out = 0, []
while i < len(reply):  # the reply's string fields, "N=value"
    key = reply[i]; i += 1
    n = reply[i]; i += 1
    out.append("%d=%s" % (key >> 3, reply[i:i + n].decode())); i += n
print(" ".join(out) or "ok")
PY
}

start_plugin() {
	"$PYTHON" "$ROOT/tools/gmsfs-csi" --endpoint "unix://$T/csi.sock" --root "$T/run" --kubelet-dir "$T/kubelet" \
		--host-ns $$ --node-id node-7 2>"$T/plugin.log" 3>&- &
	PLUGIN=$!
	wait_until grep -q "serving" "$T/plugin.log"
}

@test "gmsfs-csi: identity and node info, as the kubelet's registrar asks" {
	start_plugin
	run csi GetPluginInfo
	assert_success
	assert_output "1=csi.gmsfs.io 2=$("$GMSFS" --version | awk '$1 == "gmsfs" { print $2 }')"
	run csi Probe
	assert_output ok
	run csi NodeGetInfo
	assert_output "1=node-7"
	run csi NodeGetCapabilities
	assert_output ok
	run csi NodeStageVolume
	assert_failure
	assert_output --partial "error UNIMPLEMENTED"
	run "$PYTHON" "$ROOT/tools/gmsfs-csi" --endpoint tcp://0:1
	assert_failure 2
	assert_output --partial "only unix:// endpoints"
}

@test "gmsfs-csi: a published volume shows every GPU's mount, and one mounted later; an engine imports through it; unpublished, nothing stays" {
	daemon host-gpu-a
	mkdir "$T/run/host-gpu-a/w"
	"$BUILD/gmsfs-example" write "$T/run/host-gpu-a/w" >/dev/null
	start_plugin
	target=$T/kubelet/pods/uid-1/volumes/kubernetes.io~csi/gmsfs/mount
	run csi NodePublishVolume "$target"
	assert_success
	run csi NodePublishVolume "$target" # again: the same answer, one mount
	assert_success
	assert_equal "$(grep -c " $target " /proc/mounts)" 1
	grep -q '^uuid: host-gpu-a$' "$target/host-gpu-a/device"
	daemon host-gpu-b # a daemon that mounts after the pod started: it appears in the volume
	wait_until grep -q '^uuid: host-gpu-b$' "$target/host-gpu-b/device"
	# An engine that sees only the volume, at another path than the daemon's: the socket
	# the daemon names is not there; the library finds it beside the mount.
	run unshare --mount --propagation slave bash -c "'$ROOT/tests/helpers/drop-copied-mounts' '$(readlink /proc/self/ns/mnt)' '$T' && mount -t tmpfs none '$T/run' && test ! -e '$T/run/host-gpu-a.sock' &&
		'$BUILD/gmsfs-example' read '$target/host-gpu-a/w'"
	assert_success
	assert_output --partial 'imported 8 allocations'
	run csi NodeUnpublishVolume "$target"
	assert_success
	[ ! -e "$target" ]
	! grep -q " $T/kubelet/" /proc/mounts
	run csi NodeUnpublishVolume "$target" # again: nothing to do, no error
	assert_success
	grep -q '^uuid: host-gpu-a$' "$T/run/host-gpu-a/device" # the node's mounts untouched
}

@test "gmsfs-csi: bad requests are refused and change nothing" {
	start_plugin
	run csi NodePublishVolume "$T/elsewhere/mount"
	assert_failure
	assert_output --partial "error INVALID_ARGUMENT: target_path $T/elsewhere/mount: not under the kubelet's pods directory"
	run csi NodePublishVolume "$T/kubelet/pods/../../escape"
	assert_output --partial "not under the kubelet's pods directory"
	run csi NodePublishVolume "relative/mount"
	assert_output --partial "INVALID_ARGUMENT"
	run csi NodePublishVolume "$T/kubelet/pods/u/mount" readonly
	assert_output --partial "error INVALID_ARGUMENT: readOnly is not supported"
	run csi NodePublishVolume "$T/kubelet/pods/u/mount" gpu=0
	assert_output --partial "error INVALID_ARGUMENT: volumeAttributes gpu: gmsfs-csi takes none"
	run csi NodePublishVolume "$T/kubelet/pods/u/mount" garbage
	assert_output --partial "error INVALID_ARGUMENT: malformed request"
	run csi NodeUnpublishVolume ""
	assert_output --partial "error INVALID_ARGUMENT: target_path is required"
	[ -z "$(ls "$T/kubelet/pods")" ]
	! grep -q " $T/kubelet/" /proc/mounts
	kill -0 "$PLUGIN" # still serving
}

@test "gmsfs-csi's manifests: the CSIDriver the plugin names, ephemeral; the registrar at the plugin's socket; an engine pod with no hostPath and no privilege" {
	"$PYTHON" - "$ROOT/deploy/kubernetes" "$ROOT/tools/gmsfs-csi" <<'PY'
import sys, yaml
d = sys.argv[1]
driver, ds = yaml.safe_load_all(open(d + "/gmsfs-csi.yaml"))
name = [l for l in open(sys.argv[2]) if l.startswith("NAME = ")][0].split('"')[1]
assert driver["kind"] == "CSIDriver" and driver["metadata"]["name"] == name, driver
assert driver["spec"]["volumeLifecycleModes"] == ["Ephemeral"] and driver["spec"]["attachRequired"] is False
spec = ds["spec"]["template"]["spec"]
by = {c["name"]: c for c in spec["containers"]}
plugin, reg = by["plugin"], by["registrar"]
assert spec["hostPID"] and plugin["securityContext"]["privileged"]
endpoint = plugin["command"][plugin["command"].index("--endpoint") + 1]
assert endpoint == "unix:///csi/csi.sock" and "--csi-address=/csi/csi.sock" in reg["args"]
socket_dir = next(v["hostPath"]["path"] for v in spec["volumes"] if v["name"] == "socket-dir")
assert "--kubelet-registration-path=%s/csi.sock" % socket_dir in reg["args"], reg["args"]
assert socket_dir == "/var/lib/kubelet/plugins/" + name
pod = yaml.safe_load(open(d + "/engine-pod-csi.yaml"))
c = pod["spec"]["containers"][0]
assert pod["spec"]["volumes"] == [{"name": "gmsfs", "csi": {"driver": name}}]
assert "hostPath" not in open(d + "/engine-pod-csi.yaml").read().split("volumes:")[1]
m = c["volumeMounts"][0]
assert m["mountPropagation"] == "HostToContainer" and "--root %s" % m["mountPath"] in c["args"][0]
assert c["securityContext"]["capabilities"]["drop"] == ["ALL"] and not c["securityContext"]["allowPrivilegeEscalation"]
PY
}
