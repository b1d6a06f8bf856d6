#!/usr/bin/env bats
# A daemon in a child pid namespace sees callers from the parent as pid 0:
# it refuses them a lock, clearly, rather than guess who they are.

load helpers

setup_file() { GMSFS_WRAP="unshare --pid --fork --kill-child" mount_gmsfs; }
teardown_file() { unmount_gmsfs; }

@test "a caller outside the daemon's pid namespace gets EPERM for locks and changes, and a log line" {
	mkdir "$MNT/s" # stores need no lock
	run "$OPEN" -r "$MNT/s/lock"
	assert_output EPERM
	run "$OPEN" -w "$MNT/s/lock"
	assert_output EPERM
	run "$OPEN" -n -rw "$MNT/s/lock"
	assert_output EPERM
	run truncate -s 1 "$MNT/s/allocs/x"
	assert_failure
	assert_equal "$(state_of "$MNT/s" state)" EMPTY
	assert_equal "$(state_of "$MNT/s" readers)" 0
	run cat "$MNT.log"
	assert_output --partial "outside the daemon's pid namespace"
	# Status and listing still answer.
	run ls "$MNT/s"
	assert_success
	run cat "$MNT/device"
	assert_line "backend: host"
}
