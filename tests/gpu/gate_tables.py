#!/usr/bin/env python3
"""tests/gpu/gate_tables.py GATE.json [GATE.json...] [BENCHMARKS.md]: the GPU gate's results
(tests/gpu/gate.py) as docs/benchmarks.md's table, written between its markers

    <!-- gate: begin -->  ...  <!-- gate: end -->

with the machine, the date and the command; nothing is copied by hand.  Several GATE.json:
one gate run in parts (GMSFS_GATE_ONLY), on one machine, said so.  Without BENCHMARKS.md
the table goes to stdout."""
import json
import os
import sys

BEGIN, END = "<!-- gate: begin -->", "<!-- gate: end -->"
UNITS = {"(s)": "s", "(ms)": "ms", "(us/page)": "us/page", "(bytes)": "bytes"}


def figure(v, unit):
    if unit == "bytes":
        return "%.2f GiB" % (v / (1 << 30))
    if unit == "s":  # three figures below a second (a restart's 0.0086 s, a digest's 0.00543 s)
        return "%.3f s" % v if v >= 1 else "%.3g s" % v
    return "%.4g %s" % (v, unit)


def table(g):
    runs = "" if g.get("runs", 1) == 1 else " (in %d runs of its parts: %s)" % (g["runs"], "; ".join(g["split"]))
    rows = ["`bash tests/gpu/run.sh gate` (`tests/gpu/gate.py`), %s, %s: models of %g GiB, %d s in all%s. "
            "Each figure beside its floor, measured in the same run; a figure passes when its ratio is at most "
            "the limit, and a miss fails the gate (exit 1)." % (g["machine"], g["date"], g["model_gib"], g["seconds"],
                                                                runs),
            "", "| figure | gmsfs | floor, same run | ratio | limit | |", "| --- | --- | --- | --- | --- | --- |"]
    for r in g["results"]:
        what, unit = r["what"], ""
        for k, u in UNITS.items():
            if what.endswith(" " + k):
                what, unit = what[:-len(k) - 1], u
        ratio = "%.2fx" % r["ratio"]
        limit = "%gx" % r["limit"]
        if r["limit"] < 0.5:  # "at least N x faster than": said that way round
            ratio, limit = "%.1fx faster" % (1 / r["ratio"]), "%gx faster" % round(1 / r["limit"])
        rows.append("| %s | %s | %s | %s | %s | %s |" % (what, figure(r["value"], unit), figure(r["floor"], unit), ratio,
                                                      limit, "pass" if r["pass"] else "**miss**"))
    for b in g.get("broken", []):
        rows.append("| %s | | | | | **failed** |" % b)
    return "\n".join(rows) + "\n"


def merged(paths):
    """One gate of its parts' runs: their results in turn, their seconds summed."""
    gs = [json.load(open(p)) for p in paths]
    g = dict(gs[0], results=[], broken=[], seconds=0, runs=len(gs), split=[])
    for x in gs:
        if (x["machine"], x["model_gib"]) != (g["machine"], g["model_gib"]):
            raise SystemExit("gate_tables: %s ran on %s, %g GiB; the first on %s, %g GiB" % (
                paths[gs.index(x)], x["machine"], x["model_gib"], g["machine"], g["model_gib"]))
        g["results"] += x["results"]
        g["broken"] += x.get("broken", [])
        g["seconds"] += x["seconds"]
        g["split"].append("GMSFS_GATE_ONLY=" + ",".join(x.get("parts", {})))
    return g


def main():
    args = sys.argv[1:]
    doc_path = args.pop() if args and args[-1].endswith(".md") else None
    if not args:
        print(__doc__.split("\n\n")[0], file=sys.stderr)
        return 2
    text = table(merged(args))
    if not doc_path:
        sys.stdout.write(text)
        return 0
    doc = open(doc_path).read()
    if BEGIN not in doc or END not in doc:
        print("%s: no %s ... %s markers" % (doc_path, BEGIN, END), file=sys.stderr)
        return 1
    head, rest = doc.split(BEGIN, 1)
    tail = rest.split(END, 1)[1]
    with open(doc_path + ".new", "w") as f:
        f.write(head + BEGIN + "\n" + text + END + tail)
    os.replace(doc_path + ".new", doc_path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
