#!/usr/bin/env python3
"""uses.py: which names each C file uses and which file defines them, the rules by which
tests/helpers/layers.py draws what the files of a part use of each other.

A module is a .c and its .h (x.c, x.h).  What a module defines comes from ctags (Debian's
universal-ctags): the functions and variables its .c defines, the macros, types, struct,
union and enum tags, enumerators and static inline functions its files hold; not a .c's
static functions (no other file can use them), and a prototype or an extern declaration
is neither a definition nor a use.  A file uses every identifier in its text (comments and strings
removed), so a call through a static inline helper or a macro of a header counts, and so
does a type named only in a declaration, except in a header that declares it opaque
("struct x;": an interface may name a type whose insides live above it)."""
import json
import re


def strip(text):
    """The text without comments, strings and character constants."""
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r"//[^\n]*", " ", text)
    text = re.sub(r'"(\\.|[^"\\\n])*"', '""', text)
    return re.sub(r"'(\\.|[^'\\\n])*'", "''", text)


TAGS = ("struct", "union", "enum")


def owners(ctags_json, mod):
    """From ctags' output: {name: {modules that define it}}, and {file: names it only
    declares} (mod: {file: its module})."""
    owner, declared = {}, {f: set() for f in mod}
    for line in ctags_json.splitlines():
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
    return owner, declared


def used_names(f, declared):
    """Every name f's text uses (comments and strings aside), "struct x" for tags, less
    what it only declares, and the tags a header declares opaque."""
    text = strip(open(f).read())
    ids = set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", text)) - declared
    ids |= {"%s %s" % m for m in re.findall(r"\b(struct|union|enum)\s+([A-Za-z_][A-Za-z0-9_]*)", text)}
    if f.endswith(".h"):
        ids -= {"%s %s" % m for m in re.findall(r"^(struct|union)\s+([A-Za-z_][A-Za-z0-9_]*)\s*;", text, re.M)}
    return ids
