#!/bin/sh
# The fuzzers, FUZZ_SECONDS each (default 30), as TAP: the store's parsers, the wire codec,
# the safetensors header check, gmsfs-peer's messages.
cd "$(dirname "$0")/.." || exit 1
s=${FUZZ_SECONDS:-30}
b=${GMSFS_BUILD:-build}
n=0
failed=0
for f in meta wire safetensors net; do
	n=$((n + 1))
	corpus=$(mktemp -d /tmp/gmsfs-fuzz.XXXXXX)
	seeds=
	[ "$f" = wire ] && seeds=tests/fuzz/wire-seeds
	[ "$f" = safetensors ] && seeds=tests/fuzz/safetensors-seeds
	[ "$f" = net ] && seeds=tests/fuzz/net-seeds
	if out=$("$b/fuzz_$f" -max_total_time="$s" -max_len=8192 "$corpus" $seeds 2>&1); then
		echo "ok $n - fuzz_$f for ${s}s: $(printf '%s\n' "$out" | grep -o 'Done [0-9]* runs' | tail -1)"
	else
		echo "not ok $n - fuzz_$f"
		printf '%s\n' "$out" | tail -40 | sed 's/^/#   /'
		failed=$((failed + 1))
	fi
	rm -rf "$corpus"
done
echo "1..$n"
[ "$failed" -eq 0 ]
