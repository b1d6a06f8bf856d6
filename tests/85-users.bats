#!/usr/bin/env bats
# Another user, on a mount with allow_other: no more than its file permissions give, by
# any path (open, ioctl, socket), and no way to deny the socket to anyone else.  The test
# makes the user (gmsfs-other-PID) and removes it.

load helpers

setup_file() {
	# A user of this run's own: the same file under another checker at the same time
	# (make check runs two files at once) makes and removes its own.
	export OTHER=gmsfs-other-$$
	if ! id "$OTHER" >/dev/null 2>&1; then
		useradd --system --no-create-home --shell /usr/sbin/nologin "$OTHER"
		touch "$BATS_FILE_TMPDIR/made-user"
	fi
	# A place the other user can reach: the helpers, the mount and the socket.
	BASE=$(mktemp -d /tmp/gmsfs-users.XXXXXX)
	chmod 755 "$BASE"
	mkdir "$BASE/bin" "$BASE/mnt"
	cp "$BUILD"/{gmsfs-probe,gmsfs-open,gmsfs-example,libgmsfs.so.0} "$BASE/bin/"
	export BASE
	MNT=$BASE/mnt SOCK=$BASE/sock
	"$GMSFS" -f -o allow_other,socket="$SOCK" "$MNT" 2>"$BASE/log" 3>&- &
	GMSFS_PID=$!
	export MNT SOCK GMSFS_PID
	wait_until grep -q " $MNT fuse.gmsfs " /proc/mounts
	mkdir "$MNT/s"
	"$BASE/bin/gmsfs-example" write "$MNT/s" 4 10000 >/dev/null
}

teardown_file() {
	unmount_gmsfs
	rm -rf "$BASE"
	if [ -e "$BATS_FILE_TMPDIR/made-user" ]; then userdel "$OTHER"; fi
}

as_other() { setpriv --reuid="$OTHER" --regid="$OTHER" --clear-groups "$@"; }

# The second mount of the last test, whatever it asserted.
teardown() {
	if grep -q " $BASE/mnt2 fuse.gmsfs " /proc/mounts; then umount "$BASE/mnt2" || umount -l "$BASE/mnt2"; fi
	if [ -n "${pid2:-}" ]; then kill "$pid2" 2>/dev/null || true; fi
}

@test "another user cannot take the write lock, by open or by the lock ioctl, and changes nothing" {
	S=$MNT/s
	local before
	before=$(cat "$S/layout_hash")
	run as_other "$BASE/bin/gmsfs-open" -w "$S/lock"
	assert_output EACCES
	run as_other "$BASE/bin/gmsfs-open" -rw "$S/lock"
	assert_output EACCES
	run as_other "$BASE/bin/gmsfs-probe" ioctl "$S" lock mode=2
	assert_output EACCES
	run as_other "$BASE/bin/gmsfs-probe" ioctl "$S" lock mode=3
	assert_output EACCES
	run as_other "$BASE/bin/gmsfs-open" -w -write x "$S/allocs/layers/0/weight"
	assert_output EACCES
	# Nor say what its bytes are: the content hash is told by who could change them.
	run as_other setfattr -n user.gms.content_hash -v "$(cat "$S/generation") 00112233445566778899aabbccddeeff" "$S"
	assert_failure
	assert_output --partial "Permission denied"
	assert_equal "$(head -c 8 "$S/content_hash")" "unknown:"
	assert_equal "$(state_of "$S" state)" COMMITTED
	assert_equal "$(cat "$S/layout_hash")" "$before"
	run "$BASE/bin/gmsfs-example" read "$S"
	assert_output --partial '0 bad words'
}

@test "another user reads: read locks by open and ioctl, read-only descriptors, no writer request on the socket" {
	S=$MNT/s
	run as_other "$BASE/bin/gmsfs-open" -r "$S/lock"
	assert_output ok
	run as_other "$BASE/bin/gmsfs-probe" ioctl "$S" lock mode=1
	assert_output --partial 'ok lock=1'
	run as_other "$BASE/bin/gmsfs-probe" redeem "$S/lock" export_all ok
	assert_output 'ok n=4 readonly=4 writable=0 entries=4'
	run as_other "$BASE/bin/gmsfs-probe" bind "lock:1:$S" create
	assert_output EPERM
	run as_other "$BASE/bin/gmsfs-example" read "$S"
	assert_success
	assert_output --partial '0 bad words'
}

@test "another user cannot crowd out the socket: 64 of its 140 idle connections are kept, root imports meanwhile, the silent ones close" {
	as_other "$BASE/bin/gmsfs-probe" hog "$SOCK" 140 2600 >"$BATS_TEST_TMPDIR/hog.out" 3>&- &
	local hog=$!
	wait_until grep -q '^open=' "$BATS_TEST_TMPDIR/hog.out"
	run "$BASE/bin/gmsfs-example" read "$MNT/s"
	assert_success
	assert_output --partial '0 bad words'
	wait "$hog"
	run cat "$BATS_TEST_TMPDIR/hog.out"
	assert_line 'open=64 refused=76'
	assert_line 'closed after 2600 ms of silence: 64'
	grep -q 'too many connections of that uid' "$BASE/log"
}

@test "a bind refused at connect (the uid's connections are all taken) is told by the first call; the next binds again" {
	# libgmsfs binds its channel at connect and reads the reply with the first call's.
	# Python is started first: the hog's connections last 2 s (the daemon's auth timeout).
	run "$PYTHON" - "$ROOT/python" "$MNT/s" "$BUILD/gmsfs-probe" "$SOCK" <<'PY'
import subprocess, sys
sys.path.insert(0, sys.argv[1])
import gmsfs
hog = subprocess.Popen([sys.argv[3], "hog", sys.argv[4], "64", "1500"], stdout=subprocess.PIPE, text=True)
print("hog:", hog.stdout.readline().strip())
with gmsfs.connect(sys.argv[2], "ro") as c:
    try:
        c.import_all()
        print("first call: imported")
    except gmsfs.GmsfsError as e:
        print("first call:", e)
    hog.wait()
    c.import_all()
    print("second call: %d mappings" % len(c.mappings))
PY
	assert_success
	assert_line 'hog: open=64 refused=0'
	assert_line --regexp '^first call: .*too many connections of this uid'
	assert_line 'second call: 4 mappings'
}

@test "without allow_other the socket is the daemon's user's alone" {
	local m2=$BASE/mnt2 sock2=$BASE/sock2
	mkdir "$m2"
	"$GMSFS" -f -o socket="$sock2" "$m2" 2>/dev/null 3>&- &
	pid2=$!
	wait_until grep -q " $m2 fuse.gmsfs " /proc/mounts
	assert_equal "$(stat -c %A "$sock2")" srw-------
	assert_equal "$(stat -c %A "$SOCK")" srw-rw-rw-
	run as_other "$BASE/bin/gmsfs-probe" connect "$sock2"
	assert_output EACCES
	run "$BASE/bin/gmsfs-probe" connect "$sock2"
	assert_output ok
	umount "$m2"
	wait "$pid2"
	pid2=
}
