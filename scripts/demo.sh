#!/usr/bin/env bash
# The first thing to run on a fresh machine: builds cudaw (release), its CUDA 13 drop-in
# runtime and simgpu (the simulated GPU the demo runs on when there is no GPU), installs
# the CUDA 13 compiler into target/ when no nvcc is around (to compile the example
# program), then runs `cudaw demo`: an example CUDA program natively and under cudaw,
# paused (its device memory handed back), resumed, dumped to a file and restored, with
# the results compared. Arguments go to `cudaw demo` (try --help, --json). Standard
# output is the demo's alone (with --json, one JSON object); progress goes to stderr.
#
# The older demo, the kernels of a real nvcc-built program: scripts/demo.sh fatbin
#
# Afterwards the binaries are target/release/cudaw and target/release/cudaw-ckpt (the demo's
# last line names them); `scripts/package.sh` makes dist/bin and dist/lib, which can be
# copied anywhere or linked from a folder on PATH.
set -euo pipefail
cd "$(dirname "$0")/.."
target=${CARGO_TARGET_DIR:-target}
# nvcc: the one setup-cuda.sh installed, else the system's, else install it (once).
nvcc=
for c in target/cuda/bin/nvcc "$(command -v nvcc || true)" /usr/local/cuda/bin/nvcc; do
  if [ -n "$c" ] && [ -x "$c" ]; then nvcc=$c; break; fi
done
if [ -z "$nvcc" ]; then
  scripts/setup-cuda.sh >&2
  nvcc=target/cuda/bin/nvcc
fi
if [ "${1:-}" = fatbin ]; then
  shift
  mkdir -p target/demo
  "$nvcc" -cudart shared -gencode arch=compute_80,code=sm_80 \
    -gencode arch=compute_90,code='[sm_90,compute_90]' \
    -o target/demo/struct_of_pointers tests/cuda/programs/struct_of_pointers.cu
  cargo build -q --release -p cudaw-cli --bin cudaw
  exec "$target/release/cudaw" fatbin target/demo/struct_of_pointers "$@"
fi
echo "demo: building cudaw, its drop-in libcudart.so.13 and simgpu (release; a few minutes the first time)" >&2
cargo build -q --release -p cudart-shim --no-default-features --features cuda13
# `cudaw run` finds it in ../shims/release beside target/release/cudaw.
mkdir -p "$target/shims/release"
cp -f "$target/release/libcudart_shim.so" "$target/shims/release/libcudart.so.13.tmp"
mv -f "$target/shims/release/libcudart.so.13.tmp" "$target/shims/release/libcudart.so.13"
cargo build -q --release -p simgpu
cargo build -q --release -p cudaw-cli --bins
exec "$target/release/cudaw" demo "$@"
