#!/usr/bin/env bats
# Out of descriptors: a clear error that loses nothing committed and leaves a session
# usable.  The daemon runs with a hard limit of 48 descriptors.

load helpers

setup_file() { GMSFS_WRAP="prlimit --nofile=48:48" mount_gmsfs; }
teardown_file() { unmount_gmsfs; }

fds() { ls /proc/$GMSFS_PID/fd | wc -l; }

@test "3000 allocations take no descriptor of the daemon's (host backend: one memfd per store)" {
	local before
	before=$(fds)
	mkdir "$MNT/big"
	run "$BUILD/gmsfs-example" write "$MNT/big" 3000 4096
	assert_success
	run "$BUILD/gmsfs-example" read "$MNT/big"
	assert_output --partial 'imported 3000 allocations (12288000 bytes), 3000 metadata entries, 0 bad words'
	[ "$(fds)" -le $((before + 4)) ] || fail "the daemon holds $(fds) descriptors, $before before"
}

@test "a store too many is EMFILE, and says so; nothing committed is lost; once stores go, the session goes on" {
	S=$MNT/big
	mkdir "$MNT/work"
	# One writer's shell, a member all along: it meets the limit, reads why, frees, commits.
	run bash -c "
		exec 9>$MNT/work/lock
		truncate -s 4096 $MNT/work/allocs/first || exit 10
		for i in \$(seq 100); do mkdir $MNT/f\$i 2>$BATS_TEST_TMPDIR/mkdir.err || break; done
		[ \$i -lt 100 ] || exit 11
		echo stores=\$i
		truncate -s 4096 $MNT/work/allocs/second && exit 12
		grep '^last_error:' $MNT/work/state
		for j in \$(seq \$((i - 1))); do rmdir $MNT/f\$j; done
		truncate -s 8192 $MNT/work/allocs/third || exit 13
		echo > $MNT/work/commit || exit 14
		echo committed"
	assert_success
	assert_output --partial 'Too many open files'
	assert_output --regexp 'last_error: .*out of descriptors \(limit 48; .*\): raise its LimitNOFILE'
	assert_line committed
	run cat "$BATS_TEST_TMPDIR/mkdir.err"
	assert_output --partial 'Too many open files'
	assert_equal "$(state_of "$MNT/work" allocations)" 2
	# Committed layouts are whole.
	assert_equal "$(state_of "$S" state)" COMMITTED
	run "$BUILD/gmsfs-example" read "$S"
	assert_output --partial '0 bad words'
}
