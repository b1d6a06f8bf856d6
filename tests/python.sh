#!/bin/sh
# The Python package's tests (python/tests, pytest, host backend) as TAP: one line per test.
cd "$(dirname "$0")/.." || exit 1
xml=$(mktemp /tmp/gmsfs-pytest.XXXXXX)
trap 'rm -f "$xml"' EXIT
stalls=${GMSFS_BUILD:-build}/reports/manager-stalls.log
rm -f "$stalls"
${PYTHON:-/usr/bin/python3} -m pytest -q -p no:cacheprovider -o faulthandler_timeout=120 -o junit_logging=all \
	--junitxml="$xml" python/tests >/tmp/gmsfs-pytest.out 2>&1
${PYTHON:-/usr/bin/python3} - "$xml" <<'PY'
import sys, xml.etree.ElementTree as ET
cases = ET.parse(sys.argv[1]).getroot().iter("testcase")
n = failed = 0
for c in cases:
    n += 1
    bad = c.find("failure") if c.find("failure") is not None else c.find("error")
    skip = c.find("skipped")
    name = "%s %s in %dms" % (c.get("classname", "").rsplit(".", 1)[-1], c.get("name"), float(c.get("time", 0)) * 1000)
    if bad is not None:
        failed += 1
        print("not ok %d - %s" % (n, name))
        # On stderr too: prove shows stderr, so CI's log keeps why it failed.
        for line in (bad.text or bad.get("message", "")).splitlines()[-30:]:
            print("#   " + line)
            print("# %s: %s" % (name, line), file=sys.stderr)
        for what in ("system-out", "system-err"):  # what the test printed (daemon logs, the manager)
            for part in c.findall(what):
                for line in (part.text or "").splitlines()[-20:]:
                    print("# %s %s: %s" % (name, what, line), file=sys.stderr)
    elif skip is not None:
        print("ok %d - %s # SKIP %s" % (n, name, skip.get("message", "")))
    else:
        print("ok %d - %s" % (n, name))
print("1..%d" % n)
sys.exit(1 if failed or not n else 0)
PY
rc=$?
# The tests' service manager says a stalled listener there (python/tests/manager.py): shown.
[ -s "$stalls" ] && sed 's/^/# manager: /' "$stalls" >&2
exit $rc
