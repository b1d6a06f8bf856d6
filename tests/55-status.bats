#!/usr/bin/env bats
# status.json and metrics at the mount root, as Triton reports its regions: parsed with a
# JSON parser and with Prometheus's own text parser, and compared with state and device.

load helpers

setup_file() { mount_gmsfs; }
teardown_file() { unmount_gmsfs; }

check() { "$PYTHON" "$ROOT/tests/helpers/check_status.py" "$MNT" "$@"; }
waiting_readers_are() { [ "$(state_of "$1" waiting_readers)" = "$2" ]; }

@test "an empty mount: both files parse and show the device, no store" {
	run ls "$MNT"
	assert_output "$(printf 'device\nmetrics\nstatus.json')"
	run check
	assert_success
	assert_output --partial '0 stores checked, 0 differences'
}

@test "stores in every state: status.json and metrics say what state and device say" {
	mkdir "$MNT/w" "$MNT/r" "$MNT/e" "$MNT/q\"uo\\te"
	for s in r w; do
		bash -ec "exec 9>$MNT/$s/lock; truncate -s 8192 $MNT/$s/allocs/a; echo v > $MNT/$s/meta/k
			setfattr -n user.gms.alloc -v a $MNT/$s/meta/k; echo > $MNT/$s/commit"
	done
	bash -ec "exec 9>$MNT/r/lock; truncate -s 4096 $MNT/r/allocs/b; echo > $MNT/r/commit"
	bash -ec "exec 9>$MNT/e/lock; truncate -s 4096 $MNT/e/allocs/gone" # leaves without commit
	hold rd r "$MNT/r/lock"
	wait_held rd
	hold wr w "$MNT/w/lock" "truncate -s 4096 $MNT/w/allocs/x"
	wait_held wr
	hold waiter r "$MNT/w/lock" # waits behind the writer, gets in when it goes
	wait_until waiting_readers_are "$MNT/w" 1
	"$BUILD/gmsfs-example" write "$MNT/q\"uo\\te" >/dev/null
	"$BUILD/gmsfs-example" read "$MNT/q\"uo\\te" >/dev/null
	"$ROOT/tools/gmsfsctl" digest "$MNT/q\"uo\\te" >/dev/null # its content hash known: a label of gmsfs_store_info
	grep -q 'content_hash="[0-9a-f]\{32\}"' "$MNT/metrics"
	run check r:commits=2 r:aborts=0 e:aborts=1 e:commits=0 w:lock_waits=1 w:commits=1 'q"uo\te:exports=2' # the reader and the digest imported it
	assert_success
	assert_output --partial '4 stores checked, 0 differences'
	release wr
	wait_held waiter
	run check w:aborts=1 w:lock_waits=1
	assert_success
	release waiter
	release rd
}

@test "the root's files: read-only, not removable, and no store may take their names" {
	for f in device status.json metrics; do
		run bash -c "echo x > $MNT/$f"
		assert_failure
		assert_output --partial 'Permission denied'
		run rm -f "$MNT/$f"
		assert_failure
		run mkdir "$MNT/$f"
		assert_failure
	done
	run check
	assert_success
}
