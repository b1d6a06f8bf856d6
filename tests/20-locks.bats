#!/usr/bin/env bats
# Single writer, many readers, writers first; commit downgrades; outsiders change nothing.

load helpers

setup_file() {
	mount_gmsfs
	# A committed store to fight over.
	mkdir "$MNT/s"
	bash -ec "exec 9>$MNT/s/lock; truncate -s 4096 $MNT/s/allocs/a; echo > $MNT/s/commit"
}
teardown_file() { unmount_gmsfs; }

@test "while a writer holds: readers wait or get EAGAIN, status answers at once, outsiders get EBUSY" {
	S=$MNT/s
	hold w w "$S/lock"
	wait_held w
	assert_equal "$(state_of "$S" state)" RW
	run "$OPEN" -n -r "$S/lock"
	assert_output EAGAIN
	run "$OPEN" -n -r "$S/allocs/a"
	assert_output EAGAIN
	"$OPEN" -r "$S/lock" >"$BATS_TEST_TMPDIR/reader.out" 3>&- &
	local reader=$!
	wait_until grep -q '^waiting_readers: 1' "$S/state"
	run cat "$BATS_TEST_TMPDIR/reader.out"
	assert_output ""
	# Listing and status never take the lock.
	run timeout 2 ls -lR "$S"
	assert_success
	run timeout 2 cat "$S/layout_hash"
	assert_output --regexp '^[0-9a-f]{32}$'
	# An outsider (not a descendant of the writer) changes nothing.
	local before
	before=$(ls -R "$S/allocs")
	run "$OPEN" -truncate 100 "$S/allocs/b"
	assert_output ENOENT
	run mkdir "$S/allocs/d"
	assert_failure
	assert_output --partial 'Device or resource busy'
	run rm "$S/allocs/a"
	assert_output --partial 'Device or resource busy'
	run setfattr -n user.gms.tag -v x "$S/allocs/a"
	assert_output --partial 'Device or resource busy'
	run "$OPEN" -truncate 8192 "$S/allocs/a"
	assert_output EBUSY
	run truncate -s 8192 "$S/allocs/a" # coreutils opens with O_NONBLOCK: the lock says EAGAIN
	assert_failure
	assert_equal "$(ls -R "$S/allocs")" "$before"
	assert_equal "$(stat -c %s "$S/allocs/a")" 4096
	release w
	wait "$reader"
	assert_equal "$(cat "$BATS_TEST_TMPDIR/reader.out")" ok
	wait_until state_is "$S" COMMITTED
}

@test "children of the writer's shell are members of its session" {
	S=$MNT/s
	hold w w "$S/lock" "set -e; mkdir $S/allocs/kid; truncate -s 10 $S/allocs/kid/x; bash -c 'rm $S/allocs/kid/x; rmdir $S/allocs/kid'; echo > $S/abort"
	wait_held w
	assert_equal "$(cat "$BATS_TEST_TMPDIR/w.rc")" 0
	release w
}

@test "while readers hold: a writer waits, new readers queue behind it, the last reader lets it in" {
	S=$MNT/s
	hold r1 r "$S/lock"
	hold r2 r "$S/allocs/a"
	wait_held r1
	wait_held r2
	assert_equal "$(state_of "$S" state)" RO
	assert_equal "$(state_of "$S" readers)" 2
	run "$OPEN" -n -w "$S/lock"
	assert_output EAGAIN
	"$OPEN" -w -hold 1 "$S/lock" >"$BATS_TEST_TMPDIR/writer.out" 3>&- &
	local writer=$!
	wait_until grep -q '^waiting_writers: 1' "$S/state"
	# Writers first: a new reader waits although only readers hold the store.
	run "$OPEN" -n -r "$S/lock"
	assert_output EAGAIN
	"$OPEN" -r "$S/lock" >"$BATS_TEST_TMPDIR/late.out" 3>&- &
	local late=$!
	wait_until grep -q '^waiting_readers: 1' "$S/state"
	release r1
	sleep 0.2
	assert_equal "$(cat "$BATS_TEST_TMPDIR/writer.out")" ""
	release r2
	wait_until grep -q ok "$BATS_TEST_TMPDIR/writer.out"
	assert_equal "$(cat "$BATS_TEST_TMPDIR/late.out")" ""
	wait "$writer"
	wait "$late"
	assert_equal "$(cat "$BATS_TEST_TMPDIR/late.out")" ok
}

@test "a reader's own further reads pass a waiting writer; its write open is EDEADLK" {
	S=$MNT/s
	# One shell process (redirections are the shell's own opens) holds a read lock.
	timeout 20 bash -c "
		exec 8<$S/lock
		touch $BATS_TEST_TMPDIR/in
		while ! grep -q '^waiting_writers: 1' $S/state; do sleep 0.02; done
		exec 7<$S/allocs/a && echo nested-read-ok
		grep -q '^readers: 1$' $S/state && echo one-reader-two-handles
		exec 6>$S/allocs/b
	" >"$BATS_TEST_TMPDIR/reader.out" 2>&1 3>&- &
	local reader=$!
	wait_until test -e "$BATS_TEST_TMPDIR/in"
	"$OPEN" -w -hold 1 "$S/lock" >"$BATS_TEST_TMPDIR/writer.out" 3>&- &
	local writer=$!
	local rc=0
	wait "$reader" || rc=$?
	assert_equal "$rc" 1
	run cat "$BATS_TEST_TMPDIR/reader.out"
	assert_line --index 0 nested-read-ok
	assert_line --index 1 one-reader-two-handles
	assert_output --partial 'Resource deadlock avoided'
	wait_until grep -q ok "$BATS_TEST_TMPDIR/writer.out"
	wait "$writer"
	wait_until state_is "$S" COMMITTED
	[ ! -e "$S/allocs/b" ]
}

@test "open(lock, O_RDWR) is RW on an empty store and RO on a committed one" {
	mkdir "$MNT/e"
	hold x rw "$MNT/e/lock"
	wait_held x
	assert_equal "$(state_of "$MNT/e" state)" RW
	release x
	wait_until state_is "$MNT/e" EMPTY
	hold y rw "$MNT/s/lock"
	wait_held y
	assert_equal "$(state_of "$MNT/s" state)" RO
	release y
}

@test "a waiting open ends with EINTR on a signal" {
	S=$MNT/s
	hold w w "$S/lock"
	wait_held w
	"$OPEN" -r "$S/lock" >"$BATS_TEST_TMPDIR/intr.out" 3>&- &
	local pid=$!
	wait_until grep -q '^waiting_readers: 1' "$S/state"
	kill -USR1 "$pid"
	wait "$pid" || true
	assert_equal "$(cat "$BATS_TEST_TMPDIR/intr.out")" EINTR
	wait_until grep -q '^waiting_readers: 0' "$S/state"
	release w
}

@test "commit downgrades: the writer's handles are read handles, writes through them fail with EROFS" {
	S=$MNT/s
	wait_until state_is "$S" COMMITTED
	hold w w "$S/lock" "
		exec 8<>$S/allocs/a
		echo > $S/commit
		grep -q '^state: RO' $S/state || exit 10
		grep -q '^readers: 2' $S/state || exit 11
		printf x >&8 2>/dev/null && exit 12
		printf x 2>&1 >&8 | grep -q 'Read-only file system' || exit 13
		exit 0"
	wait_held w
	assert_equal "$(cat "$BATS_TEST_TMPDIR/w.rc")" 0
	assert_equal "$(state_of "$S" state)" RO
	assert_equal "$(state_of "$S" readers)" 1
	# No writer slips in between commit and close.
	run "$OPEN" -n -w "$S/lock"
	assert_output EAGAIN
	release w
	wait_until state_is "$S" COMMITTED
}

@test "commit refuses a bad entry (offset, allocation, extent) with EINVAL, names it, and the session goes on" {
	S=$MNT/s
	hold w w "$S/lock" "
		echo -n v > $S/meta/bad
		setfattr -n user.gms.alloc -v a $S/meta/bad
		setfattr -n user.gms.offset -v 4096 $S/meta/bad
		echo > $S/commit 2>$BATS_TEST_TMPDIR/err1 && exit 10
		grep -q 'Invalid argument' $BATS_TEST_TMPDIR/err1 || exit 11
		grep '^last_error:' $S/state > $BATS_TEST_TMPDIR/last1
		setfattr -n user.gms.alloc -v missing $S/meta/bad
		setfattr -n user.gms.offset -v 0 $S/meta/bad
		echo > $S/commit 2>/dev/null && exit 12
		grep '^last_error:' $S/state > $BATS_TEST_TMPDIR/last2
		grep -q '^state: RW' $S/state || exit 13
		setfattr -n user.gms.alloc -v a $S/meta/bad
		setfattr -n user.gms.offset -v 4000 $S/meta/bad
		setfattr -n user.gms.size -v 97 $S/meta/bad
		echo > $S/commit 2>/dev/null && exit 14
		grep '^last_error:' $S/state > $BATS_TEST_TMPDIR/last3
		setfattr -n user.gms.size -v 96 $S/meta/bad
		echo > $S/commit || exit 15"
	wait_held w
	assert_equal "$(cat "$BATS_TEST_TMPDIR/w.rc")" 0
	run cat "$BATS_TEST_TMPDIR/last1"
	assert_output --partial 'meta/bad'
	assert_output --partial 'past the end'
	run cat "$BATS_TEST_TMPDIR/last2"
	assert_output --partial "'missing' does not exist"
	# An extent (user.gms.size) must end inside its allocation, as Triton checks offset + byte_size.
	run cat "$BATS_TEST_TMPDIR/last3"
	assert_output "last_error: commit: meta/bad: offset 4000 + size 97 passes the end of 'a' (size 4096)"
	release w
	wait_until state_is "$S" COMMITTED
	assert_equal "$(getfattr --absolute-names --only-values -n user.gms.offset "$S/meta/bad")" 4000
	assert_equal "$(getfattr --absolute-names --only-values -n user.gms.size "$S/meta/bad")" 96
}

@test "commit and abort by a process outside the session are refused" {
	S=$MNT/s
	run bash -c "echo > $S/commit"
	assert_failure
	assert_output --partial 'Operation not permitted'
	run bash -c "echo > $S/abort"
	assert_output --partial 'Operation not permitted'
	run bash -c "echo x > $S/state"
	assert_failure
}

@test "poll on state sleeps until the state changes" {
	S=$MNT/s
	run "$OPEN" -poll 300 "$S/state"
	assert_output "$(printf 'ready\ntimeout')"
	"$OPEN" -poll 5000 "$S/state" >"$BATS_TEST_TMPDIR/poll.out" 3>&- &
	local pid=$!
	wait_until grep -q ready "$BATS_TEST_TMPDIR/poll.out"
	sleep 0.2
	assert_equal "$(cat "$BATS_TEST_TMPDIR/poll.out")" ready
	hold r r "$S/lock"
	wait_held r
	wait "$pid"
	assert_equal "$(cat "$BATS_TEST_TMPDIR/poll.out")" "$(printf 'ready\nchanged')"
	release r
}
