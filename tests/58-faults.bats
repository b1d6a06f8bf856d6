#!/usr/bin/env bats
# Operating through faults (issue 57), host backend: a daemon SIGSTOPped beside a healthy
# one, as a stuck GPU driver or a debugger would leave it.  Every command returns within
# its stated bound, says the stopped mount down and goes on with the other; gmsfs-node
# replaces a daemon that does not answer (losslessly, through the keeper), and the
# metrics say every GPU it lists, at 0 when down, with the same labels always.  And the
# small ones: bad arguments and mount points, with clear words and the documented status.

load helpers

setup() {
	T=$(mktemp -d "$BATS_TEST_TMPDIR/faults.XXXXXX")
	STOPPED= NODE_PID= KEEPER_PID= HUNG=
	CTL=("$PYTHON" "$ROOT/tools/gmsfsctl")
}

teardown() {
	[ -z "$STOPPED" ] || kill -CONT "$STOPPED" 2>/dev/null || true
	[ -z "$HUNG" ] || kill -KILL "$HUNG" 2>/dev/null || true # its hung thread never lets it end otherwise
	if [ -n "$NODE_PID" ] && kill -0 "$NODE_PID" 2>/dev/null; then
		kill -TERM "$NODE_PID"
		wait "$NODE_PID" 2>/dev/null || true
	fi
	for m in $(awk -v r="$T/" 'index($2, r) == 1 { print $2 }' /proc/mounts | sort -r); do
		umount "$m" 2>/dev/null || umount -l "$m"
	done
	[ -z "$KEEPER_PID" ] || kill -TERM "$KEEPER_PID" 2>/dev/null || true
	wait 2>/dev/null || true
}

# daemon NAME [ENV=VALUE...]: a daemon on $T/NAME (socket $T/NAME.sock); its pid in $T/NAME.pid.
daemon() {
	local name=$1
	shift
	set -- "$name" "$@"
	mkdir -p "$T/$1"
	env "${@:2}" "$GMSFS" -f -o "backend=host,device=host-$1,socket=$T/$1.sock" "$T/$1" 2>"$T/$1.log" 3>&- &
	echo $! >"$T/$1.pid"
	wait_until grep -q " $T/$1 fuse.gmsfs " /proc/mounts
}

commit_store() { # commit_store STORE: one committed allocation of 4 KiB
	mkdir "$1"
	(
		exec 9>"$1/lock"
		truncate -s 4096 "$1/allocs/w"
		echo "weights" | dd of="$1/allocs/w" conv=notrunc status=none
		echo > "$1/commit"
	)
}

# within S CMD...: CMD returns within S seconds (its status in $status, its words in $output).
within() {
	local s=$1 t0
	shift
	t0=$(date +%s%N)
	run timeout 60 "$@"
	elapsed=$((($(date +%s%N) - t0) / 1000000))
	echo "# $* took ${elapsed} ms (at most $((s * 1000)))" >&3
	[ "$elapsed" -le $((s * 1000)) ]
}

@test "a SIGSTOPped daemon beside a healthy one: list, metrics, --textfile, show, wait, tier, switch and takeover return within their bounds, say it down, go on with the other" {
	daemon good
	daemon stuck
	commit_store "$T/good/a"
	commit_store "$T/stuck/b"
	STOPPED=$(cat "$T/stuck.pid")
	kill -STOP "$STOPPED"
	within 8 "${CTL[@]}" list "$T/good" "$T/stuck"
	assert_failure 1
	assert_output --partial "$T/stuck: not answering (does not answer within 5 s"
	assert_output --regexp "$T/good +host host-good +a +COMMITTED"
	within 8 "${CTL[@]}" metrics --textfile "$T" "$T/good" "$T/stuck"
	assert_failure 1
	assert_output --partial "$T/stuck: its daemon does not answer (gmsfs_up 0)"
	grep -q '^gmsfs_up{device="host-good",gpu="0",UUID="host-good",mount="'"$T"'/good"} 1$' "$T/gmsfs-host-good.prom"
	grep -q '^gmsfs_store_allocations{' "$T/gmsfs-host-good.prom"
	stuck_prom=$(grep -l 'mount="'"$T"'/stuck"' "$T"/gmsfs-*.prom)
	grep -q '} 0$' "$stuck_prom"
	within 8 "${CTL[@]}" show "$T/stuck/b"
	assert_failure 1
	assert_output --partial "does not answer within 5 s"
	within 10 "${CTL[@]}" wait "$T/stuck/b" --timeout 2
	assert_failure 1
	within 10 "${CTL[@]}" tier "$T/stuck/b" host --timeout 2
	assert_failure 1
	assert_output --partial "does not answer within"
	within 14 "${CTL[@]}" switch "$T/stuck/b" --timeout 2
	assert_failure 1
	# tier as a plain query waits for no move: the read's bound alone, not --timeout's 600 s.
	within 8 "${CTL[@]}" tier "$T/stuck/b"
	assert_failure 1
	assert_output --partial "does not answer within 5 s"
	# copy --timeout 2 out of the stopped mount: within it and the read's bound.
	mkdir "$T/good/copied"
	within 10 "${CTL[@]}" copy "$T/stuck/b" "$T/good/copied" --timeout 2
	assert_failure 1
	assert_output --partial "does not answer within" # 5 s (the library's read of device), or 7
	# An engine's connect with a timeout keeps it on a stopped daemon (libgmsfs: its open of
	# the store waits in a helper of its own, left behind).
	within 8 env PYTHONPATH="$ROOT/python" "$PYTHON" -c 'import sys, gmsfs
try:
    gmsfs.connect(sys.argv[1], "ro", timeout=2)
except gmsfs.GmsfsError as e:
    print(e.errno, e)
    sys.exit(1)' "$T/stuck/b"
	assert_failure 1
	assert_output --partial "110 "
	assert_output --partial "its daemon does not answer within 2000 ms (stopped, or stuck)"
	# The loader's tools with -t: the mount's text files they read first are given 5 s each.
	# Their reader thread is left in the kernel, where LeakSanitizer's check at exit (an
	# ASan build) would wait for it to stop, for ever: not asked here.
	local nolsan=${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0
	within 8 env ASAN_OPTIONS="$nolsan" "$BUILD/gmsfs-snapshot" save "$T/stuck/b" "$T/snap" -t 2
	assert_failure 1
	assert_output --partial "$T/stuck/b: its daemon does not answer within 5 s (stopped, or stuck)"
	within 8 env ASAN_OPTIONS="$nolsan" "$BUILD/gmsfs-load" -t 2 "$T/stuck/b" "$T/model.safetensors"
	assert_failure 1
	assert_output --partial "its daemon does not answer within 5 s"
	within 8 "$GMSFS" -f -o takeover "$T/stuck"
	assert_failure 1
	assert_output --partial "does not answer within 5 s (stopped, or stuck): nothing was taken over"
	# The healthy one was never held up, and the stopped one comes back whole.
	run "${CTL[@]}" list "$T/good"
	assert_success
	kill -CONT "$STOPPED"
	STOPPED=
	run "${CTL[@]}" list "$T/good" "$T/stuck"
	assert_success
	assert_equal "$(head -c 7 "$T/stuck/b/allocs/w")" weights
}

@test "a daemon whose requests do not return (hung in a commit, its lock held: a reader waits in the kernel, unkillable) beside a healthy one: list, metrics, show, tier, the loader's tools and takeover return within their bounds, say it down, go on with the other" {
	daemon good
	daemon hung GMSFS_FAULT=commit.image:hang
	HUNG=$(cat "$T/hung.pid")
	commit_store "$T/good/a"
	mkdir "$T/hung/b"
	( exec 9>"$T/hung/b/lock"; echo >"$T/hung/b/commit" ) 3>&- 2>/dev/null &
	wait_until grep -q "GMSFS_FAULT: hung at commit.image" "$T/hung.log"
	# Each command's read of the hung mount stays in the kernel, in a process of its own
	# the command does not wait for: the command returns by its bound, and its parent too.
	within 8 "${CTL[@]}" list "$T/good" "$T/hung"
	assert_failure 1
	assert_output --partial "$T/hung: not answering (does not answer within 5 s"
	assert_output --regexp "$T/good +host host-good +a +COMMITTED"
	within 8 "${CTL[@]}" metrics --textfile "$T" "$T/good" "$T/hung"
	assert_failure 1
	assert_output --partial "$T/hung: its daemon does not answer (gmsfs_up 0)"
	grep -q '^gmsfs_up{device="host-good",gpu="0",UUID="host-good",mount="'"$T"'/good"} 1$' "$T/gmsfs-host-good.prom"
	within 8 "${CTL[@]}" show "$T/hung/b"
	assert_failure 1
	assert_output --partial "does not answer within 5 s"
	within 8 "${CTL[@]}" tier "$T/hung/b"
	assert_failure 1
	local nolsan=${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0 # LeakSanitizer would wait for the reader left behind
	within 8 env ASAN_OPTIONS="$nolsan" "$BUILD/gmsfs-snapshot" save "$T/hung/b" "$T/snap" -t 2
	assert_failure 1
	assert_output --partial "$T/hung/b: its daemon does not answer within 5 s (stopped, or stuck)"
	within 8 env ASAN_OPTIONS="$nolsan" "$BUILD/gmsfs-load" -t 2 "$T/hung/b" "$T/model.safetensors"
	assert_failure 1
	assert_output --partial "its daemon does not answer within 5 s"
	within 8 "$GMSFS" -f -o takeover "$T/hung"
	assert_failure 1
	assert_output --partial "does not answer within 5 s (stopped, or stuck): nothing was taken over"
	run "${CTL[@]}" list "$T/good"
	assert_success
}

# A stub nvidia-smi listing two "GPUs" the host backend serves (device=host-...).
node() { # node [ENV=VALUE...]: gmsfs-node in the background with the keeper; sets NODE_PID
	mkdir -p "$T/bin"
	printf '#!/bin/sh\necho host-gpu-a\necho host-gpu-b\n' >"$T/bin/nvidia-smi"
	chmod +x "$T/bin/nvidia-smi"
	env "$@" PATH="$T/bin:$PATH" GMSFS="$GMSFS" GMSFS_KEEPER="$BUILD/gmsfs-keeper" GMSFS_KEEP="$T/keep" \
		GMSFS_ROOT="$T/run" dash "$ROOT/tools/gmsfs-node" 2>>"$T/node.log" 3>&- &
	NODE_PID=$!
	wait_until two_mounts
}
two_mounts() { [ "$(grep -c " $T/run/host-gpu-[ab] fuse.gmsfs " /proc/mounts)" = 2 ]; }
pid_of() { sed -n 's/^pid: //p' "$1/device" 2>/dev/null; }
served_by_other() { local p; p=$(timeout 1 sed -n 's/^pid: //p' "$1/device" 2>/dev/null); [ -n "$p" ] && [ "$p" != "$2" ]; }

keeper() {
	"$BUILD/gmsfs-keeper" "$T/keep" 2>"$T/keeper.log" 3>&- &
	KEEPER_PID=$!
	wait_until test -S "$T/keep/keeper.sock"
}

@test "gmsfs-node replaces a daemon that does not answer (SIGSTOP): within GMSFS_HUNG_S, losslessly through the keeper, said and counted; the other GPU untouched" {
	keeper
	node GMSFS_HUNG_S=5
	commit_store "$T/run/host-gpu-a/llama"
	hash=$(cat "$T/run/host-gpu-a/llama/layout_hash")
	other=$(pid_of "$T/run/host-gpu-b")
	old=$(pid_of "$T/run/host-gpu-a")
	sleep 5 # past the start's grace (GMSFS_HUNG_S, at most 10 s): asked every 5 s from now on
	kill -STOP "$old"
	for _ in $(seq 300); do served_by_other "$T/run/host-gpu-a" "$old" && break; sleep 0.1; done
	served_by_other "$T/run/host-gpu-a" "$old"
	grep -q "the daemon of host-gpu-a (pid $old) has not answered for 5s (stopped or stuck): replacing it" "$T/node.log"
	assert_equal "$(cat "$T/run/host-gpu-a/llama/layout_hash")" "$hash"
	assert_equal "$(head -c 7 "$T/run/host-gpu-a/llama/allocs/w")" weights
	assert_equal "$(pid_of "$T/run/host-gpu-b")" "$other"
	assert_equal "$(cat "$T/run/.gmsfs-node-replaced")" "host-gpu-a 1"
	# The metrics server says it: one replacement of GPU 0, none of GPU 1.
	run "$PYTHON" - "$ROOT" "$T/run" <<'PY'
import sys
sys.path.insert(0, sys.argv[1] + "/python")
from gmsfs._ctl_metrics import _Scraper
print(_Scraper([], sys.argv[2]).scrape())
PY
	assert_output --partial 'gmsfs_daemon_replaced_total{device="host-gpu-a",gpu="0",UUID="host-gpu-a",mount="'"$T"'/run/host-gpu-a"} 1'
	assert_output --partial 'gmsfs_daemon_replaced_total{device="host-gpu-b",gpu="1",UUID="host-gpu-b",mount="'"$T"'/run/host-gpu-b"} 0'
}

@test "gmsfs-node replaces a daemon whose requests do not return (hung in a commit with its lock held: its readers wait in the kernel, unkillable), and meanwhile starts the other GPU's daemon that died" {
	keeper
	node GMSFS_HUNG_S=5 GMSFS_FAULT=commit.image:hang
	mkdir "$T/run/host-gpu-a/llama"
	old=$(pid_of "$T/run/host-gpu-a")
	other=$(pid_of "$T/run/host-gpu-b")
	sleep 5 # past the start's grace (GMSFS_HUNG_S, at most 10 s): asked every 5 s from now on
	(
		exec 9>"$T/run/host-gpu-a/llama/lock"
		truncate -s 4096 "$T/run/host-gpu-a/llama/allocs/w"
		echo >"$T/run/host-gpu-a/llama/commit" # hangs in the daemon, holding the mount's lock
	) 3>&- 2>/dev/null &
	wait_until grep -q "GMSFS_FAULT: hung at commit.image" "$T/node.log"
	kill -9 "$other"
	# Each ask of GPU a's mount now stays in the kernel until its daemon ends; GPU b's
	# daemon is started again, and GPU a's replaced, by the same loop.
	wait_until grep -q "the daemon of host-gpu-b started again" "$T/node.log"
	for _ in $(seq 300); do grep -q "the daemon of host-gpu-a (pid $old) has not answered" "$T/node.log" && break; sleep 0.1; done
	grep -q "the daemon of host-gpu-a (pid $old) has not answered for 5s (stopped or stuck): replacing it" "$T/node.log"
	wait_until served_by_other "$T/run/host-gpu-a" "$old"
	wait_until served_by_other "$T/run/host-gpu-b" "$other"
	test -d "$T/run/host-gpu-a/llama" # its mkdir's image, through the keeper
	assert_equal "$(sed -n 's/^state: //p' "$T/run/host-gpu-a/llama/state")" EMPTY
	assert_equal "$(cat "$T/run/.gmsfs-node-replaced")" "host-gpu-a 1"
	kill -TERM "$NODE_PID" # and its stop ends too: the asks left in the kernel ended with the hung daemon
	# Its stop waits each daemon up to 10 s (then SIGKILL), and under ASan a daemon's exit
	# runs the leak check: up to a minute.
	# Ended: gone, or a zombie for this shell to reap (not merely awake for a moment: a
	# check for "not sleeping" once met it running).
	ended() { local st; st=$(awk '{print $3}' "/proc/$NODE_PID/stat" 2>/dev/null || true); [ -z "$st" ] || [ "$st" = Z ]; }
	for _ in $(seq 600); do ended && break; sleep 0.1; done
	ended
	wait "$NODE_PID"
	NODE_PID=
}

@test "metrics after a clean stop of gmsfs-node: gmsfs_up stays, at 0, for every GPU it listed, with the labels it had alive (gpu too, for a fresh metrics server)" {
	keeper
	node
	# Alive, each daemon's series carry the gpu label of its place in nvidia-smi's list
	# (the host backend's device index is 0 for both): one label per GPU, up or down.
	grep -q '^gmsfs_host_tier_bytes{device="host-gpu-b",gpu="1",UUID="host-gpu-b"} ' "$T/run/host-gpu-b/metrics"
	grep -q '"index": 0, "gpu": 1,' "$T/run/host-gpu-b/status.json"
	run "$PYTHON" - "$ROOT" "$T/run" <<'PY'
import sys
sys.path.insert(0, sys.argv[1] + "/python")
from gmsfs._ctl_metrics import _Scraper
print(_Scraper([], sys.argv[2]).scrape())
PY
	assert_output --partial 'gmsfs_up{device="host-gpu-b",gpu="1",UUID="host-gpu-b",mount="'"$T"'/run/host-gpu-b"} 1'
	kill -TERM "$NODE_PID"
	wait "$NODE_PID"
	NODE_PID=
	! grep -q " $T/run/host-gpu" /proc/mounts
	run "$PYTHON" - "$ROOT" "$T/run" <<'PY'
import sys
sys.path.insert(0, sys.argv[1] + "/python")
from gmsfs._ctl_metrics import _Scraper
print(_Scraper([], sys.argv[2]).scrape())  # a metrics server that never saw them alive
PY
	assert_output --partial 'gmsfs_up{device="host-gpu-a",gpu="0",UUID="host-gpu-a",mount="'"$T"'/run/host-gpu-a"} 0'
	assert_output --partial 'gmsfs_up{device="host-gpu-b",gpu="1",UUID="host-gpu-b",mount="'"$T"'/run/host-gpu-b"} 0'
}

@test "the small ones: gmsfs-node's unknown argument, a file as mount point, an unknown option's status, host-NAME, gpu= out of range, a store given to list, a takeover keeps a default socket's name" {
	run dash "$ROOT/tools/gmsfs-node" --bogus
	assert_failure 2
	assert_output --partial "unknown argument: --bogus"
	[ ! -e "$T/run" ]
	touch "$T/file"
	run "$GMSFS" -f -o backend=host "$T/file"
	assert_failure 1
	assert_output --partial "$T/file is not a directory"
	! grep -q " $T/file " /proc/mounts
	mkdir "$T/m"
	run "$GMSFS" -f -o backend=host,bogus=1 "$T/m"
	assert_failure 2
	assert_output --partial "unknown option"
	! grep -q " $T/m " /proc/mounts
	run "$GMSFS" -f -o backend=host,device=GPU-1234 "$T/m"
	assert_failure 1
	assert_output --partial "or host-NAME"
	run "$GMSFS" -f -o backend=host,gpu=4096 "$T/m"
	assert_failure 2
	assert_output --partial "gpu=4096: a GPU's number, 0 to 4095"
	! grep -q " $T/m " /proc/mounts
	# gmsfs --version says its own line first; gmsfs-csi installed (no source tree beside it)
	# reads the version from it, not libfuse's words.
	version=$(sed -n 's/^#define GMSFS_VERSION_\(MAJOR\|MINOR\|PATCH\) \([0-9]*\)$/\2/p' "$ROOT/include/gmsfs/gmsfs.h" | paste -sd.)
	assert_equal "$("$GMSFS" --version | head -1)" "gmsfs $version"
	mkdir -p "$T/sbin"
	cp "$ROOT/tools/gmsfs-csi" "$T/sbin/"
	run env PATH="$(dirname "$GMSFS"):$PATH" "$PYTHON" "$T/sbin/gmsfs-csi" --version
	assert_success
	assert_output "gmsfs-csi $version"
	# A default socket (none given): the successor takes the same name.
	"$GMSFS" -f -o backend=host "$T/m" 2>"$T/m.log" 3>&- &
	wait_until grep -q " $T/m fuse.gmsfs " /proc/mounts
	commit_store "$T/m/s"
	sock=$(sed -n 's/^socket: //p' "$T/m/device")
	old=$(pid_of "$T/m")
	run "${CTL[@]}" list "$T/m/s"
	assert_failure 1
	assert_output --partial "$T/m/s: a store, not a mount (gmsfsctl show $T/m/s"
	"$GMSFS" -f -o takeover "$T/m" 2>"$T/m.new.log" 3>&- &
	wait_until served_by_other "$T/m" "$old"
	wait_until test "$(sed -n 's/^socket: //p' "$T/m/device")" = "$sock"
	"$BUILD/gmsfs-example" read "$T/m/s" >/dev/null 2>&1 || "$PYTHON" -c "
import sys; sys.path.insert(0, '$ROOT/python'); import gmsfs
with gmsfs.connect('$T/m/s', 'ro') as c: c.import_all(); assert c.mappings"
}

@test "gmsfsctl --timeout: nan, inf, a negative or an absurd number of seconds refused with words, exit 2" {
	for bad in nan inf -inf -1 1e12 soon; do
		for verb in "wait $T/x" "tier $T/x" "switch $T/x" "copy $T/x $T/y"; do
			# shellcheck disable=SC2086
			run "${CTL[@]}" $verb "--timeout=$bad"
			assert_failure 2
			assert_output --regexp "argument --timeout: $bad: (seconds from 0 to 604800 \(a week\)|not a number of seconds)"
		done
		run "$BUILD/gmsfs-snapshot" save "$T/x" "$T/snap" -t "$bad"
		assert_failure 2
		assert_output "gmsfs-snapshot: -t $bad: seconds from 0 to 86400"
		run "$BUILD/gmsfs-load" -t "$bad" "$T/x" "$T/model.safetensors"
		assert_failure 2
		run env PYTHONPATH="$ROOT/python" "$PYTHON" -c 'import sys, gmsfs
try:
    gmsfs.connect(sys.argv[1], "ro", timeout=float(sys.argv[2]) if sys.argv[2] != "soon" else sys.argv[2])
except (ValueError, TypeError) as e:
    print("refused:", e)' "$T/x" "$bad"
		assert_output --partial "refused: timeout"
	done
}
