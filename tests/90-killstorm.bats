#!/usr/bin/env bats
# Writers and readers killed with SIGKILL at random points, 200 times: the committed
# layout and its hash stay intact, memory and descriptors come back, the lock never
# shows a writer with readers (tests/helpers/killstorm.py).

load helpers

setup_file() { mount_gmsfs; }
teardown_file() { unmount_gmsfs; }

@test "200 SIGKILLs of shell writers, library writers and readers: hash, memory, descriptors and the lock stay right" {
	run timeout 300 "$PYTHON" "$ROOT/tests/helpers/killstorm.py" "$MNT" "$GMSFS_PID" 200 "$BUILD"
	echo "$output" | grep '^#' >&3 || true
	assert_success
	assert_output --partial 'kills=200'
}
