#!/bin/sh
# Install what gmsfs needs to build and test, on Debian or Ubuntu.  Idempotent:
# installs only what is missing, and runs apt-get update only then.
set -eu
pkgs="build-essential pkg-config libfuse3-dev fuse3 libmsgpack-dev libxxhash-dev xxhash attr
bats bats-assert bats-support bats-file"
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
