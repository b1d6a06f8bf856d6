#!/bin/bash
# The layout of the tree, as TAP:
#  - the daemon (src/) and the library (libgmsfs/) never include each other: what both
#    use is public (include/gmsfs/) or neutral (common/);
#  - the parts depend downward only: src/fs on src/fsm, src/meta, src/vmm; those three
#    on nothing of each other; libgmsfs and loader on the public headers and common/;
#  - inside src/fs, headers include each other without a cycle, and the modules' call
#    graph (from nm of each file) has one cycle, the lock and its queue (lock, wait);
#  - the public headers include only the system's and each other;
#  - no C file over 600 lines, no function over 80.
# Each #include "x" is resolved as the compiler would (the file's folder, then -Iinclude
# -Icommon), so a path that climbs out with ../ is caught too.
cd "$(dirname "$0")/.." || exit 1
n=0
failed=0
check() { # check NAME OUTPUT: ok when OUTPUT is empty
	n=$((n + 1))
	if [ -z "$2" ]; then
		echo "ok $n - $1"
	else
		echo "not ok $n - $1"
		printf '%s\n' "$2" | sed 's/^/#   /'
		failed=$((failed + 1))
	fi
}

# FILE INCLUDE -> the path it resolves to, relative to the top.
resolve() {
	for dir in "$(dirname "$1")" include common; do
		if [ -f "$dir/$2" ]; then
			realpath --relative-to=. "$dir/$2"
			return
		fi
	done
	echo "$2"
}

# Every quoted include of the C files under $1, as "file -> resolved".
includes() {
	find "$1" -name '*.[ch]' | sort | while read -r f; do
		sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/\1/p' "$f" | while read -r inc; do
			echo "$f -> $(resolve "$f" "$inc")"
		done
	done
}

check "nothing under src/ includes anything under libgmsfs/" "$(includes src | grep ' -> libgmsfs/')"
check "nothing under libgmsfs/ includes anything under src/" "$(includes libgmsfs | grep ' -> src/')"
check "common/ includes neither src/ nor libgmsfs/" "$(includes common | grep -E ' -> (src|libgmsfs)/')"
check "src/fsm includes nothing of the tree but its own header" "$(includes src/fsm | grep -v ' -> src/fsm/fsm.h$')"
check "src/meta includes neither src/fs, src/fsm nor src/vmm" "$(includes src/meta | grep -E ' -> src/(fs|fsm|vmm)/')"
check "src/vmm includes neither src/fs, src/fsm nor src/meta" "$(includes src/vmm | grep -E ' -> src/(fs|fsm|meta)/')"
check "loader/ includes nothing under src/ or libgmsfs/ (the library's public API only)" \
	"$(includes loader | grep -E ' -> (src|libgmsfs)/')"
check "libgmsfs/ and common/ include nothing under loader/" "$( (includes libgmsfs; includes common) | grep ' -> loader/')"

# src/fs's headers: FILE HEADER pairs, both under src/fs; a cycle is reported by tsort.
hdr_cycles=$(includes src/fs | grep '^src/fs/[a-z_/]*\.h -> src/fs/' | sed 's/ -> / /' | tsort 2>&1 >/dev/null)
check "src/fs: its headers include each other without a cycle" "$hdr_cycles"

# src/fs's call graph: each module's object (ops_*.c are one module, export/ one).
objs=$(mktemp -d)
mods=""
for f in src/fs/*.c src/fs/export/*.c; do
	m=$(basename "$f" .c)
	case $f in */export/*) m=export ;; esac
	case $m in ops*) m=ops ;; lock_*) m=lock ;; esac
	o=$objs/$(basename "$f" .c).o
	cc -std=gnu11 -D_GNU_SOURCE -DGMSFS_VERSION='"layout"' -Iinclude -Icommon -I/usr/local/cuda/include \
		$(pkg-config --cflags fuse3 msgpack libxxhash) -c "$f" -o "$o" 2>>"$objs/cc.log" && mods="$mods $m=$o"
done
cycles=$(python3 tests/helpers/callgraph.py $mods; cat "$objs/cc.log")
rm -rf "$objs"
check "src/fs: the modules' call graph (their objects' symbols) has no cycle" "$cycles"

# Every module's uses, calls through inline helpers and macros and types included
# (tests/helpers/uses.py, with ctags): any circle fails, named module by module.
check "no circle between the modules of src/fs, src/fs/export, src/meta and libgmsfs" \
	"$(python3 tests/helpers/uses.py src/fs src/fs/export src/meta libgmsfs 2>&1)"

check "the public headers include only <system> headers and each other" \
	"$(grep -n '#[[:space:]]*include' include/gmsfs/*.h | grep -v '<[a-z/_.]*\.h>' )"
check "the public headers include no private ones" \
	"$(grep -n '#[[:space:]]*include[[:space:]]*<gmsfs/' include/gmsfs/*.h | grep -v '<gmsfs/\(abi\|gmsfs\|torch\|load\)\.h>')"

big=$(find src libgmsfs common -name '*.c' | sort | while read -r f; do
	l=$(wc -l <"$f")
	[ "$l" -gt 600 ] && echo "$f: $l lines"
done)
check "no C file of the daemon, library or common code over 600 lines" "$big"

# Functions open with "{" and close with "}" alone in column 0.
long=$(find src libgmsfs common -name '*.c' | sort | while read -r f; do
	awk -v f="$f" '
		/^[a-z].*\(/ { name = $0 }
		/^\{$/ { start = NR }
		/^\}/ && start { if (NR - start > 80) printf "%s:%d: %d lines: %s\n", f, start, NR - start, name; start = 0 }
	' "$f"
done)
check "no function of the daemon, library or common code over 80 lines" "$long"

echo "1..$n"
[ "$failed" -eq 0 ]
