# Shared by the bats files: mount a daemon per file, hold locks from background shells.
bats_load_library bats-support
bats_load_library bats-assert

ROOT=$(cd "$BATS_TEST_DIRNAME/.." && pwd)
# The build under test: build/, or build-asan/ for make check-asan.
BUILD=$ROOT/${GMSFS_BUILD:-build}
GMSFS=${GMSFS:-$BUILD/gmsfs}
OPEN=$BUILD/gmsfs-open
# Debian's python3, with the packages install-deps.sh put there.
PYTHON=${PYTHON:-/usr/bin/python3}

# mount_gmsfs [OPTIONS...]: a daemon in the foreground, in the background; sets MNT and GMSFS_PID.
mount_gmsfs() {
	MNT=$(mktemp -d "${BATS_FILE_TMPDIR:-/tmp}/mnt.XXXXXX")
	# GMSFS_WRAP: a command to run the daemon under (unshare, valgrind).  Appended to: a
	# takeover's daemon writes beside this one, and would be written over.
	${GMSFS_WRAP:-} "$GMSFS" -f "$@" "$MNT" 2>>"$MNT.log" 3>&- &
	GMSFS_PID=$!
	export MNT GMSFS_PID
	for _ in $(seq 200); do
		grep -q " $MNT fuse.gmsfs " /proc/mounts && return 0
		kill -0 "$GMSFS_PID" 2>/dev/null || break
		sleep 0.05
	done
	cat "$MNT.log" >&2
	return 1
}

unmount_gmsfs() {
	[ -n "${MNT:-}" ] || return 0
	# Under a checker (tests/variant.sh), the daemon's stderr is kept: UBSan reports go there.
	[ -z "${GMSFS_DAEMON_LOGS:-}" ] || cp "$MNT.log" "$GMSFS_DAEMON_LOGS/daemon.$(basename "$MNT").log" 2>/dev/null || true
	umount "$MNT" 2>/dev/null || umount -l "$MNT" 2>/dev/null || true
	for _ in $(seq "$WAIT_TRIES"); do
		kill -0 "$GMSFS_PID" 2>/dev/null || break
		sleep 0.05
	done
	kill -9 "$GMSFS_PID" 2>/dev/null || true
	rmdir "$MNT" 2>/dev/null || true
}

# wait_until CMD...: retry for up to 5 s (releases reach the daemon after close returns),
# 20 s with the daemon under a checker (valgrind runs it some twenty times slower).
WAIT_TRIES=$([ -n "${GMSFS_WRAP:-}" ] && echo 400 || echo 100)
wait_until() {
	for _ in $(seq "$WAIT_TRIES"); do
		"$@" >/dev/null 2>&1 && return 0
		sleep 0.05
	done
	echo "timed out waiting for: $*" >&2
	return 1
}

state_of() { sed -n "s/^$2: //p" "$1/state"; }
state_is() { [ "$(state_of "$1" state)" = "$2" ]; }
used_bytes() { sed -n 's/^used_bytes: //p' "$MNT/device"; }

# hold NAME MODE PATH [SCRIPT]: a background shell opens PATH on fd 9 (MODE r, w or rw),
# runs SCRIPT (as a member of its own session), then holds until release NAME.
hold() {
	local name=$1 mode=$2 path=$3 script=${4:-:} dir=$BATS_TEST_TMPDIR
	rm -f "$dir/$name.held" "$dir/$name.go" "$dir/$name.rc"
	(
		case $mode in
		r) exec 9<"$path" ;;
		w) exec 9>"$path" ;;
		rw) exec 9<>"$path" ;;
		esac || exit 1
		rc=0
		bash -c "$script" >"$dir/$name.out" 2>&1 || rc=$?
		echo $rc >"$dir/$name.rc"
		touch "$dir/$name.held"
		while [ -d "$dir" ] && [ ! -e "$dir/$name.go" ] && [ ! -e "$dir/all.go" ]; do sleep 0.02; done
	) 3>&- &
	eval "${name}_pid=$!"
}
held() { [ -e "$BATS_TEST_TMPDIR/$1.held" ]; }
wait_held() {
	wait_until held "$1" && return 0
	cat "$BATS_TEST_TMPDIR/$1.out" >&2 2>/dev/null
	cat "$MNT"/*/state >&2 2>/dev/null
	return 1
}
release() {
	local pid
	touch "$BATS_TEST_TMPDIR/$1.go"
	eval "pid=\${$1_pid}"
	wait "$pid" 2>/dev/null || true
}

# Every test ends its holders, passed or failed.
teardown() {
	touch "$BATS_TEST_TMPDIR/all.go"
	wait 2>/dev/null || true
}
