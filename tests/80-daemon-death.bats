#!/usr/bin/env bats
# The daemon killed under a reader: what the reader mapped stays readable.
# Its own file: the mount is dead afterwards.

load helpers

setup_file() { mount_gmsfs; }
teardown_file() { unmount_gmsfs; }

@test "a reader keeps reading its mapped allocations after the daemon is killed" {
	mkdir "$MNT/s"
	GMSFS_DAEMON_PID=$GMSFS_PID run timeout 60 "$BUILD/gmsfs-scenario" daemon_killed "$MNT/s"
	assert_success
	run stat "$MNT/s"
	assert_output --partial 'Transport endpoint is not connected'
}
