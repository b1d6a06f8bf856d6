#!/usr/bin/env python3
"""layers.py [--edges] PART...: each part's `layers` file against what its files use
(tests/layout.sh); --edges: what each file uses of the others.

A part is a folder with a `layers` file: its modules, lowest first, one layer a line,

    name name ...: what they are (continued on indented lines)

where a module is a file's stem (x.c and x.h are one module, x_part.c is a module of its
own) and a name "sub/x" is a file of the part's subfolder sub/ (src/fs names export/'s).
Each module may use only modules on lines above its own: not one on its own line, not
one below.  What a file uses comes from tests/helpers/uses.py (ctags: every name a file
uses that another file of the part defines, types and macros included).  Fails, naming
each, on: a use upward or sideways, a file of the part that no line names, a name that
no file has, a name listed twice.  Prints nothing when all is well."""
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import uses  # noqa: E402


def read_layers(part):
    """[(line number, [names])] of part/layers, lowest first."""
    out = []
    with open(os.path.join(part, "layers")) as f:
        for no, line in enumerate(f, 1):
            if not line.strip() or line.lstrip().startswith("#") or line[0] in " \t":
                continue  # blank, a comment, or a description's continuation
            names, sep, _ = line.partition(":")
            if not sep:
                raise SystemExit("%s/layers:%d: NAME...: WHAT, not %r" % (part, no, line.rstrip()))
            out.append((no, names.split()))
    return out


def files_of(part, names):
    """The C files of part and of each subfolder a name reaches into, as {path: module}."""
    subs = {n.split("/")[0] for n in names if "/" in n}
    files = {}
    for folder in [part] + [os.path.join(part, s) for s in sorted(subs)]:
        rel = os.path.relpath(folder, part)
        for f in sorted(os.listdir(folder)):
            if f.endswith((".c", ".h")):
                stem = os.path.splitext(f)[0]
                files[os.path.join(folder, f)] = stem if rel == "." else "%s/%s" % (rel, stem)
    return files


def use_graph(files):
    """{a: {b: names}}: module a uses names module b defines (uses.py's rules, per file)."""
    paths = sorted(files)
    out = subprocess.run(["ctags", "--output-format=json", "--fields={name}{kind}{input}{file}",
                          "--kinds-C=+px-m-l", "-f", "-"] + paths, capture_output=True, text=True, check=True).stdout
    owner, declared = uses.owners(out, files)
    edges = {}
    for f in paths:
        for name in uses.used_names(f, declared[f]):
            for m in owner.get(name, ()):
                if m != files[f] and len(owner[name]) == 1:
                    edges.setdefault(files[f], {}).setdefault(m, set()).add(name)
    return edges


def check(part):
    layers = read_layers(part)
    level, problems = {}, []
    for no, names in layers:
        for n in names:
            if n in level:
                problems.append("%s/layers:%d: %s is listed twice" % (part, no, n))
            level[n] = no
    files = files_of(part, level)
    modules = set(files.values())
    for n in sorted(set(level) - modules):
        problems.append("%s/layers: %s: no such file (%s.c or %s.h)" % (part, n, n, n))
    for f, m in sorted(files.items()):
        if m not in level:
            problems.append("%s: not in %s/layers" % (f, part))
    for a, uses_of in sorted(use_graph(files).items()):
        for b, names in sorted(uses_of.items()):
            if a in level and b in level and level[b] >= level[a]:
                how = "on its own line" if level[b] == level[a] else "above it"
                problems.append("%s uses %s, %s in %s/layers (%s)" % (a, b, how, part, " ".join(sorted(names)[:4])))
    return problems


def main():
    if sys.argv[1:2] == ["--edges"]:  # what each file of each part uses: "a -> b (names)"
        for part in sys.argv[2:]:
            files = files_of(part, [n for _, names in read_layers(part) for n in names])
            for a, uses_of in sorted(use_graph(files).items()):
                for b, names in sorted(uses_of.items()):
                    print("%s: %s -> %s (%s)" % (part, a, b, " ".join(sorted(names)[:4])))
        return 0
    problems = [p for part in sys.argv[1:] for p in check(part)]
    print("\n".join(problems))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
