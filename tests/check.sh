#!/bin/bash
# make check's and make check-quick's runner: prove over the files given, two at a time
# (GMSFS_CHECK_JOBS), then what the time went to: the ten slowest files (a checker's run
# of the mount tests counted file by file) and the ten slowest tests, and one closing line
# "N passed, N failed".  A run longer than GMSFS_CHECK_LIMIT_S seconds fails, naming
# them: make check's limit is 2700 (half of CI's 90 minutes), check-quick's 300, so that
# a slow test is found the day it lands.  Each file's TAP stays in build/check-logs/.
cd "$(dirname "$0")/.." || exit 1
logs=$(pwd)/build/check-logs
rm -rf "$logs"
mkdir -p "$logs"
export GMSFS_CHECK_LOGS=$logs
t0=$EPOCHREALTIME
prove -j"${GMSFS_CHECK_JOBS:-2}" --timer --exec tests/tap-exec "$@"
rc=$?
/usr/bin/python3 tests/helpers/check_report.py "$logs" "$t0" "${GMSFS_CHECK_LIMIT_S:-2700}" "$rc"
