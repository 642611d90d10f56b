#!/usr/bin/env bash
# The test command: what CI runs (.ci/run) and what a developer runs on a fresh machine.
# Installs what it needs (the CUDA compilers, into target/cuda-venv, from the Python
# package index), then checks formatting and lints and runs every test.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-cuda.sh
# Tests that need nvcc fail rather than skip when this is set.
export CUDAW_REQUIRE_CUDA_TOOLS=1
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
# The three drop-in runtimes (one per CUDA major) that the export tests compare.
scripts/build-shims.sh
cargo test --workspace
# The docs: the book (mdbook, installed once into target/tools) and the API docs, warnings
# denied.
mdbook=target/tools/bin/mdbook
if ! "$mdbook" --version 2>/dev/null | grep -qx 'mdbook v0.5.4'; then
  cargo install mdbook --version 0.5.4 --locked --no-default-features --features search \
    --root target/tools
fi
"$mdbook" build docs
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps
