#!/bin/sh
# scripts/ptx.sh [NVCC]: libgmsfs/digest_gpu_ptx.h from libgmsfs/digest_gpu.cu and
# common/xxh3_lanes.h, where nvcc is (the GPU machine): the content hash's kernel as PTX
# for compute capability 7.5 and later, which the driver compiles for its GPU at the first
# load.  Run it after changing either source and commit what it writes; tests/layout.sh
# fails while the header's sources' hash is not theirs.
#
# nvcc declares its own PTX ISA (9.0 for CUDA 13), which drivers older than it refuse.
# The kernel needs far less (shfl.sync: 6.0), so the PTX declares ISA 7.0 (CUDA 11's
# drivers on), checked here with ptxas: it must assemble so, and for sm_90 to the very
# same machine code as under nvcc's own declaration.
set -eu
cd "$(dirname "$0")/.."
nvcc=${1:-${NVCC:-nvcc}}
ptxas=$(dirname "$(command -v "$nvcc")")/ptxas
isa=7.0
out=libgmsfs/digest_gpu_ptx.h
sum=$(cat libgmsfs/digest_gpu.cu common/xxh3_lanes.h | sha256sum | cut -c1-64)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp" "$out.new"' EXIT
"$nvcc" -ptx -O3 -arch=compute_75 -Icommon -o "$tmp/nvcc.ptx" libgmsfs/digest_gpu.cu
sed "s/^\.version [0-9.]*\$/.version $isa/" "$tmp/nvcc.ptx" > "$tmp/k.ptx"
grep -q "^\.version $isa\$" "$tmp/k.ptx" || { echo "scripts/ptx.sh: no .version line in nvcc's PTX" >&2; exit 1; }
"$ptxas" -arch=sm_75 -o "$tmp/75.cubin" "$tmp/k.ptx"
"$ptxas" -arch=sm_90 -o "$tmp/90a.cubin" "$tmp/nvcc.ptx"
"$ptxas" -arch=sm_90 -o "$tmp/90b.cubin" "$tmp/k.ptx"
cmp -s "$tmp/90a.cubin" "$tmp/90b.cubin" || { echo "scripts/ptx.sh: ISA $isa changes the kernel's code" >&2; exit 1; }
{
	echo "/* digest_gpu_ptx.h: libgmsfs/digest_gpu.cu as PTX, made by scripts/ptx.sh; do not edit."
	echo " * $("$nvcc" --version | tail -n 2 | head -n 1); declared PTX ISA $isa"
	echo " * sources: $sum */"
	echo "static const char gm_digest_ptx[] ="
	sed -e 's/\\/\\\\/g' -e 's/"/\\"/g' -e 's/^/\t"/' -e 's/$/\\n"/' "$tmp/k.ptx"
	printf "\t;\n"
} > "$out.new"
mv "$out.new" "$out"
echo "scripts/ptx.sh: $out ($(wc -c < "$out") bytes, PTX ISA $isa)"
