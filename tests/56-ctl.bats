#!/usr/bin/env bats
# gmsfsctl: list (table and JSON), wait for a commit, show a layout; no lock taken.

load helpers

setup_file() { mount_gmsfs; }
teardown_file() { unmount_gmsfs; }

ctl() { "$PYTHON" "$ROOT/tools/gmsfsctl" "$@"; }

@test "list: every store of the mount, as a table and as JSON equal to status.json" {
	mkdir "$MNT/llama" "$MNT/empty"
	bash -ec "exec 9>$MNT/llama/lock; truncate -s 1M $MNT/llama/allocs/w; echo > $MNT/llama/commit"
	run ctl list "$MNT"
	assert_success
	assert_line --regexp "^$MNT +host .* llama +COMMITTED +0 +0 +0 +1 +0 +1.0 MiB +[0-9a-f]{12}$"
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
