#!/usr/bin/env bash
# Builds the large input of `cargo bench -p fatbin --bench large`: a template-heavy .cu file
# (KERNELS instantiations, several parameter layouts each) compiled once by nvcc for eight
# SMs with zstd compression (-Xfatbin -compress-all), its fatbin container then concatenated until
# the file reaches SIZE_MB (default 300, like libtorch_cuda.so's .nv_fatbin).
# Output: target/fatbin-bench/large.fatbin (not committed).
set -euo pipefail
root=$(cd "$(dirname "$0")/../../.." && pwd)
bin=$(dirname "$(readlink -f "${CUDAW_CUDA_BIN:-$root/target/cuda/bin}/nvcc")")
kernels=${KERNELS:-450}
size_mb=${SIZE_MB:-300}
out=$root/target/fatbin-bench
mkdir -p "$out"
src=$out/templates.cu
{
  echo '#include <cstddef>'
  echo 'template <int N> struct Blob { float v[N]; };'
  echo 'template <typename T, int N> __global__ void kern(T a, Blob<N> b, T *out, const T *in, size_t n, char tag) {'
  echo '  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;'
  echo '  if (i < n) out[i] = a * in[i] + (T)b.v[i % N] + (T)tag;'
  echo '}'
  for ((i = 1; i <= kernels / 3; i++)); do
    for t in float double int; do
      echo "template __global__ void kern<$t, $i>($t, Blob<$i>, $t *, const $t *, size_t, char);"
    done
  done
} >"$src"
archs=""
for sm in 75 80 86 89 90 100 120; do archs="$archs -gencode arch=compute_$sm,code=sm_$sm"; done
archs="$archs -gencode arch=compute_120,code=compute_120"
# shellcheck disable=SC2086
"$bin/nvcc" -fatbin -Xfatbin -compress-all $archs -o "$out/one.fatbin" "$src"
one=$(stat -c %s "$out/one.fatbin")
copies=$(( (size_mb * 1024 * 1024 + one - 1) / one ))
: >"$out/large.fatbin.tmp"
for ((i = 0; i < copies; i++)); do cat "$out/one.fatbin" >>"$out/large.fatbin.tmp"; done
mv "$out/large.fatbin.tmp" "$out/large.fatbin"
echo "make_input.sh: $out/large.fatbin: $copies containers of $one bytes, $(stat -c %s "$out/large.fatbin") bytes"
