#!/bin/bash
# GMS's own client-flow tests against gmsfs (issue 28), through gmsfs.gms:
#   tests/upstream/run.sh [DIR] [pytest args]
# DIR (default .upstream/gms, git-ignored: upstream code is never committed) holds
# test_runtime_flows.py, test_torch_integration.py and test_failover_lock.py of NVIDIA
# Dynamo's lib/gpu_memory_service/tests (a public fork that tracks upstream: zinuga/dynamo):
#   for f in test_runtime_flows.py test_torch_integration.py test_failover_lock.py; do
#     git -C dynamo show HEAD:lib/gpu_memory_service/tests/$f >.upstream/gms/$f; done
# Where GMS's lib/ is fetched too (.upstream/lib: git -C dynamo archive HEAD lib/gpu_memory_service |
# tar -x -C .upstream), docs/gms.md's table is checked against its client first (api_table.py).
# The async tests need pytest-asyncio (Debian's python3-pytest-asyncio; tests/gpu/run.sh's
# prefix has it from .debs, put on PYTHONPATH here).
# They run on a copy in build/upstream-gms with conftest.py beside them, which mounts gmsfs
# (GMSFS_BACKEND: host by default, cuda on the GPU machine) where upstream's fixture
# started GMS's server in-process; the one change made to the copies is that fixture's
# name (upstream's running_gms becomes _upstream_running_gms, so that conftest's is used).
#
# Tests that cannot apply (deselected, each with what covers it on gmsfs):
#   test_allocation_manager_caches_exported_fd: GMS's server-side allocation manager; on
#     gmsfs the daemon exports each handle on every import (tests/70-libgmsfs.bats).
#   test_large_allocation_unblocks_after_export_fd_holder_dies: the same manager's retry
#     loop; on gmsfs memory comes back when the last holder's descriptor closes
#     (tests/gpu/run.sh: "memory is given back").
#
# Measured on the host backend (2026-11-29, upstream df888f68): of the 24 runtime flows
# and failover-lock tests that apply, 23 pass (the runtime state and event history through
# GMS's transport are the store's state and history files, gmsfs/_gms_rpc.py); test_torch_integration.py needs CUDA (the
# GPU machine, where its 3 pass).  Sessions are connections on gmsfs.gms as in GMS
# (gmsfs(5), "Sessions of their own"), and allocation ids are new for each layout (a
# note of the layout, which its hash leaves out).  The one that fails,
# test_reallocate_all_handles_reuses_preserved_vas_in_new_layout, expects EMPTY after a
# writer that closes without committing, where gmsfs keeps the last commit: a crashed
# writer never loses the published model.
set -u
cd "$(dirname "$0")/../.." || exit 1
root=$(pwd)
src=${1:-.upstream/gms}
[ $# -gt 0 ] && shift
files="test_runtime_flows.py test_torch_integration.py test_failover_lock.py"
for f in $files; do
	[ -f "$src/$f" ] || { echo "run.sh: $src/$f is missing (see this script's header)" >&2; exit 2; }
done
work=build/upstream-gms
rm -rf "$work"
mkdir -p "$work"
cp tests/upstream/conftest.py "$work/"
for f in $files; do
	sed 's/^def running_gms(/def _upstream_running_gms(/' "$src/$f" >"$work/$f"
	[ "$f" = test_failover_lock.py ] || grep -q '^def _upstream_running_gms(' "$work/$f" ||
		{ echo "run.sh: no running_gms fixture in $f" >&2; exit 2; }
done
site=$root/.gpu/prefix/usr/lib/python3/dist-packages # pytest-asyncio, where tests/gpu/run.sh unpacked it
[ -d "$site/pytest_asyncio" ] && export PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH}
table=0 # docs/gms.md against GMS's client, where its tree is fetched (.upstream/lib, or $GMS_LIB)
lib=${GMS_LIB:-.upstream/lib}
if [ -d "$lib/gpu_memory_service" ]; then
	"${PYTHON:-/usr/bin/python3}" tests/upstream/api_table.py "$lib" || table=1
fi
cd "$work" || exit 1
GMSFS_ROOT=$root "${PYTHON:-/usr/bin/python3}" -m pytest -p no:cacheprovider --rootdir=. -q -rs \
	--deselect test_runtime_flows.py::test_allocation_manager_caches_exported_fd \
	--deselect test_runtime_flows.py::test_large_allocation_unblocks_after_export_fd_holder_dies \
	"$@" $files
rc=$?
exit $((rc ? rc : table))
