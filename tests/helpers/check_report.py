#!/usr/bin/python3
"""check_report LOGS START LIMIT_S PROVE_RC: what tests/check.sh prints after prove.

LOGS holds one .tap per file (tests/tap-exec), each ending "# file-time T s, exit RC"; a
checker's run of the mount tests (tests/variant.sh) says each bats file's time inside
("# time F: T s"), and a test's own time closes its ok line ("... in 123ms": bats
--timing, python.sh, tests/helpers/tap.sh).  Prints the ten slowest files and tests,
fails when the run took longer than LIMIT_S seconds (naming them), names each test that
failed with the first lines of what it said (last, so that the tail of CI's log, which is
all a reader may get, shows them), and closes with "N passed, N failed".  Exits 1 when
anything failed (prove's exit included)."""
import os
import re
import sys
import time

logs, start, limit, prove_rc = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
took = time.time() - start
TEST = re.compile(r"^(not )?ok \d+ (?:- )?(.*?)(?: in (\d+) ?ms)?(?: # (SKIP|TODO).*)?$")
files, tests, failures = [], [], []
passed = failed = skipped = 0
for name in sorted(os.listdir(logs)):
    if not name.endswith(".tap"):
        continue
    what = name[:-4].replace("%", "/")
    kind = {"sanitizers.sh": "asan", "valgrind.sh": "valgrind"}.get(what, "")
    if failures:
        failures[-1][2] = False  # a failure's diagnostics end with its file
    with open(os.path.join(logs, name), errors="replace") as f:
        for line in f:
            line = line.rstrip("\n")
            m = re.match(r"^# file-time ([0-9.]+) s(?:, exit (\d+))?", line)
            if m:
                files.append((float(m.group(1)), what))
                if m.group(2) and m.group(2) != "0":
                    failures.append(["%s: the file exited %s" % (what, m.group(2)), [], False])
                continue
            m = re.match(r"^# time (\S+): ([0-9.]+) s$", line)
            if m:  # a bats file inside a checker's run
                files.append((float(m.group(2)), "%s %s" % (kind or what, m.group(1))))
                continue
            if failures and failures[-1][2] and line.startswith("#"):
                if len(failures[-1][1]) < 8:  # its diagnostics, the first few
                    failures[-1][1].append(line[:160])
                continue
            if failures:
                failures[-1][2] = False
            m = TEST.match(line)
            if not m:
                continue
            if m.group(1):
                failed += 1
                failures.append(["%s: %s" % (kind or what, m.group(2)[:140]), [], True])
            elif m.group(4) == "SKIP":
                skipped += 1
            else:
                passed += 1
            if m.group(3):
                tests.append((int(m.group(3)) / 1000, "%s: %s" % (kind or what, m.group(2)[:110])))
print("# the ten slowest files (a checker's run counted by the bats file it ran):")
for t, what in sorted(files, reverse=True)[:10]:
    print("#   %7.1f s  %s" % (t, what))
print("# the ten slowest tests:")
for t, what in sorted(tests, reverse=True)[:10]:
    print("#   %7.1f s  %s" % (t, what))
print("# the whole run: %.1f min (limit %.0f min)" % (took / 60, limit / 60))
if took > limit:
    failed += 1
    print("not ok - the run took %.1f min, over its limit of %.0f: make the slowest above wait less" %
          (took / 60, limit / 60))
    print("check: the run took %.1f min, over its limit of %.0f min" % (took / 60, limit / 60), file=sys.stderr)
if failures:
    print("# what failed:")
    for name, said, _ in failures:
        print("#   not ok: %s" % name)
        for line in said:
            print("#     %s" % line)
if prove_rc and not failed:
    failed += 1  # a file that died without a TAP line that says so
print("%d passed, %d failed, %d skipped" % (passed, failed, skipped))
sys.exit(1 if failed or prove_rc else 0)
