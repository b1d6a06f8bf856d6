"""The gmsfs wheel: a PEP 517 build backend that needs nothing but Python and the tree's
make (pyproject.toml names it, so `pip install .` works offline), and `make wheel`'s
builder (python3 python/wheel_backend.py DIR).

The wheel holds the package and, in gmsfs/_native/, the client library it speaks to
(libgmsfs.so.0, libgmsfs-load.so.1) with the one library they need that engine images
lack (libmsgpackc.so.2): the package and its library are always the same version, and
an engine image needs no Debian package and no environment variable.  Built with CUDA's
header present (as `make` builds it), the library works on the host backend and on
GPUs alike: libcuda is opened at run time.  The tag is py3-none-linux_<machine>: the
libraries need glibc 2.34 or later (Debian 12, Ubuntu 22.04, RHEL 9)."""
import base64
import hashlib
import io
import os
import platform
import re
import subprocess
import sys
import tarfile
import zipfile

TOP = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NATIVE = ("libgmsfs.so.0", "libgmsfs-load.so.1")
CARRIED = ("libmsgpackc.so.2",)  # what the libraries need beyond glibc


def project():
    """pyproject.toml's [project] table (tomllib; before Python 3.11, the few keys the
    metadata takes, as pyproject.toml writes them)."""
    path = os.path.join(TOP, "pyproject.toml")
    try:
        import tomllib
        with open(path, "rb") as f:
            return tomllib.load(f)["project"]
    except ImportError:
        text = open(path).read().split("[project]", 1)[1]
        get = lambda key: re.search(r'^%s = "([^"]*)"' % key, text, re.M).group(1)  # noqa: E731
        return {"name": get("name"), "description": get("description"), "license": {"text": "MIT"},
                "requires-python": get("requires-python"), "optional-dependencies": {"torch": ["torch"]},
                "readme": {"text": re.search(r'text = """(.*?)"""', text, re.S).group(1)}}


NAME = project()["name"]


def version():
    h = open(os.path.join(TOP, "include", "gmsfs", "gmsfs.h")).read()
    parts = [re.search(r"#define GMSFS_VERSION_%s (\d+)" % p, h).group(1) for p in ("MAJOR", "MINOR", "PATCH")]
    return ".".join(parts)


def metadata():
    p = project()
    lines = ["Metadata-Version: 2.1", "Name: %s" % p["name"], "Version: %s" % version(),
             "Summary: %s" % p["description"], "License: %s" % p["license"]["text"],
             "Requires-Python: %s" % p["requires-python"]]
    for extra, needs in sorted(p.get("optional-dependencies", {}).items()):
        lines.append("Provides-Extra: %s" % extra)
        lines += ['Requires-Dist: %s; extra == "%s"' % (n, extra) for n in needs]
    return "\n".join(lines) + "\n\n" + p["readme"]["text"]


def build_libraries():
    """make the client libraries; where each lies, and the carried ones found by ldd."""
    subprocess.run(["make", "-s", "-C", TOP, "build/libgmsfs.so", "build/libgmsfs-load.so"], check=True,
                   stdout=sys.stderr)
    paths = {n: os.path.join(TOP, "build", n) for n in NATIVE}
    seen = subprocess.run(["ldd"] + list(paths.values()), capture_output=True, text=True, check=True).stdout
    for n in CARRIED:
        m = re.search(r"^\s*%s => (\S+)" % re.escape(n), seen, re.M)
        if not m:
            raise SystemExit("wheel: %s not found by ldd (apt-get install libmsgpackc2)" % n)
        paths[n] = m.group(1)
    return paths


def package_files():
    """(path in the wheel, bytes) of the Python package."""
    root = os.path.join(TOP, "python")
    for d, dirs, files in os.walk(os.path.join(root, NAME)):
        dirs[:] = sorted(x for x in dirs if x != "__pycache__")
        for f in sorted(files):
            if f.endswith(".py"):
                p = os.path.join(d, f)
                yield os.path.relpath(p, root), open(p, "rb").read()


def _record_line(name, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return "%s,sha256=%s,%d" % (name, digest, len(data))


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    tag = "py3-none-linux_" + platform.machine()
    dist = "%s-%s" % (NAME, version())
    info = dist + ".dist-info"
    files = list(package_files())
    for n, p in sorted(build_libraries().items()):
        files.append(("%s/_native/%s" % (NAME, n), open(p, "rb").read()))
    copyright = "/usr/share/doc/libmsgpackc2/copyright"
    if os.path.exists(copyright):
        files.append(("%s/_native/copyright.libmsgpackc2" % NAME, open(copyright, "rb").read()))
    files += [
        (info + "/METADATA", metadata().encode()),
        (info + "/WHEEL", ("Wheel-Version: 1.0\nGenerator: gmsfs wheel_backend\nRoot-Is-Purelib: false\n"
                           "Tag: %s\n" % tag).encode()),
        (info + "/entry_points.txt", b"[console_scripts]\ngmsfsctl = gmsfs.ctl:main\n"),
        (info + "/top_level.txt", b"gmsfs\n"),
        (info + "/LICENSE", open(os.path.join(TOP, "LICENSE"), "rb").read()),
    ]
    name = "%s-%s.whl" % (dist, tag)
    os.makedirs(wheel_directory, exist_ok=True)
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w", zipfile.ZIP_DEFLATED) as z:
        record = []
        for path, data in files:
            zi = zipfile.ZipInfo(path, date_time=(2026, 1, 1, 0, 0, 0))
            zi.external_attr = (0o755 if "/_native/lib" in path else 0o644) << 16
            zi.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(zi, data)
            record.append(_record_line(path, data))
        record.append(info + "/RECORD,,")
        z.writestr(info + "/RECORD", "\n".join(record) + "\n")
    return name


def build_sdist(sdist_directory, config_settings=None):
    """The tracked files of the tree (git ls-files), as NAME-VERSION/..."""
    dist = "%s-%s" % (NAME, version())
    tracked = subprocess.run(["git", "-C", TOP, "ls-files", "-z"], capture_output=True, check=True).stdout
    name = dist + ".tar.gz"
    os.makedirs(sdist_directory, exist_ok=True)
    with tarfile.open(os.path.join(sdist_directory, name), "w:gz") as t:
        for f in tracked.decode().split("\0"):
            if f and os.path.isfile(os.path.join(TOP, f)):
                t.add(os.path.join(TOP, f), arcname=os.path.join(dist, f), recursive=False)
        pkg = metadata().encode()
        ti = tarfile.TarInfo(os.path.join(dist, "PKG-INFO"))
        ti.size = len(pkg)
        t.addfile(ti, io.BytesIO(pkg))
    return name


def get_requires_for_build_wheel(config_settings=None):
    return []


get_requires_for_build_sdist = get_requires_for_build_wheel


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: python3 python/wheel_backend.py DIR   (the wheel goes into DIR)")
    print(os.path.join(sys.argv[1], build_wheel(sys.argv[1])))
