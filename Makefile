# gmsfs: make [all] | check | check-unit | demo | bench | install | clean | fuzz
PREFIX ?= /usr/local
DESTDIR ?=
CC ?= cc
PKG_CONFIG ?= pkg-config
# One version, the header's: the daemon, the library, the .pc and the man pages agree.
VERSION := $(shell sed -n 's/^\#define GMSFS_VERSION_\(MAJOR\|MINOR\|PATCH\) \([0-9]*\)$$/\2/p' include/gmsfs/gmsfs.h | paste -sd.)

CFLAGS ?= -O2 -g
# include/: the public headers (the library API and the ABI); common/: what the daemon and
# the library both compile but do not publish.
CFLAGS += -std=gnu11 -Wall -Wextra -Wno-unused-parameter -D_GNU_SOURCE -DGMSFS_VERSION='"$(VERSION)"' -pthread \
	-Iinclude -Icommon
DEPS_CFLAGS := $(shell $(PKG_CONFIG) --cflags fuse3 libxxhash msgpack 2>/dev/null)
DEPS_LIBS := $(shell $(PKG_CONFIG) --libs fuse3 libxxhash msgpack 2>/dev/null)
MSGPACK_CFLAGS := $(shell $(PKG_CONFIG) --cflags msgpack 2>/dev/null)
MSGPACK_LIBS := $(shell $(PKG_CONFIG) --libs msgpack 2>/dev/null)
XXH_LIBS := $(shell $(PKG_CONFIG) --libs libxxhash 2>/dev/null)

PUBLIC_HDR := include/gmsfs/gmsfs.h include/gmsfs/abi.h
COMMON_HDR := $(PUBLIC_HDR) $(wildcard common/*.h)
WIRE_SRC := common/wire.c common/wire_req.c common/wire_reply.c
FSM_SRC := src/fsm/fsm.c
META_SRC := src/meta/meta.c src/meta/snapshot.c src/meta/layout_hash.c src/meta/batch.c
VMM_SRC := src/vmm/vmm.c src/vmm/vmm_host.c src/vmm/vmm_cuda.c
# cuda.h only: libcuda is loaded at run time (dlopen), never linked.
CUDA_INC ?= /usr/local/cuda/include
ifneq ($(wildcard $(CUDA_INC)/cuda.h),)
CFLAGS += -DGMSFS_HAVE_CUDA -I$(CUDA_INC)
HAVE_CUDA := 1
endif
FS_SRC := $(addprefix src/fs/,main.c node.c handle.c ops.c ops_tree.c ops_file.c ops_xattr.c ops_ioctl.c \
	store.c wait.c caller.c text.c ticket.c sock.c rpc.c)
DAEMON_SRC := $(FS_SRC) $(FSM_SRC) $(META_SRC) $(VMM_SRC) $(WIRE_SRC)
DAEMON_HDR := $(COMMON_HDR) $(wildcard src/*/*.h)

LIB_SRC := $(addprefix libgmsfs/,handle.c channel.c maps.c meta.c sleep.c map_host.c map_cuda.c) $(WIRE_SRC)
LIB_HDR := $(COMMON_HDR) libgmsfs/internal.h
LIB_SONAME := libgmsfs.so.0

BIN := build/gmsfs
LIB := build/libgmsfs.so build/gmsfs.pc
UNIT := build/test_fsm build/test_meta build/test_wire
HELPERS := build/gmsfs-open build/gmsfs-probe build/gmsfs-scenario
EXAMPLES := build/gmsfs-example
BENCH := build/bench-import
ifdef HAVE_CUDA
BENCH += build/bench-gpu
endif
# Programs linked against the library in build/, found there at run time.
LINK_LIB := -Lbuild -lgmsfs -Wl,-rpath,'$$ORIGIN'

.PHONY: all check check-unit demo bench install clean deps fuzz
all: $(BIN) $(LIB) $(UNIT) $(HELPERS) $(EXAMPLES) $(BENCH)

build:
	mkdir -p build

$(BIN): $(DAEMON_SRC) $(DAEMON_HDR) | build
	@$(PKG_CONFIG) --exists fuse3 libxxhash msgpack || { echo 'missing fuse3/libxxhash/msgpack: run make deps'; exit 1; }
	$(CC) $(CFLAGS) $(DEPS_CFLAGS) -o $@ $(DAEMON_SRC) $(DEPS_LIBS) -ldl

build/libgmsfs.so: $(LIB_SRC) $(LIB_HDR) | build
	$(CC) $(CFLAGS) $(MSGPACK_CFLAGS) -Ilibgmsfs -fPIC -fvisibility=hidden -shared -Wl,-soname,$(LIB_SONAME) \
		-o build/$(LIB_SONAME) $(LIB_SRC) $(MSGPACK_LIBS) -ldl
	ln -sf $(LIB_SONAME) $@

# The .pc of the build tree; make install writes one for its own PREFIX.
build/gmsfs.pc: libgmsfs/gmsfs.pc.in | build
	sed -e 's|@PREFIX@|$(PREFIX)|' -e 's|@VERSION@|$(VERSION)|' $< > $@

build/gmsfs-example: examples/weights.c build/libgmsfs.so
	$(CC) $(CFLAGS) -o $@ $< $(LINK_LIB)

build/gmsfs-scenario: tests/helpers/gmsfs-scenario.c common/cuda_api.h build/libgmsfs.so
	$(CC) $(CFLAGS) -o $@ $< $(LINK_LIB) -ldl

build/gmsfs-probe: tests/helpers/gmsfs-probe.c $(COMMON_HDR) $(WIRE_SRC) | build
	$(CC) $(CFLAGS) $(MSGPACK_CFLAGS) -o $@ $< $(WIRE_SRC) $(MSGPACK_LIBS)

build/bench-import: bench/bench_import.c bench/bench.h build/libgmsfs.so
	$(CC) $(CFLAGS) -o $@ $< $(LINK_LIB)

build/bench-gpu: bench/bench_gpu.c bench/bench.h bench/fetch.h common/cuda_api.h $(WIRE_SRC) build/libgmsfs.so
	$(CC) $(CFLAGS) $(MSGPACK_CFLAGS) -o $@ $< $(WIRE_SRC) $(LINK_LIB) $(MSGPACK_LIBS) -ldl

# The codec alone: no daemon or library internals linked in.
build/test_wire: tests/unit/test_wire.c $(WIRE_SRC) $(COMMON_HDR) tests/unit/tap.h | build
	$(CC) $(CFLAGS) $(MSGPACK_CFLAGS) -o $@ tests/unit/test_wire.c $(WIRE_SRC) $(MSGPACK_LIBS)

build/test_fsm: tests/unit/test_fsm.c $(FSM_SRC) src/fsm/fsm.h tests/unit/tap.h | build
	$(CC) $(CFLAGS) -o $@ tests/unit/test_fsm.c $(FSM_SRC)

build/test_meta: tests/unit/test_meta.c $(META_SRC) src/meta/*.h $(COMMON_HDR) tests/unit/tap.h | build
	$(CC) $(CFLAGS) $(DEPS_CFLAGS) -o $@ tests/unit/test_meta.c $(META_SRC) $(XXH_LIBS)

build/gmsfs-open: tests/helpers/gmsfs-open.c | build
	$(CC) $(CFLAGS) -o $@ $<

deps:
	sh scripts/install-deps.sh

check-unit: $(UNIT)
	prove $(UNIT)

# The whole suite, one prove run: C unit tests are TAP programs, mount tests are bats
# files, the layout rule a script.  Installs what is missing first, then builds in a
# sub-make (pkg-config must see the packages).
check: deps
	$(MAKE) all
	prove --exec tests/tap-exec $(UNIT) tests/layout.sh tests/*.bats

demo: deps
	$(MAKE) all
	sh scripts/demo.sh

# The import benchmark on the host backend (a ratio against the floor, not a test).
bench: all
	sh scripts/bench.sh

install: $(BIN) $(LIB)
	install -D -m 0755 $(BIN) $(DESTDIR)$(PREFIX)/bin/gmsfs
	install -D -m 0755 build/$(LIB_SONAME) $(DESTDIR)$(PREFIX)/lib/$(LIB_SONAME)
	ln -sf $(LIB_SONAME) $(DESTDIR)$(PREFIX)/lib/libgmsfs.so
	install -D -m 0644 include/gmsfs/gmsfs.h $(DESTDIR)$(PREFIX)/include/gmsfs/gmsfs.h
	install -D -m 0644 include/gmsfs/abi.h $(DESTDIR)$(PREFIX)/include/gmsfs/abi.h
	mkdir -p $(DESTDIR)$(PREFIX)/lib/pkgconfig
	sed -e 's|@PREFIX@|$(PREFIX)|' -e 's|@VERSION@|$(VERSION)|' libgmsfs/gmsfs.pc.in > $(DESTDIR)$(PREFIX)/lib/pkgconfig/gmsfs.pc
	install -D -m 0644 man/libgmsfs.3 $(DESTDIR)$(PREFIX)/share/man/man3/libgmsfs.3
	install -D -m 0644 man/gmsfs.8 $(DESTDIR)$(PREFIX)/share/man/man8/gmsfs.8
	install -D -m 0644 man/gmsfs.5 $(DESTDIR)$(PREFIX)/share/man/man5/gmsfs.5

clean:
	rm -rf build

# Fuzz what parses input (needs clang): make fuzz FUZZ_SECONDS=60
FUZZ_SECONDS ?= 30
FUZZ_CFLAGS := -g -O1 -D_GNU_SOURCE -Iinclude -Icommon -fsanitize=fuzzer,address,undefined
build/fuzz_meta: tests/fuzz/fuzz_meta.c $(META_SRC) src/meta/*.h $(COMMON_HDR) | build
	clang $(FUZZ_CFLAGS) -o $@ tests/fuzz/fuzz_meta.c $(META_SRC) $(XXH_LIBS)

# The wire codec alone: request headers and bodies, replies.
build/fuzz_wire: tests/fuzz/fuzz_wire.c $(WIRE_SRC) $(COMMON_HDR) | build
	clang $(FUZZ_CFLAGS) $(MSGPACK_CFLAGS) -o $@ tests/fuzz/fuzz_wire.c $(WIRE_SRC) $(MSGPACK_LIBS)

fuzz: build/fuzz_meta build/fuzz_wire
	mkdir -p build/fuzz-corpus build/fuzz-wire-corpus
	build/fuzz_meta -max_total_time=$(FUZZ_SECONDS) -max_len=2048 build/fuzz-corpus
	build/fuzz_wire -max_total_time=$(FUZZ_SECONDS) -max_len=8192 build/fuzz-wire-corpus tests/fuzz/wire-seeds
