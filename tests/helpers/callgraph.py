#!/usr/bin/env python3
"""callgraph.py OBJDIR MODULE=FILE.o...: the modules' call graph from nm, and its
cycles.  Prints one line per cycle (strongly connected component of more than one
module), its modules sorted, e.g. "lock wait"; nothing when the graph has none."""
import collections
import subprocess
import sys


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
    graph = {m: {defs[s] for s in ss if s in defs and defs[s] != m} for m, ss in uses.items()}
    index, low, stack, on, cycles, n = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = n[0]
        n[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(" ".join(sorted(comp)))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    for c in sorted(cycles):
        print(c)


main()
