#!/usr/bin/env bash
# Installs what the aarch64 check of scripts/test.sh needs, once:
#   - the Rust standard library for aarch64-unknown-linux-gnu (rustup target add);
#   - the C cross compiler gcc-aarch64-linux-gnu (apt-get), with its binutils: zstd-sys's
#     build script compiles zstd with it, cargo links the shims with it (through LLD), and
#     shim-build's tests assemble the generated AArch64 trampolines with its assembler.
# Idempotent and quiet: a second run checks that both are present and says nothing.
set -euo pipefail
target=aarch64-unknown-linux-gnu
if ! rustup target list --installed 2>/dev/null | grep -qx "$target"; then
  echo "setup-aarch64: rustup target add $target" >&2
  rustup target add "$target" >/dev/null
fi
if ! command -v aarch64-linux-gnu-gcc >/dev/null; then
  sudo=()
  if [ "$(id -u)" != 0 ]; then
    if command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
      sudo=(sudo -n)
    else
      echo "setup-aarch64: aarch64-linux-gnu-gcc is missing and this user cannot install it;" \
        "install gcc-aarch64-linux-gnu (Debian/Ubuntu) and run again" >&2
      exit 1
    fi
  fi
  echo "setup-aarch64: installing gcc-aarch64-linux-gnu" >&2
  log=$(mktemp)
  if ! "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
    gcc-aarch64-linux-gnu libc6-dev-arm64-cross >"$log" 2>&1; then
    # A fresh image may have no package lists yet.
    "${sudo[@]}" apt-get update -q >>"$log" 2>&1 || true
    "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
      gcc-aarch64-linux-gnu libc6-dev-arm64-cross >>"$log" 2>&1 || {
      cat "$log" >&2
      rm -f "$log"
      echo "setup-aarch64: apt-get install gcc-aarch64-linux-gnu failed (output above)" >&2
      exit 1
    }
  fi
  rm -f "$log"
fi
