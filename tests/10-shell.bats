#!/usr/bin/env bats
# A shell script publishes a layout; plain tools read it back; the hash is recomputable.

load helpers

setup_file() { mount_gmsfs; }
teardown_file() { unmount_gmsfs; }

# The layout of gmsfs(5)'s test vector, built by a shell script in the given order.
build_vector() {
	local s=$1 order=$2
	mkdir "$s"
	(
		set -e
		exec 9>"$s/lock"
		if [ "$order" = 1 ]; then
			mkdir -p "$s/meta/cfg" "$s/allocs/w"
			echo -n hello >"$s/meta/cfg/k"
			setfattr -n user.gms.alloc -v w/a "$s/meta/cfg/k"
			setfattr -n user.gms.private -v 1 "$s/meta/cfg/k"
			setfattr -n user.gms.offset -v 16 "$s/meta/cfg/k"
			setfattr -n user.gms.size -v 64 "$s/meta/cfg/k"
			truncate -s 100 "$s/allocs/w/b"
			truncate -s 4096 "$s/allocs/w/a"
		else
			mkdir -p "$s/allocs/w"
			truncate -s 4096 "$s/allocs/w/a"
			truncate -s 100 "$s/allocs/w/b"
			mkdir -p "$s/meta/cfg"
			echo -n hello >"$s/meta/cfg/k"
			setfattr -n user.gms.size -v 64 "$s/meta/cfg/k"
			setfattr -n user.gms.offset -v 16 "$s/meta/cfg/k"
			setfattr -n user.gms.alloc -v w/a "$s/meta/cfg/k"
			setfattr -n user.gms.private -v 1 "$s/meta/cfg/k"
		fi
		setfattr -n user.gms.tag -v weights "$s/allocs/w/a"
		echo >"$s/commit"
	)
}

@test "a shell script takes the lock, builds, writes and commits" {
	S=$MNT/model
	mkdir "$S"
	run bash -ec "
		exec 9>'$S/lock'
		mkdir -p '$S/allocs/layers/0' '$S/meta/layers/0'
		truncate -s 1048576 '$S/allocs/layers/0/weight'
		truncate -s 4096 '$S/allocs/layers/0/bias'
		head -c 1048576 /dev/urandom > '$BATS_TEST_TMPDIR/weight'
		dd if='$BATS_TEST_TMPDIR/weight' of='$S/allocs/layers/0/weight' bs=64k conv=notrunc status=none
		echo 'fp16 [1024,512]' > '$S/meta/layers/0/weight'
		setfattr -n user.gms.alloc -v layers/0/weight '$S/meta/layers/0/weight'
		setfattr -n user.gms.offset -v 0 '$S/meta/layers/0/weight'
		setfattr -n user.gms.tag -v weights '$S/allocs/layers/0/weight'
		grep -q '^state: RW' '$S/state'
		echo > '$S/commit'
	"
	assert_success
	wait_until state_is "$S" COMMITTED # the shell's close of its lock reaches the daemon after it ends
	run cat "$S/layout_hash"
	assert_output --regexp '^[0-9a-f]{32}$'
	assert_equal "$(cat "$S/meta/layers/0/weight")" 'fp16 [1024,512]'
	run getfattr --absolute-names -d "$S/meta/layers/0/weight"
	assert_line 'user.gms.alloc="layers/0/weight"'
	assert_line 'user.gms.offset="0"'
	run getfattr --absolute-names -n user.gms.tag --only-values "$S/allocs/layers/0/weight"
	assert_output weights
	# Another process (this shell's cmp) reads the bytes back under a read lock.
	run cmp "$BATS_TEST_TMPDIR/weight" "$S/allocs/layers/0/weight"
	assert_success
	assert_equal "$(stat -c %s "$S/allocs/layers/0/bias")" 4096
	assert_equal "$(state_of "$S" allocations)" 2
	assert_equal "$(state_of "$S" entries)" 1
}

@test "the hash is the documented encoding: xxhsum -H2 recomputes the test vector" {
	build_vector "$MNT/vec0" 0
	assert_equal "$(cat "$MNT/vec0/layout_hash")" bbef1f4b892576134837a2dbf79ceecd
	# Recompute it with the printf + xxhsum recipe of gmsfs(5), taken from the page itself
	# (roff writes a backslash as \e and a minus as \-).
	sed -n '/^{ printf .GMSFSLH2/,/xxhsum/p' "$ROOT/man/gmsfs.5" | sed 's/\\e/\\/g; s/\\-/-/g' >"$BATS_TEST_TMPDIR/recipe"
	assert [ -s "$BATS_TEST_TMPDIR/recipe" ]
	run bash "$BATS_TEST_TMPDIR/recipe"
	assert_output --partial "$(cat "$MNT/vec0/layout_hash")"
}

@test "the same layout built in another order gives the same hash" {
	build_vector "$MNT/vec1" 1
	assert_equal "$(cat "$MNT/vec1/layout_hash")" "$(cat "$MNT/vec0/layout_hash")"
}

@test "changing any size, path, tag, key, offset, extent, flag or value changes the hash" {
	local base
	base=$(cat "$MNT/vec0/layout_hash")
	# Each change on a fresh copy of the vector.
	local -a changes=(
		"rm \$S/allocs/w/b; truncate -s 101 \$S/allocs/w/b"
		"mkdir \$S/allocs/v; truncate -s 100 \$S/allocs/v/b; rm \$S/allocs/w/b"
		"setfattr -n user.gms.tag -v other \$S/allocs/w/b"
		"echo -n hello > \$S/meta/cfg/k2; setfattr -n user.gms.alloc -v w/a \$S/meta/cfg/k2; setfattr -n user.gms.offset -v 16 \$S/meta/cfg/k2; rm \$S/meta/cfg/k"
		"setfattr -n user.gms.offset -v 17 \$S/meta/cfg/k"
		"echo -n hellO > \$S/meta/cfg/k"
		"setfattr -n user.gms.alloc -v w/b \$S/meta/cfg/k"
		"setfattr -n user.gms.size -v 63 \$S/meta/cfg/k"
		"setfattr -n user.gms.private -v 0 \$S/meta/cfg/k"
	)
	for i in "${!changes[@]}"; do
		S=$MNT/change$i
		build_vector "$S" 0
		assert_equal "$(cat "$S/layout_hash")" "$base"
		run bash -ec "S=$S; exec 9>\$S/lock; ${changes[$i]}; echo > \$S/commit"
		assert_success
		[ "$(cat "$S/layout_hash")" != "$base" ] || fail "change $i (${changes[$i]}) did not move the hash"
	done
}

@test "a note (user.gms.note) is left out of the hash: added, changed or removed, the hash stays" {
	base=bbef1f4b892576134837a2dbf79ceecd
	S=$MNT/noted
	build_vector "$S" 0
	assert_equal "$(cat "$S/layout_hash")" "$base"
	run bash -ec "S=$S; exec 9>\$S/lock
		echo -n token-1 > \$S/meta/ids
		setfattr -n user.gms.alloc -v w/b \$S/meta/ids
		setfattr -n user.gms.note -v 1 \$S/meta/ids
		echo > \$S/commit"
	assert_success
	assert_equal "$(cat "$S/layout_hash")" "$base"
	assert_equal "$(getfattr --only-values -n user.gms.note "$S/meta/ids")" 1
	getfattr -d "$S/meta/ids" | grep -q '^user.gms.note="1"'
	run bash -ec "S=$S; exec 9>\$S/lock; echo -n token-2 > \$S/meta/ids; echo > \$S/commit"
	assert_equal "$(cat "$S/layout_hash")" "$base"
	run setfattr -n user.gms.note -v 2 "$S/meta/ids" # outside a session, and a bad value
	assert_failure
	run bash -ec "S=$S; exec 9>\$S/lock; setfattr -x user.gms.note \$S/meta/ids; echo > \$S/commit"
	assert_success
	[ "$(cat "$S/layout_hash")" != "$base" ] || fail "the same entry, no longer a note, left the hash as it was"
}

@test "content_hash: unknown until gmsfsctl digest tells it, then the recipe's hash of the files; any commit makes it unknown" {
	S=$MNT/content
	mkdir "$S"
	run cat "$S/content_hash"
	assert_output "unknown: nothing is committed"
	bash -ec "exec 9>'$S/lock'; truncate -s 5000000 '$S/allocs/b'; truncate -s 4096 '$S/allocs/a'
		printf hello >'$S/allocs/a'; printf tail | dd of='$S/allocs/b' bs=1 seek=4999996 conv=notrunc status=none
		echo >'$S/commit'"
	run cat "$S/content_hash"
	assert_output --partial "unknown: not computed for this commit"
	run "$ROOT/tools/gmsfsctl" digest "$S" --no-record
	assert_success
	h=${output%% *}
	assert_output --partial "not recorded"
	run cat "$S/content_hash"
	assert_output --partial "unknown: not computed"
	run "$ROOT/tools/gmsfsctl" digest "$S"
	assert_success
	assert_equal "${output%% *}" "$h"
	assert_equal "$(cat "$S/content_hash")" "$h"
	assert_equal "$(getfattr --only-values -n user.gms.content_hash "$S")" "1 $h"
	"$PYTHON" -c 'import json, sys; s = [s for s in json.load(open(sys.argv[1]))["stores"] if s["name"] == "content"][0]
assert s["content_hash"] == sys.argv[2], s' "$MNT/status.json" "$h"
	# The recipe of gmsfs(5), from the mount's files, split and xxhsum (b is 3 pieces of 2 MiB).
	unhex() { "$PYTHON" -c 'import sys; sys.stdout.buffer.write(bytes.fromhex(sys.stdin.read().split()[0]))'; }
	digest_of() { # an allocation's: the XXH3-128 of its 2 MiB pieces' XXH3-64s
		rm -rf "$BATS_TEST_TMPDIR/p" && mkdir "$BATS_TEST_TMPDIR/p"
		split -b 2M "$1" "$BATS_TEST_TMPDIR/p/piece."
		for p in "$BATS_TEST_TMPDIR"/p/piece.*; do xxhsum -H3 "$p" | sed 's/.* //; s/^XXH3_//' | unhex; done |
			xxhsum -H2 | unhex
	}
	recipe=$( {
		printf GMSFSCH1
		unhex <"$S/layout_hash"
		printf '\x02\0\0\0\0\0\0\0'
		for a in a b; do
			printf '\x01\0\0\0%s' "$a"
			"$PYTHON" -c 'import os, struct, sys; sys.stdout.buffer.write(struct.pack("<Q", os.path.getsize(sys.argv[1])))' "$S/allocs/$a"
			digest_of "$S/allocs/$a"
		done
	} | xxhsum -H2 | cut -d' ' -f1)
	assert_equal "$(ls "$BATS_TEST_TMPDIR/p" | wc -l)" 3
	assert_equal "$recipe" "$h"
	# A data-only writer changes a byte in place and commits: unknown, never the old hash.
	bash -ec "exec 9>>'$S/lock'; printf J | dd of='$S/allocs/a' bs=1 conv=notrunc status=none; echo >'$S/commit'"
	run cat "$S/content_hash"
	assert_output "unknown: committed again since it was computed (gmsfsctl digest STORE)"
	run getfattr -n user.gms.content_hash "$S"
	assert_failure
	run "$ROOT/tools/gmsfsctl" digest "$S"
	assert_success
	[ "${output%% *}" != "$h" ] || fail "a changed byte gave the same content hash"
	run setfattr -x user.gms.content_hash "$S"
	assert_success
	run cat "$S/content_hash"
	assert_output --partial "unknown: not computed"
}

@test "user.gms.content_hash: a bad form, another generation, a running session or a torn store are refused and change nothing" {
	S=$MNT/content2
	mkdir "$S"
	bash -ec "exec 9>'$S/lock'; truncate -s 4096 '$S/allocs/a'; echo >'$S/commit'"
	h=00112233445566778899aabbccddeeff
	for bad in "$h" "1 $h extra" "1  $h" "x $h" "1 ${h^^}" "1 ${h:0:30}" "-1 $h" "1 ${h}0"; do
		run setfattr -n user.gms.content_hash -v "$bad" "$S"
		assert_failure
		assert_output --partial "Invalid argument"
	done
	assert_equal "$(cat "$S/content_hash")" "unknown: not computed for this commit (gmsfsctl digest STORE computes it)"
	run setfattr -n user.gms.content_hash -v "2 $h" "$S"
	assert_output --partial "Stale file handle"
	grep -q "^last_error: user.gms.content_hash: computed on generation 2, the store's is 1" "$S/state"
	run bash -c "exec 9>'$S/lock'; setfattr -n user.gms.content_hash -v '1 $h' '$S'"
	assert_failure
	assert_output --partial "Device or resource busy"
	run setfattr -n user.gms.content_hash -v "1 $h" "$S" # the session is gone: taken
	assert_success
	assert_equal "$(cat "$S/content_hash")" "$h"
	# A writer writes in place and ends without commit: torn, the hash unknown, and refused.
	bash -c "exec 9>>'$S/lock'; printf x | dd of='$S/allocs/a' bs=1 conv=notrunc status=none"
	grep -q '^torn: 1' "$S/state"
	assert_equal "$(cat "$S/content_hash")" "unknown: the store is torn: a writer wrote into its bytes and did not commit"
	run setfattr -n user.gms.content_hash -v "1 $h" "$S"
	assert_failure
	run "$ROOT/tools/gmsfsctl" digest "$S"
	assert_failure
}

@test "ls -l, stat, du and df show the layout and the device" {
	run ls "$MNT"
	assert_line device
	assert_line model
	run ls "$MNT/model"
	assert_output "$(printf '%s\n' abort allocs commit content_hash generation history layout_hash lock meta prefetch state tier version versions)"
	run stat -c '%s %F' "$MNT/model/allocs/layers/0/weight"
	assert_output '1048576 regular file'
	run du -sk "$MNT/model/allocs"
	assert_output --regexp '^10[0-9][0-9]'
	run df -B1 "$MNT"
	assert_success
	assert_output --partial gmsfs
	run cat "$MNT/device"
	assert_line "backend: host"
	assert_line --regexp '^used_bytes: [1-9][0-9]*$'
	assert_line --regexp '^granularity: [0-9]+$'
}

@test "unknown xattrs answer ENODATA (ENOTSUP outside user.), bad values EINVAL and change nothing" {
	S=$MNT/model
	run getfattr -n user.nothing "$S/allocs/layers/0/weight"
	assert_failure
	assert_output --partial 'No such attribute'
	run getfattr -n user.gms.tag "$S/state"
	assert_output --partial 'No such attribute'
	# Namespaces gmsfs keeps nothing in: ENOTSUP, so that ls -l stops asking (once per mount).
	for name in security.selinux system.posix_acl_access trusted.x; do
		run getfattr -n $name "$S/allocs/layers/0/weight"
		assert_failure
		assert_output --partial 'Operation not supported'
		run setfattr -x $name "$S/meta/layers/0/weight"
		assert_output --partial 'Operation not supported'
	done
	run setfattr -x user.nothing "$S/meta/layers/0/weight"
	assert_output --partial 'No such attribute'
	hold w w "$S/lock" "
		setfattr -n user.gms.offset -v 12abc '$S/meta/layers/0/weight' 2>&1 | grep -q 'Invalid argument' || exit 11
		setfattr -n user.gms.offset --value=-1 '$S/meta/layers/0/weight' 2>&1 | grep -q 'Invalid argument' || exit 12
		setfattr -n user.gms.alloc -v ../../etc '$S/meta/layers/0/weight' 2>&1 | grep -q 'Invalid argument' || exit 13
		setfattr -n user.gms.alloc -v /abs '$S/meta/layers/0/weight' 2>&1 | grep -q 'Invalid argument' || exit 14
		setfattr -n user.gms.alloc -v 'a//b' '$S/meta/layers/0/weight' 2>&1 | grep -q 'Invalid argument' || exit 15
		setfattr -n user.other -v x '$S/meta/layers/0/weight' 2>&1 | grep -q 'not supported' || exit 16
		exit 0"
	wait_held w
	assert_equal "$(cat "$BATS_TEST_TMPDIR/w.rc")" 0
	release w
	run getfattr --absolute-names -d "$S/meta/layers/0/weight"
	assert_line 'user.gms.offset="0"'
	assert_line 'user.gms.alloc="layers/0/weight"'
}
