#!/bin/sh
# Install what gmsfs needs, on Debian or Ubuntu: sh scripts/install-deps.sh [demo].
# Idempotent: installs only what is missing, and runs apt-get update only then.
#   demo:   what make demo shows alone: the build, fuse3, attr, python3 with PyTorch (CPU)
#   (none): everything below, what make check runs
#   build:  compiler, libfuse3, msgpack-c, xxHash, UCX (gmsfs-peer)
#   tests:  fuse3, bats and its libraries, attr and xxhash (shell tools), util-linux
#           (setpriv, prlimit), iproute2 (gmsfs-peer's network namespaces), valgrind,
#           clang with its sanitizer and libFuzzer runtimes,
#           python3 with numpy, pytest, torch (CPU), prometheus-client and grpcio (gmsfs-csi), systemd
#           (systemd-analyze verifies the units), universal-ctags (tests/layout.sh reads
#           which names each file uses)
#   packages: debhelper, dpkg-dev, lintian, git (make deb builds from the files git knows);
#           python3-venv, python3-pip and unzip (tests/wheel.sh installs the wheel in venvs);
#           podman, runc and debootstrap (tests/container.sh builds and runs the images)
set -eu
demo="build-essential pkg-config libfuse3-dev fuse3 libmsgpack-dev libxxhash-dev attr python3 python3-numpy
python3-torch"
pkgs="build-essential pkg-config libfuse3-dev fuse3 libmsgpack-dev libxxhash-dev libucx-dev xxhash attr iproute2
bats bats-assert bats-support bats-file util-linux passwd valgrind clang libclang-rt-14-dev
python3 python3-numpy python3-pytest python3-torch python3-prometheus-client python3-grpcio systemd
debhelper dpkg-dev lintian git dpkg-repack python3-yaml dash universal-ctags
python3-venv python3-pip unzip podman runc debootstrap"
[ "${1:-}" = demo ] && pkgs=$demo
missing=""
for p in $pkgs; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
[ -z "$missing" ] && exit 0
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
echo "install-deps: installing:$missing" >&2
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends $missing >/dev/null
