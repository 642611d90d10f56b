#!/usr/bin/env bash
# Builds the release artifacts a GPU machine needs into dist/ (stripped, ignored by git):
#   dist/lib/libcudart.so.11.0  dist/lib/libcudart.so.12  dist/lib/libcudart.so.13
#   dist/lib/libcuda.so.1 (the driver shim)
#   dist/bin/cudaw  dist/bin/cudaw-ckpt  dist/bin/vmm_check  dist/bin/staging_bench
# `cudaw run` finds the libraries in ../lib beside its own binary.
set -euo pipefail
cd "$(dirname "$0")/.."
target=${CARGO_TARGET_DIR:-target}
scripts/build-shims.sh release
rm -rf dist && mkdir -p dist/lib dist/bin
cp target/shims/release/libcudart.so.* target/shims/release/libcuda.so.1 dist/lib/
cargo build -q --release -p cudaw-cli
for b in cudaw cudaw-ckpt; do
  if [ -f "$target/release/$b" ]; then cp "$target/release/$b" dist/bin/; fi
done
for ex in vmm_check staging_bench; do
  if cargo build -q --release -p driver --example $ex 2>/dev/null; then
    cp "$target/release/examples/$ex" dist/bin/
  fi
done
strip dist/bin/* dist/lib/* 2>/dev/null || true
du -sh dist
find dist -type f | sort
