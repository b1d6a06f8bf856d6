#!/usr/bin/env python3
"""inside_map.py [--check | --write] [FILE]: docs/inside.md's map of the parts, drawn from
their layers files (tests/layout.sh checks every file against those), so that the map a
newcomer reads cannot drift from the rules the tests keep.  The map stands in FILE
between the two marker lines below; --check prints what differs (nothing when it is
current), --write puts it there; no option prints it."""
import os
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
PARTS = ["common", "src/fsm", "src/meta", "src/vmm", "src/fs", "src/mover", "src/keeper", "libgmsfs", "loader", "peer"]
BEGIN = "<!-- the layers files, as tests/helpers/inside_map.py draws them: edit those, then run it with --write -->"
END = "<!-- end of the layers files -->"


def drawn():
    out = [BEGIN, ""]
    for part in PARTS:
        with open(os.path.join(ROOT, part, "layers")) as f:
            lines = [l.rstrip("\n") for l in f]
        head = [l[2:] for l in lines if l.startswith("# ")]
        body = [l for l in lines if l.strip() and not l.startswith("#")]
        out += ["### %s" % part, "", " ".join(head), "", "```"] + body + ["```", ""]
    return "\n".join(out + [END])


def main(argv):
    mode = argv[0] if argv and argv[0].startswith("--") else None
    path = (argv[1:] if mode else argv) or [os.path.join(ROOT, "docs", "inside.md")]
    map_ = drawn()
    if not mode:
        print(map_)
        return 0
    text = open(path[0]).read()
    if BEGIN not in text or END not in text:
        print("%s: no map between the markers (%s ... %s)" % (path[0], BEGIN, END))
        return 1
    before, rest = text.split(BEGIN, 1)
    now, after = rest.split(END, 1)
    if mode == "--write":
        with open(path[0], "w") as f:
            f.write(before + map_ + after)
        return 0
    if BEGIN + now + END != map_:
        print("%s: its map of the layers is not what the layers files say: run %s --write" % (path[0], sys.argv[0]))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
