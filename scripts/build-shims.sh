#!/usr/bin/env bash
# Builds the three drop-in runtimes, one per CUDA major, the driver shim and the
# host-memory interposer (smart pinning) into target/shims/PROFILE/:
#   libcudart.so.11.0  libcudart.so.12  libcudart.so.13  libcuda.so.1  libcudaw_hostmem.so
# Usage: scripts/build-shims.sh [debug|release]   (default debug)
set -euo pipefail
cd "$(dirname "$0")/.."
profile=${1:-debug}
flag=(); [ "$profile" = release ] && flag=(--release)
target=${CARGO_TARGET_DIR:-target}
out=target/shims/$profile
mkdir -p "$out"
for pair in cuda11:libcudart.so.11.0 cuda12:libcudart.so.12 cuda13:libcudart.so.13; do
  feat=${pair%%:*}; soname=${pair#*:}
  cargo build -q "${flag[@]}" -p cudart-shim --no-default-features --features "$feat"
  cp -f "$target/$profile/libcudart_shim.so" "$out/$soname.tmp"
  mv -f "$out/$soname.tmp" "$out/$soname"
done
cargo build -q "${flag[@]}" -p driver-shim
cp -f "$target/$profile/libdriver_shim.so" "$out/libcuda.so.1.tmp"
mv -f "$out/libcuda.so.1.tmp" "$out/libcuda.so.1"
cargo build -q "${flag[@]}" -p cudaw-hostmem
cp -f "$target/$profile/libcudaw_hostmem.so" "$out/libcudaw_hostmem.so.tmp"
mv -f "$out/libcudaw_hostmem.so.tmp" "$out/libcudaw_hostmem.so"
echo "built $(ls "$out" | tr '\n' ' ')in $out" >&2
