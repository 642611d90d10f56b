#!/usr/bin/env python3
"""`cudaw-ckpt pause --release` on one GPU (gpu-check.sh's `release` section), in one run:

  1. For each size (GiB): a PyTorch process holding that much (tensors of a known pattern)
     - under `cudaw run`: `cudaw-ckpt pause PID` / `resume PID` (the context stays);
     - under `cudaw run`: `cudaw-ckpt pause PID --release` / `resume PID`: nvidia-smi must
       list no memory of the process while it is released (0 MiB / not listed);
     - natively: NVIDIA's checkpoint alone (driver_checkpoint checkpoint/restore PID);
     each verified word for word afterwards. Wall times of the commands (a process started,
     the driver loaded: what an operator waits for), and the JSON's own figures.
     Verdicts: 0 MiB while released; pause and resume each within 0.3 s of cudaw's
     without --release; the goal <= 0.5 s pause + resume at 8 GiB (information elsewhere).
  2. A PyTorch training job (examples/torch_train.py, as torch_pause_check.py runs it)
     paused with --release PAUSES times at random instants (seeded) and resumed by
     cudaw-ckpt: its output (every loss as an exact hex float, the weights' digest, the
     held buffer) must equal the native run's.

Prints `PASS | name | detail`, `FAIL | ...` and `info | ...` lines and exits 0 when all
passed. Run from the repository root with dist/ built by scripts/package.sh:

  scripts/release_check.py --dist dist --bin /tmp/work --work /tmp/w --sizes 8 32 --pauses 10
"""
import argparse
import json
import os
import random
import re
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from lines import Lines  # noqa: E402
import torch_pause_check as tpc  # noqa: E402
# GPU memory nvidia-smi lists for a PID (MiB): 0 when not listed; None without a reading.
from pausebench import gpu_used_mib as smi_mib  # noqa: E402

HOLDER = r"""
import os, sys, torch
gib = float(sys.argv[1])
n = int(gib * (1 << 30)) // 8
chunks = []
left = n
while left > 0:
    k = min(left, 1 << 28)
    t = torch.arange(k, dtype=torch.int64, device="cuda")
    t.mul_(2654435761).add_(len(chunks))
    chunks.append(t)
    left -= k
torch.cuda.synchronize()
print(f"ready pid={os.getpid()} bytes={n * 8}", flush=True)
for line in sys.stdin:
    cmd = line.strip()
    if cmd == "verify":
        ok = True
        for i, t in enumerate(chunks):
            want = torch.arange(t.numel(), dtype=torch.int64, device="cuda").mul_(2654435761).add_(i)
            ok &= bool(torch.equal(t, want))
            del want
        torch.cuda.synchronize()
        print("verified ok" if ok else "verified BAD", flush=True)
    elif cmd == "quit":
        break
"""

results = []


def verdict(status, name, detail):
    results.append(status)
    print(f"{status} | {name} | {detail}", flush=True)


class Holder:
    def __init__(self, cmd, env, err_path):
        self.err = open(err_path, "a")
        self.p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=self.err, text=True, env=env)
        self.lines = Lines(self.p.stdout, 300)
        line = self.lines.next()
        m = re.search(r"ready pid=(\d+) bytes=(\d+)", line)
        if not m:
            self.kill()
            raise RuntimeError(f"the holder did not start: {line!r} (see {err_path})")
        self.pid = int(m.group(1))

    def verify(self):
        self.p.stdin.write("verify\n")
        self.p.stdin.flush()
        return self.lines.next() == "verified ok"

    def quit(self):
        try:
            self.p.stdin.write("quit\n")
            self.p.stdin.flush()
            self.p.wait(timeout=120)
        except (OSError, subprocess.TimeoutExpired):
            self.kill()
        self.err.close()

    def kill(self):
        self.p.kill()
        self.p.wait()


def timed(cmd, env=None, timeout=300):
    t = time.monotonic()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    return p, time.monotonic() - t


def cudaw_cycle(args, size, release, env):
    """One holder under cudaw, paused (with or without --release) and resumed once."""
    ckpt = os.path.join(args.dist, "bin", "cudaw-ckpt")
    h = Holder([os.path.join(args.dist, "bin", "cudaw"), "run", "--", "python3", "-c", HOLDER, str(size)],
               env, os.path.join(args.work, f"holder-{size}g{'-release' if release else ''}.err"))
    r = {"ok": False}
    try:
        r["before_mib"] = smi_mib(h.pid)
        # A first pause and resume, not timed: a process's first pause allocates its host
        # memory (3.8 s at 32 GiB on the H100 host, against 1.3 s the next time), which
        # is not what --release adds. Both kinds are timed on their second pause.
        timed([ckpt, "pause", str(h.pid)], env)
        timed([ckpt, "resume", str(h.pid)], env)
        words = ["pause", str(h.pid), "--json"] + (["--release"] if release else [])
        p, r["pause_s"] = timed([ckpt, *words], env)
        r["pause_json"] = p.stdout.strip()
        r["paused_mib"] = smi_mib(h.pid)
        q, r["resume_s"] = timed([ckpt, "resume", str(h.pid), "--json"], env)
        r["resume_json"] = q.stdout.strip()
        with open(os.path.join(args.work, "ckpt.log"), "a") as f:
            f.write(f"{size} GiB release={release}: {words} rc {p.returncode} {p.stdout}{p.stderr}"
                    f"resume rc {q.returncode} {q.stdout}{q.stderr}\n")
        released = '"released":true' in p.stdout.replace(" ", "")
        r["ok"] = p.returncode == 0 and q.returncode == 0 and h.verify() and (released or not release)
        if release and not released:
            r["error"] = (p.stderr.strip() or p.stdout.strip())[-300:]
    finally:
        if r["ok"]:
            h.quit()
        else:
            # Never leave it paused: resume (the driver's restore first), then kill.
            try:
                subprocess.run([ckpt, "resume", str(h.pid)], capture_output=True, env=env, timeout=120)
            except subprocess.TimeoutExpired:
                pass
            h.kill()
    return r


def driver_cycle(args, size):
    prog = os.path.join(args.bin, "driver_checkpoint")
    h = Holder(["python3", "-c", HOLDER, str(size)], dict(os.environ),
               os.path.join(args.work, f"holder-{size}g-native.err"))
    r = {"ok": False}
    try:
        p, r["pause_s"] = timed([prog, "checkpoint", str(h.pid)])
        r["paused_mib"] = smi_mib(h.pid)
        q, r["resume_s"] = timed([prog, "restore", str(h.pid)])
        with open(os.path.join(args.work, "ckpt.log"), "a") as f:
            f.write(f"{size} GiB driver alone: {p.stdout}{p.stderr}{q.stdout}{q.stderr}\n")
        r["ok"] = p.returncode == 0 and q.returncode == 0 and h.verify()
        if not r["ok"]:
            r["error"] = (p.stderr + q.stderr).strip()[-300:]
    finally:
        if r["ok"]:
            h.quit()
        else:
            h.kill()
    return r


def sizes_part(args, env):
    for size in args.sizes:
        try:
            plain = cudaw_cycle(args, size, False, env)
            rel = cudaw_cycle(args, size, True, env)
            drv = driver_cycle(args, size)
        except (RuntimeError, subprocess.TimeoutExpired) as e:
            verdict("FAIL", f"release: {size:g} GiB", f"{type(e).__name__}: {e}")
            continue
        name = f"release: {size:g} GiB"
        if not rel["ok"]:
            verdict("FAIL", f"{name}: pause --release", rel.get("error", "failed or not verified; see ckpt.log"))
            continue
        mib = rel["paused_mib"]
        # nvidia-smi must see the process at all (another PID namespace lists nothing):
        # running, and paused without --release (its context), it holds memory.
        seen = (rel.get("before_mib") or 0) > 0 and (plain.get("paused_mib") or 0) > 0
        verdict("PASS" if mib == 0 and seen else "FAIL", f"{name}: GPU memory while released",
                ("" if seen else "cannot verify: nvidia-smi does not list this process's memory; ") +
                f"nvidia-smi: {mib} MiB (0: not listed) while released; {rel['before_mib']} MiB running; "
                f"without --release {plain.get('paused_mib')} MiB paused")
        for what in ("pause", "resume"):
            d = rel[f"{what}_s"] - plain[f"{what}_s"]
            verdict("PASS" if d <= 0.3 and plain["ok"] else "FAIL", f"{name}: {what} --release vs cudaw's",
                    f"{rel[f'{what}_s']:.3f} s vs {plain[f'{what}_s']:.3f} s without --release "
                    f"(+{d:.3f} s, goal <= +0.3 s); driver alone {drv.get(f'{what}_s', float('nan')):.3f} s"
                    + ("" if drv["ok"] else f" (driver alone FAILED: {drv.get('error', '')})"))
        total = rel["pause_s"] + rel["resume_s"]
        goal = size <= 8
        verdict(("PASS" if total <= 0.5 else "FAIL") if goal else "info", f"{name}: pause + resume --release",
                f"{total:.3f} s (goal <= 0.5 s at 8 GiB); driver alone "
                f"{drv.get('pause_s', float('nan')) + drv.get('resume_s', float('nan')):.3f} s; "
                f"JSON: {rel['pause_json'][:300]} / {rel['resume_json'][:300]}")


def training_part(args, env):
    rng = random.Random(args.seed)
    steps = args.steps or tpc.calibrated_steps(seconds=20.0, least=3000)
    train = ["python3", tpc.TRAIN, "--steps", str(steps), "--print-losses", "--hold-gib", "1"]
    with open(os.path.join(args.work, "train-native.out"), "w") as out:
        rn = subprocess.run(train, stdout=out, stderr=subprocess.DEVNULL, timeout=600).returncode
    pid_file = os.path.join(args.work, "train.pid")
    if os.path.exists(pid_file):
        os.remove(pid_file)
    out = open(os.path.join(args.work, "train-cudaw.out"), "w")
    err = open(os.path.join(args.work, "train-cudaw.err"), "w")
    proc = subprocess.Popen([os.path.join(args.dist, "bin", "cudaw"), "run", "--", *train, "--pid-file", pid_file],
                            stdout=out, stderr=err, env=env)
    ckpt = os.path.join(args.dist, "bin", "cudaw-ckpt")
    problems, released, pause_s, resume_s = [], 0, [], []
    pid = None
    t0 = time.monotonic()
    while pid is None and proc.poll() is None and time.monotonic() - t0 < 300:
        try:
            pid = int(open(pid_file).read())
        except (OSError, ValueError):
            time.sleep(0.05)
    running_mib = (smi_mib(pid) or 0) if pid else 0
    try:
        for i in range(args.pauses if pid else 0):
            time.sleep(rng.uniform(0, 0.5))
            if proc.poll() is not None:
                problems.append(f"training ended after {i} pauses: raise --steps")
                break
            p, ps = timed([ckpt, "pause", str(pid), "--release", "--json"], env)
            if p.returncode != 0 or '"released":true' not in p.stdout.replace(" ", ""):
                problems.append(f"pause {i}: rc {p.returncode}: {(p.stderr or p.stdout).strip()[-200:]}")
                if p.returncode == 0:
                    subprocess.run([ckpt, "resume", str(pid)], capture_output=True, env=env, timeout=120)
                break
            if i == 0:
                mib = smi_mib(pid)
                verdict("PASS" if mib == 0 and running_mib > 0 else "FAIL",
                        "release: training job's GPU memory while released",
                        f"nvidia-smi: {mib} MiB (0: not listed) released, {running_mib} MiB running"
                        + ("" if running_mib > 0 else "; cannot verify: nvidia-smi does not list it"))
            time.sleep(rng.uniform(0, 0.2))
            q, rs = timed([ckpt, "resume", str(pid), "--json"], env)
            if q.returncode != 0:
                problems.append(f"resume {i}: rc {q.returncode}: {q.stderr.strip()[-200:]}")
                break
            released += 1
            pause_s.append(ps)
            resume_s.append(rs)
    except (subprocess.TimeoutExpired, OSError) as e:
        problems.append(f"{type(e).__name__}: {e}")
    finally:
        if pid is None:
            problems.append("the trainer wrote no PID; see train-cudaw.err")
        elif problems and proc.poll() is None:
            # Never wait on a paused or released trainer: resume it (the driver's restore
            # first), and kill it if it does not end soon.
            try:
                subprocess.run([ckpt, "resume", str(pid)], capture_output=True, env=env, timeout=120)
            except subprocess.TimeoutExpired:
                pass
        try:
            rc = proc.wait(timeout=60 if problems else 300)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            rc = "timeout"
        out.close()
        err.close()
    a = open(os.path.join(args.work, "train-native.out")).read()
    b = open(os.path.join(args.work, "train-cudaw.out")).read()
    med = (lambda xs: sorted(xs)[len(xs) // 2] if xs else float("nan"))
    verdict("PASS" if not problems and released == args.pauses else "FAIL",
            f"release: training job paused with --release {args.pauses} times",
            f"{released} done (median pause {med(pause_s):.3f} s, resume {med(resume_s):.3f} s, wall); "
            f"seed {args.seed}" + (f"; {'; '.join(problems)}" if problems else ""))
    same = rn == 0 and rc == 0 and a == b and "intact True" in a
    verdict("PASS" if same else "FAIL", "release: training job bit-identical to native",
            f"native rc {rn}, cudaw rc {rc}; {steps} steps; "
            + ("identical" if a == b else "DIFFER: " + tpc.first_difference(a, b, [])))


def main():
    # gpu-check's timeout sends SIGTERM: run the finally blocks (resume, kill) on the way out.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(124))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dist", required=True)
    ap.add_argument("--bin", required=True, help="folder holding driver_checkpoint (gpu-check.sh compiles it)")
    ap.add_argument("--work", required=True)
    ap.add_argument("--sizes", type=float, nargs="*", default=[8, 32])
    ap.add_argument("--pauses", type=int, default=10)
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--seed", type=int, default=int(time.time()))
    args = ap.parse_args()
    os.makedirs(args.work, exist_ok=True)
    env = dict(os.environ, CUDAW_LOG="info", CUDAW_RUN_DIR=os.path.join(args.work, "run"))
    os.makedirs(env["CUDAW_RUN_DIR"], mode=0o700, exist_ok=True)
    # Which driver and what it needs: the table says so beside the verdicts.
    smi = subprocess.run(["nvidia-smi", "--query-gpu=driver_version,persistence_mode", "--format=csv,noheader"],
                         capture_output=True, text=True).stdout.strip()
    verdict("info", "release: driver, persistence mode, uid", f"{smi}; uid {os.getuid()}")
    sizes_part(args, env)
    if args.pauses > 0:
        training_part(args, env)
    print(json.dumps({"passed": all(s != "FAIL" for s in results)}), flush=True)
    return 0 if all(s != "FAIL" for s in results) else 1


if __name__ == "__main__":
    sys.exit(main())
