#!/usr/bin/env bash
# Diagnostic (issue #26): two ranks of examples/ddp_train.py under cudaw, paused at once
# (A) and one alone (B); records every thread (state, wchan, kernel stack), cuda-gdb
# backtraces of both ranks, and whether /proc/PID/cmdline blocks. On nvidia-h100-x2:
#   OUT=$OUT scripts/mgpu-probe.sh   (about 5 minutes; files in $OUT)
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
OUT=${OUT:-/tmp/probe}; mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
nvidia-smi -L
W=$(mktemp -d /tmp/probe.XXXX)
snap() { # label pids...
  local label=$1; shift
  for p in "$@"; do
    echo "=== $label pid $p"
    timeout 3 cat /proc/$p/cmdline >/dev/null 2>&1 && echo "cmdline readable" || echo "cmdline BLOCKED/failed rc=$?"
    for t in /proc/$p/task/*; do
      tid=${t##*/}
      printf -- '--- tid %s comm %s state %s wchan %s syscall %s\n' "$tid" "$(cat $t/comm 2>/dev/null)" \
        "$(awk '{print $3}' $t/stat 2>/dev/null)" "$(cat $t/wchan 2>/dev/null)" "$(timeout 2 cat $t/syscall 2>/dev/null | cut -c1-60)"
      timeout 2 cat $t/stack 2>/dev/null | head -25
    done
  done
}
run_job() { # name extra-env...
  local name=$1; shift
  rm -rf "$W/$name"; mkdir -p "$W/$name"
  env "$@" CUDAW_LOG=${PROBE_LOG:-info} "$ROOT/dist/bin/cudaw" run -- torchrun --standalone --nproc_per_node 2 \
    examples/ddp_train.py --steps 100000 --print-losses --pid-dir "$W/$name" --hold-gib 1 >"$OUT/$name.job.out" 2>"$OUT/$name.job.err" &
  JOB=$!
  for i in $(seq 1 120); do [ -f "$W/$name/rank0.pid" ] && [ -f "$W/$name/rank1.pid" ] && break; sleep 1; done
  R0=$(cat "$W/$name/rank0.pid"); R1=$(cat "$W/$name/rank1.pid")
  echo "job $name: torchrun-wrapper $JOB ranks $R0 $R1"
  sleep 4
}
end_job() {
  kill -9 $R0 $R1 2>/dev/null; sleep 1; pkill -9 -f ddp_train.py; pkill -9 -f torchrun; wait $JOB 2>/dev/null
  sleep 2
}

echo "##### native smoke"
timeout 120 torchrun --standalone --nproc_per_node 2 examples/ddp_train.py --steps 20 --print-losses 2>&1 | tail -4

echo "##### A: pause both ranks at once"
run_job A
nvidia-smi --query-gpu=index,memory.used --format=csv,noheader
( timeout 90 dist/bin/cudaw-ckpt pause $R0 >"$OUT/A.pause0" 2>&1; echo "rc $?" >>"$OUT/A.pause0" ) &
( timeout 90 dist/bin/cudaw-ckpt pause $R1 >"$OUT/A.pause1" 2>&1; echo "rc $?" >>"$OUT/A.pause1" ) &
wait %2 %3 2>/dev/null; sleep 0.5
cat "$OUT/A.pause0" "$OUT/A.pause1"
nvidia-smi --query-gpu=index,memory.used --format=csv,noheader
snap "A+1s" $R0 $R1 >"$OUT/A.snap1" 2>&1
sleep 4
snap "A+5s" $R0 $R1 >"$OUT/A.snap5" 2>&1
grep -E '^===|cmdline' "$OUT/A.snap5"; echo "progress: $(grep -c ^step "$OUT/A.job.out") steps"
timeout 30 dist/bin/cudaw-ckpt status $R0; echo "status rc $?"
timeout 30 dist/bin/cudaw-ckpt resume $R0; echo "resume0 rc $?"
timeout 30 dist/bin/cudaw-ckpt resume $R1; echo "resume1 rc $?"
sleep 3
snap "A+resume" $R0 $R1 >"$OUT/A.snap9" 2>&1
grep -E '^===|cmdline' "$OUT/A.snap9"; echo "progress: $(grep -c ^step "$OUT/A.job.out") steps"
timeout 60 cuda-gdb -batch -p $R0 -ex 'info threads' -ex 'thread apply all bt 30' >"$OUT/A.gdb0" 2>&1; echo "gdb rc $?"
timeout 60 cuda-gdb -batch -p $R1 -ex "info threads" -ex "thread apply all bt 30" >"$OUT/A.gdb1" 2>&1
tail -2 "$OUT/A.job.out" 2>/dev/null; end_job
tail -30 "$OUT/A.job.err"

echo "##### B: pause rank 0 only"
run_job B
( timeout 90 dist/bin/cudaw-ckpt pause $R0 >"$OUT/B.pause0" 2>&1; echo "rc $?" >>"$OUT/B.pause0" )
cat "$OUT/B.pause0"
sleep 3
snap "B+3s" $R0 $R1 >"$OUT/B.snap3" 2>&1
grep -E '^===|cmdline' "$OUT/B.snap3"; echo "progress: $(grep -c ^step "$OUT/B.job.out") steps"
timeout 30 dist/bin/cudaw-ckpt resume $R0; echo "resume0 rc $?"
sleep 5
snap "B+resume" $R0 $R1 >"$OUT/B.snap8" 2>&1
grep -E '^===|cmdline' "$OUT/B.snap8"; echo "progress: $(grep -c ^step "$OUT/B.job.out") steps"
tail -3 "$OUT/B.job.out"
tail -2 "$OUT/B.job.out" 2>/dev/null; end_job
tail -30 "$OUT/B.job.err"
