#!/usr/bin/env bats
# gmsfs-peer between two nodes: two daemons, a server in one network namespace and the
# pulls in another, joined by a veth pair, UCX over TCP.  A store pulled whole (bytes,
# entries, layout hash); refusals (token, allow list, not committed, a token file others
# read); a pull killed, a server killed, a peer that stops reading; a pull in stripes, and
# a source committed again between its stripes.

load helpers

PEER=$BUILD/gmsfs-peer

# In namespace A (the server's) or B (the puller's), UCX on that side's veth.  They exec:
# run in a subshell (run, &), the command is that process, so that $! is its pid.  ip netns
# exec makes a mount namespace too: other tests' mounts copied into it are let go there.
in_ns() {
	local ns=$1 dev=$2
	shift 2
	exec ip netns exec "$ns" "$ROOT/tests/helpers/drop-copied-mounts" "$(readlink /proc/self/ns/mnt)" \
		"$BATS_FILE_TMPDIR" env UCX_TLS=tcp UCX_NET_DEVICES="$dev" "$@"
}
in_a() { in_ns "$NS_A" "$VA" "$@"; }
in_b() { in_ns "$NS_B" "$VB" "$@"; }

# serve PORT [ALLOW [ARG...]]: a server in A, its pid in SERVER_PID, its log in
# $BATS_FILE_TMPDIR/serve.PORT.log.
serve() {
	local port=$1 allow=${2:-m,big,draft,named,g0,g1}
	shift $(($# < 2 ? $# : 2))
	in_a "$PEER" serve "$A" --listen "$ADDR_A:$port" --token "$TOKEN" --allow "$allow" -t 3 "$@" \
		>/dev/null 2>"$BATS_FILE_TMPDIR/serve.$port.log" 3>&- &
	SERVER_PID=$!
	[ -z "${BATS_TEST_TMPDIR:-}" ] || echo "$SERVER_PID" >>"$BATS_TEST_TMPDIR/pids" # a test's own
	for _ in $(seq 100); do
		grep -q serving "$BATS_FILE_TMPDIR/serve.$port.log" && return 0
		kill -0 "$SERVER_PID" 2>/dev/null || break
		sleep 0.05
	done
	cat "$BATS_FILE_TMPDIR/serve.$port.log" >&2
	return 1
}

publish() { # STORE BYTES-A-PIECE PIECES
	"$PYTHON" - "$@" <<'PY'
import gmsfs, os, sys
store, size, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
with gmsfs.connect(store, "rw", timeout=10) as c:
    for i in range(n):
        m = c.create("layers/%d/w" % i, size + i, tag="t%d" % (i % 3))
        b = c.buffer(m.ptr, m.size, writable=True)
        b[:min(m.size, 1 << 20)] = os.urandom(min(m.size, 1 << 20))
        b[m.size - 7:] = b"the end"
        c.meta_put("torch/layers.%d.weight" % i, "layers/%d/w" % i, offset=0, size=m.size,
                   value=b'{"dtype": "uint8", "shape": [%d]}' % m.size)
    c.commit()
PY
}

setup_file() {
	export PYTHONPATH=$ROOT/python
	[ -x "$PEER" ] || { echo "no $PEER: build with libucx-dev" >&2; return 1; }
	mount_gmsfs
	A=$MNT A_PID=$GMSFS_PID
	mount_gmsfs
	B=$MNT B_PID=$GMSFS_PID
	export A A_PID B B_PID
	n=$(($$ % 200 + 20))
	export NS_A=gmsfs-a-$$ NS_B=gmsfs-b-$$ VA=gva$$ VB=gvb$$ ADDR_A=10.77.$n.1 ADDR_B=10.77.$n.2
	ip netns add "$NS_A"
	ip netns add "$NS_B"
	ip link add "$VA" type veth peer name "$VB"
	ip link set "$VA" netns "$NS_A"
	ip link set "$VB" netns "$NS_B"
	ip -n "$NS_A" addr add "$ADDR_A/24" dev "$VA"
	ip -n "$NS_B" addr add "$ADDR_B/24" dev "$VB"
	for ns in "$NS_A" "$NS_B"; do ip -n "$ns" link set lo up; done
	ip -n "$NS_A" link set "$VA" up
	ip -n "$NS_B" link set "$VB" up
	export TOKEN=$BATS_FILE_TMPDIR/token
	head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$TOKEN"
	chmod 600 "$TOKEN"
	mkdir "$A/m" "$A/big" "$A/draft" "$A/other"
	publish "$A/m" 70000 5
	# big: allocations of more than one 32 MiB piece each (PL_PIECE, SV_PIECE), 80 units of
	# 2 MiB for stripes, and long enough to stop a pull mid-way: 4 of 40 MiB (8 of 64 MiB
	# cost this file minutes, most of them copying through the veth two files at a time).
	publish "$A/big" $((40 << 20)) 4
	publish "$A/other" 4096 1
	# Below the ephemeral ports (32768 on): UCX's TCP transport listens on one per worker,
	# and a test's port that met one of the main server's was "Device is busy".
	export PORT=$((20000 + $$ % 12000))
	serve "$PORT"
	export MAIN_SERVER_PID=$SERVER_PID
}

teardown_file() {
	[ -z "${MAIN_SERVER_PID:-}" ] || kill -9 "$MAIN_SERVER_PID" 2>/dev/null || true
	ip netns del "$NS_A" 2>/dev/null || true
	ip netns del "$NS_B" 2>/dev/null || true
	rm -rf "/etc/netns/$NS_B"
	rmdir /etc/netns 2>/dev/null || true
	MNT=$B GMSFS_PID=$B_PID unmount_gmsfs
	MNT=$A GMSFS_PID=$A_PID unmount_gmsfs
}

# bg CMD...: a pull or server a test starts in the background; its pid in $!, and in the
# test's list, which teardown continues and kills whatever a failed assertion left.
bg() {
	"$@" 3>&- &
	echo $! >>"$BATS_TEST_TMPDIR/pids"
}

teardown() {
	[ -e "$BATS_TEST_TMPDIR/pids" ] || return 0
	while read -r p; do
		kill -CONT "$p" 2>/dev/null || true
		kill -9 "$p" 2>/dev/null || true
	done <"$BATS_TEST_TMPDIR/pids"
}

# A server's read lock goes when its thread disconnects, after its last log line and after
# the peer may have gone: waited for, never read at once.
no_readers() { [ "$(state_of "$1" readers)" = 0 ]; }

# The bytes through each store's mappings, as an engine reads them (libgmsfs readers), not
# through the mount's read(2): a daemon under valgrind would copy every byte of a 512 MiB
# store for each comparison (most of this file's half hour there); reads through the mount
# are 10-shell's and 40-stores'.
same_bytes() { # SRC DST
	"$PYTHON" - "$1" "$2" <<'PY'
import sys, gmsfs
with gmsfs.connect(sys.argv[1], "ro", timeout=10) as a, gmsfs.connect(sys.argv[2], "ro", timeout=10) as b:
    ma, mb = a.import_all(), b.import_all()
    assert [m.name for m in ma] == [m.name for m in mb], "names differ"
    for x, y in zip(ma, mb):
        # as bytes ('B'): ctypes' format '<B' would compare them one by one, 50x slower
        assert x.size == y.size and memoryview(a.buffer(x.ptr, x.size)).cast("B") == \
            memoryview(b.buffer(y.ptr, y.size)).cast("B"), "%s differs" % x.name
PY
}

same_store() { # SRC DST: layout hash, every allocation's bytes, every entry
	[ "$(cat "$1/layout_hash")" = "$(cat "$2/layout_hash")" ] || return 1
	(cd "$1/allocs" && find . -type f | sort) >"$BATS_TEST_TMPDIR/a"
	(cd "$2/allocs" && find . -type f | sort) >"$BATS_TEST_TMPDIR/b"
	cmp "$BATS_TEST_TMPDIR/a" "$BATS_TEST_TMPDIR/b" || return 1
	same_bytes "$1" "$2" || return 1
	(cd "$1/meta" && find . -type f | sort | xargs cat) >"$BATS_TEST_TMPDIR/ma"
	(cd "$2/meta" && find . -type f | sort | xargs cat) >"$BATS_TEST_TMPDIR/mb"
	cmp "$BATS_TEST_TMPDIR/ma" "$BATS_TEST_TMPDIR/mb"
}

@test "a store pulled across the veth is the served one: bytes, entries, layout hash, content hash; the server says so" {
	mkdir "$B/m"
	run "$ROOT/tools/gmsfsctl" digest "$A/m" # known to the server's daemon: the puller's is told it
	assert_success
	run in_b "$PEER" pull "gmsfs://$ADDR_A:$PORT/m" "$B/m" --token "$TOKEN" -t 5
	assert_success
	assert_output --partial "5 allocations"
	state_is "$B/m" COMMITTED
	same_store "$A/m" "$B/m"
	assert_equal "$(cat "$B/m/content_hash")" "$(cat "$A/m/content_hash")"
	run "$ROOT/tools/gmsfsctl" digest "$B/m" --no-record # and it is the pulled bytes' own
	assert_equal "${output%% *}" "$(cat "$A/m/content_hash")"
	# The server's thread logs once its last send is gone: the pull may be done before.
	wait_until grep -q "sent m (5 allocations" "$BATS_FILE_TMPDIR/serve.$PORT.log"
	state_is "$A/m" COMMITTED # the server's read lock went with its connection
	wait_until no_readers "$A/m"
}

@test "a pull carries the source commit's version name, where the target never had one of that name" {
	mkdir "$A/named" "$B/named" "$B/had"
	publish "$A/named" 4096 2
	commit_named() { "$PYTHON" -c 'import gmsfs, sys
with gmsfs.connect(sys.argv[1], "rw", timeout=10) as c:
    c.commit(version=sys.argv[2])' "$1" "$2"; }
	commit_named "$A/named" step-7
	run in_b "$PEER" pull "gmsfs://$ADDR_A:$PORT/named" "$B/named" --token "$TOKEN" -t 5
	assert_success
	assert_equal "$(cat "$B/named/version")" step-7
	same_store "$A/named" "$B/named"
	commit_named "$B/had" step-7 # an empty commit of that name: the store had it once
	run in_b "$PEER" pull "gmsfs://$ADDR_A:$PORT/named" "$B/had" --token "$TOKEN" -t 5
	assert_success
	assert_equal "$(cat "$B/had/version")" "none: the last commit was not named"
	same_store "$A/named" "$B/had"
	wait_until no_readers "$A/named"
}

@test "refused, with words, the target left empty: a wrong token, a store not served, one not committed" {
	before=$(grep -c 'refused' "$BATS_FILE_TMPDIR/serve.$PORT.log" || true)
	mkdir "$B/r1"
	run in_b "$PEER" pull "gmsfs://$ADDR_A:$((PORT + 11))/m" "$B/r1" --token "$TOKEN" -t 5 # nobody listens there
	assert_failure 1
	assert_output --partial "nobody answers at $ADDR_A port $((PORT + 11)) (no gmsfs-peer serve listens there"
	head -c 40 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$BATS_TEST_TMPDIR/wrong"
	chmod 600 "$BATS_TEST_TMPDIR/wrong"
	run in_b "$PEER" pull "gmsfs://$ADDR_A:$PORT/m" "$B/r1" --token "$BATS_TEST_TMPDIR/wrong" -t 5
	assert_failure
	assert_output --partial "refused: the token is not this server's"
	run in_b "$PEER" pull "gmsfs://$ADDR_A:$PORT/other" "$B/r1" --token "$TOKEN" -t 5
	assert_failure
	assert_output --partial "refused: other is not served here"
	run in_b "$PEER" pull "gmsfs://$ADDR_A:$PORT/draft" "$B/r1" --token "$TOKEN" -t 5
	assert_failure
	assert_output --partial "refused: draft is EMPTY, not committed"
	run in_b "$PEER" pull "gmsfs://$ADDR_A:$PORT/nope" "$B/r1" --token "$TOKEN" -t 5
	assert_failure
	assert_output --partial "not served here"
	state_is "$B/r1" EMPTY
	# One refusal each, logged once (a refusal for the token was once refused again as "not committed").
	[ "$(grep -c 'refused' "$BATS_FILE_TMPDIR/serve.$PORT.log")" = $((before + 4)) ]
	# A target that holds allocations already is not touched, and the peer is not asked.
	run in_b "$PEER" pull "gmsfs://$ADDR_A:$PORT/m" "$B/m" --token "$TOKEN" -t 5
	assert_failure
	assert_output --partial "pull into an empty store"
}

@test "bad arguments: a token file others may read, a URL, a store name; nothing is served" {
	cp "$TOKEN" "$BATS_TEST_TMPDIR/open"
	chmod 644 "$BATS_TEST_TMPDIR/open"
	run "$PEER" serve "$A" --listen 127.0.0.1:1 --token "$BATS_TEST_TMPDIR/open" --allow m
	assert_failure
	assert_output --partial "its owner alone reads (chmod 600)"
	run "$PEER" pull "gmsfs://$ADDR_A:$PORT/m" "$B/x" --token "$BATS_TEST_TMPDIR/open"
	assert_failure
	assert_output --partial "chmod 600"
	printf 'short' >"$BATS_TEST_TMPDIR/short"
	chmod 600 "$BATS_TEST_TMPDIR/short"
	run "$PEER" pull "gmsfs://$ADDR_A:$PORT/m" "$B/x" --token "$BATS_TEST_TMPDIR/short"
	assert_failure
	assert_output --partial "a token of 16 to"
	for url in "http://$ADDR_A:$PORT/m" "gmsfs://$ADDR_A/m" "gmsfs://$ADDR_A:0/m" "gmsfs://$ADDR_A:$PORT/a/b" \
		"gmsfs://$ADDR_A:$PORT/.." "gmsfs://:$PORT/m"; do
		run "$PEER" pull "$url" "$B/x" --token "$TOKEN"
		assert_failure
		assert_output --partial "not gmsfs://HOST:PORT/STORE"
	done
	run "$PEER" serve "$A" --listen "$ADDR_A:$PORT" --token "$TOKEN" --allow ../m
	assert_failure
	assert_output --partial "--allow NAME"
	run "$PEER" serve "$A" --listen nothing --token "$TOKEN" --allow m
	assert_failure
	run "$PEER" pull "gmsfs://$ADDR_A:$PORT/m" "$B/x" --token "$TOKEN" -t -1
	assert_failure
}

wait_allocations() { # STORE: the pull has made its layout (its bytes are under way)
	for _ in $(seq 400); do
		[ "$(state_of "$1" allocations)" != 0 ] && return 0
		sleep 0.01
	done
	return 1
}

@test "a pull killed mid-way leaves the target uncommitted and the source untouched" {
	mkdir "$B/k"
	before=$(cat "$A/big/layout_hash")
	bg in_b "$PEER" pull "gmsfs://$ADDR_A:$PORT/big" "$B/k" --token "$TOKEN" -t 5 -q
	pid=$!
	wait_allocations "$B/k"
	kill -9 "$pid"
	wait "$pid" || true
	wait_until state_is "$B/k" EMPTY
	[ "$(state_of "$B/k" allocations)" = 0 ]
	[ "$(cat "$A/big/layout_hash")" = "$before" ]
	# The server holds its read lock until its send to the dead peer fails (at most its -t).
	for _ in $(seq 200); do state_is "$A/big" COMMITTED && break; sleep 0.05; done
	state_is "$A/big" COMMITTED
	# The server lost that peer and serves the next.
	mkdir "$B/k2"
	run in_b "$PEER" pull "gmsfs://$ADDR_A:$PORT/m" "$B/k2" --token "$TOKEN" -t 10
	assert_success
	same_store "$A/m" "$B/k2"
}

@test "a pull killed at every stage (hello, layout, bytes, entries, commit): its target empty, or committed whole as the source" {
	before=$(cat "$A/big/layout_hash")
	committed=0
	# A server of its own with a place for every pull: a killed pull's place is held until
	# the server's timeout (-t 3) says the peer is gone, and the next pull is not to wait
	# for it (with the default 4 places, this test waited out ten of them).
	local port=$((PORT + 10))
	serve "$port" big --peers 16
	for i in $(seq 0 13); do
		mkdir "$B/ks"
		bg in_b "$PEER" pull "gmsfs://$ADDR_A:$port/big" "$B/ks" --token "$TOKEN" -t 5 -q
		pid=$!
		sleep "$(awk -v i="$i" 'BEGIN { printf "%.2f", i * i * 0.006 }')" # 0 to 1 s, denser early
		kill -9 "$pid" 2>/dev/null || true
		wait "$pid" || true
		wait_until eval '[ "$(state_of "$B/ks" state)" = EMPTY ] || [ "$(state_of "$B/ks" state)" = COMMITTED ]'
		if state_is "$B/ks" COMMITTED; then
			same_store "$A/big" "$B/ks"
			committed=$((committed + 1))
		else
			[ "$(state_of "$B/ks" allocations)" = 0 ]
		fi
		rmdir "$B/ks"
	done
	echo "# $committed of 14 were committed before their kill" >&3
	[ "$(cat "$A/big/layout_hash")" = "$before" ]
	wait_until no_readers "$A/big" # each dead peer's read lock goes (at most -t)
}

@test "a server killed mid-pull: the pull fails with words, its target uncommitted; a server started again at once listens on the same port" {
	port=$((PORT + 1))
	serve "$port"
	mkdir "$B/s"
	bg in_b "$PEER" pull "gmsfs://$ADDR_A:$port/big" "$B/s" --token "$TOKEN" -t 5 -q >"$BATS_TEST_TMPDIR/out" 2>&1
	pid=$!
	wait_allocations "$B/s"
	kill -9 "$SERVER_PID" # this test's own server
	rc=0
	wait "$pid" || rc=$?
	[ "$rc" = 1 ]
	grep -q "gmsfs-peer: pull: " "$BATS_TEST_TMPDIR/out"
	wait_until state_is "$B/s" EMPTY
	state_is "$A/big" COMMITTED
	wait_until no_readers "$A/big" # the killed server's read lock goes with it
	# A server started again at once listens on the same port (its connections in
	# TIME_WAIT: UCX's listener binds with SO_REUSEADDR) and serves.
	serve "$port" m
	mkdir "$B/relisten"
	run in_b "$PEER" pull "gmsfs://$ADDR_A:$port/m" "$B/relisten" --token "$TOKEN" -t 10 -q
	assert_success
	same_store "$A/m" "$B/relisten"
}

log_since() { # LINE PATTERN: the server's log from line LINE on says PATTERN
	tail -n "+$1" "$BATS_FILE_TMPDIR/serve.$PORT.log" | grep -qE "$2"
}

big_sent_since() { # LINE: since line LINE the server has sent big whole, every stripe of it
	local sent of
	sent=$(tail -n "+$1" "$BATS_FILE_TMPDIR/serve.$PORT.log" | grep "sent big ") || return 1
	of=$(printf '%s\n' "$sent" | sed -n 's/.*stripe [0-9]* of \([0-9]*\).*/\1/p' | head -n 1)
	[ "$(printf '%s\n' "$sent" | wc -l)" -ge "${of:-1}" ]
}

# The server drops a stopped pull of big after its -t: mid-send, or at the hello of a stripe
# the pull had opened and not yet asked on (under valgrind the pull can stop that early).
DROPPED="big: sending: |refused: hello: receiving: "

stopped_or_sent() { # LINE: the server dropped a stopped pull of big, or sent it whole
	log_since "$1" "$DROPPED" || big_sent_since "$1"
}

@test "a peer that stops reading holds up no other, and loses its connection after the timeout" {
	for try in 1 2 3 4 5; do
		mkdir "$B/stop" "$B/next"
		from=$(($(wc -l <"$BATS_FILE_TMPDIR/serve.$PORT.log") + 1))
		bg in_b "$PEER" pull "gmsfs://$ADDR_A:$PORT/big" "$B/stop" --token "$TOKEN" -t 60 -q
		pid=$!
		wait_allocations "$B/stop"
		kill -STOP "$pid" || true # (the pull may have ended before it)
		# The next peer is served while the first is stopped; then the server drops the first.
		run in_b "$PEER" pull "gmsfs://$ADDR_A:$PORT/m" "$B/next" --token "$TOKEN" -t 60
		assert_success
		same_store "$A/m" "$B/next"
		wait_until stopped_or_sent "$from"
		# Sent whole before it stopped (the pull outran the stop on a loaded machine): again.
		log_since "$from" "$DROPPED" && break
		kill -CONT "$pid" || true
		wait "$pid"
		rmdir "$B/stop" "$B/next"
	done
	log_since "$from" "$DROPPED"
	kill -9 "$pid"
	kill -CONT "$pid" 2>/dev/null || true
	wait "$pid" || true
	wait_until state_is "$B/stop" EMPTY
}

@test "peers served at once: three pulls together, each whole; with --peers 1 the next waits its turn" {
	mkdir "$B/c1" "$B/c2" "$B/c3" "$B/s1" "$B/s2"
	pids=
	for t in c1 c2 c3; do
		bg in_b "$PEER" pull "gmsfs://$ADDR_A:$PORT/big" "$B/$t" --token "$TOKEN" -t 20 -q
		pids="$pids $!"
	done
	for p in $pids; do wait "$p"; done
	for t in c1 c2 c3; do same_store "$A/big" "$B/$t"; done
	wait_until no_readers "$A/big"
	serve $((PORT + 2)) m,big --peers 1
	bg in_b "$PEER" pull "gmsfs://$ADDR_A:$((PORT + 2))/big" "$B/s1" --token "$TOKEN" -t 60 -q
	first=$!
	wait_allocations "$B/s1"
	kill -STOP "$first"
	bg in_b "$PEER" pull "gmsfs://$ADDR_A:$((PORT + 2))/m" "$B/s2" --token "$TOKEN" -t 20 -q
	second=$!
	sleep 1
	[ "$(state_of "$B/s2" state)" != COMMITTED ] # its turn is not yet: the first holds the one place for its 3 s
	wait "$second"
	same_store "$A/m" "$B/s2"
	grep -q "big: sending: " "$BATS_FILE_TMPDIR/serve.$((PORT + 2)).log"
	run "$PEER" serve "$A" --listen "$ADDR_A:1" --token "$TOKEN" --allow m --peers 17
	[ "$status" -eq 2 ]
	assert_output --partial "peers served at once, 1 to 16"
}

@test "a name of several addresses (a headless Service's pods): each asked in turn until one serves the store" {
	addr_c=${ADDR_A%.1}.3
	ip -n "$NS_A" addr add "$addr_c/24" dev "$VA"
	mkdir -p "/etc/netns/$NS_B"
	printf '%s peers\n%s peers\n' "$addr_c" "$ADDR_A" >"/etc/netns/$NS_B/hosts"
	port=$((PORT + 3))
	serve "$port" m # on .1 only: at .3 nothing listens (a pod gone, or not serving yet)
	mkdir "$B/several" "$B/several2"
	run in_b "$PEER" pull "gmsfs://peers:$port/m" "$B/several" --token "$TOKEN" -t 20
	[ "$status" -eq 0 ] || echo "$output" >&3
	assert_success
	same_store "$A/m" "$B/several"
	run in_b "$PEER" pull "gmsfs://peers:$port/nope" "$B/several2" --token "$TOKEN" -t 20
	rm -r "/etc/netns/$NS_B"
	ip -n "$NS_A" addr del "$addr_c/24" dev "$VA"
	assert_failure
	assert_output --partial "none of the 2 addresses of peers served nope; the last: "
	grep -q "refused: nope is not served here" "$BATS_FILE_TMPDIR/serve.$port.log"
	state_is "$B/several2" EMPTY
}

@test "a node's mounts served together (a directory of mounts, as /run/gmsfs); a token through a symlink (a Secret's)" {
	root=$BATS_TEST_TMPDIR/root
	mkdir "$root" "$B/onlyb" "$B/fromroot" "$B/fromroot2"
	ln -s "$A" "$root/gpu0"
	ln -s "$B" "$root/gpu1"
	publish "$B/onlyb" 4096 2
	mkdir "$BATS_TEST_TMPDIR/secret"
	cp "$TOKEN" "$BATS_TEST_TMPDIR/secret/..token"
	ln -s ..token "$BATS_TEST_TMPDIR/secret/token"
	port=$((PORT + 4))
	in_a "$PEER" serve "$root" --listen "$ADDR_A:$port" --token "$BATS_TEST_TMPDIR/secret/token" --allow '*' -t 3 \
		>/dev/null 2>"$BATS_TEST_TMPDIR/root.log" 3>&- &
	echo $! >>"$BATS_TEST_TMPDIR/pids"
	wait_until grep -q serving "$BATS_TEST_TMPDIR/root.log"
	run in_b "$PEER" pull "gmsfs://$ADDR_A:$port/onlyb" "$B/fromroot" --token "$TOKEN" -t 5
	assert_success
	same_store "$B/onlyb" "$B/fromroot"
	run in_b "$PEER" pull "gmsfs://$ADDR_A:$port/big" "$B/fromroot2" --token "$TOKEN" -t 5
	assert_success
	same_store "$A/big" "$B/fromroot2"
	mkdir "$B/fromroot3"
	run in_b "$PEER" pull "gmsfs://$ADDR_A:$port/draft" "$B/fromroot3" --token "$TOKEN" -t 5
	assert_failure
	assert_output --partial "refused: draft is EMPTY, not committed"
}

@test "a writer of the source waits for a pull under way; the pull gets the commit it began with" {
	before=$(cat "$A/big/layout_hash")
	for try in 1 2 3 4 5; do
		mkdir "$B/w"
		from=$(($(wc -l <"$BATS_FILE_TMPDIR/serve.$PORT.log") + 1))
		bg in_b "$PEER" pull "gmsfs://$ADDR_A:$PORT/big" "$B/w" --token "$TOKEN" -t 20 -q
		pid=$!
		wait_allocations "$B/w"
		kill -STOP "$pid" || true # the server holds its read lock while it sends (up to its -t of 3 s)
		run "$PYTHON" -c 'import gmsfs, sys; gmsfs.connect(sys.argv[1], "rw", timeout=0.5)' "$A/big"
		kill -CONT "$pid" || true # (the pull may have ended before the stop)
		wait "$pid"
		# A writer granted the lock is right only where the server had sent it all (it says
		# so before it lets go): the pull outran the stop on a loaded machine; again.
		[ "$status" = 0 ] && big_sent_since "$from" || break
		rmdir "$B/w"
	done
	assert_failure
	assert_output --partial "not granted within 500 ms"
	same_store "$A/big" "$B/w"
	# Then a writer commits a new layout at the source; the pulled store keeps the old one.
	"$PYTHON" -c 'import gmsfs, sys
with gmsfs.connect(sys.argv[1], "rw", timeout=10) as c:
    c.create("added", 4096)
    c.commit()' "$A/big"
	[ "$(cat "$A/big/layout_hash")" != "$before" ]
	[ "$(cat "$B/w/layout_hash")" = "$before" ]
}

@test "a big store pulled whole, every byte and entry" {
	mkdir "$B/big"
	run in_b "$PEER" pull "gmsfs://$ADDR_A:$PORT/big" "$B/big" --token "$TOKEN" -t 10
	assert_success
	same_store "$A/big" "$B/big"
}

@test "a pull in stripes, a connection each: the same bytes; as many as the server serves at once; a bad count refused" {
	mkdir "$B/s3" "$B/s8" "$B/bad"
	# the argument, not the environment's count
	run in_b env GMSFS_PEER_STRIPES=99 "$PEER" pull "gmsfs://$ADDR_A:$PORT/big" "$B/s3" --token "$TOKEN" --stripes 3 -t 10
	assert_success
	assert_output --partial "over 3 connections"
	same_store "$A/big" "$B/s3"
	wait_until grep -q "sent big ([0-9]* allocations, [0-9]* bytes, stripe 3 of 3" "$BATS_FILE_TMPDIR/serve.$PORT.log"
	# A server of 2 at once cuts 8 asked for in 2; a store of one 2 MiB unit is one stripe.
	serve $((PORT + 5)) big,m --peers 2
	run in_b env GMSFS_PEER_STRIPES=8 "$PEER" pull "gmsfs://$ADDR_A:$((PORT + 5))/big" "$B/s8" --token "$TOKEN" -t 10
	assert_success
	assert_output --partial "over 2 connections"
	same_store "$A/big" "$B/s8"
	run in_b env GMSFS_PEER_STRIPES=8 "$PEER" pull "gmsfs://$ADDR_A:$((PORT + 5))/m" "$B/bad" --token "$TOKEN" -t 10
	assert_success
	assert_output --partial "over 1 connection:"
	same_store "$A/m" "$B/bad"
	wait_until grep -q "sent m (5 allocations, [0-9]* bytes, layout" "$BATS_FILE_TMPDIR/serve.$((PORT + 5)).log"
	# A host mount's bytes through bounce buffers (taken by itself where the machine has 8
	# cores or more), or in place: the same bytes either way; another value refused.
	mkdir "$B/b1" "$B/b0" "$B/bx"
	run in_b env GMSFS_PEER_BOUNCE=1 "$PEER" pull "gmsfs://$ADDR_A:$PORT/big" "$B/b1" --token "$TOKEN" --stripes 3 -t 10
	assert_success
	assert_output --partial "over 3 connections: "
	assert_output --partial ", through bounce buffers), layout"
	same_store "$A/big" "$B/b1"
	run in_b env GMSFS_PEER_BOUNCE=0 "$PEER" pull "gmsfs://$ADDR_A:$PORT/big" "$B/b0" --token "$TOKEN" -t 10
	assert_success
	refute_output --partial "through bounce buffers"
	same_store "$A/big" "$B/b0"
	run in_b env GMSFS_PEER_BOUNCE=yes "$PEER" pull "gmsfs://$ADDR_A:$PORT/big" "$B/bx" --token "$TOKEN" -t 10
	assert_failure 1
	assert_output --partial "GMSFS_PEER_BOUNCE=yes: 0 or 1"
	state_is "$B/bx" EMPTY
	for n in 0 17 x; do
		mkdir "$B/bad$n"
		run in_b "$PEER" pull "gmsfs://$ADDR_A:$PORT/big" "$B/bad$n" --token "$TOKEN" --stripes $n -t 10
		assert_failure 2 # a bad argument, as gmsfs-peer(1) says
		assert_output --partial "--stripes $n: connections a pull, 1 to 16"
		state_is "$B/bad$n" EMPTY
		# the variable, as engines set it, is refused by the pull itself
		run in_b env GMSFS_PEER_STRIPES=$n "$PEER" pull "gmsfs://$ADDR_A:$PORT/big" "$B/bad$n" --token "$TOKEN" -t 10
		assert_failure 1
		assert_output --partial "GMSFS_PEER_STRIPES=$n: connections a pull, 1 to 16"
		state_is "$B/bad$n" EMPTY
	done
	# a server has no stripes of its own to set (--peers is what it serves at once)
	run "$PEER" serve "$A" --listen 127.0.0.1:1 --token "$TOKEN" --allow m --stripes 2
	assert_failure 2
	assert_output --partial "usage: gmsfs-peer"
}

@test "a source committed again between stripes: the pull fails with words, its target uncommitted" {
	# A server of two places: one held by a stopped pull of big, the other by this pull's
	# first stripe, so its second waits in the queue until the first is done.  A writer
	# waits meanwhile and, writers first, commits before the second stripe's read lock:
	# that stripe finds another layout hash.
	mkdir "$A/stale" "$B/blk" "$B/stale"
	publish "$A/stale" $((40 << 20)) 4
	before=$(cat "$A/stale/layout_hash")
	serve $((PORT + 7)) big,stale --peers 2 -t 30
	bg in_b env GMSFS_PEER_STRIPES=1 "$PEER" pull "gmsfs://$ADDR_A:$((PORT + 7))/big" "$B/blk" --token "$TOKEN" -t 60 -q
	blocker=$!
	wait_allocations "$B/blk"
	kill -STOP "$blocker"
	in_b "$PEER" pull "gmsfs://$ADDR_A:$((PORT + 7))/stale" "$B/stale" --token "$TOKEN" --stripes 2 -t 60 -q \
		2>"$BATS_TEST_TMPDIR/pull.err" 3>&- &
	pid=$!
	echo "$pid" >>"$BATS_TEST_TMPDIR/pids"
	for _ in $(seq 1000); do # the first stripe's read lock, taken at its hello: stopped there
		[ "$(state_of "$A/stale" readers)" = 1 ] && break
		sleep 0.01
	done
	kill -STOP "$pid"
	[ "$(state_of "$A/stale" readers)" = 1 ]
	"$PYTHON" -c 'import gmsfs, sys
with gmsfs.connect(sys.argv[1], "rw", timeout=30) as c:
    c.create("added", 4096)
    c.commit()' "$A/stale" 3>&- &
	writer=$!
	writer_waits() { [ "$(state_of "$A/stale" waiting_writers)" = 1 ]; }
	wait_until writer_waits
	kill -CONT "$pid"
	wait "$writer"
	[ "$(cat "$A/stale/layout_hash")" != "$before" ]
	st=0
	wait "$pid" || st=$?
	[ "$st" -eq 1 ]
	run cat "$BATS_TEST_TMPDIR/pull.err"
	assert_output --partial "was committed again during the pull (layout"
	assert_output --partial "pull again"
	state_is "$B/stale" EMPTY
	grep -q "stripe 1 of 2, layout $before" "$BATS_FILE_TMPDIR/serve.$((PORT + 7)).log"
	kill -9 "$blocker"
	kill -CONT "$blocker" 2>/dev/null || true
	wait "$blocker" || true
	wait_until state_is "$B/blk" EMPTY
	wait_until no_readers "$A/stale"
}

@test "gmsfsctl group pull: every rank of another node's group at once, one version; ranks of two versions refused" {
	for s in g0 g1; do
		mkdir "$A/$s" "$B/$s" "$B/h$s"
		publish "$A/$s" 8192 2
		"$PYTHON" -c 'import gmsfs, sys
with gmsfs.connect(sys.argv[1], "rw", timeout=10) as c:
    c.commit(version="step-3")' "$A/$s"
	done
	printf '%s\n' "$B/g0" "$B/g1" >"$BATS_TEST_TMPDIR/local.group"
	printf 'gmsfs://%s:%s/%s\n' "$ADDR_A" "$PORT" g0 "$ADDR_A" "$PORT" g1 >"$BATS_TEST_TMPDIR/sources"
	run in_b "$ROOT/tools/gmsfsctl" group pull "$BATS_TEST_TMPDIR/local.group" "$BATS_TEST_TMPDIR/sources" \
		--token "$TOKEN" --timeout 5
	assert_success
	assert_output --partial "2 ranks of version step-3 pulled"
	same_store "$A/g0" "$B/g0"
	same_store "$A/g1" "$B/g1"
	# The source group mid-refit: rank 1 is at step-4 already.
	"$PYTHON" -c 'import gmsfs, sys
with gmsfs.connect(sys.argv[1], "rw", timeout=10) as c:
    c.commit(version="step-4")' "$A/g1"
	printf '%s\n' "$B/hg0" "$B/hg1" >"$BATS_TEST_TMPDIR/other.group"
	run in_b "$ROOT/tools/gmsfsctl" group pull "$BATS_TEST_TMPDIR/other.group" "$BATS_TEST_TMPDIR/sources" \
		--token "$TOKEN" --timeout 5
	assert_failure
	assert_output --partial "the ranks pulled are versions ['step-3', 'step-4'], not one"
	head -1 "$BATS_TEST_TMPDIR/sources" >"$BATS_TEST_TMPDIR/one"
	run in_b "$ROOT/tools/gmsfsctl" group pull "$BATS_TEST_TMPDIR/local.group" "$BATS_TEST_TMPDIR/one" --token "$TOKEN"
	assert_failure
	assert_output --partial "1 URLs for a group of 2 ranks"
	wait_until no_readers "$A/g0"
	wait_until no_readers "$A/g1"
}

@test "gmsfsctl pull: the served store, the same layout hash; refused with words, the target left empty" {
	mkdir "$B/ctl" "$B/ctl2"
	run in_b "$ROOT/tools/gmsfsctl" pull "gmsfs://$ADDR_A:$PORT/m" "$B/ctl" --token "$TOKEN" --timeout 5
	assert_success
	assert_output --partial "5 allocations"
	same_store "$A/m" "$B/ctl"
	cp "$TOKEN" "$BATS_TEST_TMPDIR/wrong" && echo -n 0123456789abcdef0123 >"$BATS_TEST_TMPDIR/wrong"
	run in_b "$ROOT/tools/gmsfsctl" pull "gmsfs://$ADDR_A:$PORT/m" "$B/ctl2" --token "$BATS_TEST_TMPDIR/wrong"
	assert_failure
	assert_output --partial "gmsfsctl: pull gmsfs://$ADDR_A:$PORT/m into $B/ctl2:"
	assert_output --partial "refused: the token is not this server's"
	state_is "$B/ctl2" EMPTY
	run in_b "$ROOT/tools/gmsfsctl" pull "gmsfs://$ADDR_A/m" "$B/ctl2" --token "$TOKEN"
	assert_failure
	assert_output --partial "not gmsfs://HOST:PORT/STORE"
	run in_b "$ROOT/tools/gmsfsctl" pull "gmsfs://$ADDR_A:$PORT/m" "$B/ctl2" --token "$TOKEN" --timeout 0
	assert_failure
	assert_output --partial "timeout is seconds, more than 0"
	run in_b "$ROOT/tools/gmsfsctl" pull "gmsfs://$ADDR_A:$PORT/m" "$B/ctl2" --token "$TOKEN" --timeout 1e12
	assert_failure
	assert_output --partial "at most a day"
	state_is "$B/ctl2" EMPTY
	# --stripes: the connections asked for, as gmsfs-peer pull's; a bad count is a bad argument
	mkdir "$B/ctl3"
	run in_b env GMSFS_PEER_STRIPES=99 "$ROOT/tools/gmsfsctl" pull "gmsfs://$ADDR_A:$PORT/big" "$B/ctl3" --token "$TOKEN" --stripes 3
	assert_success
	assert_output --partial "over 3 connections"
	same_store "$A/big" "$B/ctl3"
	for n in 0 17 x; do
		run in_b "$ROOT/tools/gmsfsctl" pull "gmsfs://$ADDR_A:$PORT/big" "$B/ctl2" --token "$TOKEN" --stripes $n
		assert_failure 2
		assert_output --partial "--stripes: $n: connections a pull, 1 to 16"
	done
	state_is "$B/ctl2" EMPTY
}

@test "gmsfs.pull in an engine's process: what was done, or GmsfsError with its errno; gmsfs_pull checks its options" {
	mkdir "$B/py" "$B/py2" "$B/py3"
	run in_b "$PYTHON" - "gmsfs://$ADDR_A:$PORT" "$B" "$TOKEN" <<'PY'
import ctypes, errno, os, sys
import gmsfs
from gmsfs import _lib
url, b, token = sys.argv[1:4]
how = gmsfs.pull(url + "/big", b + "/py", token, timeout=10)
print("pulled:", how)
with gmsfs.connect(b + "/py", "ro", timeout=5) as c:
    c.import_all()
    print("entries:", len(c.meta_list("torch/")))
try:
    gmsfs.pull(url + "/big", b + "/py", token, timeout=10)
except gmsfs.GmsfsError as e:
    print("again:", errno.errorcode[e.errno])
try:
    gmsfs.pull(url + "/other", b + "/py2", token, timeout=10)
except gmsfs.GmsfsError as e:
    print("not served:", errno.errorcode[e.errno])
lib = _lib.peer_lib()
def raw(**fields):  # gmsfs_pull as a C caller calls it: an options struct, the words in gmsfs_errmsg(NULL)
    opt = _lib.sized(_lib.PullOptions, token_file=token.encode(), timeout_ms=1000)
    for k, v in fields.items():
        setattr(opt, k, v)
    e = lib.gmsfs_pull((url + "/big").encode(), (b + "/py2").encode(), ctypes.byref(opt), None)
    return errno.errorcode.get(-e, e), _lib.side_errmsg(lib)
print("flags:", *raw(flags=0x2))
print("stripes 17:", *raw(stripes=17))
print("size:", *raw(size=8))
print("no token:", *raw(token_file=None))
for n in (0, 17, True, "2", 2.0):
    try:
        gmsfs.pull(url + "/big", b + "/py2", token, timeout=10, stripes=n)
    except ValueError as e:
        print("stripes=%r:" % (n,), e)
print("timeout:", *raw(timeout_ms=0))
report = _lib.sized(_lib.Report)
report.size = 4
e = lib.gmsfs_pull((url + "/big").encode(), (b + "/py2").encode(), None, ctypes.byref(report))
print("report:", errno.errorcode[-e], _lib.side_errmsg(lib))
os.environ["GMSFS_PEER_STRIPES"] = "99"
try:
    gmsfs.pull(url + "/big", b + "/py2", token, timeout=10)
except gmsfs.GmsfsError as e:
    print("stripes:", errno.errorcode[e.errno], e.strerror)
print("stripes=2:", gmsfs.pull(url + "/big", b + "/py3", token, timeout=10, stripes=2))  # the argument wins
PY
	assert_success
	assert_line --regexp "^pulled: [0-9]+ allocations, [0-9]+ bytes"
	assert_line --regexp "^entries: [0-9]+$"
	assert_line "again: EEXIST"
	assert_line "not served: EACCES"
	assert_line "flags: EINVAL gmsfs_pull: flags 0x2: only GMSFS_PULL_PROGRESS is known"
	assert_line "stripes 17: EINVAL gmsfs_pull: 17 stripes: connections a pull, 1 to 16 (0: GMSFS_PEER_STRIPES, else 4)"
	assert_line --regexp "^size: EINVAL gmsfs_pull: options of 8 bytes: this libgmsfs-peer knows [0-9]+ \(set .size, or start from GMSFS_PULL_OPTIONS\)$"
	assert_line "no token: EINVAL gmsfs_pull: no token_file: the token the peer is shown"
	assert_line --regexp "^report: EINVAL gmsfs_pull: a report of 4 bytes: this libgmsfs-peer knows [0-9]+ \(start from GMSFS_REPORT\)$"
	for n in 0 17 True "'2'" 2.0; do
		assert_line "stripes=$n: pull: stripes is the connections asked for, 1 to 16 (not $n)"
	done
	assert_line --regexp "^stripes=2: [0-9]+ allocations, .* over 2 connections"
	assert_line "timeout: EINVAL gmsfs_pull: a timeout of 0 ms: more than 0"
	assert_line --partial "stripes: EINVAL"
	assert_output --partial "GMSFS_PEER_STRIPES=99: connections a pull, 1 to 16"
	same_store "$A/big" "$B/py"
	same_store "$A/big" "$B/py3"
	state_is "$B/py2" EMPTY
}

@test "engine-pod-pull.yaml's init script: pulls what the node lacks; run again, finds it committed and asks no peer" {
	script=$("$PYTHON" -c 'import sys, yaml
print(yaml.safe_load(open(sys.argv[1]))["spec"]["initContainers"][0]["args"][0])' "$ROOT/deploy/kubernetes/engine-pod-pull.yaml")
	script=${script//gmsfs-peer.kube-system.svc.cluster.local:7470\/llama/$ADDR_A:$PORT\/m}
	script=${script//\/etc\/gmsfs-peer\/token/$TOKEN}
	[[ $script != *kube-system* && $script == *"gmsfsctl pull"* ]]
	mkdir "$BATS_TEST_TMPDIR/bin"
	# gmsfsctl path asks nvidia-smi for this container's GPU: here, B's mount stands for it.
	printf '#!/bin/sh\n[ "$1" = path ] && { echo "%s/init-$2"; exit 0; }\nexec %s "$@"\n' "$B" "$ROOT/tools/gmsfsctl" \
		>"$BATS_TEST_TMPDIR/bin/gmsfsctl"
	chmod +x "$BATS_TEST_TMPDIR/bin/gmsfsctl"
	sent=$(grep -c "sent m " "$BATS_FILE_TMPDIR/serve.$PORT.log" || true)
	run in_b env PATH="$BATS_TEST_TMPDIR/bin:$PATH" sh -c "$script"
	assert_success
	same_store "$A/m" "$B/init-llama"
	wait_until eval '[ "$(grep -c "sent m " "$BATS_FILE_TMPDIR/serve.$PORT.log")" = $((sent + 1)) ]'
	run in_b env PATH="$BATS_TEST_TMPDIR/bin:$PATH" sh -c "$script"
	assert_success
	sleep 0.2 # a send it would have asked for is logged by now
	[ "$(grep -c "sent m " "$BATS_FILE_TMPDIR/serve.$PORT.log")" = $((sent + 1)) ]
}

@test "a server's SIGTERM ends it with status 0, said, as gmsfs-peer(1) says; it can listen again at once" {
	local port=$((PORT + 9)) rc=0
	serve "$port" m
	kill -TERM "$SERVER_PID"
	wait "$SERVER_PID" || rc=$?
	assert_equal "$rc" 0
	grep -q "stopped serving (SIGTERM or SIGINT)" "$BATS_FILE_TMPDIR/serve.$port.log"
	serve "$port" m # the same port again
	mkdir "$B/again"
	run in_b "$PEER" pull "gmsfs://$ADDR_A:$port/m" "$B/again" --token "$TOKEN" -t 10 -q
	assert_success
	same_store "$A/m" "$B/again"
}
