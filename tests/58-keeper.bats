#!/usr/bin/env bats
# Stores that outlive their daemon where there is no systemd (issue 47): gmsfs-keeper
# holds the descriptors of their memory in a process of its own (a container of its own in
# the DaemonSet's pod); gmsfs-node starts each GPU's daemon through it and starts a daemon
# that died again, alone.  A daemon's SIGKILL, the SIGKILL of every process of the node's
# container, and a new daemon binary lose no store: the same bytes and layout hash, and a
# reader that mapped before keeps its bytes and its read lock.  Host backend.

load helpers

setup() {
	T=$(mktemp -d "$BATS_TEST_TMPDIR/keep.XXXXXX")
	KEEPER=$BUILD/gmsfs-keeper
	KEEPER_PID= NODE_PID=
}

teardown() {
	if [ -n "$NODE_PID" ] && kill -0 "$NODE_PID" 2>/dev/null; then
		kill -TERM "$NODE_PID"
		wait "$NODE_PID" 2>/dev/null || true
	fi
	touch "$T/go"
	touch "$T/thawed" # its guard ends
	[ -z "${FROZEN:-}" ] || fsfreeze -u "$FROZEN"
	for m in $(awk -v r="$T/" 'index($2, r) == 1 { print $2 }' /proc/mounts); do umount -l "$m"; done
	if [ -n "$KEEPER_PID" ]; then kill -TERM "$KEEPER_PID" 2>/dev/null || true; fi
	wait 2>/dev/null || true
}

start_keeper() {
	"$KEEPER" "$T/keep" 2>"$T/keeper.log" 3>&- &
	KEEPER_PID=$!
	wait_until test -S "$T/keep/keeper.sock"
}

commit_store() { # commit_store STORE TEXT: one allocation of 64 KiB starting with TEXT
	(
		exec 9>"$1/lock"
		truncate -s 65536 "$1/allocs/w"
		printf '%s' "$2" | dd of="$1/allocs/w" conv=notrunc status=none
		echo "u8 [65536]" >"$1/meta/w"
		setfattr -n user.gms.alloc -v w "$1/meta/w"
		echo >"$1/commit"
	)
}

run_daemon() { # the mount $T/m's daemon, in the background under the keeper (its images in $STATE)
	"$KEEPER" --exec "$T/keep" gpu-a "$GMSFS" -f -o "backend=host,socket=$T/s,state=${STATE:-$T/keep/state/gpu-a}" \
		"$T/m" 2>>"$T/daemon.log" 3>&- &
}

# A keeper, the daemon of $T/m under it, and two committed stores: llama and qwen.
keeper_daemon_two_stores() {
	start_keeper
	mkdir "$T/m"
	run_daemon
	wait_until grep -q " $T/m fuse.gmsfs " /proc/mounts
	mkdir "$T/m/llama" "$T/m/qwen"
	commit_store "$T/m/llama" "weights1"
	commit_store "$T/m/qwen" "weights2"
	standby_is 131072 # each store's host memory made ahead: its own descriptor, named in its image
}

# standby_is BYTES: wait until the daemon of $T/m has made BYTES of host memory ahead.
standby_is() { wait_until grep -qx "host_standby_bytes: $1" "$T/m/device"; }

daemon_pid() { sed -n 's/^pid: //p' "$1/device" 2>/dev/null; }
served_by_other() { local p; p=$(daemon_pid "$1"); [ -n "$p" ] && [ "$p" != "$2" ]; }

# reader STORE: a process that imports STORE and holds it mapped (and read-locked) until
# $T/go; then it prints the first bytes of w as it maps them.  Output in $T/reader.out.
reader() {
	$PYTHON - "$1" "$ROOT" "$T" >"$T/reader.out" 2>&1 3>&- <<'PY' &
import ctypes, os, sys, time
sys.path.insert(0, sys.argv[2] + "/python")
import gmsfs
with gmsfs.connect(sys.argv[1], "ro") as c:
    c.import_all()
    a = c.find("w")
    open(sys.argv[3] + "/mapped", "w").close()
    while not os.path.exists(sys.argv[3] + "/go"):
        time.sleep(0.05)
    print(ctypes.string_at(a.ptr, 8).decode(), flush=True)
PY
	READER_PID=$!
	wait_until test -e "$T/mapped"
}

@test "gmsfs-keeper: bad use is refused with a reason; one keeper per directory" {
	run "$KEEPER"
	assert_failure 2
	assert_output --partial "usage: gmsfs-keeper DIR"
	run "$KEEPER" --exec "$T/none" gpu-a true
	assert_failure 1
	assert_output --partial "keeper.sock: No such file or directory"
	start_keeper
	run "$KEEPER" "$T/keep"
	assert_failure 1
	assert_output --partial "a keeper serves it already"
	run "$KEEPER" --exec "$T/keep" "../x" true
	assert_failure 1
	assert_output --partial "../x: Invalid argument"
	[ "$(stat -c %a "$T/keep")" = 700 ] && [ "$(stat -c %a "$T/keep/keeper.sock")" = 600 ]
	# What --exec hands a daemon: no descriptor yet, its notify socket.
	run "$KEEPER" --exec "$T/keep" gpu-a sh -c 'echo "${LISTEN_FDS:-none} $NOTIFY_SOCKET"'
	assert_success
	assert_output --partial "none $T/keep/gpu-a.notify"
	"$KEEPER" --version | grep -q '^gmsfs-keeper '
}

@test "gmsfs-keeper: a daemon SIGKILLed, then SIGTERMed, comes back with every store; the keeper's end lets go" {
	start_keeper
	mkdir "$T/m"
	run_daemon
	wait_until grep -q " $T/m fuse.gmsfs " /proc/mounts
	mkdir "$T/m/llama"
	commit_store "$T/m/llama" "weights1"
	standby_is 65536
	hash=$(cat "$T/m/llama/layout_hash")
	reader "$T/m/llama"
	old=$(daemon_pid "$T/m")
	kill -9 "$old"
	run_daemon
	wait_until served_by_other "$T/m" "$old"
	assert_equal "$(cat "$T/m/llama/layout_hash")" "$hash"
	assert_equal "$(head -c 8 "$T/m/llama/allocs/w")" weights1
	assert_equal "$(state_of "$T/m/llama" readers)" 1 # the reader's lock came back with it
	old=$(daemon_pid "$T/m")
	kill -TERM "$old"
	wait_until bash -c "! grep -q ' $T/m fuse.gmsfs ' /proc/mounts"
	run_daemon
	wait_until served_by_other "$T/m" "$old"
	assert_equal "$(cat "$T/m/llama/layout_hash")" "$hash"
	touch "$T/go"
	wait "$READER_PID"
	assert_equal "$(cat "$T/reader.out")" weights1
	grep -q "gpu-a: 3 descriptors handed" "$T/keeper.log" # the store's, its host memory made ahead, the service's mark
	assert_equal "$(sed -n 's/^host_standby_bytes: //p' "$T/m/device")" 65536 # kept, not made again
	umount "$T/m"
	kill -TERM "$KEEPER_PID"
	wait "$KEEPER_PID"
	KEEPER_PID=
	grep -q "ending: 3 descriptors let go" "$T/keeper.log"
}

# A stub nvidia-smi that lists two "GPUs" the host backend serves (device=host-...).
node() { # node: gmsfs-node in the background, with the keeper; sets NODE_PID
	mkdir -p "$T/bin"
	printf '#!/bin/sh\necho host-gpu-a\necho host-gpu-b\n' >"$T/bin/nvidia-smi"
	chmod +x "$T/bin/nvidia-smi"
	PATH=$T/bin:$PATH GMSFS=${NODE_GMSFS:-$GMSFS} GMSFS_KEEPER=$KEEPER GMSFS_KEEP=$T/keep GMSFS_ROOT=$T/run \
		dash "$ROOT/tools/gmsfs-node" 2>>"$T/node.log" 3>&- &
	NODE_PID=$!
	wait_until two_mounts
}
two_mounts() { [ "$(grep -c " $T/run/host-gpu-[ab] fuse.gmsfs " /proc/mounts)" = 2 ]; }

@test "gmsfs-node with a keeper: a daemon SIGKILLed is started again alone, its stores back; the other GPU untouched" {
	start_keeper
	node
	mkdir "$T/run/host-gpu-a/llama" "$T/run/host-gpu-b/qwen"
	commit_store "$T/run/host-gpu-a/llama" "llama-v1"
	commit_store "$T/run/host-gpu-b/qwen" "qwen-v1"
	hash=$(cat "$T/run/host-gpu-a/llama/layout_hash")
	reader "$T/run/host-gpu-a/llama"
	a=$(daemon_pid "$T/run/host-gpu-a") b=$(daemon_pid "$T/run/host-gpu-b")
	kill -9 "$a"
	run env GMSFS_ROOT="$T/run" dash "$ROOT/tools/gmsfs-node" --live # one GPU down: no restart of the node
	assert_success
	wait_until served_by_other "$T/run/host-gpu-a" "$a"
	kill -0 "$NODE_PID"
	assert_equal "$(daemon_pid "$T/run/host-gpu-b")" "$b"
	assert_equal "$(cat "$T/run/host-gpu-a/llama/layout_hash")" "$hash"
	assert_equal "$(head -c 8 "$T/run/host-gpu-a/llama/allocs/w")" llama-v1
	assert_equal "$(state_of "$T/run/host-gpu-a/llama" readers)" 1
	grep -q "the daemon of host-gpu-a (pid $a) ended (137): starting it again in 1s" "$T/node.log"
	run env GMSFS_ROOT="$T/run" dash "$ROOT/tools/gmsfs-node" --check
	assert_success
	touch "$T/go"
	wait "$READER_PID"
	assert_equal "$(cat "$T/reader.out")" llama-v1
}

@test "gmsfs-node with a keeper: every process of the node SIGKILLed, then a new daemon binary: every store back" {
	start_keeper
	node
	mkdir "$T/run/host-gpu-a/llama" "$T/run/host-gpu-b/qwen"
	commit_store "$T/run/host-gpu-a/llama" "llama-v1"
	commit_store "$T/run/host-gpu-b/qwen" "qwen-v1"
	ha=$(cat "$T/run/host-gpu-a/llama/layout_hash") hb=$(cat "$T/run/host-gpu-b/qwen/layout_hash")
	reader "$T/run/host-gpu-b/qwen"
	# The container's processes, all at once: the script and both daemons.
	a=$(daemon_pid "$T/run/host-gpu-a") b=$(daemon_pid "$T/run/host-gpu-b")
	kill -9 "$NODE_PID" "$a" "$b"
	wait "$NODE_PID" 2>/dev/null || true
	node # the container started again: the stale mounts lifted, the stores restored
	wait_until served_by_other "$T/run/host-gpu-a" "$a"
	wait_until served_by_other "$T/run/host-gpu-b" "$b" # each daemon in its own time
	assert_equal "$(cat "$T/run/host-gpu-a/llama/layout_hash")" "$ha"
	assert_equal "$(cat "$T/run/host-gpu-b/qwen/layout_hash")" "$hb"
	assert_equal "$(head -c 7 "$T/run/host-gpu-b/qwen/allocs/w")" qwen-v1
	# An upgrade: the container stopped (SIGTERM) and started with another binary.
	cp "$GMSFS" "$T/gmsfs-next"
	kill -TERM "$NODE_PID"
	wait "$NODE_PID"
	! grep -q " $T/run/" /proc/mounts
	NODE_GMSFS=$T/gmsfs-next node
	pgrep -f -- "^$T/gmsfs-next -f -o device=host-gpu-a" >/dev/null
	assert_equal "$(cat "$T/run/host-gpu-a/llama/layout_hash")" "$ha"
	assert_equal "$(cat "$T/run/host-gpu-b/qwen/layout_hash")" "$hb"
	assert_equal "$(head -c 8 "$T/run/host-gpu-a/llama/allocs/w")" llama-v1
	assert_equal "$(state_of "$T/run/host-gpu-b/qwen" readers)" 1
	touch "$T/go"
	wait "$READER_PID"
	assert_equal "$(cat "$T/reader.out")" qwen-v1
	kill -TERM "$NODE_PID"
	wait "$NODE_PID"
	NODE_PID=
	! grep -q " $T/run/" /proc/mounts
}

@test "gmsfs-keeper: garbage on a daemon's socket and on its own changes nothing; another uid is refused" {
	start_keeper
	run "$KEEPER" --exec "$T/keep" gpu-f true # makes gpu-f's socket
	assert_success
	"$PYTHON" - "$T/keep" <<'PY'
import array, os, random, re, socket, sys
d = sys.argv[1]
kept = {"kept"}  # the names the keeper must hold: valid ones, as it reads a datagram
rnd = random.Random(47)
fd = os.open("/dev/null", os.O_RDONLY)
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
for i in range(3000):
    kind = rnd.randrange(5)
    if kind == 0:
        msg = bytes(rnd.randrange(256) for _ in range(rnd.randrange(300)))
    elif kind == 1:
        name = bytes(rnd.choice(b"ab./-_\n=\0\xff") for _ in range(rnd.randrange(300)))
        msg = b"FDSTORE=1\nFDNAME=" + name
        value = name.split(b"\0")[0].split(b"\n")[0]
        if re.fullmatch(rb"[A-Za-z0-9._-]{1,255}", value) and value not in (b".", b".."):
            kept.add(value.decode())
    elif kind == 2:
        msg = b"FDSTOREREMOVE=1\nFDNAME=nope%d" % i
    elif kind == 3:
        msg = b"FDSTORE=1\nFDNAME=kept"  # one name: the newest replaces it
    else:
        msg = b"FDSTORE=1\nFDNAME=two"  # two descriptors for one name: refused
    fds = [fd] if kind in (1, 3) else [fd, fd] if kind == 4 else []
    anc = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
    s.sendmsg([msg], anc, 0, d + "/gpu-f.notify")
for i in range(200):  # the request socket: garbage names, empty messages, hang-ups
    c = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    c.connect(d + "/keeper.sock")
    c.send(bytes(rnd.randrange(1, 256) for _ in range(rnd.randrange(1, 150))))
    c.close()
open(d + "/../want", "w").write("%d %s\n" % (len(kept), ":".join(sorted(kept))))
PY
	# The keeper serves on: gpu-f's store holds one descriptor for each valid name sent.
	run "$KEEPER" --exec "$T/keep" gpu-f sh -c 'echo "$LISTEN_FDS $(echo $LISTEN_FDNAMES | tr : "\n" | sort | paste -sd:)"'
	assert_success
	assert_line "$(cat "$T/want")"
	grep -q "an invalid FDNAME ignored" "$T/keeper.log"
	grep -q "FDSTORE=1 with 2 descriptors ignored" "$T/keeper.log"
	[ "$(ls /proc/$KEEPER_PID/fd | wc -l)" -lt $(($(cut -d' ' -f1 "$T/want") + 12)) ] # nothing refused stays open
	# Another uid that can reach the socket (its modes opened up here) is refused by the keeper.
	local open_dir
	open_dir=$(mktemp -d /tmp/gmsfs-keep-uid.XXXXXX)
	chmod 755 "$open_dir"
	"$KEEPER" "$open_dir/keep" 2>"$open_dir/log" 3>&- &
	local other=$!
	wait_until test -S "$open_dir/keep/keeper.sock"
	chmod 755 "$open_dir/keep" && chmod 666 "$open_dir/keep/keeper.sock"
	run setpriv --reuid 65534 --regid 65534 --clear-groups "$KEEPER" --exec "$open_dir/keep" gpu-f true
	kill -TERM $other
	wait $other
	assert_failure
	grep -q "a request from uid 65534 refused" "$open_dir/log"
	rm -rf "$open_dir"
}

@test "gmsfs-keeper killed and started again under a running daemon: persistence off is said, then every store handed again; the daemon's SIGKILL then loses nothing" {
	keeper_daemon_two_stores
	hash=$(cat "$T/m/llama/layout_hash")
	run "$KEEPER" --check "$T/keep"
	assert_success
	assert_output --partial "daemons, descriptors: 1 5" # two stores, their host memory, the mark
	grep -q '"keep": {"armed": true' "$T/m/status.json"
	grep -qx 'gmsfs_keep_armed{.*} 1' "$T/m/metrics"
	kill -9 "$KEEPER_PID"
	wait "$KEEPER_PID" || true
	KEEPER_PID=
	run "$KEEPER" --check "$T/keep"
	assert_failure 1
	# Within a couple of seconds, without a commit: said in status.json, the metric, the log.
	wait_until grep -q '"keep": {"armed": false, "error": "the service manager.s socket .*gpu-a.notify does not answer' "$T/m/status.json"
	grep -qx 'gmsfs_keep_armed{.*} 0' "$T/m/metrics"
	grep -q '"descriptors": 0,' "$T/m/status.json" # what the dead keeper held went with it
	grep -q "stores are not kept across a restart" "$T/daemon.log"
	start_keeper # the kubelet's restart: it binds gpu-a.notify again, and the daemon hands everything anew
	wait_until grep -q '"keep": {"armed": true' "$T/m/status.json"
	# armed is said as the handing begins; its line in the log when it is done
	wait_until grep -q "every store handed to the service manager again (2 stores, 4 descriptors)" "$T/daemon.log"
	run "$KEEPER" --check "$T/keep"
	assert_output --partial "daemons, descriptors: 1 5" # two stores, their host memory, the mark
	old=$(daemon_pid "$T/m")
	kill -9 "$old"
	run_daemon
	wait_until served_by_other "$T/m" "$old"
	assert_equal "$(cat "$T/m/llama/layout_hash")" "$hash"
	assert_equal "$(head -c 8 "$T/m/llama/allocs/w")" weights1
	assert_equal "$(head -c 8 "$T/m/qwen/allocs/w")" weights2
	grep -q '"keep": {"armed": true' "$T/m/status.json"
	umount "$T/m"
}

@test "gmsfs-keeper killed and started again at once, twice in a row (its socket may get the same inode number): every store handed again; the daemon's SIGKILL then loses nothing" {
	keeper_daemon_two_stores
	hash=$(cat "$T/m/llama/layout_hash")
	for round in 1 2; do
		before=$(grep -c "every store handed to the service manager again" "$T/daemon.log" || true)
		kill -9 "$KEEPER_PID"
		wait "$KEEPER_PID" || true
		start_keeper # at once: within the daemon's look at its socket, once a second
		wait_until eval '[ "$(grep -c "every store handed to the service manager again" "$T/daemon.log")" -gt "$before" ]'
		run "$KEEPER" --check "$T/keep"
		assert_output --partial "daemons, descriptors: 1 5" # round $round: two stores, their host memory, the mark
	done
	old=$(daemon_pid "$T/m")
	kill -9 "$old"
	run_daemon
	wait_until served_by_other "$T/m" "$old"
	assert_equal "$(cat "$T/m/llama/layout_hash")" "$hash"
	assert_equal "$(head -c 8 "$T/m/llama/allocs/w")" weights1
	assert_equal "$(head -c 8 "$T/m/qwen/allocs/w")" weights2
	umount "$T/m"
}

@test "a takeover of a daemon under the keeper is refused with words: the old one serves on, its stores kept" {
	start_keeper
	mkdir "$T/m"
	run_daemon
	wait_until grep -q " $T/m fuse.gmsfs " /proc/mounts
	mkdir "$T/m/llama"
	commit_store "$T/m/llama" "weights1"
	old=$(daemon_pid "$T/m")
	run timeout 30 "$GMSFS" -f -o takeover "$T/m"
	assert_failure
	assert_output --partial "keeps its stores under a service manager (state=$T/keep/state/gpu-a)"
	assert_output --partial "restart it through its manager instead"
	assert_equal "$(daemon_pid "$T/m")" "$old"
	kill -9 "$old" # and its stores still come back through the keeper
	run_daemon
	wait_until served_by_other "$T/m" "$old"
	assert_equal "$(head -c 8 "$T/m/llama/allocs/w")" weights1
	umount "$T/m"
}

@test "state= on a file system that stops answering (fsfreeze of a loop device): mkdir, commit, reads, the probes and the keeper's check return, and it is said; a write in place is refused (nothing torn); thawed, every image is written again, and a SIGKILL loses nothing committed while it was frozen" {
	truncate -s 32M "$T/disk.img"
	mkfs.ext4 -q -F "$T/disk.img"
	mkdir "$T/disk"
	mount -o loop "$T/disk.img" "$T/disk"
	STATE=$T/disk/state
	keeper_daemon_two_stores # llama and qwen, their images on the loop device
	hash=$(cat "$T/m/llama/layout_hash")
	fsfreeze -f "$T/disk"
	FROZEN=$T/disk
	# A daemon that died here would leave every request in the kernel until the disk thaws
	# (its thread on the disk keeps its end of the mount): thawed after 60 s whatever
	# happens, so that a failure fails and does not hang.
	(for _ in $(seq 600); do [ -e "$T/thawed" ] && exit; sleep 0.1; done; fsfreeze -u "$T/disk") 3>&- 2>/dev/null &
	# The first write waits GMSFS_KEEP_DISK_MS (1 s) and is left; later ones do not wait.
	run timeout 20 mkdir "$T/m/gemma"
	assert_success
	run timeout 20 bash -c "$(declare -f commit_store); commit_store '$T/m/gemma' weights3"
	assert_success
	# A write in place must say TORN on disk before a byte changes: refused, nothing torn.
	run timeout 20 bash -c "exec 9>'$T/m/qwen/lock'; printf weights4 | dd of='$T/m/qwen/allocs/w' conv=notrunc status=none"
	assert_failure
	assert_output --partial "Input/output error"
	assert_equal "$(timeout 5 head -c 8 "$T/m/qwen/allocs/w")" weights2
	assert_equal "$(timeout 5 head -c 8 "$T/m/llama/allocs/w")" weights1
	run timeout 5 cat "$T/m/status.json"
	assert_output --partial '"keep": {"armed": false, "error": "the state directory does not answer: writing '"$T"'/disk/state/'
	run timeout 5 grep -x 'gmsfs_keep_armed{.*} 0' "$T/m/metrics"
	assert_success
	run timeout 20 "$KEEPER" --check "$T/keep"
	assert_success
	run timeout 20 "$PYTHON" "$ROOT/tools/gmsfsctl" list "$T/m"
	assert_success
	grep -q "has not been written within 1000 ms: the state directory does not answer" "$T/daemon.log"
	fsfreeze -u "$T/disk"
	FROZEN=
	touch "$T/thawed"
	wait_until grep -q "answers again: every store's image written again (3 stores)" "$T/daemon.log"
	grep -q '"keep": {"armed": true, "error": ""' "$T/m/status.json"
	old=$(daemon_pid "$T/m")
	kill -9 "$old"
	run_daemon
	wait_until served_by_other "$T/m" "$old"
	assert_equal "$(cat "$T/m/llama/layout_hash")" "$hash"
	assert_equal "$(head -c 8 "$T/m/llama/allocs/w")" weights1
	assert_equal "$(head -c 8 "$T/m/qwen/allocs/w")" weights2
	[ "$(sed -n 's/^state: //p' "$T/m/qwen/state")" = COMMITTED ]
	assert_equal "$(head -c 8 "$T/m/gemma/allocs/w")" weights3
	umount "$T/m"
}
