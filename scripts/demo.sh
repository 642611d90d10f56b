#!/usr/bin/env bash
# The first thing to run on a fresh machine: builds cudaw (release), its CUDA 13 drop-in
# runtime and simgpu (the simulated GPU the demo runs on when there is no GPU), installs
# the CUDA 13 compiler into target/ when no nvcc is around (to compile the example
# program), then runs `cudaw demo`: an example CUDA program natively and under cudaw,
# paused (its device memory handed back), resumed, dumped to a file and restored, with
# the results compared. Arguments go to `cudaw demo` (try --help, --json).
#
# The older demo, the kernels of a real nvcc-built program: scripts/demo.sh fatbin
set -euo pipefail
cd "$(dirname "$0")/.."
target=${CARGO_TARGET_DIR:-target}
if ! command -v nvcc >/dev/null 2>&1 && [ ! -x /usr/local/cuda/bin/nvcc ]; then
  scripts/setup-cuda.sh
fi
if [ "${1:-}" = fatbin ]; then
  shift
  mkdir -p target/demo
  target/cuda/bin/nvcc -cudart shared -gencode arch=compute_80,code=sm_80 \
    -gencode arch=compute_90,code='[sm_90,compute_90]' \
    -o target/demo/struct_of_pointers tests/cuda/programs/struct_of_pointers.cu
  exec cargo run -q --release -p cudaw-cli -- fatbin target/demo/struct_of_pointers "$@"
fi
echo "demo: building cudaw, its drop-in libcudart.so.13 and simgpu (release; a few minutes the first time)" >&2
cargo build -q --release -p cudart-shim --no-default-features --features cuda13
mkdir -p target/shims/release
cp -f "$target/release/libcudart_shim.so" target/shims/release/libcudart.so.13.tmp
mv -f target/shims/release/libcudart.so.13.tmp target/shims/release/libcudart.so.13
cargo build -q --release -p simgpu
cargo build -q --release -p cudaw-cli --bins
exec "$target/release/cudaw" demo "$@"
