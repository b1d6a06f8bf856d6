# gmsfs: make [all] | check | check-unit | demo | bench | install | clean | fuzz
PREFIX ?= /usr/local
# Where the library goes: $(PREFIX)/lib, or Debian's multiarch folder (make deb).
LIBDIR ?= $(PREFIX)/lib
# Where the systemd units go (Debian's debhelper of bookworm finds them in /lib/systemd/system).
SYSTEMDUNITDIR ?= $(PREFIX)/lib/systemd/system
DESTDIR ?=
CC ?= cc
PKG_CONFIG ?= pkg-config
# One version, the header's: the daemon, the library, the .pc and the man pages agree.
VERSION := $(shell sed -n 's/^\#define GMSFS_VERSION_\(MAJOR\|MINOR\|PATCH\) \([0-9]*\)$$/\2/p' include/gmsfs/gmsfs.h | paste -sd.)

CFLAGS ?= -O2 -g
# Where to build: build/, or another folder for a variant (make check-asan uses build-asan/).
B ?= build
# include/: the public headers (the library API and the ABI); common/: what the daemon and
# the library both compile but do not publish.
override CFLAGS += -std=gnu11 -Wall -Wextra -Wno-unused-parameter -D_GNU_SOURCE -DGMSFS_VERSION='"$(VERSION)"' -pthread \
	-Iinclude -Icommon
DEPS_CFLAGS := $(shell $(PKG_CONFIG) --cflags fuse3 libxxhash msgpack 2>/dev/null)
DEPS_LIBS := $(shell $(PKG_CONFIG) --libs fuse3 libxxhash msgpack 2>/dev/null)
MSGPACK_CFLAGS := $(shell $(PKG_CONFIG) --cflags msgpack 2>/dev/null)
MSGPACK_LIBS := $(shell $(PKG_CONFIG) --libs msgpack 2>/dev/null)
XXH_LIBS := $(shell $(PKG_CONFIG) --libs libxxhash 2>/dev/null)
XXH_CFLAGS := $(shell $(PKG_CONFIG) --cflags libxxhash 2>/dev/null)

PUBLIC_HDR := include/gmsfs/gmsfs.h include/gmsfs/abi.h include/gmsfs/torch.h include/gmsfs/load.h include/gmsfs/peer.h
COMMON_HDR := $(PUBLIC_HDR) $(wildcard common/*.h)
# XXH3-64 of pieces at the CPU's widest vectors (each kind its own file: its own target).
PIECE_HASH_SRC := common/piece_hash.c common/piece_hash_avx2.c common/piece_hash_avx512.c
WIRE_SRC := common/wire_msgpack.c common/wire_req.c common/wire_reply.c common/wire_image.c
FSM_SRC := src/fsm/fsm.c
META_SRC := src/meta/node.c src/meta/store.c src/meta/entry.c src/meta/commit.c src/meta/undo.c src/meta/intern.c src/meta/layout_hash.c src/meta/batch.c src/meta/view.c src/meta/version_name.c
VMM_SRC := src/vmm/vmm_release.c src/vmm/vmm_account.c src/vmm/vmm_spare.c src/vmm/vmm_buf.c src/vmm/vmm_move.c src/vmm/vmm_facts.c src/vmm/vmm_open.c src/vmm/vmm_pieces.c src/vmm/vmm_pages.c src/vmm/vmm_switch.c src/vmm/vmm_copy.c src/vmm/vmm_host.c src/vmm/vmm_cuda_open.c src/vmm/vmm_cuda.c
# cuda.h only: libcuda is loaded at run time (dlopen), never linked.
CUDA_INC ?= /usr/local/cuda/include
ifneq ($(wildcard $(CUDA_INC)/cuda.h),)
override CFLAGS += -DGMSFS_HAVE_CUDA -I$(CUDA_INC)
HAVE_CUDA := 1
endif
FS_SRC := $(addprefix src/fs/,main.c options.c node.c content.c named.c history.c memory.c ops.c ops_handle.c ops_tree.c ops_file.c ops_xattr.c ops_ioctl.c fault.c version.c \
	store.c lock_want.c lock.c lock_restart.c lock_member.c wait.c inval.c caller.c text.c mnt.c log.c tier.c tier_move.c tier_room.c image.c handover.c keep_disk.c keep.c keep_start.c keep_watch.c export/ticket.c export/sock.c export/sock_accept.c export/rpc_reply.c export/rpc.c)
DAEMON_SRC := $(FS_SRC) $(FSM_SRC) $(META_SRC) $(VMM_SRC) $(WIRE_SRC)
DAEMON_HDR := $(COMMON_HDR) $(wildcard src/*/*.h src/*/*/*.h)

LIB_SRC := $(PIECE_HASH_SRC) $(addprefix libgmsfs/,handle.c let_go.c channel.c hash_cuda.c maps.c meta.c layout.c refit.c sleep.c space.c pages.c pages_held.c kept.c tie.c version.c graph.c torch.c manifest.c digest.c map_host.c map_cuda.c) $(WIRE_SRC)
LIB_HDR := $(COMMON_HDR) libgmsfs/internal.h libgmsfs/digest_gpu_ptx.h
LIB_SONAME := libgmsfs.so.0

BIN := $(B)/gmsfs
KEEPER := $(B)/gmsfs-keeper
LIB := $(B)/libgmsfs.so $(B)/gmsfs.pc $(B)/libgmsfs-load.so
UNIT := $(B)/test_fsm $(B)/test_meta $(B)/test_wire $(B)/test_piece_hash $(B)/test_copy $(B)/test_show_only $(B)/test_facts \
	$(B)/test_release $(B)/test_xxh3_lanes
HELPERS := $(B)/gmsfs-open $(B)/gmsfs-session $(B)/gmsfs-probe $(B)/gmsfs-scenario $(B)/gmsfs-storm
EXAMPLES := $(B)/gmsfs-example
LOADER := $(B)/gmsfs-load $(B)/gmsfs-save $(B)/gmsfs-snapshot
LOADER_SRC := $(PIECE_HASH_SRC) loader/json.c loader/layout_hash.c loader/safetensors.c loader/copy_cuda.c loader/copy.c loader/copy_save.c loader/peer.c loader/gms_format.c loader/snap.c loader/snap_save.c loader/store_files.c
LOAD_SONAME := libgmsfs-load.so.1
# gmsfs-peer (serve and pull stores between nodes) is built where UCX is (libucx-dev).
UCX_CFLAGS := $(shell $(PKG_CONFIG) --cflags ucx 2>/dev/null)
UCX_LIBS := $(shell $(PKG_CONFIG) --libs ucx 2>/dev/null)
PEER_SRC := $(PIECE_HASH_SRC) peer/net_wire.c peer/net.c peer/lane.c peer/serve.c peer/pull.c loader/copy_cuda.c loader/copy.c loader/copy_save.c loader/store_files.c common/wire_msgpack.c
PEER_SONAME := libgmsfs-peer.so.1
ifneq ($(UCX_LIBS),)
LOADER += $(B)/gmsfs-peer
LIB += $(B)/libgmsfs-peer.so
endif
BENCH := $(B)/bench-import $(B)/bench-minfs $(B)/bench-control $(B)/bench-pages
ifdef HAVE_CUDA
BENCH += $(B)/bench-gpu $(B)/bench-load-floor $(B)/bench-duplex
MOVER := $(B)/gmsfs-mover
endif
# Programs linked against the library in $(B)/, found there at run time.
LINK_LIB := -L$(B) -lgmsfs -Wl,-rpath,'$$ORIGIN'

.PHONY: all check check-quick check-asan check-unit demo bench install install-node install-peer deb wheel clean deps fuzz fuzzers
all: $(BIN) $(KEEPER) $(MOVER) $(LIB) $(UNIT) $(HELPERS) $(EXAMPLES) $(BENCH) $(LOADER)

$(B):
	mkdir -p $(B)

# The host tier's copy helper of the cuda backend (a CUDA context, which the daemon never makes).
$(B)/gmsfs-mover: src/mover/mover.c src/mover/mover.h common/cuda_api.h common/fdpass.h | $(B)
	$(CC) $(CPPFLAGS) $(CFLAGS) $(LDFLAGS) -o $@ $< -ldl

# The descriptor store of daemons without systemd (a container's): stores outlive their daemon.
$(KEEPER): src/keeper/keeper.c common/fdpass.h | $(B)
	$(CC) $(CPPFLAGS) $(CFLAGS) $(LDFLAGS) -o $@ $<

$(BIN): $(DAEMON_SRC) $(DAEMON_HDR) | $(B)
	@$(PKG_CONFIG) --exists fuse3 libxxhash msgpack || { echo 'missing fuse3/libxxhash/msgpack: run make deps'; exit 1; }
	$(CC) $(CPPFLAGS) $(CFLAGS) $(DEPS_CFLAGS) $(LDFLAGS) -o $@ $(DAEMON_SRC) $(DEPS_LIBS) -ldl

$(B)/libgmsfs.so: $(LIB_SRC) $(LIB_HDR) | $(B)
	$(CC) $(CPPFLAGS) $(CFLAGS) $(MSGPACK_CFLAGS) $(LDFLAGS) -Ilibgmsfs -fPIC -fvisibility=hidden -shared -Wl,-soname,$(LIB_SONAME) \
		-o $(B)/$(LIB_SONAME) $(LIB_SRC) $(MSGPACK_LIBS) -ldl
	ln -sf $(LIB_SONAME) $@

# The .pc of the build tree; make install writes one for its own PREFIX.
$(B)/gmsfs.pc: libgmsfs/gmsfs.pc.in | $(B)
	sed -e 's|@PREFIX@|$(PREFIX)|' -e 's|@LIBDIR@|$(LIBDIR)|' -e 's|@VERSION@|$(VERSION)|' $< > $@

$(B)/gmsfs-example: examples/weights.c $(B)/libgmsfs.so
	$(CC) $(CPPFLAGS) $(CFLAGS) -o $@ $< $(LINK_LIB)

SCENARIO_SRC := $(wildcard tests/helpers/scenario/*.c)
$(B)/gmsfs-scenario: tests/helpers/gmsfs-scenario.c $(SCENARIO_SRC) tests/helpers/scenario/scenario.h common/cuda_api.h \
		$(B)/libgmsfs.so
	$(CC) $(CPPFLAGS) $(CFLAGS) -o $@ $< $(SCENARIO_SRC) $(LINK_LIB) -ldl

$(B)/gmsfs-storm: tests/helpers/gmsfs-storm.c $(B)/libgmsfs.so
	$(CC) $(CPPFLAGS) $(CFLAGS) -o $@ $< $(LINK_LIB)

$(B)/gmsfs-probe: tests/helpers/gmsfs-probe.c $(COMMON_HDR) $(WIRE_SRC) | $(B)
	$(CC) $(CPPFLAGS) $(CFLAGS) $(MSGPACK_CFLAGS) -o $@ $< $(WIRE_SRC) $(MSGPACK_LIBS)

$(B)/bench-import: bench/bench_import.c bench/bench.h $(B)/libgmsfs.so
	$(CC) $(CPPFLAGS) $(CFLAGS) -o $@ $< $(LINK_LIB)

# The loader: safetensors in (gmsfs-load, around libgmsfs-load: gmsfs_load, which Python
# engines call in their own process) and out (gmsfs-save), on libgmsfs.
$(B)/libgmsfs-load.so: loader/loadlib.c $(LOADER_SRC) loader/*.h $(PUBLIC_HDR) common/cuda_api.h $(B)/libgmsfs.so
	$(CC) $(CPPFLAGS) $(CFLAGS) $(XXH_CFLAGS) $(LDFLAGS) -fPIC -fvisibility=hidden -shared -Wl,-soname,$(LOAD_SONAME) \
		-o $(B)/$(LOAD_SONAME) loader/loadlib.c $(LOADER_SRC) $(LINK_LIB) -ldl
	ln -sf $(LOAD_SONAME) $@

$(B)/gmsfs-load: loader/load.c $(PUBLIC_HDR) $(B)/libgmsfs-load.so
	$(CC) $(CPPFLAGS) $(CFLAGS) $(LDFLAGS) -o $@ $< -L$(B) -lgmsfs-load $(LINK_LIB)

$(B)/gmsfs-%: loader/%.c $(LOADER_SRC) loader/*.h $(PUBLIC_HDR) common/cuda_api.h common/unheld.h $(B)/libgmsfs.so
	$(CC) $(CPPFLAGS) $(CFLAGS) $(XXH_CFLAGS) $(LDFLAGS) -o $@ $< $(LOADER_SRC) $(LINK_LIB) -ldl

# libgmsfs-peer: gmsfs_pull, which gmsfsctl pull and Python engines call in their own process.
$(B)/libgmsfs-peer.so: peer/peerlib.c $(PEER_SRC) peer/*.h loader/*.h $(PUBLIC_HDR) common/cuda_api.h $(B)/libgmsfs.so
	$(CC) $(CPPFLAGS) $(CFLAGS) $(UCX_CFLAGS) $(MSGPACK_CFLAGS) $(XXH_CFLAGS) $(LDFLAGS) -fPIC -fvisibility=hidden \
		-shared -Wl,-soname,$(PEER_SONAME) -o $(B)/$(PEER_SONAME) peer/peerlib.c $(PEER_SRC) \
		$(LINK_LIB) $(UCX_LIBS) $(MSGPACK_LIBS) $(XXH_LIBS) -ldl
	ln -sf $(PEER_SONAME) $@

$(B)/gmsfs-peer: peer/gmsfs_peer.c $(PEER_SRC) peer/*.h loader/*.h $(PUBLIC_HDR) common/cuda_api.h $(B)/libgmsfs.so
	$(CC) $(CPPFLAGS) $(CFLAGS) $(UCX_CFLAGS) $(MSGPACK_CFLAGS) $(XXH_CFLAGS) $(LDFLAGS) -o $@ $< $(PEER_SRC) \
		$(LINK_LIB) $(UCX_LIBS) $(MSGPACK_LIBS) $(XXH_LIBS) -ldl

# The baseline for the control files: a minimal low-level FUSE file system.
$(B)/bench-minfs: bench/bench_minfs.c | $(B)
	$(CC) $(CPPFLAGS) $(CFLAGS) $(DEPS_CFLAGS) -o $@ $< $(DEPS_LIBS)

$(B)/bench-control: bench/bench_control.c bench/bench.h | $(B)
	$(CC) $(CPPFLAGS) $(CFLAGS) -o $@ $<

$(B)/bench-gpu: bench/bench_gpu.c bench/bench.h bench/fetch.h common/cuda_api.h $(WIRE_SRC) $(B)/libgmsfs.so
	$(CC) $(CPPFLAGS) $(CFLAGS) $(MSGPACK_CFLAGS) -o $@ $< $(WIRE_SRC) $(LINK_LIB) $(MSGPACK_LIBS) -ldl

$(B)/bench-pages: bench/bench_pages.c common/cuda_api.h $(B)/libgmsfs.so
	$(CC) $(CPPFLAGS) $(CFLAGS) -o $@ $< $(LINK_LIB) -ldl

$(B)/bench-load-floor: bench/bench_load_floor.c common/cuda_api.h | $(B)
	$(CC) $(CPPFLAGS) $(CFLAGS) -o $@ $< -ldl

$(B)/bench-duplex: bench/bench_duplex.c common/cuda_api.h | $(B)
	$(CC) $(CPPFLAGS) $(CFLAGS) -o $@ $< -ldl

# The codec alone: no daemon or library internals linked in.
$(B)/test_wire: tests/unit/test_wire.c $(WIRE_SRC) $(COMMON_HDR) tests/unit/tap.h | $(B)
	$(CC) $(CPPFLAGS) $(CFLAGS) $(MSGPACK_CFLAGS) -o $@ tests/unit/test_wire.c $(WIRE_SRC) $(MSGPACK_LIBS)

# Where a loaded piece sits in its pinned buffer (the GPU path's arithmetic, on any host).
$(B)/test_copy: tests/unit/test_copy.c loader/copy.h tests/unit/tap.h | $(B)
	$(CC) $(CPPFLAGS) $(CFLAGS) -Iloader -o $@ tests/unit/test_copy.c

# What a command shows the driver of the machine's GPUs (its stores' alone), on stand-in mounts.
$(B)/test_show_only: tests/unit/test_show_only.c loader/copy_cuda.c loader/copy_cuda.h loader/store_files.c \
		loader/store_files.h tests/unit/tap.h | $(B)
	$(CC) $(CPPFLAGS) $(CFLAGS) -Iloader -Icommon -o $@ tests/unit/test_show_only.c loader/copy_cuda.c \
		loader/store_files.c -ldl -pthread

# A device's facts kept for the next daemon's start: written, read, checked, fitted.
$(B)/test_facts: tests/unit/test_facts.c src/vmm/vmm_facts.c src/vmm/vmm.h tests/unit/tap.h | $(B)
	$(CC) $(CPPFLAGS) $(CFLAGS) -o $@ tests/unit/test_facts.c src/vmm/vmm_facts.c

$(B)/test_release: tests/unit/test_release.c src/vmm/vmm_release.c src/vmm/vmm_internal.h src/vmm/vmm.h \
		tests/unit/tap.h | $(B)
	$(CC) $(CPPFLAGS) $(CFLAGS) -Isrc/vmm -o $@ tests/unit/test_release.c src/vmm/vmm_release.c -lpthread

# Each kind of the pieces' hash against libxxhash's own XXH3.
$(B)/test_piece_hash: tests/unit/test_piece_hash.c $(PIECE_HASH_SRC) common/piece_hash.h tests/unit/tap.h | $(B)
	$(CC) $(CPPFLAGS) $(CFLAGS) $(XXH_CFLAGS) -o $@ tests/unit/test_piece_hash.c $(PIECE_HASH_SRC) $(XXH_LIBS)

# The GPU's XXH3 (the content hash's kernel, compiled as C) against libxxhash's.
$(B)/test_xxh3_lanes: tests/unit/test_xxh3_lanes.c common/xxh3_lanes.h tests/unit/tap.h | $(B)
	$(CC) $(CPPFLAGS) $(CFLAGS) $(XXH_CFLAGS) -o $@ tests/unit/test_xxh3_lanes.c $(XXH_LIBS)

$(B)/test_fsm: tests/unit/test_fsm.c $(FSM_SRC) src/fsm/fsm.h tests/unit/tap.h | $(B)
	$(CC) $(CPPFLAGS) $(CFLAGS) -o $@ tests/unit/test_fsm.c $(FSM_SRC)

$(B)/test_meta: tests/unit/test_meta.c $(META_SRC) src/meta/*.h $(COMMON_HDR) tests/unit/tap.h | $(B)
	$(CC) $(CPPFLAGS) $(CFLAGS) $(DEPS_CFLAGS) -o $@ tests/unit/test_meta.c $(META_SRC) $(XXH_LIBS)

$(B)/gmsfs-open: tests/helpers/gmsfs-open.c | $(B)
	$(CC) $(CPPFLAGS) $(CFLAGS) -o $@ $<

$(B)/gmsfs-session: tests/helpers/gmsfs-session.c | $(B)
	$(CC) $(CPPFLAGS) $(CFLAGS) -o $@ $<

deps:
	sh scripts/install-deps.sh

check-unit: $(UNIT)
	prove $(UNIT)

ASAN_CFLAGS := -O1 -g -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer
# The longest files first, so that two at a time end together (tests/README.md has the times).
LONG_BATS := tests/62-peer.bats tests/58-faults.bats tests/25-waiting.bats tests/57-operations.bats
QUICK_TESTS := tests/python.sh $(LONG_BATS) $(filter-out $(LONG_BATS),$(wildcard tests/*.bats)) tests/wheel.sh \
	tests/memory.sh tests/docs.sh tests/layout.sh $(UNIT)
# The whole suite, one prove run, two files at a time (tests/check.sh, which then names
# the slowest files and tests, and fails past 45 minutes): C unit tests are TAP programs,
# mount tests are bats files; the mount tests again with the daemon under valgrind and on
# an ASan+UBSan build, the container images (built and run: tests/container.sh), every
# fuzzer for 30 s, and last, alone, the Debian packages (built, installed, used, purged:
# tests/debs.sh).  Installs what is missing first, then builds in a sub-make (pkg-config
# must see the packages).  make check-quick: the first part only, within 10 minutes.
check: deps
	$(MAKE) all fuzzers
	$(MAKE) all B=build-asan CFLAGS="$(ASAN_CFLAGS)"
	bash tests/check.sh tests/valgrind.sh tests/sanitizers.sh tests/container.sh $(QUICK_TESTS) tests/fuzz.sh tests/debs.sh

check-quick: all
	GMSFS_CHECK_LIMIT_S=600 bash tests/check.sh $(QUICK_TESTS)

check-asan:
	$(MAKE) all B=build-asan CFLAGS="$(ASAN_CFLAGS)"
	prove --exec tests/tap-exec tests/sanitizers.sh

# Only what the demo shows is installed (no podman, lintian, valgrind...).
demo:
	sh scripts/install-deps.sh demo
	$(MAKE) all
	sh scripts/demo.sh

# The host benchmarks (ratios against baselines measured in the same run, not tests):
# import against the mapping floor, control files against a minimal FUSE file system,
# and scale (bench/scale.py).
bench: all
	sh scripts/bench.sh

# The Python package: where Debian's python3 looks (PREFIX=/usr: dist-packages of all versions).
PYVER := $(shell /usr/bin/python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)
PYTHONDIR ?= $(if $(filter /usr,$(PREFIX)),$(PREFIX)/lib/python3/dist-packages,$(PREFIX)/lib/python$(PYVER)/dist-packages)

# What a node runs, and all the daemon image has (deploy/container/Containerfile): the
# daemon and its mover, the node script, gmsfsctl with the Python package and the library
# that package loads.
install-node: $(BIN) $(KEEPER) $(B)/libgmsfs.so $(MOVER)
	install -D -m 0755 $(BIN) $(DESTDIR)$(PREFIX)/bin/gmsfs
	install -D -m 0755 $(KEEPER) $(DESTDIR)$(PREFIX)/sbin/gmsfs-keeper
	$(if $(MOVER),install -D -m 0755 $(MOVER) $(DESTDIR)$(PREFIX)/lib/gmsfs/gmsfs-mover)
	install -D -m 0755 tools/gmsfs-node $(DESTDIR)$(PREFIX)/sbin/gmsfs-node
	install -D -m 0755 tools/gmsfs-csi $(DESTDIR)$(PREFIX)/sbin/gmsfs-csi
	install -D -m 0755 tools/gmsfsctl $(DESTDIR)$(PREFIX)/bin/gmsfsctl
	install -D -m 0644 $(B)/$(LIB_SONAME) $(DESTDIR)$(LIBDIR)/$(LIB_SONAME)
	for f in python/gmsfs/*.py; do install -D -m 0644 $$f $(DESTDIR)$(PYTHONDIR)/gmsfs/$${f##*/}; done
	install -D -m 0644 python/gmsfs/gms_alias/gpu_memory_service/__init__.py \
		$(DESTDIR)$(PYTHONDIR)/gmsfs/gms_alias/gpu_memory_service/__init__.py

# gmsfs-peer and libgmsfs-peer (gmsfsctl pull, gmsfs.pull), where UCX is: the daemon image
# serves and pulls with them.
install-peer: $(filter $(B)/gmsfs-peer $(B)/libgmsfs-peer.so,$(LOADER) $(LIB))
	@[ -x $(B)/gmsfs-peer ] || { echo "install-peer: no gmsfs-peer: build with UCX (libucx-dev)" >&2; exit 1; }
	install -D -m 0755 $(B)/gmsfs-peer $(DESTDIR)$(PREFIX)/bin/gmsfs-peer
	install -D -m 0644 $(B)/$(PEER_SONAME) $(DESTDIR)$(LIBDIR)/$(PEER_SONAME)
	install -D -m 0644 man/gmsfs-peer.1 $(DESTDIR)$(PREFIX)/share/man/man1/gmsfs-peer.1

install: install-node $(LIB) $(LOADER)
	ln -sf $(LIB_SONAME) $(DESTDIR)$(LIBDIR)/libgmsfs.so
	install -D -m 0644 $(B)/$(LOAD_SONAME) $(DESTDIR)$(LIBDIR)/$(LOAD_SONAME)
	ln -sf $(LOAD_SONAME) $(DESTDIR)$(LIBDIR)/libgmsfs-load.so
	install -D -m 0644 include/gmsfs/gmsfs.h $(DESTDIR)$(PREFIX)/include/gmsfs/gmsfs.h
	install -D -m 0644 include/gmsfs/abi.h $(DESTDIR)$(PREFIX)/include/gmsfs/abi.h
	install -D -m 0644 include/gmsfs/torch.h $(DESTDIR)$(PREFIX)/include/gmsfs/torch.h
	install -D -m 0644 include/gmsfs/load.h $(DESTDIR)$(PREFIX)/include/gmsfs/load.h
	mkdir -p $(DESTDIR)$(LIBDIR)/pkgconfig
	sed -e 's|@PREFIX@|$(PREFIX)|' -e 's|@LIBDIR@|$(LIBDIR)|' -e 's|@VERSION@|$(VERSION)|' libgmsfs/gmsfs.pc.in \
		> $(DESTDIR)$(LIBDIR)/pkgconfig/gmsfs.pc
	install -D -m 0644 man/libgmsfs.3 $(DESTDIR)$(PREFIX)/share/man/man3/libgmsfs.3
	install -D -m 0644 man/gmsfs.8 $(DESTDIR)$(PREFIX)/share/man/man8/gmsfs.8
	install -D -m 0644 man/gmsfs.5 $(DESTDIR)$(PREFIX)/share/man/man5/gmsfs.5
	install -D -m 0644 man/gmsfsctl.8 $(DESTDIR)$(PREFIX)/share/man/man8/gmsfsctl.8
	install -D -m 0644 man/gmsfs-keeper.8 $(DESTDIR)$(PREFIX)/share/man/man8/gmsfs-keeper.8
	install -D -m 0644 man/gmsfs-csi.8 $(DESTDIR)$(PREFIX)/share/man/man8/gmsfs-csi.8
	install -D -m 0644 man/mount.gmsfs.8 $(DESTDIR)$(PREFIX)/share/man/man8/mount.gmsfs.8
	for n in mount.fuse.gmsfs gmsfs-mount-all gmsfs-node; do echo '.so man8/mount.gmsfs.8' > $(DESTDIR)$(PREFIX)/share/man/man8/$$n.8; done
	install -D -m 0755 $(B)/gmsfs-load $(DESTDIR)$(PREFIX)/bin/gmsfs-load
	install -D -m 0755 $(B)/gmsfs-save $(DESTDIR)$(PREFIX)/bin/gmsfs-save
	install -D -m 0644 man/gmsfs-load.1 $(DESTDIR)$(PREFIX)/share/man/man1/gmsfs-load.1
	install -D -m 0755 $(B)/gmsfs-snapshot $(DESTDIR)$(PREFIX)/bin/gmsfs-snapshot
	if [ -x $(B)/gmsfs-peer ]; then $(MAKE) -s install-peer && \
		ln -sf $(PEER_SONAME) $(DESTDIR)$(LIBDIR)/libgmsfs-peer.so && \
		install -D -m 0644 include/gmsfs/peer.h $(DESTDIR)$(PREFIX)/include/gmsfs/peer.h; fi
	for n in gmsfs-save gmsfs-snapshot; do echo '.so man1/gmsfs-load.1' > $(DESTDIR)$(PREFIX)/share/man/man1/$$n.1; done
	install -D -m 0755 tools/gmsfs-mount-all $(DESTDIR)$(PREFIX)/sbin/gmsfs-mount-all
	# mount -t fuse.gmsfs runs /sbin/mount.fuse.gmsfs (/usr/sbin on a merged /usr)
	install -D -m 0755 tools/mount.gmsfs $(DESTDIR)$(PREFIX)/sbin/mount.fuse.gmsfs
	ln -sf mount.fuse.gmsfs $(DESTDIR)$(PREFIX)/sbin/mount.gmsfs
	for f in systemd/*; do sed -e 's|/usr/bin/|$(PREFIX)/bin/|; s|/usr/sbin/|$(PREFIX)/sbin/|' $$f | \
		install -D -m 0644 /dev/stdin $(DESTDIR)$(SYSTEMDUNITDIR)/$${f##*/}; done

# Debian packages (gmsfs, libgmsfs0, libgmsfs-dev, python3-gmsfs) into $(B)/deb/, built
# by debhelper in a copy of the tree (git's files, committed or not), then lintian.
deb:
	rm -rf $(B)/deb && mkdir -p $(B)/deb/gmsfs-$(VERSION)
	git ls-files -co --exclude-standard | tar -cf - -T - | tar -xf - -C $(B)/deb/gmsfs-$(VERSION)
	cd $(B)/deb/gmsfs-$(VERSION) && env -u MAKEFLAGS -u MAKELEVEL -u MFLAGS dpkg-buildpackage -us -uc -b >../build.log 2>&1 || { tail -30 ../build.log; exit 1; }
	lintian --no-tag-display-limit $(B)/deb/*.changes || true
	ls $(B)/deb/*.deb

# The Python package with its client library, for venvs and engine images (pip install
# dist/gmsfs-*.whl): python/wheel_backend.py, also pyproject.toml's backend.
wheel:
	rm -f dist/gmsfs-*.whl
	python3 python/wheel_backend.py dist

clean:
	rm -rf build dist

# Fuzz what parses input (needs clang): make fuzz FUZZ_SECONDS=60
FUZZ_SECONDS ?= 30
FUZZ_CFLAGS := -g -O1 -D_GNU_SOURCE -Iinclude -Icommon -fsanitize=fuzzer,address,undefined
$(B)/fuzz_meta: tests/fuzz/fuzz_meta.c $(META_SRC) src/meta/*.h $(COMMON_HDR) | $(B)
	clang $(FUZZ_CFLAGS) -o $@ tests/fuzz/fuzz_meta.c $(META_SRC) $(XXH_LIBS)

# The wire codec alone: request headers and bodies, replies.
$(B)/fuzz_wire: tests/fuzz/fuzz_wire.c $(WIRE_SRC) $(COMMON_HDR) | $(B)
	clang $(FUZZ_CFLAGS) $(MSGPACK_CFLAGS) -o $@ tests/fuzz/fuzz_wire.c $(WIRE_SRC) $(MSGPACK_LIBS)

$(B)/fuzz_safetensors: tests/fuzz/fuzz_safetensors.c loader/safetensors.c loader/json.c loader/*.h | $(B)
	clang $(FUZZ_CFLAGS) -o $@ tests/fuzz/fuzz_safetensors.c loader/safetensors.c loader/json.c

$(B)/fuzz_net: tests/fuzz/fuzz_net.c peer/net_wire.c peer/net_wire.h common/wire_msgpack.c | $(B)
	clang $(FUZZ_CFLAGS) $(MSGPACK_CFLAGS) -o $@ tests/fuzz/fuzz_net.c peer/net_wire.c common/wire_msgpack.c $(MSGPACK_LIBS)

fuzzers: $(B)/fuzz_meta $(B)/fuzz_wire $(B)/fuzz_safetensors $(B)/fuzz_net

fuzz: $(B)/fuzz_meta $(B)/fuzz_wire $(B)/fuzz_safetensors $(B)/fuzz_net
	mkdir -p $(B)/fuzz-corpus $(B)/fuzz-wire-corpus $(B)/fuzz-st-corpus $(B)/fuzz-net-corpus
	$(B)/fuzz_net -max_total_time=$(FUZZ_SECONDS) -max_len=8192 $(B)/fuzz-net-corpus tests/fuzz/net-seeds
	$(B)/fuzz_safetensors -max_total_time=$(FUZZ_SECONDS) -max_len=8192 $(B)/fuzz-st-corpus tests/fuzz/safetensors-seeds
	$(B)/fuzz_meta -max_total_time=$(FUZZ_SECONDS) -max_len=2048 $(B)/fuzz-corpus
	$(B)/fuzz_wire -max_total_time=$(FUZZ_SECONDS) -max_len=8192 $(B)/fuzz-wire-corpus tests/fuzz/wire-seeds
