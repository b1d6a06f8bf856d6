#!/usr/bin/env bats
# What a writer session shows (gmsfs(5)): its members see the session's layout; anyone
# else sees the last commit, for every operation (lookup, getattr, readdir, getxattr,
# open, read), whichever side asked the kernel first.  Each test holds a session in a
# background shell that removes a committed entry, makes new names and changes a
# committed entry's value and attributes, then checks both views.

load helpers

setup_file() { mount_gmsfs; }
teardown_file() { unmount_gmsfs; }

setup() {
	S=$MNT/s$BATS_TEST_NUMBER
	mkdir "$S"
	bash -ec "
		exec 9>$S/lock
		truncate -s 4096 $S/allocs/a
		echo v1 > $S/meta/gone
		setfattr -n user.gms.alloc -v a $S/meta/gone
		echo k > $S/meta/changed
		setfattr -n user.gms.alloc -v a $S/meta/changed
		echo > $S/commit"
}

# The session's changes, made by a member (the shell that holds lock, or its children).
CHANGE='set -e
	S=$0
	rm $S/meta/gone
	echo new > $S/meta/made
	setfattr -n user.gms.alloc -v a $S/meta/made
	mkdir $S/allocs/dir
	truncate -s 8192 $S/allocs/dir/x
	echo "a longer value" > $S/meta/changed
	setfattr -n user.gms.offset -v 8 $S/meta/changed
	setfattr -n user.gms.size -v 16 $S/meta/changed'

# What a caller sees of the store, one line per operation.
VIEW='S=$0
	echo "meta: $(ls $S/meta | tr "\n" " ")"
	echo "allocs: $(ls $S/allocs | tr "\n" " ")"
	echo "ls -l: $(ls -l $S/meta | awk "NR > 1 {print \$5, \$NF}" | tr "\n" " ")"
	echo "stat gone: $(stat -c %s $S/meta/gone 2>&1 | sed "s/.*: //")"
	echo "stat made: $(stat -c %s $S/meta/made 2>&1 | sed "s/.*: //")"
	echo "stat dir: $(stat -c %F $S/allocs/dir 2>&1 | sed "s/.*: //")"
	echo "changed: $(stat -c %s $S/meta/changed) $(getfattr --only-values -n user.gms.offset $S/meta/changed 2>/dev/null)/$(getfattr --only-values -n user.gms.size $S/meta/changed 2>/dev/null)"
	echo "xattrs: $(getfattr -d --absolute-names $S/meta/changed 2>/dev/null | grep -c user.gms)"'

COMMITTED="meta: changed gone 
allocs: a 
ls -l: 2 changed 3 gone 
stat gone: 3
stat made: No such file or directory
stat dir: No such file or directory
changed: 2 0/
xattrs: 2"

SESSION="meta: changed made 
allocs: a dir 
ls -l: 15 changed 4 made 
stat gone: No such file or directory
stat made: 4
stat dir: directory
changed: 15 8/16
xattrs: 3"

view() { bash -c "$VIEW" "$S"; }

@test "the member sees its session; outside it, every operation shows the last commit" {
	hold w w "$S/lock" "bash -c '$CHANGE' $S; bash -c '$VIEW' $S > $BATS_TEST_TMPDIR/member"
	wait_held w
	assert_equal "$(cat "$BATS_TEST_TMPDIR/w.rc")" 0
	assert_equal "$(cat "$BATS_TEST_TMPDIR/member")" "$SESSION"
	run view
	assert_output "$COMMITTED"
	release w
}

@test "the kernel's cache carries neither view to the other side, whoever asked first" {
	view >/dev/null # this side first: the kernel has the committed names and attributes
	local again=$BATS_TEST_TMPDIR/again
	hold w w "$S/lock" "bash -c '$CHANGE' $S; bash -c '$VIEW' $S > $BATS_TEST_TMPDIR/m; mv $BATS_TEST_TMPDIR/m $BATS_TEST_TMPDIR/member
		while [ ! -e $again ] && [ ! -e $BATS_TEST_TMPDIR/all.go ]; do sleep 0.02; done
		bash -c '$VIEW' $S > $BATS_TEST_TMPDIR/member2"
	wait_until test -s "$BATS_TEST_TMPDIR/member"
	assert_equal "$(cat "$BATS_TEST_TMPDIR/member")" "$SESSION"
	run view # after the member's
	assert_output "$COMMITTED"
	touch "$again" # and the member again, after ours
	wait_held w
	assert_equal "$(cat "$BATS_TEST_TMPDIR/member2")" "$SESSION"
	release w
}

@test "outside the session, open and read wait for it: the committed bytes after a rollback, ENOENT after a commit" {
	hold w w "$S/lock" "bash -c '$CHANGE' $S"
	wait_held w
	# O_NONBLOCK: EAGAIN at once, for a name the session removed and for one it changed.
	run "$OPEN" -r -n "$S/meta/gone"
	assert_output EAGAIN
	run "$OPEN" -r -n "$S/meta/changed"
	assert_output EAGAIN
	# A blocking cat waits; the session ends without commit: it reads the committed value.
	timeout 10 cat "$S/meta/gone" "$S/meta/changed" >"$BATS_TEST_TMPDIR/cat.out" 2>&1 3>&- &
	local cat=$!
	sleep 0.3
	kill -0 "$cat" # still waiting
	release w
	wait "$cat"
	assert_equal "$(cat "$BATS_TEST_TMPDIR/cat.out")" "v1
k"
	# Again, and this time the session commits while cat waits.
	# cat starts once the session holds (before, it could read the old commit at once: a
	# slow start under ASan did); whether it waits for the commit or opens after it, gone is gone.
	hold w w "$S/lock" "bash -c '$CHANGE' $S; sleep 0.6; echo > $S/commit"
	wait_held w
	timeout 10 cat "$S/meta/gone" >"$BATS_TEST_TMPDIR/cat2.out" 2>&1 3>&- &
	cat=$!
	wait "$cat" || true
	run cat "$BATS_TEST_TMPDIR/cat2.out"
	assert_output --partial "No such file or directory"
	release w
}

@test "after a commit both sides see the new layout; after a rollback, the old one" {
	hold w w "$S/lock" "bash -c '$CHANGE' $S; echo > $S/commit"
	wait_held w
	run view
	assert_output "$SESSION"
	release w
	S=$MNT/s$BATS_TEST_NUMBER.b
	mkdir "$S"
	bash -ec "
		exec 9>$S/lock
		truncate -s 4096 $S/allocs/a
		echo v1 > $S/meta/gone
		setfattr -n user.gms.alloc -v a $S/meta/gone
		echo k > $S/meta/changed
		setfattr -n user.gms.alloc -v a $S/meta/changed
		echo > $S/commit"
	hold w w "$S/lock" "bash -c '$CHANGE' $S; bash -c '$VIEW' $S > /dev/null; echo > $S/abort"
	wait_held w
	run view
	assert_output "$COMMITTED"
	release w
	wait_until state_is "$S" COMMITTED
	run view
	assert_output "$COMMITTED"
}

# ---- How a session begins (gmsfs(5), LOCKS: any open for writing, any create) ----

@test "a session begins by any open for writing or create (C): the member's fstat, stat, ftruncate, write, read, mkdir, commit" {
	local way T
	for way in lock-wronly lock-rdwr creat-alloc-rdwr creat-alloc-wronly creat-meta-rdwr creat-meta-wronly; do
		T=$MNT/s$BATS_TEST_NUMBER-$way
		mkdir "$T"
		run "$BUILD/gmsfs-session" "$way" "$T"
		assert_success
		assert_line committed
		assert_equal "$(state_of "$T" generation)" 1
		# Its read handles (the commit's downgrade) go with the kernel's releases, which
		# come after the process has ended: RO until then (a slow daemon's, under valgrind).
		wait_until state_is "$T" COMMITTED
		assert_equal "$(stat -c %s "$T/allocs/d/y")" 8192
	done
	# O_WRONLY of a committed allocation begins the next one.
	T=$MNT/s$BATS_TEST_NUMBER-creat-alloc-rdwr
	run "$BUILD/gmsfs-session" alloc-wronly "$T"
	assert_success
	assert_line committed
	assert_equal "$(state_of "$T" generation)" 2
	assert_equal "$(head -c 5 "$T/allocs/x")" hello
	assert_equal "$(ls "$T/allocs" | tr '\n' ' ')" "d d2 x "
}

@test "a session begins by a shell's open for writing: exec 9>, 9<>, 9>> and > of lock, allocs/ and meta/ files" {
	local how T f
	for how in "9>lock" "9<>lock" "9>allocs/x" "9<>allocs/x" "9>meta/e" "9>>meta/e"; do
		T=$MNT/s$BATS_TEST_NUMBER-$(echo "$how" | tr -c 'a-z0-9\n' -)
		mkdir "$T"
		f=${how##*>}
		run bash -ec "
			cd $T
			exec $how
			stat -c %s $f >/dev/null                # the member's getattr of what it opened
			truncate -s 8192 allocs/x               # made, or sized, in the session
			printf hello | dd of=allocs/x conv=notrunc status=none
			test \"\$(head -c 5 allocs/x)\" = hello
			mkdir allocs/d meta/d
			echo '{\"v\": 1}' > meta/d/w
			test \"\$(cat meta/d/w)\" = '{\"v\": 1}'
			echo v >> meta/e
			setfattr -n user.gms.alloc -v x meta/e
			setfattr -n user.gms.alloc -v x meta/d/w
			echo > commit
			echo committed"
		assert_success
		assert_output committed
		assert_equal "$(state_of "$T" state)" COMMITTED
		assert_equal "$(cat "$T/meta/d/w")" '{"v": 1}'
	done
}

@test "a lone command's session (truncate, echo >) begins and ends with it: rolled back, and the next command may begin one" {
	local T=$MNT/s$BATS_TEST_NUMBER.t
	mkdir "$T"
	run truncate -s 4096 "$T/allocs/y" # its own session: the open creates, the ftruncate sizes
	assert_success
	wait_until state_is "$T" EMPTY # the session ended with truncate, without commit
	assert_equal "$(ls "$T/allocs")" ""
	run bash -c "echo v > $T/meta/e"
	assert_success
	wait_until state_is "$T" EMPTY
	# In a committed store (setup's S), a new allocation without lock first: the same.
	run truncate -s 4096 "$S/allocs/new"
	assert_success
	wait_until state_is "$S" COMMITTED
	run ls "$S/allocs"
	assert_output a
	# Writing an existing allocation begins one too.  Its bytes are written in place, which
	# a rollback cannot undo: the store is TORN, no reader reads them as the last commit,
	# until a session commits them (gmsfs(5), Abort).
	printf XY | dd of="$S/allocs/a" conv=notrunc status=none
	wait_until state_is "$S" TORN
	run head -c 2 "$S/allocs/a"
	assert_failure
	assert_output --partial "Structure needs cleaning"
	grep -q "^last_error: writer left without commit: TORN: it wrote into generation 1's bytes in place" "$S/state"
	bash -ec "exec 9>$S/lock; echo > $S/commit"
	assert_equal "$(state_of "$S" state)" COMMITTED
	assert_equal "$(head -c 2 "$S/allocs/a")" XY
	# A change of the namespace is no open: outside a session it fails (EROFS) and begins none.
	run mkdir "$S/allocs/d"
	assert_failure
	assert_output --partial "Read-only file system"
	assert_equal "$(state_of "$S" state)" COMMITTED
}

@test "a data-only session (exec 9>>lock, GMS's RW_DATA) writes the committed bytes and changes no layout; its commit keeps the hash" {
	local hash gen
	hash=$(cat "$S/layout_hash")
	gen=$(state_of "$S" generation)
	run bash -c "
		exec 9>>$S/lock
		test \"\$(sed -n 's/^data_only: //p' $S/state)\" = 1 || exit 9
		truncate -s 4096 $S/allocs/new && exit 1
		truncate -s 8192 $S/allocs/a && exit 2
		rm $S/allocs/a && exit 3
		mkdir $S/meta/d && exit 4
		echo v2 > $S/meta/gone && exit 5
		setfattr -n user.gms.tag -v t $S/allocs/a && exit 6
		printf XY | dd of=$S/allocs/a conv=notrunc status=none || exit 7
		echo > $S/commit || exit 8
		echo committed"
	assert_success
	assert_output --partial committed
	assert_output --partial "Operation not permitted"
	assert_equal "$(state_of "$S" state)" COMMITTED
	assert_equal "$(state_of "$S" generation)" $((gen + 1))
	assert_equal "$(cat "$S/generation")" $((gen + 1)) # what a script watches
	assert_equal "$(cat "$S/layout_hash")" "$hash"
	assert_equal "$(head -c 2 "$S/allocs/a")" XY
	assert_equal "$(cat "$S/meta/gone")" v1
	[ ! -e "$S/allocs/new" ]
	# Killed after writing in place: TORN, as any session that wrote the committed bytes.
	run bash -c "exec 9>>$S/lock; printf ZZ | dd of=$S/allocs/a conv=notrunc status=none; kill -9 \$\$"
	wait_until state_is "$S" TORN
	run head -c 2 "$S/allocs/a"
	assert_failure
	assert_output --partial "Structure needs cleaning"
	bash -ec "exec 9>>$S/lock; echo > $S/commit" # a data-only commit heals it
	assert_equal "$(state_of "$S" state)" COMMITTED
	assert_equal "$(cat "$S/layout_hash")" "$hash"
}

@test "an outside reader that waited while a session removed and wrote an entry again reads the commit's value" {
	echo '{"v":1}' >"$BATS_TEST_TMPDIR/want"
	local i
	for i in 1 2 3 4 5; do
		hold w w "$S/lock" "rm -f $S/meta/gone; sleep 0.4; echo '{\"v\":$i}' > $S/meta/gone; setfattr -n user.gms.alloc -v a $S/meta/gone; echo > $S/commit"
		sleep 0.1
		run timeout 10 cat "$S/meta/gone" # waits for the session: the name is committed again
		assert_success
		assert_output "{\"v\":$i}"
		release w
	done
	# and a name the commit removed is gone (ENOENT), as a fresh lookup says
	hold w w "$S/lock" "rm -f $S/meta/gone; sleep 0.4; echo > $S/commit"
	sleep 0.1
	run timeout 10 cat "$S/meta/gone"
	assert_failure
	assert_output --partial "No such file or directory"
	release w
	# A writer right after: the reader's retry held no lock past its read.
	run timeout 10 bash -c "exec 9>$S/lock; echo > $S/abort"
	assert_success
}
