#!/usr/bin/env bats
# Waiting opens hold no worker thread; a session's orphans stay members; a process that
# closed its handles is not taken for their holder.  The daemon runs with 4 worker threads.

load helpers

STORM=$BUILD/gmsfs-storm

setup_file() {
	mount_gmsfs -o max_threads=4
	mkdir "$MNT/s"
	bash -ec "exec 9>$MNT/s/lock; truncate -s 4096 $MNT/s/allocs/a; echo > $MNT/s/commit"
}
teardown_file() { unmount_gmsfs; }

@test "with 4 worker threads, 100 opens wait behind a writer while state, ls and other stores answer; all get in" {
	S=$MNT/s
	hold w w "$S/lock"
	wait_held w
	local pids=() i
	for i in $(seq 100); do
		"$OPEN" -r "$S/allocs/a" >"$BATS_TEST_TMPDIR/r$i.out" 3>&- &
		pids+=($!)
	done
	wait_until grep -q '^waiting_readers: 100$' "$S/state"
	run timeout 2 cat "$S/state"
	assert_success
	run timeout 2 ls -l "$S/allocs"
	assert_success
	run timeout 2 mkdir "$MNT/other"
	assert_success
	run timeout 2 bash -c "exec 9>$MNT/other/lock; truncate -s 10 $MNT/other/allocs/x; echo > $MNT/other/commit"
	assert_success
	release w
	for i in "${!pids[@]}"; do wait "${pids[$i]}"; done
	run cat "$BATS_TEST_TMPDIR"/r*.out
	assert_equal "$(grep -c '^ok$' <<<"$output")" 100
	wait_until state_is "$S" COMMITTED
	rmdir "$MNT/other"
}

@test "a lock ioctl that waits holds no thread either, and its timeout lets the readers it held back in" {
	S=$MNT/s
	hold r r "$S/lock"
	wait_held r
	"$BUILD/gmsfs-probe" ioctl "$S" lock mode=2 timeout=1500 >"$BATS_TEST_TMPDIR/w.out" 3>&- &
	local w=$!
	wait_until grep -q '^waiting_writers: 1$' "$S/state"
	"$OPEN" -r "$S/lock" >"$BATS_TEST_TMPDIR/late.out" 3>&- &
	local late=$!
	wait_until grep -q '^waiting_readers: 1$' "$S/state"
	run timeout 2 cat "$S/state"
	assert_success
	wait "$w" || true
	assert_equal "$(cat "$BATS_TEST_TMPDIR/w.out")" ETIMEDOUT
	wait "$late"
	assert_equal "$(cat "$BATS_TEST_TMPDIR/late.out")" ok
	release r
}

@test "a child its leader left behind stays a member: its write succeeds, the session ends when it exits" {
	S=$MNT/s
	local rc=$BATS_TEST_TMPDIR/orphan.rc
	# The issue's case: the shell exits at once; its subshell writes half a second later.
	bash -c "exec 9>'$S/lock'; ( sleep 0.5; echo v > '$S/meta/k'; echo \$? > '$rc' ) 3>&- & exit 0"
	assert_equal "$(state_of "$S" state)" RW
	# A reader that waits meanwhile gets in once the orphan is done.
	"$OPEN" -r "$S/lock" >"$BATS_TEST_TMPDIR/reader.out" 3>&- &
	local reader=$!
	wait_until test -s "$rc"
	assert_equal "$(cat "$rc")" 0
	wait "$reader"
	assert_equal "$(cat "$BATS_TEST_TMPDIR/reader.out")" ok
	wait_until state_is "$S" COMMITTED
	[ ! -e "$S/meta/k" ] # never committed: rolled back
}

@test "a process that closed its read handle opens for writing at once: no EDEADLK in 2000 tries" {
	run "$STORM" reopen "$MNT/s" 2000
	assert_success
	assert_output --partial 'edeadlk=0 stuck=0 unexpected=0'
}

@test "64 processes open, write, commit, abort and close for 5 s: no EDEADLK, nothing stuck, never a writer with readers" {
	run timeout 60 "$STORM" opens "$MNT/s" 64 5
	assert_success
	assert_output --regexp 'ops=[0-9]+ edeadlk=0 stuck=0 unexpected=0 violations=0'
	wait_until state_is "$MNT/s" COMMITTED
}

@test "1000 random sequences (300 under valgrind) of opens in every mode, timed lock ioctls, commits, aborts and kills: nobody ever waits for a lock it could have" {
	# gmsfs(5), "Waiting": after each step the store's state is read until the rule holds;
	# a RW_OR_RO waiter that stayed counted as a writer after a commit broke it.  Under
	# valgrind (GMSFS_WRAP) 1000 took 260-270 s of a two-core machine's check: 300 there,
	# for its memory checks; the plain and asan runs keep 1000 for the rule.
	local n=1000
	[[ ${GMSFS_WRAP:-} == valgrind* ]] && n=300
	run timeout 600 "$PYTHON" "$ROOT/tests/helpers/lockfuzz.py" "$MNT" "$n" "$(date +%s)"
	echo "$output"
	assert_success
}
