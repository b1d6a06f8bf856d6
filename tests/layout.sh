#!/bin/sh
# The layout of the tree, as TAP:
#  - the daemon (src/) and the library (libgmsfs/) never include each other: what both
#    use is public (include/gmsfs/) or neutral (common/);
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
check "the public headers include only <system> headers and each other" \
	"$(grep -n '#[[:space:]]*include' include/gmsfs/*.h | grep -v '<[a-z/_.]*\.h>' )"
check "the public headers include no private ones" \
	"$(grep -n '#[[:space:]]*include[[:space:]]*<gmsfs/' include/gmsfs/*.h | grep -v '<gmsfs/\(abi\|gmsfs\)\.h>')"

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
