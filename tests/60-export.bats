#!/usr/bin/env bats
# The export path (gmsfs/abi.h, gmsfs(5) EXPORT): ioctls, tickets, the socket and its channel.
# Every refusal is followed by a check that the daemon still serves everyone else.

load helpers

PROBE=$BUILD/gmsfs-probe
EXAMPLE=$BUILD/gmsfs-example

setup_file() {
	mount_gmsfs -o socket="$BATS_FILE_TMPDIR/export.sock"
	mkdir "$MNT/m"
	"$BUILD/gmsfs-example" write "$MNT/m" 4 10000 >/dev/null
}
teardown_file() { unmount_gmsfs; }

# The daemon still answers a reader that does everything right.
still_serves() {
	run "$EXAMPLE" read "$MNT/m"
	assert_success
	assert_output --partial 'imported 4 allocations'
	assert_output --partial '0 bad words'
	wait_until state_is "$MNT/m" COMMITTED
}

@test "INFO on any file of a store; LOCK on its directory; EXPORT_ALL on the lock holder" {
	run "$PROBE" ioctl "$MNT/m/state" info
	assert_output --regexp '^ok lock=0 count=4 has_hash=1 socket=.*export.sock$'
	run "$PROBE" ioctl "$MNT/m" lock mode=1 timeout=0
	assert_output --partial 'ok lock=1 count=4'
	run "$PROBE" ioctl "$MNT/m/lock" export_all
	assert_output --partial 'ok lock=1 count=4'
	run "$PROBE" ioctl "lock:1:$MNT/m" export_all
	assert_output --partial 'ok lock=1'
	run "$PROBE" ioctl "$MNT/m/allocs/layers/0/weight" export
	assert_output --partial 'ok lock=1 count=1'
}

@test "UNLOCK: a locked directory and a read handle of lock give their lock back at once; a session's lock, another file: ENOTTY" {
	run "$PROBE" ioctl "lock:1:$MNT/m" unlock
	assert_output --partial 'ok lock=0'
	run "$PROBE" ioctl "$MNT/m/lock" unlock
	assert_output --partial 'ok lock=0'
	run "$PROBE" ioctl "$MNT/m/state" unlock
	assert_output ENOTTY
	mkdir "$MNT/w"
	run bash -c "exec 9>$MNT/w/lock; $PROBE ioctl rw:$MNT/w/lock unlock; sed -n 's/^state: //p' $MNT/w/state"
	assert_line --index 0 ENOTTY
	assert_line --index 1 RW
	wait_until state_is "$MNT/w" EMPTY
	rmdir "$MNT/w"
}

@test "a reader's descriptors cannot be mapped writable; a writer's can, from a file it opened for writing" {
	run "$PROBE" redeem "$MNT/m/lock" export_all ok
	assert_output 'ok n=4 readonly=4 writable=0 entries=4'
	run "$PROBE" redeem "$MNT/m/allocs/layers/1/weight" export ok
	assert_output 'ok n=1 readonly=1 writable=0 entries=0'
	mkdir "$MNT/w"
	run bash -c "exec 9>$MNT/w/lock; truncate -s 4096 $MNT/w/allocs/a; $PROBE redeem rw:$MNT/w/allocs/a export ok;
		$PROBE redeem $MNT/w/allocs/a export ok"
	assert_line --index 0 'ok n=1 readonly=0 writable=1 entries=0'
	assert_line --index 1 'ok n=1 readonly=1 writable=0 entries=0'
	wait_until state_is "$MNT/w" EMPTY
	rmdir "$MNT/w"
}

@test "ioctl: unknown commands are ENOTTY; wrong size, flags, reserved bits, mode or timeout are EINVAL" {
	run "$PROBE" ioctl "$MNT/m/lock" unknown
	assert_output ENOTTY
	run "$PROBE" ioctl "$MNT/m/lock" oldsize
	assert_output ENOTTY
	run "$PROBE" ioctl "$MNT/m/lock" info size=200
	assert_output EINVAL
	run "$PROBE" ioctl "$MNT/m/lock" info flags=1
	assert_output EINVAL
	run "$PROBE" ioctl "$MNT/m/lock" info reserved=1
	assert_output EINVAL
	run "$PROBE" ioctl "$MNT/m/lock" info mode=1
	assert_output EINVAL
	run "$PROBE" ioctl "$MNT/m" lock mode=5
	assert_output EINVAL
	run "$PROBE" ioctl "$MNT/m" lock mode=0
	assert_output EINVAL
	run "$PROBE" ioctl "$MNT/m" lock mode=1 timeout=-2
	assert_output EINVAL
	still_serves
}

@test "ioctl on the wrong file: ENOTTY; EXPORT_ALL without the lock: ENOLCK; a second LOCK: EBUSY" {
	run "$PROBE" ioctl "$MNT/device" info
	assert_output ENOTTY
	run "$PROBE" ioctl "$MNT" info
	assert_output ENOTTY
	run "$PROBE" ioctl "$MNT/m/lock" lock
	assert_output ENOTTY
	run "$PROBE" ioctl "$MNT/m/state" export
	assert_output ENOTTY
	run "$PROBE" ioctl "$MNT/m/meta/tensors/layer0" export
	assert_output ENOTTY
	# A layout directory's handle keeps its listing, and nothing an ioctl could use.
	for d in allocs meta meta/tensors; do
		for cmd in info lock export export_all unlock; do
			run "$PROBE" ioctl "$MNT/m/$d" $cmd
			assert_output ENOTTY
		done
	done
	run "$PROBE" ioctl "$MNT/m" export_all
	assert_output ENOLCK
	run "$PROBE" ioctl "lock:1:$MNT/m" lock mode=1
	assert_output EBUSY
	run lsattr "$MNT/m/state"
	assert_failure
	still_serves
}

@test "tickets: forged, replayed, or spent after close are EACCES" {
	run "$PROBE" redeem "$MNT/m/lock" export_all forged
	assert_output EACCES
	run "$PROBE" redeem "$MNT/m/lock" export_all replay
	assert_output EACCES
	run "$PROBE" redeem "$MNT/m/lock" export_all closed
	assert_output EACCES
	still_serves
}

@test "tickets: another process (a forked child, even on its parent's connection) or uid is EPERM" {
	run "$PROBE" redeem "$MNT/m/lock" export_all child
	assert_line --index 0 EPERM
	assert_line --index 1 'owner: ok n=4 readonly=4 writable=0 entries=4'
	run "$PROBE" redeem "$MNT/m/lock" export_all child-sameconn
	assert_line --index 0 EPERM
	assert_line --index 1 'owner: ok n=4 readonly=4 writable=0 entries=4'
	run "$PROBE" redeem "$MNT/m/lock" export_all uid
	assert_line --index 0 EPERM
	assert_line --index 1 'owner: ok n=4 readonly=4 writable=0 entries=4'
	grep -q 'ticket belongs to pid' "$MNT.log"
	still_serves
}

@test "socket: short, a body where none belongs, bad magic, unknown flags or descriptors sent: EINVAL, then hang up" {
	for how in short long badmagic badflags withfds; do
		run "$PROBE" redeem "$MNT/m/lock" export_all "$how"
		assert_line --index 0 EINVAL
		assert_line --index 1 closed
	done
	still_serves
}

@test "the channel: BIND then EXPORT; every op needs a BIND by the same process; a reader cannot CREATE" {
	run "$PROBE" bind "lock:1:$MNT/m" export
	assert_output 'ok n=4 readonly=4 writable=0 entries=4'
	run "$PROBE" bind "lock:1:$MNT/m" unbound
	assert_output ENOLCK
	run "$PROBE" bind "lock:1:$MNT/m" child
	assert_line --index 0 EPERM
	assert_line --index 1 'owner: ok n=4 readonly=4 writable=0 entries=4'
	run "$PROBE" bind "lock:1:$MNT/m" create
	assert_output EPERM
	run "$PROBE" bind "lock:1:$MNT/m" closed
	assert_output ENOLCK
	run "$PROBE" bind "lock:1:$MNT/m" redeem
	assert_output EINVAL
	run "$PROBE" redeem "$MNT/m/lock" export_all bind
	assert_output EINVAL
	mkdir "$MNT/cw"
	run "$PROBE" bind "lock:2:$MNT/cw" create
	assert_output 'ok n=1 readonly=0 writable=1 entries=0'
	wait_until state_is "$MNT/cw" EMPTY
	rmdir "$MNT/cw"
	still_serves
}

@test "the channel: COMMIT_LEAVE commits and gives back the writer's holds, its directory still open; a reader's is refused" {
	run "$PROBE" bind "lock:1:$MNT/m" commit-leave
	assert_line --index 0 EPERM
	mkdir "$MNT/cl"
	"$EXAMPLE" write "$MNT/cl" 2 4096
	run "$PROBE" bind "lock:2:$MNT/cl" commit-leave
	assert_line --index 0 'ok n=0 readonly=0 writable=0 entries=0'
	assert_line 'state: COMMITTED'
	assert_line 'writer: 0'
	assert_line 'readers: 0'
	run "$PROBE" bind "lock:2:$MNT/cl" commit-leave
	assert_line 'readers: 0'
	rmdir "$MNT/cl"
	still_serves
}

@test "the channel: SOON gets no reply (the next read is the EXPORT's); a reader's is EPERM, an unbound connection's ENOLCK, a body on it EINVAL, each hung up" {
	mkdir "$MNT/so"
	"$EXAMPLE" write "$MNT/so" 2 4096
	run "$PROBE" bind "lock:1:$MNT/so" soon-alone
	assert_line --index 0 EPERM
	run "$PROBE" bind "lock:1:$MNT/so" soon-unbound
	assert_line --index 0 ENOLCK
	run "$PROBE" bind "lock:4:$MNT/so" soon-body
	assert_line --index 0 EINVAL
	wait_until state_is "$MNT/so" COMMITTED
	# A writer's: its EXPORT answered (the last commit's bytes given writable: its end
	# without a commit leaves the store TORN, as any writer's would).
	run "$PROBE" bind "lock:4:$MNT/so" soon
	assert_output 'ok n=2 readonly=0 writable=2 entries=2'
	wait_until state_is "$MNT/so" TORN
	rmdir "$MNT/so"
	still_serves
}

@test "the channel: UNLOCK gives a reader's lock back and unbinds; a writer's is EPERM, an unbound connection's ENOLCK, a body on it EINVAL" {
	run "$PROBE" bind "lock:1:$MNT/m" unlock
	assert_line --index 0 'ok n=0 readonly=0 writable=0 entries=0'
	assert_line 'readers: 0'
	assert_line 'export: ENOLCK'
	assert_line 'ioctl unlock: ENOLCK'
	run "$PROBE" bind "lock:1:$MNT/m" unlock-unbound
	assert_line --index 0 ENOLCK
	run "$PROBE" bind "lock:1:$MNT/m" unlock-body
	assert_line --index 0 EINVAL
	mkdir "$MNT/ul"
	"$EXAMPLE" write "$MNT/ul" 2 4096
	run "$PROBE" bind "lock:2:$MNT/ul" unlock
	assert_line --index 0 EPERM
	assert_line 'state: RW' # the session holds on, still bound: a writer's ends by its ioctl or a commit
	assert_line --partial 'export: ok n=2'
	assert_line 'ioctl unlock: ok'
	wait_until state_is "$MNT/ul" COMMITTED
	rmdir "$MNT/ul"
	still_serves
}

@test "the channel: a ticket on an op that takes none, a body on COMMIT, an op switched mid-body, a body that does not parse: EINVAL, then hang up" {
	for how in ticketed-op commit-body op-switch garbage-body; do
		run "$PROBE" bind "lock:1:$MNT/m" "$how"
		assert_line --index 0 EINVAL
	done
	still_serves
}

@test "the bulk export sends more than 253 allocations in several messages" {
	mkdir "$MNT/many"
	run "$EXAMPLE" write "$MNT/many" 600 4096
	assert_success
	run "$PROBE" redeem "$MNT/many/lock" export_all ok
	assert_output 'ok n=600 readonly=600 writable=0 entries=600'
	run "$EXAMPLE" read "$MNT/many"
	assert_output --partial 'imported 600 allocations'
	assert_output --partial '0 bad words'
}

@test "a socket of a dead daemon is replaced; the daemon removes its socket at exit" {
	[ -S "$BATS_FILE_TMPDIR/export.sock" ]
	local m2 pid
	m2=$(mktemp -d)
	: > "$BATS_FILE_TMPDIR/stale.sock"
	"$GMSFS" -f -o socket="$BATS_FILE_TMPDIR/stale.sock" "$m2" 2>/dev/null 3>&- &
	pid=$!
	wait_until grep -q " $m2 fuse.gmsfs " /proc/mounts
	[ -S "$BATS_FILE_TMPDIR/stale.sock" ]
	umount "$m2"
	wait "$pid"
	[ ! -e "$BATS_FILE_TMPDIR/stale.sock" ]
	rmdir "$m2"
}
