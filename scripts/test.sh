#!/usr/bin/env bash
# The test command: what CI runs (.ci/run) and what a developer runs on a fresh machine.
# Installs what it needs (the CUDA compilers, into target/cuda-venv, from the Python
# package index; the aarch64 Rust target and C cross compiler), then checks formatting and
# lints (x86-64 and aarch64), the modules' layering and the commit subjects, builds the
# shims for aarch64, runs every test, and builds the book and the API docs.
set -euo pipefail
cd "$(dirname "$0")/.."
# One clean build, nothing to keep for the next: no incremental caches (2.4 GB of a 9 GB
# target folder), so that the tests have room on a small disk.
export CARGO_INCREMENTAL=0
scripts/setup-cuda.sh
# Tests that need nvcc fail rather than skip when this is set.
export CUDAW_REQUIRE_CUDA_TOOLS=1
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
# No import cycle between the modules of the engine, the plumbing and the two shims; commit
# subjects in the form `area: what changed`, at most 72 characters.
python3 scripts/module-cycles.py crates/engine crates/shim-core crates/config \
  crates/cudart-shim crates/driver-shim
scripts/check-history.sh
# The aarch64 host build (GH200, GB200): the whole workspace type-checks and lints for it
# (clippy runs `cargo check` and more), and the two shims, whose generated trampolines
# are AArch64 assembly there, assemble and link.
scripts/setup-aarch64.sh
export CC_aarch64_unknown_linux_gnu=aarch64-linux-gnu-gcc
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
export CUDAW_REQUIRE_CROSS_TOOLS=1
cargo clippy --workspace --all-targets --target aarch64-unknown-linux-gnu -- -D warnings
cargo build -q --target aarch64-unknown-linux-gnu -p cudart-shim -p driver-shim
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
