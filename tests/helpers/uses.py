#!/usr/bin/env python3
"""uses.py [--edges] DIR...: which module of a folder uses which, from the names each file
uses, and every circle between them (tests/layout.sh).

A module is a .c and its .h (x.c, x.h; x_part.c and x_part.h belong to x when x.c or x.h
is there: ops_file.c is ops).  What a module defines comes from ctags (Debian's
universal-ctags): the functions and variables its .c defines, the macros, types, struct,
union and enum tags, enumerators and static inline functions its files hold; not a .c's
static functions (no other file can use them), and a prototype or an extern declaration
is neither a definition nor a use.  A file uses every identifier in its text (comments and strings
removed), so a call through a static inline helper or a macro of a header counts, and so
does a type named only in a declaration, except in a header that declares it opaque
("struct x;": an interface may name a type whose insides live above it).  Prints each circle as "a -> b -> ... -> a"
(one per strongly connected group), or with --edges every "a -> b"."""
import json
import os
import re
import subprocess
import sys


def module_of(path, stems):
    stem = os.path.splitext(os.path.basename(path))[0]
    head = stem.split("_", 1)[0]
    return head if head != stem and head in stems else stem


def strip(text):
    """The text without comments, strings and character constants."""
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r"//[^\n]*", " ", text)
    text = re.sub(r'"(\\.|[^"\\\n])*"', '""', text)
    return re.sub(r"'(\\.|[^'\\\n])*'", "''", text)


TAGS = ("struct", "union", "enum")


def graph(folder):
    files = sorted(os.path.join(folder, f) for f in os.listdir(folder) if f.endswith((".c", ".h")))
    stems = {os.path.splitext(os.path.basename(f))[0] for f in files}
    mod = {f: module_of(f, stems) for f in files}
    out = subprocess.run(["ctags", "--output-format=json", "--fields={name}{kind}{input}{file}",
                          "--kinds-C=+px-m-l", "-f", "-"] + files, capture_output=True, text=True, check=True).stdout
    owner, declared = {}, {f: set() for f in files}
    for line in out.splitlines():
        t = json.loads(line)
        if t.get("_type") != "tag":
            continue
        f, kind, name = t["path"], t["kind"], t["name"]
        if kind in ("prototype", "externvar"):
            declared[f].add(name)  # a declaration is not a use; the definition says whose
            continue
        if t.get("file") and f.endswith(".c"):
            continue  # static in a .c: nobody else can use it (a header's static inline can)
        if kind == "macro" and name.endswith("_H"):
            continue  # an include guard
        key = (kind if kind in TAGS else "") + " " + name
        owner.setdefault(key.strip(), set()).add(mod[f])
    edges = {}
    for f in files:
        text = strip(open(f).read())
        ids = set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", text)) - declared[f]
        ids |= {"%s %s" % m for m in re.findall(r"\b(struct|union|enum)\s+([A-Za-z_][A-Za-z0-9_]*)", text)}
        if f.endswith(".h"):
            ids -= {"%s %s" % m for m in re.findall(r"^(struct|union)\s+([A-Za-z_][A-Za-z0-9_]*)\s*;", text, re.M)}
        for name in ids:
            for m in owner.get(name, ()):
                if m != mod[f] and len(owner[name]) == 1:
                    edges.setdefault(mod[f], {}).setdefault(m, set()).add(name)
    return sorted(set(mod.values())), edges


def groups(nodes, edges):
    """Tarjan's strongly connected groups of more than one module (edges: {a: {b: ...}}),
    each sorted (tests/helpers/callgraph.py uses it too)."""
    index, low, stack, on, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, {})):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            g = []
            while True:
                w = stack.pop()
                on.discard(w)
                g.append(w)
                if w == v:
                    break
            if len(g) > 1:
                found.append(sorted(g))

    sys.setrecursionlimit(10000)
    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return sorted(found)


def circles(nodes, edges):
    """Each group as one path around it, with the names that make each step."""
    out = []
    for g in groups(nodes, edges):  # one path around the group, from its first module, by shortest steps
        start, path, seen = g[0], [g[0]], {g[0]}
        prev = {start: None}
        queue = [start]
        back = None
        while queue and back is None:
            v = queue.pop(0)
            for w in sorted(edges.get(v, {})):
                if w == start:
                    back = v
                    break
                if w in g and w not in prev:
                    prev[w] = v
                    queue.append(w)
        path = []
        v = back
        while v is not None:
            path.append(v)
            v = prev[v]
        path.reverse()
        how = ", ".join("%s uses %s (%s)" % (a, b, " ".join(sorted(edges[a][b])[:3]))
                        for a, b in zip(path, path[1:] + [start]))
        out.append("%s -> %s: %s  [group: %s]" % (" -> ".join(path), start, how, " ".join(g)))
    return out


def main():
    args = sys.argv[1:]
    show_edges = args and args[0] == "--edges"
    for folder in args[1:] if show_edges else args:
        nodes, edges = graph(folder)
        if show_edges:
            for a in sorted(edges):
                for b in sorted(edges[a]):
                    print("%s: %s -> %s (%s)" % (folder, a, b, " ".join(sorted(edges[a][b])[:4])))
        else:
            for c in circles(nodes, edges):
                print("%s: %s" % (folder, c))


if __name__ == "__main__":
    main()
