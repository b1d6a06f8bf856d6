#!/bin/sh
# scripts/container-base.sh: the base images the Containerfiles name, made where no image
# registry can be reached (as here): Debian 12 from the Debian archive (debootstrap,
# imported into podman), an image holding this machine's CUDA header, and a Python base
# with pip on its PATH in a venv (as a PyTorch engine image has).  An image that exists is
# kept.  Prints the --build-arg options that name them, for podman build:
#   podman build $(sh scripts/container-base.sh daemon) -f deploy/container/Containerfile -t gmsfs .
# Needs root, podman, debootstrap and /usr/local/cuda/include/cuda.h (CUDA_INC to change).
set -eu
cd "$(dirname "$0")/.."
what=${1:-daemon} # daemon | engine: which Containerfile's options to print
debian=localhost/gmsfs-base-debian:bookworm
cuda=localhost/gmsfs-base-cuda-headers:latest
python=localhost/gmsfs-base-python:bookworm
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
cuda_inc=${CUDA_INC:-/usr/local/cuda/include}
. scripts/podman-env.sh
tmp=$(mktemp -d /tmp/gmsfs-base.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
podman_env "$tmp/containers.conf"
have() { podman image exists "$1"; }

if ! have "$debian"; then
	echo "container-base: debootstrap bookworm from $mirror" >&2
	debootstrap --variant=minbase bookworm "$tmp/root" "$mirror" >"$tmp/debootstrap.log" 2>&1 ||
		{ tail -20 "$tmp/debootstrap.log" >&2; exit 1; }
	rm -rf "$tmp/root/var/cache/apt/archives"/*.deb "$tmp/root/var/lib/apt/lists"/*
	tar -C "$tmp/root" -cf - . | podman import -q - "$debian" >/dev/null
	rm -rf "$tmp/root"
fi
if ! have "$cuda"; then
	[ -f "$cuda_inc/cuda.h" ] || { echo "container-base: $cuda_inc/cuda.h not found (set CUDA_INC)" >&2; exit 1; }
	mkdir -p "$tmp/cuda" && cp "$cuda_inc/cuda.h" "$tmp/cuda/"
	printf 'FROM scratch\nCOPY cuda.h /usr/local/cuda/include/cuda.h\n' >"$tmp/cuda/Containerfile"
	podman build -q -t "$cuda" "$tmp/cuda" >/dev/null
fi
if ! have "$python"; then
	mkdir -p "$tmp/python"
	cat >"$tmp/python/Containerfile" <<EOC
FROM $debian
RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
	python3 python3-venv && rm -rf /var/lib/apt/lists/* && python3 -m venv /opt/venv
ENV PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
EOC
	podman build -q --network host -t "$python" "$tmp/python" >/dev/null
fi
case $what in
daemon) echo "--build-arg BASE=$debian --build-arg CUDA_HEADERS=$cuda" ;;
engine) echo "--build-arg BASE=$python" ;;
*) echo "container-base: daemon or engine, not $what" >&2; exit 2 ;;
esac
