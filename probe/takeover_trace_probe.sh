#!/bin/bash
# probe/takeover_trace_probe.sh [GIB]: bench/restart.py's big model (cuda) with its trace, once
# with the host memory made ahead (the default: it comes across a takeover) and once with
# -o no_host_ahead, two takeovers each; prints the trace and both daemons' own account of the
# handover (handover.c's timings).  Run from the repository root after tests/gpu/run.sh built it.
set -u
gib=${1:-16}
for opts in "" no_host_ahead; do
	echo "### options: ${opts:-(default)}"
	GMSFS_BENCH_OPTIONS=$opts GMSFS_BENCH_TRACE=1 GMSFS_BENCH_REPEAT=${REPEAT:-2} timeout 280 \
		python3 bench/restart.py build "$gib" cuda big 2>&1 |
		grep -E "trace|handed|took|serving|takeover|gate:|loaded again|Error|error" | cut -c1-400
done
