#!/usr/bin/env bash
# The main job for a newcomer (for now): compile a real CUDA program with nvcc and list its
# kernels and their parameter layouts with `cudaw fatbin`. Installs the CUDA 13 compiler
# into target/ on first use.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-cuda.sh
mkdir -p target/demo
target/cuda/bin/nvcc -cudart shared -gencode arch=compute_80,code=sm_80 \
  -gencode arch=compute_90,code='[sm_90,compute_90]' \
  -o target/demo/struct_of_pointers tests/cuda/programs/struct_of_pointers.cu
cargo run -q --release -p cudaw-cli -- fatbin target/demo/struct_of_pointers "$@"
