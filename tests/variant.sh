#!/bin/bash
# The mount tests again, as TAP, under a checker; then what the checker reported.
#   tests/variant.sh asan       daemon, library and helpers built with ASan+UBSan (build-asan/):
#                               any report (errors, leaks at exit) fails
#   tests/variant.sh valgrind   the daemon under valgrind: no error, nothing lost at exit
# Every report is kept in build/reports/KIND.TIME/ (beside the bats output, tap.out) and
# printed whole where the TAP goes, so that a failure says why wherever it ran.
cd "$(dirname "$0")/.." || exit 1
kind=$1
mkdir -p build/reports
logs=$(mktemp -d "$(pwd)/build/reports/$kind.$(date +%Y%m%d-%H%M%S).XXXX")
chmod 1777 "$logs" # processes of the other user (85-users) write their reports here too
chmod 755 build/reports "$(pwd)/build" 2>/dev/null
case $kind in
asan)
	export GMSFS_BUILD=build-asan
	export ASAN_OPTIONS=log_path=$logs/asan:detect_leaks=1:abort_on_error=1
	export UBSAN_OPTIONS=log_path=$logs/ubsan:print_stacktrace=1:halt_on_error=1
	;;
valgrind)
	export GMSFS_WRAP="valgrind -q --log-file=$logs/vg.%p --leak-check=full --show-leak-kinds=definite,indirect"
	;;
*)
	echo "usage: $0 asan|valgrind" >&2
	exit 2
	;;
esac
export GMSFS_DAEMON_LOGS=$logs
files=${GMSFS_VARIANT_FILES:-$(ls tests/*.bats)}
# Under valgrind, 58-faults.bats's daemons run unwrapped (it times the bounds of commands
# on a stopped daemon): a second plain run of it would check nothing more.
[ "$kind" = valgrind ] && files=$(printf '%s\n' "$files" | grep -v '/58-faults\.bats$')
# One bats run per file, each timed (bats --timing: each test's own time on its line), so that
# the checker's cost is seen file by file (tests/check.sh lists the slowest).
# Numbered anew across the files, as one TAP stream.
out=$(for f in $files; do
	t0=$EPOCHREALTIME
	bats --tap --timing "$f" 2>&1
	echo "# time ${f##*/}: $(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }') s"
done | awk '/^(not )?ok [0-9]+/ { n++; sub(/ok [0-9]+/, "ok " n) } { print }')
printf '%s\n' "$out" >"$logs/tap.out"
printf '%s\n' "$out" | grep -v '^1\.\.[0-9]*$'
n=$(printf '%s\n' "$out" | grep -c '^\(not \)\?ok ')
failed=$(printf '%s\n' "$out" | grep -c '^not ok ')
n=$((n + 1))
if [ "$kind" = asan ]; then
	# UBSan's reports of the combined runtime go to stderr: the daemons' logs are read too.
	# A file with no report in it is not one: LeakSanitizer writes "Running thread N was not
	# suspended. False leaks are possible." alone when a thread is ending as it checks.
	reports=$(grep -l -e 'runtime error:' -e 'ERROR: AddressSanitizer' -e 'ERROR: LeakSanitizer' -e 'SUMMARY: ' \
		"$logs"/asan.* "$logs"/ubsan.* "$logs"/daemon.*.log 2>/dev/null | xargs -r cat)
	what="no ASan or UBSan report from any process"
else
	# A daemon that a test killed (80-daemon-death) leaves no summary: its log is skipped.
	reports=$(for f in "$logs"/vg.*; do
		[ -e "$f" ] || continue
		grep -q 'ERROR SUMMARY' "$f" || continue
		grep -q 'ERROR SUMMARY: 0 errors' "$f" && ! grep -q 'definitely lost: [1-9]\|indirectly lost: [1-9]' "$f" ||
			cat "$f"
	done)
	what="valgrind: no error and nothing lost in $(ls "$logs" | wc -l) daemons"
fi
if [ -z "$reports" ]; then
	echo "ok $n - $what"
else
	echo "not ok $n - $what (every report: $logs)"
	printf '%s\n' "$reports" | head -2000 | sed 's/^/#   /'
	failed=$((failed + 1))
fi
# Kept when something failed; a clean run's logs go (valgrind's are one per daemon).
[ "$failed" -eq 0 ] && rm -rf "$logs"
# prove shows a script's stderr where it stands, next to its summary: the failures in
# short, for a CI log that keeps only its last lines.
# Each with where it failed, and a scenario's own "FAIL line N: ..." (which check).
[ "$failed" -eq 0 ] || printf '%s\n' "$out" | grep -e '^not ok ' -e '^# (' -e '^#  in test file' -e 'FAIL line' \
	-e '^# *timed out' | cut -c1-200 | head -12 | sed "s/^/$kind: /" >&2
# And the checker's report, in short: which error, and the frames that name our code.
[ -z "$reports" ] || printf '%s\n' "$reports" | grep -e 'ERROR:' -e 'runtime error:' -e 'SUMMARY' -e 'definitely lost' -e 'build-asan/[a-z_-]*+0x' \
	-e 'Invalid ' -e '#[0-9]* .* in [a-z_]* .*/\(src\|common\|libgmsfs\|tools\|tests/helpers\)/' -e '[ab]y 0x.*: [a-z_]* (.*\.c:' |
	cut -c1-200 | head -24 | sed "s/^/$kind report: /" >&2
echo "1..$n"
[ "$failed" -eq 0 ]
