# Sourced by the shell tests that print TAP themselves (debs.sh, wheel.sh): n and failed
# count, t runs one check.
n=0
failed=0
t() { # t NAME CMD...: one TAP line; the command's output as comments when it fails
	local name=$1 out rc
	shift
	n=$((n + 1))
	local t0=$EPOCHREALTIME
	out=$("$@" 2>&1)
	rc=$?
	if [ $rc -eq 0 ]; then
		echo "ok $n - $name in $(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%d", (b - a) * 1000 }')ms"
	else
		echo "not ok $n - $name (exit $rc)"
		# On stderr too: prove shows a script's stderr, not its comments, so CI's log says why.
		printf '%s\n' "$out" | tail -30 | sed 's/^/#   /' | tee /dev/stderr
		failed=$((failed + 1))
	fi
}
