#!/bin/sh
# scripts/ptx.sh [NVCC]: libgmsfs/digest_gpu_ptx.h from libgmsfs/digest_gpu.cu and
# common/xxh3_lanes.h, where nvcc is (the GPU machine): the content hash's kernel as PTX
# for compute capability 7.5 and later, which the driver compiles for its GPU at the first
# load.  Run it after changing either source and commit what it writes; tests/layout.sh
# fails while the header's sources' hash is not theirs.
set -eu
cd "$(dirname "$0")/.."
nvcc=${1:-${NVCC:-nvcc}}
out=libgmsfs/digest_gpu_ptx.h
sum=$(cat libgmsfs/digest_gpu.cu common/xxh3_lanes.h | sha256sum | cut -c1-64)
ptx=$(mktemp)
trap 'rm -f "$ptx" "$out.new"' EXIT
"$nvcc" -ptx -O3 -arch=compute_75 -Icommon -o "$ptx" libgmsfs/digest_gpu.cu
{
	echo "/* digest_gpu_ptx.h: libgmsfs/digest_gpu.cu as PTX, made by scripts/ptx.sh; do not edit."
	echo " * $("$nvcc" --version | tail -n 2 | head -n 1)"
	echo " * sources: $sum */"
	echo "static const char gm_digest_ptx[] ="
	sed -e 's/\\/\\\\/g' -e 's/"/\\"/g' -e 's/^/\t"/' -e 's/$/\\n"/' "$ptx"
	printf "\t;\n"
} > "$out.new"
mv "$out.new" "$out"
echo "scripts/ptx.sh: $out ($(wc -c < "$out") bytes)"
