"""The Python package's copies of the C contract match it: the ctypes mirrors of
gmsfs.h's structs (size and every field's offset, from a C program compiled here) and
gmsfs.torch's layout constants (from include/gmsfs/torch.h)."""
import ctypes
import os
import re
import subprocess

from conftest import ROOT

from gmsfs import _lib

MIRRORS = {"gmsfs_mapping": _lib.Mapping, "gmsfs_entry": _lib.Entry, "gmsfs_new": _lib.New,
           "gmsfs_meta": _lib.Meta}


def c_layout(tmp_path):
    """{struct: (size, {field: offset})} as the C compiler lays gmsfs.h's structs out."""
    src = ["#include <gmsfs/gmsfs.h>", "#include <stddef.h>", "#include <stdio.h>", "int main(void) {"]
    for name, mirror in MIRRORS.items():
        src.append('printf("%s .sizeof %%zu\\n", sizeof(struct %s));' % (name, name))
        for field, _ in mirror._fields_:
            src.append('printf("%s %s %%zu\\n", offsetof(struct %s, %s));' % (name, field, name, field))
    src.append("return 0; }")
    c, exe = tmp_path / "layout.c", tmp_path / "layout"
    c.write_text("\n".join(src))
    subprocess.run(["cc", "-I" + os.path.join(ROOT, "include"), "-o", str(exe), str(c)], check=True)
    out = {}
    for line in subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout.splitlines():
        struct, field, n = line.split()
        size, fields = out.setdefault(struct, [0, {}])
        if field == ".sizeof":
            out[struct][0] = int(n)
        else:
            fields[field] = int(n)
    return out


def test_ctypes_mirrors_match_the_c_structs(tmp_path):
    layout = c_layout(tmp_path)
    for name, mirror in MIRRORS.items():
        size, fields = layout[name]
        assert ctypes.sizeof(mirror) == size, name
        assert {f: getattr(mirror, f).offset for f, _ in mirror._fields_} == fields, name
        assert len(fields) == len(mirror._fields_)


def test_a_mirror_with_a_field_missing_would_be_caught(tmp_path):
    """The check above can fail: a struct with one field less has another size."""
    class Short(ctypes.Structure):
        _fields_ = _lib.Entry._fields_[:-1]
    assert ctypes.sizeof(Short) != c_layout(tmp_path)["gmsfs_entry"][0]


def test_torch_layout_constants_match_the_header():
    import gmsfs.torch as gt
    text = open(os.path.join(ROOT, "include", "gmsfs", "torch.h")).read()
    defs = {k: v.split("/*")[0].strip() for k, v in re.findall(r"#define (GMSFS_TORCH_\w+) ([^\n]+)", text)}
    assert defs["GMSFS_TORCH_PREFIX"] == '"%s"' % gt.PREFIX
    assert defs["GMSFS_TORCH_TAG"] == '"%s"' % gt.TAG
    assert int(defs["GMSFS_TORCH_ALIGN"].rstrip("u")) == gt.ALIGN
    assert eval(defs["GMSFS_TORCH_SLAB_BYTES"].replace("ull", "")) == gt.SLAB_BYTES
