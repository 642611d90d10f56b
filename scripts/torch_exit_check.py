#!/usr/bin/env python3
"""A PyTorch training job paused while it finishes must still exit (issue #24's GPU check).

RUNS times: examples/torch_train.py (a few steps, a held buffer) runs under `cudaw run`;
once it prints its final line, the job is paused, in turn: with one `kill -USR1` at a
random instant in the next 300 ms; with `kill -USR1` in a tight loop (every millisecond)
until it exits; or with `cudaw-ckpt pause` at once (a pause taken before the interpreter
shuts down, which must be undone at exit). It is never resumed. Each run must exit by itself within
EXIT_LIMIT seconds with status 0, and afterwards no process of it may be left on the GPU
(nvidia-smi's compute-apps list) and the GPU's memory in use must be back to what it was
before the run (within 64 MiB).

Prints `PASS | name | detail` / `FAIL | name | detail` lines and exits 0 when all passed.

  scripts/torch_exit_check.py --dist dist --runs 20 --seed 1
"""
import argparse
import os
import random
import signal
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN = os.path.join(ROOT, "examples", "torch_train.py")
EXIT_LIMIT = 120


def smi_used_mib():
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits",
                              "-i", "0"], capture_output=True, text=True, timeout=30).stdout
        return int(out.strip().splitlines()[0])
    except (OSError, ValueError, IndexError, subprocess.TimeoutExpired):
        return None


def smi_pids():
    try:
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30).stdout
        return {int(x) for x in out.split() if x.strip().isdigit()}
    except (OSError, subprocess.TimeoutExpired):
        return set()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dist", required=True)
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--hold-gib", type=float, default=2)
    p.add_argument("--log", default="/tmp/torch_exit_check.log")
    args = p.parse_args()
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    rng = random.Random(seed)
    print(f"seed {seed}", flush=True)
    cudaw = os.path.join(args.dist, "bin", "cudaw")
    train = [sys.executable, TRAIN, "--steps", "8", "--no-compile", "--hold-gib", str(args.hold_gib)]
    env = dict(os.environ, CUDAW_LOG="info")
    baseline = smi_used_mib()
    failures, undone, refused, times = [], 0, 0, []
    log = open(args.log, "w")
    for run in range(args.runs):
        mode = ("once", "loop", "held")[run % 3]
        errf = f"{args.log}.{run}.err"
        proc = subprocess.Popen([cudaw, "run", "--", *train], stdout=subprocess.PIPE,
                                stderr=open(errf, "w"), env=env, text=True)
        for line in proc.stdout:
            if line.startswith("final loss"):
                break
        t0 = time.monotonic()
        if mode == "once":
            time.sleep(rng.random() * 0.3)
            try:
                os.kill(proc.pid, signal.SIGUSR1)
            except ProcessLookupError:
                pass
        elif mode == "held":
            subprocess.run([os.path.join(args.dist, "bin", "cudaw-ckpt"), "pause", str(proc.pid)],
                           capture_output=True, text=True, timeout=EXIT_LIMIT)
        else:
            while proc.poll() is None and time.monotonic() - t0 < EXIT_LIMIT:
                try:
                    os.kill(proc.pid, signal.SIGUSR1)
                except ProcessLookupError:
                    break
                time.sleep(0.001)
        try:
            rc = proc.wait(timeout=max(1, EXIT_LIMIT - (time.monotonic() - t0)))
        except subprocess.TimeoutExpired:
            rc = None
            proc.kill()
            proc.wait()
        took = time.monotonic() - t0
        times.append(took)
        err = open(errf).read()
        undone += "the pause was undone" in err
        refused += "pause refused" in err
        time.sleep(0.5)
        left = proc.pid in smi_pids()
        used = smi_used_mib()
        log.write(f"run {run} {mode}: rc {rc} in {took:.2f} s, on the GPU after: {left}, used {used} MiB "
                  f"(baseline {baseline})\n{err[-2000:]}\n")
        if rc != 0 or left or (used is not None and baseline is not None and used > baseline + 64):
            failures.append(f"run {run} ({mode}): rc {rc} after {took:.1f} s, left on the GPU {left}, "
                            f"used {used} MiB vs {baseline}")
    ok = not failures
    detail = (f"{args.runs} runs (seed {seed}) exited by themselves, longest {max(times):.2f} s after the last line; "
              f"{undone} paused before exit and undone, {refused} with pauses refused; GPU memory back to "
              f"{baseline} MiB, no process left") if ok else "; ".join(failures[:3])
    print(f"{'PASS' if ok else 'FAIL'} | torch job paused while it exits, always exits | {detail}", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
