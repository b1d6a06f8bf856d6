#!/usr/bin/env bats
# gmsfsctl: list (table and JSON), wait for a commit, show a layout; no lock taken.

load helpers
bats_require_minimum_version 1.5.0

setup_file() { mount_gmsfs; }
teardown_file() { unmount_gmsfs; }

ctl() { "$PYTHON" "$ROOT/tools/gmsfsctl" "$@"; }

# Mounts a test adds (extra GPUs) go at its end, passed or failed: bats waits for their daemons.
EXTRA=()
teardown() {
	for m in "${EXTRA[@]}"; do umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true; done
	EXTRA=()
	touch "$BATS_TEST_TMPDIR/all.go"
	wait 2>/dev/null || true
}

@test "list: every store of the mount, as a table and as JSON equal to status.json" {
	mkdir "$MNT/llama" "$MNT/empty"
	bash -ec "exec 9>$MNT/llama/lock; truncate -s 1M $MNT/llama/allocs/w; echo > $MNT/llama/commit"
	run ctl list "$MNT"
	assert_success
	assert_line --regexp "^$MNT +host .* llama +COMMITTED +device +0 +0 +0 +1 +0 +1.0 MiB +[0-9a-f]{12}$"
	assert_line --regexp "^$MNT +host .* empty +EMPTY "
	run ctl list --json "$MNT"
	assert_success
	"$PYTHON" -c 'import json, sys
a = json.loads(sys.argv[1])[0]
b = json.load(open(sys.argv[2] + "/status.json"))
a.pop("mount")
for s in a["stores"] + b["stores"]:
    s.pop("requests")  # reading status.json between the two is not a request of a store
assert a == b, (a, b)' "$output" "$MNT"
	run ctl list "$MNT" /nonexistent
	assert_failure
	assert_output --partial '/nonexistent: not a gmsfs mount'
}

@test "list of every mount: one whose daemon died is named on stderr, the others are listed" {
	mkdir -p "$MNT/alive"
	local d=$BATS_TEST_TMPDIR/dead
	mkdir "$d"
	"$GMSFS" -f -o "socket=$d.sock" "$d" 2>/dev/null 3>&- &
	local pid=$!
	EXTRA+=("$d")
	wait_until grep -q " $d fuse.gmsfs " /proc/mounts
	kill -9 "$pid"
	wait "$pid" 2>/dev/null || true
	run --separate-stderr ctl list
	assert_failure # something is wrong, and said
	assert_output --partial "alive"
	[[ "$stderr" == *"$d: not answering (Transport endpoint is not connected)"* ]]
}

@test "wait: returns the hash once a writer commits, and times out clearly when none does" {
	mkdir "$MNT/later"
	run ctl wait "$MNT/later" --timeout 0.3
	assert_failure
	assert_output --partial 'nothing committed after 0.3 s (state EMPTY)'
	(sleep 0.3; bash -c "exec 9>$MNT/later/lock; truncate -s 4096 $MNT/later/allocs/a; echo > $MNT/later/commit") 3>&- &
	run ctl wait "$MNT/later" --timeout 20
	assert_success
	assert_output "$(cat "$MNT/later/layout_hash")"
	assert_equal "$(state_of "$MNT/later" readers)" 0 # it took no lock
	run ctl wait "$MNT/nope"
	assert_failure
	assert_output --partial 'not a gmsfs store'
}

@test "show: allocations with sizes and tags, entries with their extents" {
	mkdir "$MNT/shown"
	bash -ec "exec 9>$MNT/shown/lock; mkdir $MNT/shown/allocs/l; truncate -s 8192 $MNT/shown/allocs/l/0
		echo v > $MNT/shown/meta/k
		setfattr -n user.gms.tag -v weights $MNT/shown/allocs/l/0
		setfattr -n user.gms.alloc -v l/0 $MNT/shown/meta/k; setfattr -n user.gms.offset -v 16 $MNT/shown/meta/k
		setfattr -n user.gms.size -v 32 $MNT/shown/meta/k; echo > $MNT/shown/commit"
	run ctl show "$MNT/shown"
	assert_success
	assert_line "  allocs/l/0  8.0 KiB  tag weights"
	assert_line "  meta/k -> l/0+16 (32 bytes)"
	run ctl show --json "$MNT/shown"
	assert_success
	"$PYTHON" -c 'import json, sys
d = json.loads(sys.argv[1])
assert d["allocations"] == [{"name": "l/0", "size": 8192, "tag": "weights"}], d
assert d["entries"] == [{"key": "k", "alloc": "l/0", "offset": 16, "size": 32, "private": False, "value_bytes": 2}], d' "$output"
}

@test "metrics of two mounts (two GPUs) merge: one family each, every series its device's; --textfile writes one file per device by rename" {
	local m2 s2
	m2=$(mktemp -d "$BATS_TEST_TMPDIR/m2.XXXXXX")
	"$GMSFS" -f -o "device=host-second,socket=$m2.sock" "$m2" 2>/dev/null 3>&- &
	EXTRA+=("$m2")
	wait_until grep -q " $m2 fuse.gmsfs " /proc/mounts
	mkdir "$MNT/same" "$m2/same" # the same store name on both GPUs
	run ctl metrics "$MNT" "$m2"
	assert_success
	"$PYTHON" -c '
import sys
from prometheus_client.parser import text_string_to_metric_families
fams = list(text_string_to_metric_families(sys.argv[1]))
names = [f.name for f in fams]
assert len(names) == len(set(names)), "a family twice"
state = next(f for f in fams if f.name == "gmsfs_store_state")
keys = [tuple(sorted(s.labels.items())) for s in state.samples]
assert len(keys) == len(set(keys)), "duplicate series"
devs = {s.labels["device"] for s in state.samples if s.labels["store"] == "same"}
assert devs == {"host-second", open(sys.argv[2] + "/device").read().split("uuid: ")[1].split()[0]}, devs
' "$output" "$MNT"
	mkdir "$BATS_TEST_TMPDIR/tf"
	run ctl metrics --textfile "$BATS_TEST_TMPDIR/tf" "$MNT" "$m2"
	assert_success
	run ls "$BATS_TEST_TMPDIR/tf"
	assert_output "$(printf 'gmsfs-%s.prom\ngmsfs-host-second.prom' "$(sed -n 's/^uuid: //p' "$MNT/device")" | sort)"
	for f in "$BATS_TEST_TMPDIR"/tf/*.prom; do # each a whole text (node_exporter reads each file)
		"$PYTHON" -c 'import sys
from prometheus_client.parser import text_string_to_metric_families
assert len(list(text_string_to_metric_families(open(sys.argv[1]).read()))) > 5' "$f"
	done
}

@test "metrics --textfile after a clean stop: the mount gone is up 0 with no other series, said, exit 1" {
	# Its device name is this run's own: metrics reads every mount of the machine, and the
	# same test under ASan or valgrind may run beside it (a shared name, a shared .prom).
	local m2 p2 f dev=host-stopping-${BATS_RUN_TMPDIR##*-}
	m2=$(mktemp -d "$BATS_TEST_TMPDIR/m2.XXXXXX")
	"$GMSFS" -f -o "device=$dev,socket=$m2.sock" "$m2" 2>/dev/null 3>&- &
	p2=$!
	EXTRA+=("$m2")
	wait_until grep -q " $m2 fuse.gmsfs " /proc/mounts
	mkdir "$m2/s" "$BATS_TEST_TMPDIR/tf"
	f=$BATS_TEST_TMPDIR/tf/gmsfs-$dev.prom
	ctl metrics --textfile "$BATS_TEST_TMPDIR/tf" || true # every mount of the machine (others may be stopped)
	grep -q "^gmsfs_up{.*mount=\"$m2\"} 1$" "$f"
	grep -q "^gmsfs_store_state{device=\"$dev\"" "$f"
	umount "$m2" # a clean stop: the daemon ends, the mount is gone
	wait $p2
	run ctl metrics --textfile "$BATS_TEST_TMPDIR/tf"
	assert_failure
	assert_output --partial "$m2: its mount is gone (gmsfs_up 0)"
	refute_output --partial ".prom: its daemon does not answer"
	run cat "$f"
	refute_output --partial gmsfs_store_state
	assert_output --partial "mount=\"$m2\"} 0"
}

@test "metrics with a dead mount: gmsfs_up 0 for it and nothing stale, the live one written, exit 1; --version; --textfile must exist" {
	local dev=host-dying-${BATS_RUN_TMPDIR##*-} # this run's own (as above)
	local m2 p2
	m2=$(mktemp -d "$BATS_TEST_TMPDIR/m2.XXXXXX")
	"$GMSFS" -f -o "device=$dev,socket=$m2.sock" "$m2" 2>/dev/null 3>&- &
	p2=$!
	EXTRA+=("$m2")
	wait_until grep -q " $m2 fuse.gmsfs " /proc/mounts
	mkdir "$m2/s" "$BATS_TEST_TMPDIR/tf"
	run ctl metrics --textfile "$BATS_TEST_TMPDIR/tf" "$MNT" "$m2"
	assert_success
	grep -q "^gmsfs_store_state{device=\"$dev\",gpu=\"0\",UUID=\"$dev\"" "$BATS_TEST_TMPDIR/tf/gmsfs-$dev.prom"
	grep -q "^gmsfs_up{device=\"$dev\",gpu=\"0\",UUID=\"$dev\",mount=\"$m2\"} 1$" "$BATS_TEST_TMPDIR/tf/gmsfs-$dev.prom"
	kill -9 $p2
	wait $p2 2>/dev/null || true
	run ctl metrics --textfile "$BATS_TEST_TMPDIR/tf" "$MNT" "$m2"
	assert_failure
	assert_output --partial "$m2: its daemon does not answer (gmsfs_up 0)"
	run cat "$BATS_TEST_TMPDIR/tf/gmsfs-$dev.prom" # the dead GPU's stores no longer reported
	refute_output --partial gmsfs_store_state
	assert_output --partial "gmsfs_up{device=\"$dev\",gpu=\"0\",UUID=\"$dev\",mount=\"$m2\"} 0"
	grep -q "^gmsfs_up{.*mount=\"$MNT\"} 1$" "$BATS_TEST_TMPDIR/tf/gmsfs-$(sed -n 's/^uuid: //p' "$MNT/device").prom"
	run ctl metrics "$MNT" "$m2"
	assert_failure
	assert_output --partial "mount=\"$m2\"} 0"
	assert_output --partial "mount=\"$MNT\"} 1"
	run ctl metrics --textfile "$BATS_TEST_TMPDIR/missing" "$MNT"
	assert_failure
	assert_output "gmsfsctl: --textfile $BATS_TEST_TMPDIR/missing: not a directory"
	run ctl --version
	assert_success
	assert_output "gmsfsctl $("$GMSFS" --version | awk '$1 == "gmsfs" { print $2 }')"
}

# scrape PORT: the text /metrics serves (curl is not in Debian's minimal set: Python's urllib).
scrape() {
	"$PYTHON" -c 'import sys, urllib.request
print(urllib.request.urlopen("http://127.0.0.1:%s%s" % (sys.argv[1], sys.argv[2]), timeout=10).read().decode(), end="")' "$1" "${2:-/metrics}"
}

@test "metrics --listen: every mount at each scrape over HTTP; a stuck daemon is up 0 within the scrape, a dead one up 0 with nothing stale; SIGTERM ends it" {
	local m2 p2 srv port
	m2=$(mktemp -d "$BATS_TEST_TMPDIR/m2.XXXXXX")
	"$GMSFS" -f -o "device=host-served,socket=$m2.sock" "$m2" 2>/dev/null 3>&- &
	p2=$!
	EXTRA+=("$m2")
	wait_until grep -q " $m2 fuse.gmsfs " /proc/mounts
	mkdir "$m2/s"
	run ctl metrics --listen 127.0.0.1:http "$MNT"
	assert_failure
	assert_output "gmsfsctl: --listen 127.0.0.1:http: not [HOST]:PORT"
	run ctl metrics --listen :1 --textfile "$BATS_TEST_TMPDIR" "$MNT"
	assert_failure 2 # one or the other
	"$PYTHON" "$ROOT/tools/gmsfsctl" metrics --listen 127.0.0.1:0 "$MNT" "$m2" 2>"$BATS_TEST_TMPDIR/srv.log" 3>&- &
	srv=$!
	wait_until grep -q "metrics on http" "$BATS_TEST_TMPDIR/srv.log"
	port=$(sed -n 's|.*http://127.0.0.1:\([0-9]*\)/metrics|\1|p' "$BATS_TEST_TMPDIR/srv.log")
	run scrape "$port"
	assert_success
	assert_output --partial "gmsfs_store_state{device=\"host-served\",gpu=\"0\",UUID=\"host-served\",store=\"s\",state=\"EMPTY\"} 1"
	assert_output --partial "mount=\"$m2\"} 1"
	"$PYTHON" -c '
import sys
from prometheus_client.parser import text_string_to_metric_families
names = [f.name for f in text_string_to_metric_families(sys.argv[1])]
assert len(names) == len(set(names)) and "gmsfs_up" in names, names' "$output"
	kill -STOP $p2 # stuck: the scrape still answers, in its time
	local t0=$SECONDS
	run scrape "$port"
	kill -CONT $p2
	assert_success
	assert_output --partial "mount=\"$m2\"} 0"
	assert_output --partial "mount=\"$MNT\"} 1"
	[ $((SECONDS - t0)) -le 4 ]
	wait_until bash -c "'$PYTHON' -c 'import sys, urllib.request
print(urllib.request.urlopen(\"http://127.0.0.1:$port/metrics\").read().decode())' | grep -q 'mount=\"$m2\"} 1'"
	kill -9 $p2
	wait $p2 2>/dev/null || true
	run scrape "$port"
	assert_success
	assert_output --partial "gmsfs_up{device=\"host-served\",gpu=\"0\",UUID=\"host-served\",mount=\"$m2\"} 0"
	refute_output --partial 'store="s"' # the dead GPU's stores no longer reported
	run scrape "$port" /other
	assert_failure
	assert_output --partial "404"
	kill -TERM $srv
	wait $srv
}

@test "path: the store on this process's GPU (nvidia-smi's), as an engine pod finds it; a missing mount is an error" {
	mkdir -p "$BATS_TEST_TMPDIR/bin" "$BATS_TEST_TMPDIR/run"
	printf '#!/bin/sh\necho host-gpu-x\necho host-gpu-y\n' >"$BATS_TEST_TMPDIR/bin/nvidia-smi"
	chmod +x "$BATS_TEST_TMPDIR/bin/nvidia-smi"
	local r=$BATS_TEST_TMPDIR/run
	mkdir "$r/host-gpu-y"
	"$GMSFS" -f -o "device=host-gpu-y,socket=$r/y.sock" "$r/host-gpu-y" 2>/dev/null 3>&- &
	EXTRA+=("$r/host-gpu-y")
	wait_until grep -q " $r/host-gpu-y fuse.gmsfs " /proc/mounts
	PATH=$BATS_TEST_TMPDIR/bin:$PATH run ctl path llama --gpu 1 --root "$r"
	assert_success
	assert_output "$r/host-gpu-y/llama"
	PATH=$BATS_TEST_TMPDIR/bin:$PATH run ctl path llama --root "$r" # GPU 0 has no mount
	assert_failure
	assert_output --partial "$r/host-gpu-x: not a gmsfs mount"
}
