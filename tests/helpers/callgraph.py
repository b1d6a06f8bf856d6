#!/usr/bin/env python3
"""callgraph.py MODULE=FILE.o...: the modules' call graph from nm, and its cycles.
Prints one line per cycle (strongly connected group of more than one module), its
modules sorted, e.g. "lock wait"; nothing when the graph has none.  (uses.py reads the
names in the sources; this reads the calls the objects make.)"""
import collections
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from uses import groups  # noqa: E402


def main():
    defs, uses = {}, collections.defaultdict(set)
    for arg in sys.argv[1:]:
        module, path = arg.split("=", 1)
        for line in subprocess.check_output(["nm", path], text=True).splitlines():
            f = line.split()
            if len(f) == 3 and f[1] in "TDBR":
                defs[f[2]] = module
            elif len(f) == 2 and f[0] == "U":
                uses[module].add(f[1])
    graph = {m: {defs[s]: True for s in ss if s in defs and defs[s] != m} for m, ss in uses.items()}
    for g in groups(graph, graph):
        print(" ".join(g))


main()
