#!/usr/bin/env bats
# A writer killed mid-session and a writer that aborts: the store is exactly its last commit.

load helpers

setup_file() {
	mount_gmsfs
	mkdir "$MNT/s"
	bash -ec "
		exec 9>$MNT/s/lock
		mkdir -p $MNT/s/allocs/w $MNT/s/meta/cfg
		truncate -s 65536 $MNT/s/allocs/w/a
		printf 'committed bytes' | dd of=$MNT/s/allocs/w/a conv=notrunc status=none
		truncate -s 4096 $MNT/s/allocs/w/b
		echo -n v1 > $MNT/s/meta/cfg/k
		setfattr -n user.gms.alloc -v w/a $MNT/s/meta/cfg/k
		echo > $MNT/s/commit"
}
teardown_file() { unmount_gmsfs; }

listing() { # what needs no lock: listing, sizes, xattrs
	(cd "$1" && ls -lR allocs meta | grep -v '^total' | awk '{print $1, $5, $NF}' && getfattr -R -d --absolute-names allocs meta 2>/dev/null)
}

snapshot() { # listing, hash, bytes and values of store $1
	(cd "$1" && ls -lR allocs meta | grep -v '^total' | awk '{print $1, $5, $NF}' && cat layout_hash &&
		head -c 15 allocs/w/a && echo && cat meta/cfg/k && getfattr -R -d --absolute-names allocs meta 2>/dev/null)
}

# A session that changes everything: new, removed and changed allocations and entries.
MESS='set -e
	S=$0
	mkdir -p $S/allocs/new/deep $S/meta/new
	truncate -s 1048576 $S/allocs/new/deep/big
	truncate -s 2097152 $S/allocs/new/other
	rm $S/allocs/w/b
	setfattr -n user.gms.tag -v changed $S/allocs/w/a
	echo -n v2 > $S/meta/cfg/k
	echo -n x > $S/meta/new/e
	setfattr -n user.gms.alloc -v new/other $S/meta/new/e'

@test "a writer killed with SIGKILL mid-session: the last committed layout, memory freed" {
	S=$MNT/s
	local before used
	before=$(snapshot "$S")
	before_listing=$(listing "$S")
	used=$(used_bytes)
	hold w w "$S/lock" "bash -c '$MESS' $S"
	wait_held w
	assert_equal "$(cat "$BATS_TEST_TMPDIR/w.rc")" 0
	[ "$(used_bytes)" -ge $((used + 3145728)) ] || fail "the session's memory was not counted"
	# From outside the session (this shell), the store is still its last commit.
	assert_equal "$(listing "$S")" "$before_listing"
	kill -9 "$w_pid"
	wait "$w_pid" || true
	wait_until state_is "$S" COMMITTED
	assert_equal "$(snapshot "$S")" "$before"
	assert_equal "$(used_bytes)" "$used"
	run state_of "$S" last_error
	assert_output --partial 'rolled back'
}

@test "a writer that writes abort: back to the last commit, session kept, removed handles answer ESTALE" {
	S=$MNT/s
	local before used
	before=$(snapshot "$S")
	before_listing=$(listing "$S")
	used=$(used_bytes)
	hold w w "$S/lock" "
		bash -c '$MESS' $S || exit 9
		exec 7<>$S/allocs/new/other
		echo > $S/abort || exit 10
		grep -q '^state: RW' $S/state || exit 11
		printf x >&7 2>$BATS_TEST_TMPDIR/stale && exit 12
		grep -q 'Stale file handle' $BATS_TEST_TMPDIR/stale || exit 13
		exec 7>&-
		[ ! -e $S/allocs/new ] || exit 14"
	wait_held w
	assert_equal "$(cat "$BATS_TEST_TMPDIR/w.rc")" 0
	assert_equal "$(listing "$S")" "$before_listing"
	assert_equal "$(used_bytes)" "$used"
	assert_equal "$(state_of "$S" state)" RW
	# Nobody slipped in while the aborted session stayed open.
	run "$OPEN" -n -w "$S/lock"
	assert_output EAGAIN
	release w
	wait_until state_is "$S" COMMITTED
	assert_equal "$(snapshot "$S")" "$before"
}

@test "a store never committed goes back to EMPTY and frees everything" {
	mkdir "$MNT/fresh"
	local used
	used=$(used_bytes)
	hold w w "$MNT/fresh/lock" "set -e; mkdir $MNT/fresh/allocs/x; truncate -s 1048576 $MNT/fresh/allocs/x/y; echo -n z > $MNT/fresh/meta/z"
	wait_held w
	[ "$(used_bytes)" -gt "$used" ]
	release w
	wait_until state_is "$MNT/fresh" EMPTY
	assert_equal "$(ls -A "$MNT/fresh/allocs" "$MNT/fresh/meta" | grep -v '^$' | grep -v ':$' | wc -l)" 0
	assert_equal "$(used_bytes)" "$used"
	assert_equal "$(cat "$MNT/fresh/layout_hash")" ""
}

@test "a new writer starts from the committed layout" {
	S=$MNT/s
	hold w w "$S/lock" "set -e; [ -e $S/allocs/w/a ]; [ \"\$(cat $S/meta/cfg/k)\" = v1 ]; head -c 15 $S/allocs/w/a | grep -q 'committed bytes'"
	wait_held w
	assert_equal "$(cat "$BATS_TEST_TMPDIR/w.rc")" 0
	release w
}

@test "a session whose one change is a removexattr: abort puts the attribute back" {
	S=$MNT/s
	local before
	before=$(snapshot "$S")
	for name in user.gms.alloc user.gms.offset; do
		bash -ec "
			exec 9>$S/lock
			setfattr -n user.gms.offset -v 16 $S/meta/cfg/k
			echo > $S/commit"
		before=$(snapshot "$S")
		bash -ec "
			exec 9>$S/lock
			setfattr -x $name $S/meta/cfg/k
			getfattr -n $name $S/meta/cfg/k 2>&1 | grep -q 'No such attribute' || [ $name = user.gms.offset ]
			echo > $S/abort"
		assert_equal "$(snapshot "$S")" "$before"
		assert_equal "$(getfattr --only-values -n user.gms.alloc "$S/meta/cfg/k")" w/a
		assert_equal "$(getfattr --only-values -n user.gms.offset "$S/meta/cfg/k")" 16
	done
}

@test "history: each session's start and end in order, with its writer's pid and the generation after it" {
	S=$MNT/hist
	mkdir "$S"
	bash -c "exec 9>$S/lock; echo > $S/commit"  # rw_connected, committed
	bash -c "exec 9>$S/lock; echo > $S/abort"   # rw_connected, aborted; then its end: left
	hold w w "$S/lock"                           # rw_connected; killed: left
	wait_held w
	kill -9 "$w_pid"
	wait "$w_pid" || true
	wait_until state_is "$S" COMMITTED
	# A data-only writer that writes into the committed bytes in place and dies: torn.
	bash -c "exec 9>$S/lock; truncate -s 4096 $S/allocs/a; echo > $S/commit"
	bash -c "exec 9>>$S/lock; printf x | dd of=$S/allocs/a conv=notrunc status=none"
	bash -c "exec 9>$S/lock; echo > $S/commit"  # a writer commits it whole again
	run awk '{print $1, $3, $5}' "$S/history"
	assert_output "1 rw_connected 0
2 committed 1
3 rw_connected 1
4 aborted 1
5 left 1
6 rw_connected 1
7 left 1
8 rw_connected 1
9 committed 2
10 data_connected 2
11 torn 2
12 rw_connected 2
13 committed 3"
	assert_equal "$(awk 'NR == 6 {print $4}' "$S/history")" "$w_pid"
	# Times never go back, and are this machine's clock now.
	awk -v now="$(date +%s)" 'prev > $2 || $2 < now - 60 || $2 > now + 60 {exit 1} {prev = $2}' "$S/history"
	# Reading it changes nothing: no lock, no session.
	assert_equal "$(state_of "$S" readers) $(state_of "$S" writer)" "0 0"
}

@test "history keeps a store's last 64 events, numbered on" {
	S=$MNT/hist64
	mkdir "$S"
	for _ in $(seq 40); do bash -c "exec 9>$S/lock; echo > $S/commit"; done
	assert_equal "$(wc -l < "$S/history")" 64
	assert_equal "$(head -n1 "$S/history" | cut -d' ' -f1) $(tail -n1 "$S/history" | cut -d' ' -f1)" "17 80"
	assert_equal "$(tail -n1 "$S/history" | cut -d' ' -f3,5)" "committed 40"
}
