# gmsfs: make [all] | check | check-unit | demo | install | clean
PREFIX ?= /usr/local
DESTDIR ?=
CC ?= cc
PKG_CONFIG ?= pkg-config
VERSION := 0.1.0

CFLAGS ?= -O2 -g
CFLAGS += -std=gnu11 -Wall -Wextra -Wno-unused-parameter -D_GNU_SOURCE -DGMSFS_VERSION='"$(VERSION)"' -pthread
DEPS_CFLAGS := $(shell $(PKG_CONFIG) --cflags fuse3 libxxhash msgpack 2>/dev/null)
DEPS_LIBS := $(shell $(PKG_CONFIG) --libs fuse3 libxxhash msgpack 2>/dev/null)
MSGPACK_LIBS := $(shell $(PKG_CONFIG) --libs msgpack 2>/dev/null)
XXH_LIBS := $(shell $(PKG_CONFIG) --libs libxxhash 2>/dev/null)

FSM_SRC := src/fsm/fsm.c
META_SRC := src/meta/meta.c src/meta/layout_hash.c
VMM_SRC := src/vmm/vmm.c src/vmm/vmm_host.c src/vmm/vmm_cuda.c
# cuda.h only: libcuda is loaded at run time (dlopen), never linked.
CUDA_INC ?= /usr/local/cuda/include
ifneq ($(wildcard $(CUDA_INC)/cuda.h),)
CFLAGS += -DGMSFS_HAVE_CUDA -I$(CUDA_INC)
HAVE_CUDA := 1
endif
FS_SRC := src/fs/main.c src/fs/ops.c src/fs/store.c src/fs/caller.c src/fs/text.c src/fs/export.c

LIB_SRC := libgmsfs/gmsfs.c libgmsfs/export_client.c libgmsfs/map_host.c libgmsfs/map_cuda.c
LIB_HDR := libgmsfs/gmsfs.h libgmsfs/gmsfs_ioctl.h libgmsfs/internal.h libgmsfs/cuda_api.h src/grow.h src/meta/meta_path.h
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

$(BIN): $(FS_SRC) $(FSM_SRC) $(META_SRC) $(VMM_SRC) src/fs/*.h src/fsm/fsm.h src/meta/*.h src/vmm/vmm.h src/grow.h libgmsfs/gmsfs_ioctl.h libgmsfs/cuda_api.h | build
	@$(PKG_CONFIG) --exists fuse3 libxxhash msgpack || { echo 'missing fuse3/libxxhash/msgpack: run make deps'; exit 1; }
	$(CC) $(CFLAGS) $(DEPS_CFLAGS) -o $@ $(FS_SRC) $(FSM_SRC) $(META_SRC) $(VMM_SRC) $(DEPS_LIBS) -ldl

build/libgmsfs.so: $(LIB_SRC) $(LIB_HDR) | build
	$(CC) $(CFLAGS) $(DEPS_CFLAGS) -fPIC -fvisibility=hidden -shared -Wl,-soname,$(LIB_SONAME) -o build/$(LIB_SONAME) $(LIB_SRC) $(MSGPACK_LIBS) -ldl
	ln -sf $(LIB_SONAME) $@

build/gmsfs.pc: libgmsfs/gmsfs.pc.in | build
	sed -e 's|@PREFIX@|$(PREFIX)|' -e 's|@VERSION@|$(VERSION)|' $< > $@

build/gmsfs-example: examples/weights.c build/libgmsfs.so
	$(CC) $(CFLAGS) -Ilibgmsfs -o $@ $< $(LINK_LIB)

build/gmsfs-scenario: tests/helpers/gmsfs-scenario.c libgmsfs/cuda_api.h build/libgmsfs.so
	$(CC) $(CFLAGS) -Ilibgmsfs -o $@ $< $(LINK_LIB) -ldl

build/gmsfs-probe: tests/helpers/gmsfs-probe.c libgmsfs/gmsfs_ioctl.h | build
	$(CC) $(CFLAGS) -Ilibgmsfs -o $@ $<

build/bench-import: bench/bench_import.c bench/bench.h build/libgmsfs.so
	$(CC) $(CFLAGS) -Ilibgmsfs -o $@ $< $(LINK_LIB)

# The GPU benchmark uses the library's export client for the floor's descriptors: linked whole.
build/bench-gpu: bench/bench_gpu.c bench/bench.h $(LIB_SRC) $(LIB_HDR) | build
	$(CC) $(CFLAGS) $(DEPS_CFLAGS) -o $@ bench/bench_gpu.c $(LIB_SRC) $(MSGPACK_LIBS) -ldl

build/test_wire: tests/unit/test_wire.c src/fs/export.c libgmsfs/export_client.c tests/fuzz/stubs.c libgmsfs/*.h src/fs/fs.h tests/unit/tap.h | build
	$(CC) $(CFLAGS) $(DEPS_CFLAGS) -o $@ tests/unit/test_wire.c src/fs/export.c libgmsfs/export_client.c tests/fuzz/stubs.c $(DEPS_LIBS)

build/test_fsm: tests/unit/test_fsm.c $(FSM_SRC) src/fsm/fsm.h tests/unit/tap.h | build
	$(CC) $(CFLAGS) -o $@ tests/unit/test_fsm.c $(FSM_SRC)

build/test_meta: tests/unit/test_meta.c $(META_SRC) src/meta/*.h src/grow.h tests/unit/tap.h | build
	$(CC) $(CFLAGS) $(DEPS_CFLAGS) -o $@ tests/unit/test_meta.c $(META_SRC) $(XXH_LIBS)

build/gmsfs-open: tests/helpers/gmsfs-open.c | build
	$(CC) $(CFLAGS) -o $@ $<

deps:
	sh scripts/install-deps.sh

check-unit: $(UNIT)
	prove $(UNIT)

# The whole suite, one prove run: C unit tests are TAP programs, mount tests are bats files.
# Installs what is missing first, then builds in a sub-make (pkg-config must see the packages).
check: deps
	$(MAKE) all
	prove --exec tests/tap-exec $(UNIT) tests/*.bats

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
	install -D -m 0644 libgmsfs/gmsfs.h $(DESTDIR)$(PREFIX)/include/gmsfs.h
	install -D -m 0644 libgmsfs/gmsfs_ioctl.h $(DESTDIR)$(PREFIX)/include/gmsfs_ioctl.h
	install -D -m 0644 build/gmsfs.pc $(DESTDIR)$(PREFIX)/lib/pkgconfig/gmsfs.pc
	install -D -m 0644 man/libgmsfs.3 $(DESTDIR)$(PREFIX)/share/man/man3/libgmsfs.3
	install -D -m 0644 man/gmsfs.8 $(DESTDIR)$(PREFIX)/share/man/man8/gmsfs.8
	install -D -m 0644 man/gmsfs.5 $(DESTDIR)$(PREFIX)/share/man/man5/gmsfs.5

clean:
	rm -rf build

# Fuzz the store's input parsers (needs clang): make fuzz FUZZ_SECONDS=60
FUZZ_SECONDS ?= 30
build/fuzz_meta: tests/fuzz/fuzz_meta.c $(META_SRC) src/meta/*.h | build
	clang -g -O1 -D_GNU_SOURCE -fsanitize=fuzzer,address,undefined -o $@ tests/fuzz/fuzz_meta.c $(META_SRC) $(XXH_LIBS)

# The wire: the daemon's request parser (export.c) and the library's manifest parser.
build/fuzz_wire: tests/fuzz/fuzz_wire.c src/fs/export.c libgmsfs/export_client.c libgmsfs/*.h | build
	clang -g -O1 -D_GNU_SOURCE -DFUSE_USE_VERSION=312 $(DEPS_CFLAGS) -fsanitize=fuzzer,address,undefined -o $@ \
		tests/fuzz/fuzz_wire.c src/fs/export.c libgmsfs/export_client.c tests/fuzz/stubs.c $(DEPS_LIBS)

fuzz: build/fuzz_meta build/fuzz_wire
	mkdir -p build/fuzz-corpus build/fuzz-wire-corpus
	build/fuzz_meta -max_total_time=$(FUZZ_SECONDS) -max_len=2048 build/fuzz-corpus
	build/fuzz_wire -max_total_time=$(FUZZ_SECONDS) -max_len=4096 build/fuzz-wire-corpus tests/fuzz/wire-seeds
