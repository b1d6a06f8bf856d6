#!/bin/bash
# The layout of the tree, as TAP:
#  - the daemon (src/) and the library (libgmsfs/) never include each other: what both
#    use is public (include/gmsfs/) or neutral (common/);
#  - the parts depend downward only: src/fs on src/fsm, src/meta, src/vmm; those three
#    on nothing of each other; libgmsfs and loader on the public headers and common/;
#  - inside each part, its files stand in the layers its layers file lists, each using
#    only those below (per file, from the names it uses); src/fs's headers include each
#    other without a cycle; only the lock's files touch a store's lock;
#  - the public headers include only the system's and each other;
#  - no C file over 600 lines, no function over 80 (src, libgmsfs, loader, peer, common); no Python module over 600 lines,
#    and the package's root a short list of names.
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
check "libgmsfs/ and common/ include nothing under loader/ or peer/" "$( (includes libgmsfs; includes common) | grep -E ' -> (loader|peer)/')"
check "peer/ includes nothing under src/ or libgmsfs/, and of loader/ only copy.h and store_files.h" \
	"$(includes peer | grep -E ' -> (src|libgmsfs)/|-> loader/' | grep -vE ' -> loader/(copy|store_files)\.h$')"
check "loader/ includes nothing under peer/" "$(includes loader | grep ' -> peer/')"

# src/fs's headers: FILE HEADER pairs, both under src/fs; a cycle is reported by tsort.
hdr_cycles=$(includes src/fs | grep '^src/fs/[a-z_/]*\.h -> src/fs/' | sed 's/ -> / /' | tsort 2>&1 >/dev/null)
check "src/fs: its headers include each other without a cycle" "$hdr_cycles"

# Each part's files in layers, written once in its folder's layers file and checked file
# by file from the names each file uses (tests/helpers/layers.py, with ctags): an upward
# or sideways use, a file the list misses, a name no file has, all fail.
parts="src/fsm src/meta src/vmm src/fs src/keeper src/mover libgmsfs loader peer common"
check "every file of $parts stands in its part's layers file, using only the layers below its own" \
	"$(python3 tests/helpers/layers.py $parts 2>&1)"

# The lock's state is decided in the lock's files; the rest read it through store_lock()
# (const), which the compiler holds to reading.
check "src/fs: a store's lock is touched only by lock.c, lock_restart.c, lock_member.c, wait.c and store.h" \
	"$(grep -rnE '(->|\.)lock\.|&[a-z_]+->lock\b' src/fs --include='*.[ch]' |
		grep -vE '^src/fs/(lock|lock_restart|lock_member|wait)\.c:|^src/fs/store\.h:')"

check "the public headers include only <system> headers and each other" \
	"$(grep -n '#[[:space:]]*include' include/gmsfs/*.h | grep -v '<[a-z/_.]*\.h>' )"
check "the public headers include no private ones" \
	"$(grep -n '#[[:space:]]*include[[:space:]]*<gmsfs/' include/gmsfs/*.h | grep -v '<gmsfs/\(abi\|gmsfs\|torch\|load\)\.h>')"

big=$(find src libgmsfs common loader peer -name '*.c' | sort | while read -r f; do
	l=$(wc -l <"$f")
	[ "$l" -gt 600 ] && echo "$f: $l lines"
done)
check "no C file of the daemon, library, loader, peer or common code over 600 lines" "$big"

bigpy=$(find python/gmsfs -name '*.py' | sort | while read -r f; do
	l=$(wc -l <"$f")
	[ "$l" -gt 600 ] && echo "$f: $l lines"
done)
check "no Python module of the package over 600 lines" "$bigpy"
# The package's root is the list of its public names: the code lives in modules of one idea each.
root=$(grep -cvE '^\s*(#|$)' python/gmsfs/__init__.py)
check "python/gmsfs/__init__.py is a short list of public names (at most 60 lines of code)" \
	"$([ "$root" -gt 60 ] && echo "python/gmsfs/__init__.py: $root lines of code")"

# The content hash's kernel travels as PTX made from its sources (scripts/ptx.sh, where
# nvcc is): a source changed without the PTX made again fails here.
ptx_sum=$(cat libgmsfs/digest_gpu.cu common/xxh3_lanes.h | sha256sum | cut -c1-64)
check "libgmsfs/digest_gpu_ptx.h was made from libgmsfs/digest_gpu.cu and common/xxh3_lanes.h as they are" \
	"$(grep -q " \* sources: $ptx_sum " libgmsfs/digest_gpu_ptx.h || echo "run scripts/ptx.sh where nvcc is (sources $ptx_sum)")"

# docs/inside.md's map of the parts is drawn from the layers files, never written by hand.
check "docs/inside.md's map of the layers is what the layers files say" "$(python3 tests/helpers/inside_map.py --check)"

# Functions open with "{" and close with "}" alone in column 0.
long=$(find src libgmsfs common loader peer -name '*.c' | sort | while read -r f; do
	awk -v f="$f" '
		/^[a-z].*\(/ { name = $0 }
		/^\{$/ { start = NR }
		/^\}/ && start { if (NR - start > 80) printf "%s:%d: %d lines: %s\n", f, start, NR - start, name; start = 0 }
	' "$f"
done)
check "no function of the daemon, library, loader, peer or common code over 80 lines" "$long"

echo "1..$n"
[ "$failed" -eq 0 ]
