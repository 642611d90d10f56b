#!/usr/bin/env bash
# `cudaw fatbin` on PyTorch's libtorch_cuda.so: wall time, peak RSS and kernels for the
# whole file and for --sm 90, on one core (taskset -c 0) and on every core, beside the
# figures before the listing was streamed (issue 30). Needs no GPU.
#
#   scripts/fatbin_bench.sh                  # torch 2.11 from the package index
#   TORCH_SPEC='torch==2.11.*' RUNS=5 scripts/fatbin_bench.sh
#   LIBTORCH=/path/to/libtorch_cuda.so scripts/fatbin_bench.sh   # skip the download
#   BASELINE=/path/to/old/cudaw scripts/fatbin_bench.sh          # also time another build
#
# The wheel (about 530 MB) is downloaded to a temporary folder and removed at the end; only
# torch/lib/libtorch_cuda.so (456 MB) is unpacked. Each figure is the best of RUNS runs
# (default 3): the machine may be shared. The JSON of each build is compared byte for byte
# with the first one's.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
RUNS=${RUNS:-3}
TORCH_SPEC=${TORCH_SPEC:-'torch==2.11.*'}
TMP=$(mktemp -d "${TMPDIR:-/tmp}/fatbin-bench.XXXXXX")
trap 'rm -rf "$TMP"' EXIT

command -v /usr/bin/time >/dev/null || { echo "needs /usr/bin/time (apt-get install time)" >&2; exit 1; }

if [ -z "${LIBTORCH:-}" ]; then
  echo "downloading $TORCH_SPEC (CUDA build) ..." >&2
  python3 -m pip download --no-deps -q -d "$TMP/wheel" "$TORCH_SPEC" >&2
  whl=$(ls "$TMP"/wheel/torch-*.whl | head -1)
  python3 - "$whl" "$TMP" <<'PY'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    z.extract("torch/lib/libtorch_cuda.so", sys.argv[2])
    v = z.read("torch/version.py").decode()
print(next(l for l in v.splitlines() if l.startswith("__version__")), file=sys.stderr)
PY
  rm -rf "$TMP/wheel"
  LIBTORCH="$TMP/torch/lib/libtorch_cuda.so"
fi

(cd "$ROOT" && cargo build --release -q -p cudaw-cli --bin cudaw)
CUDAW="$ROOT/target/release/cudaw"

# best_of CMD...: prints "WALL_S PEAK_MB" of the fastest of $RUNS runs (stdout to $TMP/out).
best_of() {
  local best="" i
  for i in $(seq "$RUNS"); do
    /usr/bin/time -f "%e %M" -o "$TMP/time" "$@" >"$TMP/out"
    read -r wall kb <"$TMP/time"
    if [ -z "$best" ] || awk "BEGIN{exit !($wall < ${best% *})}"; then
      best="$wall $((kb / 1024))"
    fi
  done
  echo "$best"
}

kernels() { python3 -c 'import json,sys; print(len(json.load(open(sys.argv[1]))["kernels"]))' "$1"; }

echo
echo "file: $LIBTORCH ($(stat -c %s "$LIBTORCH") bytes), $(nproc) core(s), best of $RUNS"
echo
printf '| %-44s | %-7s | %-7s | %-9s | %-8s |\n' command wall "peak RSS" kernels "same JSON"
printf '|%s|%s|%s|%s|%s|\n' "$(printf -- '-%.0s' {1..46})" "---------" "---------" "-----------" "----------"
for build in "$CUDAW" ${BASELINE:+"$BASELINE"}; do
  for pin in "taskset -c 0" ""; do
    for sm in "" "--sm 90"; do
      key=$(echo "$sm" | tr -d ' -')
      read -r wall mb < <(best_of $pin "$build" fatbin "$LIBTORCH" --json $sm)
      if [ -f "$TMP/ref$key.json" ]; then
        cmp -s "$TMP/out" "$TMP/ref$key.json" && same=yes || same=NO
      else
        cp "$TMP/out" "$TMP/ref$key.json"; same=reference
      fi
      label="$( [ "$build" = "$CUDAW" ] && echo cudaw || echo baseline) fatbin --json${sm:+ $sm}${pin:+ (1 core)}"
      printf '| %-44s | %5s s | %4s MB | %9s | %-8s |\n' "$label" "$wall" "$mb" "$(kernels "$TMP/out")" "$same"
    done
  done
done
echo
echo "Where the time goes (one core, --stats):"
taskset -c 0 "$CUDAW" fatbin "$LIBTORCH" --json --stats >/dev/null
taskset -c 0 "$CUDAW" fatbin "$LIBTORCH" --json --sm 90 --stats >/dev/null
echo
echo "Before streaming (issue 30; same file, release build, taskset -c 0):"
echo "| cudaw fatbin --json          | 6.77 s (10.3 s on the GPU host) | 2.16 GB | 130,498 |"
echo "| cudaw fatbin --json --sm 90  | 1.24 s                          | 744 MB  | 21,495  |"
