#!/usr/bin/env bash
# Builds the seed corpus for `cargo +nightly fuzz run parse` from real nvcc output: fatbins
# in every compression scheme, with and without PTX, cubins of both ELF flavours, PTX text and
# an -rdc object. Needs scripts/setup-cuda.sh to have run.
#   fuzz/seed.sh && cd fuzz && cargo +nightly fuzz run parse -- -jobs=1 -max_total_time=300
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin=$(dirname "$(readlink -f "${CUDAW_CUDA_BIN:-$root/target/cuda/bin}/nvcc")")
out=$root/fuzz/corpus/parse
mkdir -p "$out"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
n=0
for src in "$root"/tests/cuda/layouts_*.cu; do
  base=$(basename "$src" .cu)
  while read -r name flags; do
    # shellcheck disable=SC2086
    "$bin/nvcc" $flags -o "$out/$base-$name" "$src"
    n=$((n + 1))
  done <<'FORMS'
zstd.fatbin -fatbin -arch=sm_90 -Xfatbin -compress-all
lz4.fatbin -fatbin -arch=sm_90 --compress-mode=speed -Xfatbin -compress-all
plain.fatbin -fatbin -arch=sm_90 -Xfatbin -compress=false
multi.fatbin -fatbin -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=[sm_90,compute_90]
sm90.cubin -cubin -arch=sm_90
k.ptx -ptx -arch=compute_90
rdc.o -c -rdc=true -arch=sm_90
FORMS
  if [ -x "$root/target/cuda/cu12/ptxas" ]; then
    sed 's/^\.version .*/.version 8.8/' "$out/$base-k.ptx" >"$tmp/$base.ptx"
    "$root/target/cuda/cu12/ptxas" -arch=sm_90 -o "$out/$base-cu12.cubin" "$tmp/$base.ptx"
    n=$((n + 1))
  fi
done
# The hand-made regression inputs of the robustness test, if any.
if [ -d "$root/crates/fatbin/tests/regressions" ]; then
  cp "$root"/crates/fatbin/tests/regressions/* "$out"/ 2>/dev/null || true
fi
echo "seed.sh: $n seeds in $out"
