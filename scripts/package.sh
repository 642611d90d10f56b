#!/usr/bin/env bash
# Builds the release artifacts a GPU machine needs into dist/ (stripped, ignored by git):
#   dist/lib/libcudart.so.11.0  dist/lib/libcudart.so.12  dist/lib/libcudart.so.13
#   dist/lib/libcuda.so.1 (the driver shim)  dist/lib/libcudaw_hostmem.so (smart pinning)
#   dist/bin/cudaw  dist/bin/cudaw-ckpt  dist/bin/vmm_check  dist/bin/staging_bench
#   dist/lib/libsimgpu.so                     the simulated GPU (`cudaw demo` without a GPU)
#   dist/share/cudaw/cudaw_demo{,.cu}         `cudaw demo`'s example, prebuilt with nvcc
# `cudaw run` finds the libraries in ../lib beside its own binary.
set -euo pipefail
cd "$(dirname "$0")/.."
target=${CARGO_TARGET_DIR:-target}
scripts/build-shims.sh release
rm -rf dist && mkdir -p dist/lib dist/bin
cp target/shims/release/libcudart.so.* target/shims/release/libcuda.so.1 \
  target/shims/release/libcudaw_hostmem.so dist/lib/
cargo build -q --release -p cudaw-cli
for b in cudaw cudaw-ckpt; do
  if [ -f "$target/release/$b" ]; then cp "$target/release/$b" dist/bin/; fi
done
for ex in vmm_check staging_bench; do
  if cargo build -q --release -p driver --example $ex 2>/dev/null; then
    cp "$target/release/examples/$ex" dist/bin/
  fi
done
cargo build -q --release -p simgpu
cp "$target/release/libsimgpu.so" dist/lib/
# The demo's example, for machines without nvcc (the CUDA 13 compiler from target/cuda-venv).
mkdir -p dist/share/cudaw
if scripts/setup-cuda.sh && target/cuda/bin/nvcc -O2 -cudart shared \
    -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code='[sm_90,compute_90]' \
    -o dist/share/cudaw/cudaw_demo tests/cuda/programs/cudaw_demo.cu; then
  cp tests/cuda/programs/cudaw_demo.cu tests/cuda/programs/common.h dist/share/cudaw/
else
  echo "package: no prebuilt demo example (nvcc unavailable); cudaw demo will compile it with nvcc" >&2
fi
strip dist/bin/* dist/lib/* dist/share/cudaw/cudaw_demo 2>/dev/null || true
du -sh dist
find dist -type f | sort
