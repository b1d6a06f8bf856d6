#!/bin/bash
# The wheel as an engine image meets it (issue 45): `make wheel`, pip-installed offline
# into fresh venvs, used from outside the tree with no PYTHONPATH, GMSFS_LIBRARY or
# LD_LIBRARY_PATH, against a host-backend mount; and `pip install .` from a copy of the
# tree through pyproject.toml's in-tree backend.  TAP.
set -u
cd "$(dirname "$0")/.." || exit 1
top=$(pwd)
b=${GMSFS_BUILD:-build}
. tests/helpers/tap.sh
tmp=$(mktemp -d /tmp/gmsfs-wheel.XXXXXX)
m=$tmp/mnt
mkdir "$m"
pid=
cleanup() {
	if [ -n "$pid" ]; then
		umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null
		for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.05; done
		kill -9 "$pid" 2>/dev/null
	fi
	rm -rf "$tmp"
}
trap cleanup EXIT

# What runs in a venv runs as an engine's would: from elsewhere, with nothing of the tree.
clean_env() { (cd "$tmp" && env -u PYTHONPATH -u GMSFS_LIBRARY -u GMSFS_LOAD_LIBRARY -u LD_LIBRARY_PATH "$@"); }

wheel=$(make -s wheel 2>&1 | tail -1)
t "make wheel builds dist/gmsfs-VERSION-py3-none-linux_ARCH.whl, offline" test -f "$wheel"
t "the wheel carries the package, its libraries and what they need but glibc" sh -c "
	unzip -l '$wheel' | grep -q 'gmsfs/_native/libgmsfs.so.0' &&
	unzip -l '$wheel' | grep -q 'gmsfs/_native/libgmsfs-load.so.1' &&
	unzip -l '$wheel' | grep -q 'gmsfs/_native/libmsgpackc.so.2' &&
	unzip -l '$wheel' | grep -q 'gmsfs/gms_alias/gpu_memory_service/__init__.py' &&
	unzip -l '$wheel' | grep -q 'gmsfs-[0-9.]*.dist-info/RECORD'"

"$b/gmsfs" -f -o backend=host,max_bytes=256M "$m" 2>"$tmp/daemon.log" 3>&- &
pid=$!
for _ in $(seq 200); do grep -q " $m fuse.gmsfs " /proc/mounts && break; sleep 0.05; done

# ---- a plain venv: no system site-packages, so nothing but the wheel gives gmsfs ----
v=$tmp/venv
t "python3 -m venv, then pip install --no-index of the wheel" \
	clean_env sh -c "/usr/bin/python3 -m venv '$v' && '$v/bin/pip' install -q --no-index '$top/$wheel'"
t "import gmsfs in the venv loads the wheel's own libgmsfs (no environment variable)" clean_env "$v/bin/python" -c "
import gmsfs, gmsfs._lib as l, sys
assert gmsfs.__file__.startswith('$v/'), gmsfs.__file__
assert l.path.startswith('$v/') and '/_native/' in l.path, l.path
assert l.load_lib() is not None
print(l.path, l.version_string)"
t "a writer and a reader, two fresh processes of the venv: the bytes and the entry" clean_env sh -c "
	mkdir '$m/w' && '$v/bin/python' -c '
import ctypes, gmsfs
with gmsfs.connect(\"$m/w\", \"rw\") as c:
    a = c.create(\"a\", 4096)
    ctypes.memmove(a.ptr, b\"hello\", 5)
    c.meta_put(\"layer0\", \"a\", 0, b\"v1\")
    c.commit()' &&
	'$v/bin/python' -c '
import ctypes, gmsfs
with gmsfs.connect(\"$m/w\", \"ro\") as c:
    c.import_all()
    assert ctypes.string_at(c.find(\"a\").ptr, 5) == b\"hello\", \"bytes\"
    assert c.meta_get(\"layer0\").value == b\"v1\"
'"
t "gmsfsctl and python3 -m gmsfs from the venv list the store" clean_env sh -c "
	'$v/bin/gmsfsctl' list '$m' | grep -q ' w  *COMMITTED ' && '$v/bin/python' -m gmsfs list '$m' | grep -q ' w  *COMMITTED '"
t "python3 -m gmsfs.gms --pth: import gpu_memory_service is gmsfs.gms, a GMS writer and reader on the mount" \
	clean_env sh -c "'$v/bin/python' -m gmsfs.gms --pth >/dev/null && '$v/bin/python' -c '
import os
from gpu_memory_service.client.memory_manager import GMSClientMemoryManager
from gpu_memory_service.common.locks import RequestedLockType
import gmsfs.gms
assert GMSClientMemoryManager is gmsfs.gms.GMSClientMemoryManager
os.mkdir(\"$m/gms\")
w = GMSClientMemoryManager(\"$m/gms\")
w.connect(RequestedLockType.RW)
va = w.create_mapping(size=1 << 20)
w.metadata_put(\"k\", w.mappings[va].allocation_id, 0, b\"x\")
assert w.commit()
r = GMSClientMemoryManager(\"$m/gms\")
r.connect(RequestedLockType.RO)
assert r.metadata_get(\"k\")[2] == b\"x\"
r.close()' && '$v/bin/python' -m gmsfs.gms --no-pth && ! '$v/bin/python' -c 'import gpu_memory_service' 2>/dev/null"

# ---- a venv that sees the system's PyTorch, as an engine image's does ----
vt=$tmp/venv-torch
t "a venv with --system-site-packages: gmsfs.torch publishes and a fresh process materializes, zero-copy" \
	clean_env sh -c "/usr/bin/python3 -m venv --system-site-packages '$vt' && '$vt/bin/pip' install -q --no-index '$top/$wheel' &&
	'$vt/bin/python' -c '
import gmsfs, torch, gmsfs.torch as gt, gmsfs.adapters, gmsfs.transformers, os
assert gmsfs.__file__.startswith(\"$vt/\"), gmsfs.__file__
torch.manual_seed(0)
m = torch.nn.Linear(64, 32)
os.mkdir(\"$m/t\")
gt.publish(m, \"$m/t\")
torch.save(m.state_dict(), \"$tmp/ref.pt\")' &&
	'$vt/bin/python' -c '
import torch, gmsfs, gmsfs.torch as gt
m = torch.nn.Linear(64, 32, device=\"meta\")
gt.materialize(m, \"$m/t\")
c = m._gmsfs
ref = torch.load(\"$tmp/ref.pt\")
assert torch.equal(m.weight, ref[\"weight\"]) and torch.equal(m.bias, ref[\"bias\"])
assert any(x.ptr <= m.weight.data_ptr() < x.ptr + x.size for x in c.mappings), \"a view of the store\"'"

# ---- pip install . from a copy of the tree: pyproject.toml's in-tree backend, offline ----
src=$tmp/src
vs=$tmp/venv-src
t "pip install . from a copy of the tree builds through pyproject.toml's backend, offline" \
	clean_env sh -c "mkdir '$src' && git -C '$top' ls-files -co --exclude-standard -z | (cd '$top' && xargs -0 tar -cf -) | tar -xf - -C '$src' &&
	/usr/bin/python3 -m venv '$vs' && '$vs/bin/pip' install -q --no-index '$src' &&
	'$vs/bin/python' -c 'import gmsfs._lib as l; assert l.path.startswith(\"$vs/\"), l.path'"

echo "1..$n"
[ "$failed" -eq 0 ]
