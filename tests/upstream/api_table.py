#!/usr/bin/env python3
"""tests/upstream/api_table.py [GMS_LIB]: docs/gms.md's table of GMS's client against what
it describes.  Without GMS_LIB: every name the table says gmsfs gives is in gmsfs.gms's
modules, as `import gpu_memory_service...` gives them (python/tests/test_gms.py runs this
in CI).  With GMS_LIB (GMS's lib/ of a fetched tree): every public name of GMS's client
modules is in the table too (tests/upstream/run.sh).  Prints what is missing; exit 1 if
anything is."""
import ast
import importlib
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOC = os.path.join(ROOT, "docs", "gms.md")
# GMS's client modules, and the private class of one that GMS's own tests use.
CLIENT = ("client/memory_manager.py", "client/session.py", "common/locks.py", "common/utils.py",
          "client/torch/allocator.py", "client/torch/module.py", "client/torch/tensor.py",
          "failover_lock/interface.py", "failover_lock/flock/lock.py")
PRIVATE_USED = {"_GMSClientSession"}
# Where GMS's package re-exports a module's names (failover_lock/__init__.py and its flock's).
PACKAGE_OF = {"failover_lock.interface": "failover_lock", "failover_lock.flock.lock": "failover_lock.flock"}


def rows(doc=DOC):
    """(name, module, status) of each row between the table's markers."""
    text = open(doc).read()
    table = text[text.index("<!-- gms-api: begin -->"):text.index("<!-- gms-api: end -->")]
    return [(m.group(1), m.group(2), m.group(3)) for m in
            re.finditer(r"^\| `([\w.]+)` \| ([\w.]+) \| ([^|]+?) \|", table, re.M)]


def missing_in_gmsfs(doc=DOC):
    sys.path.insert(0, os.path.join(ROOT, "python"))
    import gmsfs.gms
    gmsfs.gms.install()
    out = []
    for name, module, status in rows(doc):
        if status == "not on gmsfs":
            continue
        try:
            obj = importlib.import_module("gpu_memory_service." + module)
            for part in name.split("."):
                obj = getattr(obj, part)
        except (ImportError, AttributeError) as e:
            out.append("%s (gpu_memory_service.%s): %s" % (name, module, e))
    return out


def public_names(gms_lib):
    """(name, module) of every public function, class, method and property of GMS's client."""
    names = []
    for rel in CLIENT:
        module = PACKAGE_OF.get(rel[:-3].replace("/", "."), rel[:-3].replace("/", "."))
        tree = ast.parse(open(os.path.join(gms_lib, "gpu_memory_service", rel)).read())
        for node in tree.body:
            if not isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                continue
            if node.name.startswith("_") and node.name not in PRIVATE_USED:
                continue
            names.append((node.name, module))
            if isinstance(node, ast.ClassDef):
                names += [("%s.%s" % (node.name, b.name), module) for b in node.body
                          if isinstance(b, (ast.FunctionDef, ast.AsyncFunctionDef)) and not b.name.startswith("_")]
    return names


def missing_in_table(gms_lib, doc=DOC):
    listed = {(n, m) for n, m, _ in rows(doc)}
    return ["%s (%s)" % nm for nm in public_names(gms_lib) if nm not in listed]


def main():
    problems = missing_in_gmsfs()
    problems = ["docs/gms.md says gmsfs gives it, and it is not there: " + p for p in problems]
    if len(sys.argv) > 1:
        problems += ["GMS's client has it, and docs/gms.md does not say: " + p for p in missing_in_table(sys.argv[1])]
    for p in problems:
        print(p)
    print("docs/gms.md: %d names, %s" % (len(rows()), "%d problems" % len(problems) if problems else "all true"))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
