#!/usr/bin/env python3
"""A PyTorch training loop paused, resumed, dumped and restored under cudaw, against an
uninterrupted native run of the same loop (issue #6's GPU acceptance).

  1. native:  examples/torch_train.py --steps N --print-losses --hold-gib G
  2. cudaw:   the same under `cudaw run`; while it trains, at random instants (seeded):
              PAUSES pause/resume pairs (half `kill -USR1/-USR2`, half `cudaw-ckpt`),
              and DUMPS `cudaw-ckpt dump PID -o FILE` + `cudaw-ckpt restore PID -i FILE`;
              during the first pause, nvidia-smi's GPU memory use must drop by at least
              the held buffer, and another process must be able to allocate more than was
              free before the pause (the freed memory is really available).
  3. the two outputs (every step's loss as an exact hex float, the weights' digest, the
     held buffer checked word for word) must be identical.

Prints `PASS | name | detail` / `FAIL | name | detail` lines (gpu-check.sh turns them into
table rows) and exits 0 when all passed.

  scripts/torch_pause_check.py --dist dist --work /tmp/w --pauses 50 --dumps 5
"""
import argparse
import os
import random
import re
import signal
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN = os.path.join(ROOT, "examples", "torch_train.py")
ALLOC = """
import sys, torch
n = int(sys.argv[1])
x = torch.empty(n, dtype=torch.uint8, device="cuda")
x.fill_(7)
torch.cuda.synchronize()
print(f"allocated {n >> 20} MiB ok")
"""

verdicts = []


def verdict(ok, name, detail):
    verdicts.append(ok)
    print(f"{'PASS' if ok else 'FAIL'} | {name} | {detail}", flush=True)


def smi_used_mib():
    """GPU-wide memory in use (MiB), from nvidia-smi, or None."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used,memory.free",
                              "--format=csv,noheader,nounits", "-i", "0"],
                             capture_output=True, text=True, timeout=30).stdout
        used, free = (int(x) for x in out.strip().splitlines()[0].split(","))
        return used, free
    except (OSError, ValueError, IndexError, subprocess.TimeoutExpired):
        return None, None


def ckpt(args, *words, timeout=300):
    t = time.monotonic()
    p = subprocess.run([os.path.join(args.dist, "bin", "cudaw-ckpt"), *words],
                       capture_output=True, text=True, timeout=timeout)
    with open(os.path.join(args.work, "ckpt.log"), "a") as f:
        f.write(f"$ cudaw-ckpt {' '.join(words)} -> rc {p.returncode} ({time.monotonic() - t:.3f} s)\n"
                f"{p.stdout}{p.stderr}")
    return p


def state(args, pid):
    p = ckpt(args, "status", str(pid), "--json")
    m = re.search(r'"state"\s*:\s*"(\w+)"', p.stdout)
    return m.group(1) if m else None


def wait_state(args, pid, want, timeout=120):
    t = time.monotonic()
    while time.monotonic() - t < timeout:
        if state(args, pid) == want:
            return True
        time.sleep(0.02)
    return False


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dist", default=os.path.join(ROOT, "dist"))
    ap.add_argument("--work", required=True, help="folder for outputs, images and logs")
    ap.add_argument("--steps", type=int, default=None,
                    help="training steps (default: as many as take about 40 s, at least 6000, "
                         "from a short timed run: the events need the trainer running)")
    ap.add_argument("--hold-gib", type=float, default=2)
    ap.add_argument("--pauses", type=int, default=50)
    ap.add_argument("--dumps", type=int, default=5)
    ap.add_argument("--control", action="store_true",
                    help="also run under cudaw without pauses (done anyway when outputs differ)")
    ap.add_argument("--seed", type=int, default=int(time.time()))
    args = ap.parse_args()
    os.makedirs(args.work, exist_ok=True)
    rng = random.Random(args.seed)
    print(f"seed {args.seed}", flush=True)
    if args.steps is None:
        args.steps = calibrated_steps()
    train = ["python3", TRAIN, "--steps", str(args.steps), "--print-losses", "--hold-gib", str(args.hold_gib)]

    t = time.monotonic()
    with open(os.path.join(args.work, "native.out"), "w") as out, \
            open(os.path.join(args.work, "native.err"), "w") as err:
        rn = subprocess.run(train, stdout=out, stderr=err, timeout=900).returncode
    native_s = time.monotonic() - t
    print(f"native run: rc {rn}, {native_s:.1f} s", flush=True)

    pid_file = os.path.join(args.work, "train.pid")
    if os.path.exists(pid_file):
        os.remove(pid_file)
    env = dict(os.environ, CUDAW_LOG="info", CUDAW_RUN_DIR=os.path.join(args.work, "run"))
    os.makedirs(env["CUDAW_RUN_DIR"], mode=0o700, exist_ok=True)
    os.environ["CUDAW_RUN_DIR"] = env["CUDAW_RUN_DIR"]
    out = open(os.path.join(args.work, "cudaw.out"), "w")
    err = open(os.path.join(args.work, "cudaw.err"), "w")
    proc = subprocess.Popen([os.path.join(args.dist, "bin", "cudaw"), "run", "--", *train, "--pid-file", pid_file],
                            stdout=out, stderr=err, env=env)
    started = time.monotonic()
    while not os.path.exists(pid_file) and proc.poll() is None and time.monotonic() - started < 300:
        time.sleep(0.05)
    if proc.poll() is not None or not os.path.exists(pid_file):
        why = f"exited early rc {proc.returncode}" if proc.poll() is not None else "no pid file after 300 s"
        verdict(False, "torch under cudaw: started", why + "; see cudaw.err")
        proc.kill()
        return 1
    pid = None
    while pid is None and time.monotonic() - started < 300:
        try:
            pid = int(open(pid_file).read())
        except ValueError:  # created, not yet written
            time.sleep(0.02)
    if pid is None:
        verdict(False, "torch under cudaw: started", "the pid file stayed empty; see cudaw.err")
        proc.kill()
        return 1

    # The plan: PAUSES pause/resume events and DUMPS dump/restore events in random order,
    # separated by random running intervals (0-150 ms) so they land at random instants.
    events = ["pause"] * args.pauses + ["dump"] * args.dumps
    rng.shuffle(events)
    done = {"pause": 0, "dump": 0}
    pause_ms, resume_ms, problems = [], [], []
    timeline = []  # (lines of output when the event began, event)
    image = os.path.join(args.work, "train.img")
    try:
        run_events(args, rng, proc, pid, events, done, pause_ms, resume_ms, problems, timeline, image)
    except Exception as e:  # noqa: BLE001 - any failure is a verdict, and the trainer must not be left behind
        problems.append(f"the event loop failed: {type(e).__name__}: {e}")
    if problems and proc.poll() is None:
        # Never leave the trainer paused (it would wait for ever): resume it, whatever state it is in.
        ckpt(args, "resume", str(pid), timeout=120)
    try:
        rc = proc.wait(timeout=120 if problems else 300)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        rc = "timeout"
    out.close()
    err.close()
    if os.path.exists(image):
        os.remove(image)

    med = (lambda xs: sorted(xs)[len(xs) // 2] if xs else float("nan"))
    verdict(not problems and done["pause"] == args.pauses and done["dump"] == args.dumps,
            f"torch {args.pauses} pauses + {args.dumps} dumps at random instants",
            f"{done['pause']} pauses (median pause {med(pause_ms):.1f} ms, resume {med(resume_ms):.1f} ms), "
            f"{done['dump']} dump+restore of {args.hold_gib:g} GiB held; seed {args.seed}"
            + (f"; {'; '.join(problems)}" if problems else ""))
    a = open(os.path.join(args.work, "native.out")).read()
    b = open(os.path.join(args.work, "cudaw.out")).read()
    last = (a.strip().splitlines() or ["(no output)"])[-1]
    same = rn == 0 and rc == 0 and a == b and "intact True" in a
    verdict(same, "torch paused/dumped run bit-identical to native",
            f"native rc {rn}, cudaw rc {rc}; {args.steps} losses + weights + held buffer "
            + ("identical: " + last if a == b else "DIFFER: " + first_difference(a, b, timeline)))
    if args.control or a != b:
        # The same run under cudaw without any pause: tells a pause's fault from a
        # difference cudaw makes anyway.
        with open(os.path.join(args.work, "control.out"), "w") as out, \
                open(os.path.join(args.work, "control.err"), "w") as err:
            rk = subprocess.run([os.path.join(args.dist, "bin", "cudaw"), "run", "--", *train],
                                stdout=out, stderr=err, env=env, timeout=900).returncode
        c = open(os.path.join(args.work, "control.out")).read()
        verdict(rk == 0 and c == a, "torch under cudaw, no pauses, bit-identical to native",
                f"rc {rk}; " + ("identical" if c == a else "DIFFER: " + first_difference(a, c, [])))
    return 0 if all(verdicts) else 1


def run_events(args, rng, proc, pid, events, done, pause_ms, resume_ms, problems, timeline, image):
    """The plan's events, one after the other; the first problem ends them."""
    freed_checked = False
    for i, ev in enumerate(events):
        time.sleep(rng.uniform(0, 0.15))
        if proc.poll() is not None:
            problems.append(f"training finished after {done['pause']} pauses and {done['dump']} dumps: raise --steps")
            break
        try:
            at_step = sum(1 for _ in open(os.path.join(args.work, "cudaw.out")))
        except OSError:
            at_step = -1
        timeline.append((at_step, ev))
        if ev == "pause":
            if not freed_checked:
                check_freed.before = smi_used_mib()
            by_signal = rng.random() < 0.5
            if by_signal:
                os.kill(pid, signal.SIGUSR1)
                if rng.random() < 0.3:
                    os.kill(pid, signal.SIGUSR1)  # a second USR1 while pausing: harmless
                if not wait_state(args, pid, "paused"):
                    problems.append(f"event {i}: SIGUSR1 did not pause")
                    break
            else:
                p = ckpt(args, "pause", str(pid))
                m = re.search(r"in ([\d.]+) ms", p.stdout)
                if p.returncode != 0:
                    problems.append(f"event {i}: pause rc {p.returncode}: {p.stderr.strip()[:200]}")
                    break
                if m:
                    pause_ms.append(float(m.group(1)))
            if not freed_checked:
                freed_checked = True
                check_freed(args)
            if by_signal and rng.random() < 0.5:
                os.kill(pid, signal.SIGUSR2)
                if not wait_state(args, pid, "running"):
                    problems.append(f"event {i}: SIGUSR2 did not resume")
                    break
            else:
                p = ckpt(args, "resume", str(pid))
                m = re.search(r"in ([\d.]+) ms", p.stdout)
                if p.returncode != 0:
                    problems.append(f"event {i}: resume rc {p.returncode}: {p.stderr.strip()[:200]}")
                    break
                if m:
                    resume_ms.append(float(m.group(1)))
        else:
            p = ckpt(args, "dump", str(pid), "-o", image)
            if p.returncode != 0:
                problems.append(f"event {i}: dump rc {p.returncode}: {p.stderr.strip()[:200]}")
                break
            p = ckpt(args, "restore", str(pid), "-i", image)
            if p.returncode != 0:
                problems.append(f"event {i}: restore rc {p.returncode}: {p.stderr.strip()[:200]}")
                break
            os.remove(image)
        done[ev] += 1


def calibrated_steps(seconds=40.0, least=6000, most=100000):
    """Steps that take about `seconds` of training (natively), from a short timed run: the
    events must land while the trainer runs, whatever the GPU's speed."""
    try:
        p = subprocess.run(["python3", TRAIN, "--bench", "--steps", "200"], capture_output=True,
                           text=True, timeout=300)
        ms = float(re.search(r"ms_per_step=([\d.]+)", p.stdout).group(1))
    except (subprocess.TimeoutExpired, AttributeError, ValueError):
        print("calibration failed: using the least number of steps", flush=True)
        return least
    steps = max(least, min(most, int(seconds * 1000 / max(ms, 1e-3))))
    print(f"calibration: {ms:.3f} ms per step: {steps} steps", flush=True)
    return steps


def first_difference(a, b, timeline):
    la, lb = a.splitlines(), b.splitlines()
    for i, (x, y) in enumerate(zip(la, lb)):
        if x != y:
            before = [e for e in timeline if e[0] <= i]
            return (f"first at line {i}: {x!r} vs {y!r}; last event before it: "
                    f"{before[-1] if before else None}, events so far {len(before)}")
    return f"one output is a prefix of the other ({len(la)} vs {len(lb)} lines)"


def check_freed(args):
    """While the trainer is paused: nvidia-smi shows its memory gone, and another process
    allocates more than was free before the pause."""
    used_paused, free_paused = smi_used_mib()
    before = getattr(check_freed, "before", None)
    if used_paused is None:
        verdict(False, "paused: memory freed (nvidia-smi)", "nvidia-smi gave no reading")
        return
    want = int(args.hold_gib * 1024)
    detail = (f"GPU used {before[0]} MiB running -> {used_paused} MiB paused" if before and before[0] is not None
              else f"{used_paused} MiB used paused (no reading before the pause)")
    ok = before is not None and before[0] is not None and before[0] - used_paused >= want
    verdict(ok, "paused: trainer's memory released (nvidia-smi)", f"{detail}; held buffer {want} MiB")
    # More than was free before the pause: only possible with the trainer's memory.
    n = (free_paused - 2048) << 20
    p = subprocess.run(["python3", "-c", ALLOC, str(n)], capture_output=True, text=True, timeout=300)
    ok = (p.returncode == 0 and "ok" in p.stdout and before is not None and before[1] is not None
          and (n >> 20) > before[1])
    verdict(ok, "paused: another process allocates the freed memory",
            f"allocated {n >> 20} MiB (free before the pause: {before[1] if before else '?'} MiB): "
            f"{(p.stdout.strip() or p.stderr.strip()[-200:])}")


if __name__ == "__main__":
    sys.exit(main())
