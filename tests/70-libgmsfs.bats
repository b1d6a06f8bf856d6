#!/usr/bin/env bats
# libgmsfs against a live mount: GMS's runtime scenarios and the issue's bars.
# Each scenario is a small multi-process C program (tests/helpers/gmsfs-scenario.c, a file per family in tests/helpers/scenario/)
# run on a fresh store.

load helpers

SCENARIO=$BUILD/gmsfs-scenario

# The daemon watches a connection's socket after each reply (GMSFS_SPIN_US; by default only
# on machines of 8 cores or more): here too, so that the path is taken.
setup_file() { GMSFS_SPIN_US=200 mount_gmsfs; }
teardown_file() { unmount_gmsfs; }

scenario() {
	mkdir "$MNT/$1"
	run timeout 60 "$SCENARIO" "$1" "$MNT/$1"
	assert_success
}

@test "64 allocations, three bulk readers read the right bytes, no reader maps writable" { scenario readers64; }
@test "readers that watch their sockets for replies (GMSFS_SPIN_US) read the same bytes and remap at the same addresses" {
	for s in readers64 remap_same; do
		mkdir "$MNT/spin-$s"
		GMSFS_SPIN_US=300 run timeout 60 "$SCENARIO" "$s" "$MNT/spin-$s"
		assert_success
	done
}
@test "commit publishes allocations, metadata and hash" { scenario commit_publishes; }
@test "a writer that disconnects without commit aborts; the next starts from the committed layout" { scenario abort_on_disconnect; }
@test "RW_OR_RO is RW on an empty store, RO on a committed one" { scenario rw_or_ro; }
@test "a waiting writer blocks new readers until the last reader leaves" { scenario writer_blocks_readers; }
@test "RW_OR_RO times out while a writer waits behind a reader" { scenario rw_or_ro_timeout; }
@test "a waiting reader gets in when the waiting writer times out" { scenario reader_after_writer_timeout; }
@test "a handler that fires every millisecond never fails a wait: 2 s wait out, or the lock at 1 s; GMSFS_EINTR hands the signal over" { scenario signal_wait; }
@test "several readers hold the committed state until the last leaves" { scenario several_readers; }
@test "a reader's RW-only calls fail with EPERM and change nothing; it cannot become a writer by reallocate_all" { scenario reader_rw_calls_fail; }
@test "one RW connection per writer session (EBUSY, a child's too); no mapping of committed memory stays writable" { scenario one_rw_per_session; }
@test "NULL out-parameters are EINVAL; a directory or a missing name is EISDIR or ENOENT with the name" { scenario bad_args; }
@test "an invalid metadata offset is refused and changes nothing" { scenario bad_offset; }
@test "freeing a mapping removes its allocation and the entries that point at it" { scenario free_removes; }
@test "remap after an unchanged layout keeps every address" { scenario remap_same; }
@test "commit_unmap_all publishes and unmaps the writer, addresses kept; remap_all maps the layout there read-only" { scenario commit_unmap_all; }
@test "remap after a different committed structure fails with ESTALE" { scenario remap_changed; }
@test "remap after the same structure rebuilt is accepted, with the new bytes" { scenario remap_rebuilt; }
@test "remap after the store was removed: ENOENT; made again with another layout: ESTALE" { scenario remap_removed; }
@test "reallocate_all puts fresh allocations behind the preserved addresses" { scenario reallocate; }
@test "virtual spaces: one allocation at three addresses, kept across unmap_all, remap_all and reallocate_all; refusals" { scenario spaces; }
@test "graph pool: captures in spaces of their own over the memory of the largest, in any order" { scenario graph_pool; }
# On a mount of its own: on the shared one, idle committed stores of the other scenarios
# would give way to the host tier and the room it sets up would not be what it counts on.
@test "pages: 64 placed in one request, each its own memory; within a minimum made at reserve and held; a minimum holds room; pages asked back of the lower priority only" {
	local m d
	m=$(mktemp -d "$BATS_TEST_TMPDIR/pages.XXXXXX")
	${GMSFS_WRAP:-} "$GMSFS" -f -o "max_bytes=512M,socket=$m.sock" "$m" 2>"$m.log" 3>&- &
	d=$!
	wait_until grep -q " $m fuse.gmsfs " /proc/mounts
	mkdir "$m/pages"
	run timeout 60 "$SCENARIO" pages "$m/pages"
	umount "$m" 2>/dev/null || umount -l "$m"
	wait $d || true
	[ -z "${GMSFS_DAEMON_LOGS:-}" ] || cp "$m.log" "$GMSFS_DAEMON_LOGS/daemon.pages.log"
	assert_success
}
@test "kept: a dead engine's pages adopted at the same indices with their bytes and records, what it did after its last keep gone, never TORN; dropped, they come back" { scenario kept; }
@test "a writer killed after creating 256 MiB: memory comes back, the last commit stands" { scenario dead_holder_memory; }
@test "a writer killed after importing the last commit (read-only to it) and creating 256 MiB: COMMITTED, not TORN; a reader waiting behind it gets the last commit" { scenario importer_killed; }
@test "100 create-and-leave cycles leak nothing" { scenario abort_cycles; }

@test "a reader's import_all + meta_get of 1000 keys, a writer's bulk put of 1000: at most 4 daemon requests each" {
	scenario requests
	assert_output --partial 'bulk put of 1000 entries'
}
@test "bulk put is all or nothing and names the bad entry; 1 MiB values arrive whole; private entries are copies" { scenario bulk_meta; }
@test "an import maps side by side in one range: freeing some leaves the rest whole and writable; the range goes with the last" { scenario shared_range; }
@test "gmsfs_unmap lets one mapping go: the rest of its range whole, mapped again with its bytes, the range gone with the last; a writer's let go before its commit is committed" { scenario unmap_one; }
@test "create_many: one request for many, all or nothing; a bad entry, a committed name or an unmappable batch leave the layout as it was" { scenario create_many; }

@test "the example program: writer, then reader" {
	mkdir "$MNT/ex"
	run "$BUILD/gmsfs-example" write "$MNT/ex" 8 65536
	assert_success
	local hash
	hash=$(cat "$MNT/ex/layout_hash")
	assert_output --partial "layout $hash"
	run "$BUILD/gmsfs-example" read "$MNT/ex"
	assert_success
	assert_output --partial "imported 8 allocations (524288 bytes), 8 metadata entries, 0 bad words, layout $hash"
	assert_output --partial 'tensors/layer0 -> layers/0/weight+0 u64[8192]'
	# Other allocations beside the layers' (a shell adds one): the reader checks what its entries describe.
	bash -ec "exec 9>$MNT/ex/lock; truncate -s 65536 $MNT/ex/allocs/layers/0/qkv; echo > $MNT/ex/commit"
	run "$BUILD/gmsfs-example" read "$MNT/ex"
	assert_success
	assert_output --partial "imported 9 allocations (589824 bytes), 8 metadata entries, 0 bad words"
}
@test "refit by name in C: every name, dtype and shape checked first, both sides said, nothing written; then the bytes" { scenario refit_by_name; }
@test "refit in C beside a reader (versions): a slab its tensors write whole is not copied for the next version, one they cover in part is" { scenario refit_whole; }
@test "pause: a data-only writer writes in place past a paused reader, which resumes with no map to the new bytes" { scenario pause_resume; }
@test "versions: a data-only writer beside a reader copies what it imports; the reader flips to its name (gmsfs_commit_version, gmsfs_flip_to) when it chooses" { scenario versions_flip; }
@test "gmsfs_commit_version_unmap_all: a name taken refused with the session and its mapping as they were; then named, unmapped, the lock given back" { scenario commit_version_unmap; }
@test "gmsfs_commit_soon gets no reply and changes nothing; gmsfs_commit_disconnect: refusals leave the handle whole, then committed (named or not) and the store free at once" { scenario commit_disconnect; }
