"""TAP for the Python GPU tests: check() prints one line, done() the plan and the count."""
import sys

n = failed = 0


def check(ok, what, detail=""):
    global n, failed
    n += 1
    print("%sok %d - %s" % ("" if ok else "not ", n, what))
    if detail:
        print("# " + str(detail))
    failed += not ok
    sys.stdout.flush()


def done():
    print("1..%d" % n)
    print("%d passed, %d failed" % (n - failed, failed))
    return 1 if failed else 0
