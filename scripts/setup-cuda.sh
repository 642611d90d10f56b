#!/usr/bin/env bash
# Installs the CUDA compilers and tools the tests need, from the Python package index,
# into target/cuda-venv (once), and exposes them under stable paths:
#   target/cuda/bin/{nvcc,cuobjdump,fatbinary,ptxas,nvlink}   CUDA 13
#   target/cuda/include                                       CUDA 13 headers
#   target/cuda/cu12/ptxas                                    CUDA 12 (its wheel ships ptxas alone)
#   target/cuda/lib/libcudart.so.{13,12,11.0}                 the real runtimes
# Idempotent: a second run checks that the links are in place and says nothing (it prints
# nvcc's version only when it installed or repaired something).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv=$root/target/cuda-venv
out=$root/target/cuda
stamp=$venv/.cudaw-installed-v1
linked=$venv/.cudaw-linked-v1
if [ -f "$stamp" ] && [ -f "$linked" ] && [ -x "$out/bin/nvcc" ] && [ -e "$out/lib/libcudart.so" ]; then
  exit 0
fi
if [ ! -f "$stamp" ]; then
  echo "setup-cuda: installing CUDA 13 nvcc/cuobjdump/runtime and CUDA 12 ptxas into $venv" >&2
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
    nvidia-cuda-nvcc nvidia-cuda-runtime nvidia-cuda-cuobjdump nvidia-cuda-crt \
    nvidia-cuda-nvcc-cu12 nvidia-cuda-runtime-cu12 nvidia-cuda-runtime-cu11
  touch "$stamp"
fi
site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
cu13=$site/nvidia/cu13
[ -x "$cu13/bin/nvcc" ] || { echo "setup-cuda: nvcc missing under $cu13" >&2; exit 1; }
# nvcc links -lcudart for -cudart shared; the wheel ships only the versioned file.
ln -sf libcudart.so.13 "$cu13/lib/libcudart.so"
# nvcc finds its headers and libraries relative to the folder it is invoked from, so
# target/cuda is a link to the CUDA 13 tree itself; the CUDA 12 ptxas and the older runtimes
# are linked into that tree (it is ours: it lives in target/cuda-venv).
mkdir -p "$cu13/cu12"
ln -sf "$site/nvidia/cuda_nvcc/bin/ptxas" "$cu13/cu12/ptxas"
for rt in "$site"/nvidia/cuda_runtime/lib/libcudart.so.12 "$site"/nvidia/cuda_runtime/lib/libcudart.so.11.0; do
  if [ -e "$rt" ]; then ln -sf "$rt" "$cu13/lib/$(basename "$rt")"; fi
done
if [ -d "$out" ] && [ ! -L "$out" ]; then rm -rf "$out"; fi
ln -sfn "$cu13" "$out"
touch "$linked"
echo "setup-cuda: $("$out/bin/nvcc" --version | tail -1)" >&2
