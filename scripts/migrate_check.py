#!/usr/bin/env python3
"""`cudaw-ckpt migrate PID --to GPU` on a host with two GPUs (gpu-check.sh's `migrate`
section), in one run:

  1. A training job (examples/torch_gpt.py: a GPT-style transformer, torch.compile, AdamW,
     holding a buffer of a known pattern) under `cudaw run`, moved GPU 0 -> 1 (`--to 1`)
     and back 1 -> 0 (`--to GPU-<uuid of 0>`) at two seeded random steps. After each move
     nvidia-smi must list the process's memory on the new GPU and none on the old one. Its
     output (every loss as an exact hex float, the weights' and AdamW's digest, the held
     buffer) must equal the unmoved native run's.
  2. For each size (GiB): a PyTorch process holding that much (release_check.py's HOLDER
     pattern) under `cudaw run`: cudaw's plain pause + resume, then `migrate --to 1 --json`
     and `migrate --to 0 --json`, verified word for word and placed by nvidia-smi after each
     move; beside it in the same run the pinned copy of the same size (pausebench.py's
     ceiling: device -> pinned host and back) and NVIDIA's own checkpoint + restore with
     GPU remapping (cuCheckpointProcessRestore with GPU pairs, from a ctypes helper) of the
     same process run natively. Wall times of the commands and the JSON's four phases.
     Verdicts: data intact and on the new GPU; each move of <= 8 GiB under 1 s (the goal);
     times as information, and a markdown table at the end.
  3. Refusals, on the first size's process before it moves: `migrate --to 7` (no such GPU)
     and `--to 0` (the GPU it is on) exit non-zero with `cudaw-ckpt: error:`, and the
     process still runs with its data intact.

Prints `PASS | name | detail`, `FAIL | ...` and `info | ...` lines and exits 0 when all
passed. Run from the repository root with dist/ built by scripts/package.sh, on two or more
GPUs (fewer: one `info` line, exit 0):

  scripts/migrate_check.py --dist dist --bin /tmp/work --work /tmp/w --sizes 8 32
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
import types

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pausebench  # noqa: E402  (the pinned-copy ceiling)
import torch_pause_check as tpc  # noqa: E402  (first_difference)
from release_check import HOLDER, Holder  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN = os.path.join(ROOT, "examples", "torch_gpt.py")
# Kept in every environment started here (shared machines: no NVLink multicast).
MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                 "NVSHMEM_DISABLE_NVLS": "1"}
GIB = float(1 << 30)

# NVIDIA's process checkpoint with GPU remapping, called from outside the process as the
# API requires (libcuda.so.1 through ctypes; run as `python3 -c DRIVER ...`):
#   checkpoint PID            lock (30 s at most), then checkpoint: prints lock_s checkpoint_s
#   restore PID OLD NEW       restore with the GPU pair OLD -> NEW (UUIDs GPU-...), then
#                             unlock: prints restore_s unlock_s pairs
# "If an array of GPU UUID pairs is specified, it must contain every checkpointed GPU": the
# pair OLD -> NEW first; refused with the process still checkpointed, the swap of the two
# (OLD -> NEW, NEW -> OLD), for a driver that counts every GPU the process sees.
DRIVER = r'''
import ctypes, sys, time

cu = ctypes.CDLL("libcuda.so.1")


class Uuid(ctypes.Structure):
    _fields_ = [("bytes", ctypes.c_ubyte * 16)]


class GpuPair(ctypes.Structure):  # CUcheckpointGpuPair
    _fields_ = [("old", Uuid), ("new", Uuid)]


class RestoreArgs(ctypes.Structure):  # CUcheckpointRestoreArgs: 64 bytes, the rest zeroed
    _fields_ = [("gpuPairs", ctypes.POINTER(GpuPair)), ("gpuPairsCount", ctypes.c_uint),
                ("reserved", ctypes.c_ubyte * 52)]


class LockArgs(ctypes.Structure):  # CUcheckpointLockArgs
    _fields_ = [("timeoutMs", ctypes.c_uint), ("reserved0", ctypes.c_uint),
                ("reserved1", ctypes.c_uint64 * 7)]


class Args64(ctypes.Structure):  # CUcheckpointCheckpointArgs, CUcheckpointUnlockArgs: zeroed
    _fields_ = [("reserved", ctypes.c_uint64 * 8)]


for t, n in ((GpuPair, 32), (RestoreArgs, 64), (LockArgs, 64), (Args64, 64)):
    assert ctypes.sizeof(t) == n, f"{t.__name__} is {ctypes.sizeof(t)} bytes, expected {n}"
CHECKPOINTED = 2  # CU_PROCESS_STATE_CHECKPOINTED


def fn(name):
    f = getattr(cu, name, None)
    if f is None:
        sys.exit(f"driver_remap: {name} not found in libcuda.so.1 (driver too old?)")
    return f


def err(r):
    s = ctypes.c_char_p()
    if fn("cuGetErrorName")(r, ctypes.byref(s)) == 0 and s.value:
        return f"{s.value.decode()} ({r})"
    return f"error {r}"


def check(r, what):
    if r != 0:
        sys.exit(f"driver_remap: {what} failed: {err(r)}")


def text(u):
    h = bytes(u.bytes).hex()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def uuid(s):
    h = s.lower()
    h = (h[4:] if h.startswith("gpu-") else h).replace("-", "")
    if len(h) != 32:
        sys.exit(f"driver_remap: GPU UUID {s!r}: expected GPU- and 32 hex digits")
    u = Uuid()
    u.bytes[:] = list(bytes.fromhex(h))
    return u


def devices():
    n = ctypes.c_int()
    check(fn("cuDeviceGetCount")(ctypes.byref(n)), "cuDeviceGetCount")
    get = getattr(cu, "cuDeviceGetUuid_v2", None) or fn("cuDeviceGetUuid")
    out = []
    for i in range(n.value):
        d = ctypes.c_int()
        check(fn("cuDeviceGet")(ctypes.byref(d), i), "cuDeviceGet")
        u = Uuid()
        check(get(ctypes.byref(u), d), "cuDeviceGetUuid")
        out.append(text(u).lower())
    return out


def state(pid):
    s = ctypes.c_int()
    return s.value if fn("cuCheckpointProcessGetState")(pid, ctypes.byref(s)) == 0 else None


check(fn("cuInit")(0), "cuInit")
op, pid = sys.argv[1], int(sys.argv[2])
if op == "checkpoint":
    la = LockArgs()
    la.timeoutMs = 30000
    t0 = time.monotonic()
    check(fn("cuCheckpointProcessLock")(pid, ctypes.byref(la)), "cuCheckpointProcessLock")
    t1 = time.monotonic()
    r = fn("cuCheckpointProcessCheckpoint")(pid, ctypes.byref(Args64()))
    if r != 0:
        # Never leave the process locked: it would wait for ever in its next CUDA call.
        u = fn("cuCheckpointProcessUnlock")(pid, ctypes.byref(Args64()))
        sys.exit(f"driver_remap: cuCheckpointProcessCheckpoint failed: {err(r)}"
                 + (f"; the unlock after it failed too: {err(u)}" if u else ""))
    print(f"lock_s={t1 - t0:.4f} checkpoint_s={time.monotonic() - t1:.4f}", flush=True)
elif op == "restore":
    old, new = sys.argv[3].lower(), sys.argv[4].lower()
    devs = devices()
    for u in (old, new):
        if u not in devs:
            sys.exit(f"driver_remap: {u} is not among this driver's GPUs {devs}")
    errors, used, restore_s = [], None, None
    for pairs in ([(old, new)], [(old, new), (new, old)]):
        arr = (GpuPair * len(pairs))()
        for i, (a, b) in enumerate(pairs):
            arr[i].old, arr[i].new = uuid(a), uuid(b)
        ra = RestoreArgs()
        ra.gpuPairs = ctypes.cast(arr, ctypes.POINTER(GpuPair))
        ra.gpuPairsCount = len(pairs)
        t0 = time.monotonic()
        r = fn("cuCheckpointProcessRestore")(pid, ctypes.byref(ra))
        if r == 0:
            used, restore_s = pairs, time.monotonic() - t0
            break
        errors.append(f"{len(pairs)}_pair(s):{err(r).replace(' ', '')}")
        if state(pid) != CHECKPOINTED:
            break
    if used is None:
        sys.exit(f"driver_remap: cuCheckpointProcessRestore with GPU pairs refused: {'; '.join(errors)}; "
                 f"process state now {state(pid)}")
    t1 = time.monotonic()
    check(fn("cuCheckpointProcessUnlock")(pid, ctypes.byref(Args64())), "cuCheckpointProcessUnlock")
    print(f"restore_s={restore_s:.4f} unlock_s={time.monotonic() - t1:.4f} pairs={len(used)}"
          + (f" refused_first={errors[0]}" if errors else ""), flush=True)
elif op == "restore-same":
    # Whether the driver takes pairs that map every GPU onto itself (on a host of more
    # than two GPUs, a move leaves the others in place): identity=ok, or refused (then the
    # process is restored without pairs, so that it goes on).
    devs = devices()
    arr = (GpuPair * len(devs))()
    for i, a in enumerate(devs):
        arr[i].old, arr[i].new = uuid(a), uuid(a)
    ra = RestoreArgs()
    ra.gpuPairs = ctypes.cast(arr, ctypes.POINTER(GpuPair))
    ra.gpuPairsCount = len(devs)
    r = fn("cuCheckpointProcessRestore")(pid, ctypes.byref(ra))
    verdict_text = "ok" if r == 0 else "refused:" + err(r).replace(" ", "")
    if r != 0 and state(pid) == CHECKPOINTED:
        check(fn("cuCheckpointProcessRestore")(pid, None), "cuCheckpointProcessRestore (no pairs)")
    check(fn("cuCheckpointProcessUnlock")(pid, ctypes.byref(Args64())), "cuCheckpointProcessUnlock")
    print(f"identity_pairs={verdict_text} gpus={len(devs)}", flush=True)
else:
    sys.exit("usage: checkpoint PID | restore PID OLD_UUID NEW_UUID | restore-same PID")
'''

results = []
TABLE = {}  # row name -> {size key: text}
ROWS = []   # row names, in order


def verdict(status, name, detail):
    results.append(status)
    print(f"{status} | {name} | {detail}", flush=True)


def cell(row, key, text):
    if row not in TABLE:
        TABLE[row] = {}
        ROWS.append(row)
    TABLE[row][key] = text


# The processes moved see one GPU, as a job's process sees its own: the driver's restore
# maps that GPU onto another, and a process that saw the other GPU too would have it twice.
# cudaw-ckpt and the driver helper see every GPU (nvidia-smi's numbering).
ONE_GPU = {"CUDA_VISIBLE_DEVICES": "0"}


def gpus():
    """[(nvidia-smi index, UUID as nvidia-smi writes it: GPU-...)], or [] without a reading."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=index,uuid", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30).stdout
        return [(int(i), u.strip()) for i, u in (line.split(",") for line in out.strip().splitlines())]
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return []


def verify(h, timeout=120):
    """The holder's data checked word for word; a holder that does not answer in time (left
    paused) fails it instead of holding up the run."""
    try:
        h.p.stdin.write("verify\n")
        h.p.stdin.flush()
    except OSError:
        return False
    return h.lines.next(timeout) == "verified ok"


def where(pid, gl):
    """{nvidia-smi index: MiB} of the GPUs that list memory of PID ({} when none does), or
    None without a reading."""
    index = {u.lower(): i for i, u in gl}
    try:
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,gpu_uuid,used_memory",
                              "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    found = {}
    for line in out.stdout.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 3 and parts[0] == str(pid):
            try:
                found[index.get(parts[1].lower(), parts[1])] = int(parts[2])
            except ValueError:
                return None
    return found


def placed(pid, gl, on, off):
    """(ok, text): nvidia-smi lists memory of PID on GPU `on` and none on GPU `off`."""
    w = where(pid, gl)
    if w is None:
        return False, "nvidia-smi gave no reading"
    ok = w.get(on, 0) > 0 and w.get(off, 0) == 0
    return ok, (f"nvidia-smi: GPU {on} {w.get(on, 0)} MiB, GPU {off} {w.get(off, 0)} MiB"
                + ("" if w else " (the process is not listed at all: another PID namespace?)"))


class Ckpt:
    """cudaw-ckpt, each call logged with its exit status and wall time."""

    def __init__(self, args, env):
        self.bin = os.path.join(args.dist, "bin", "cudaw-ckpt")
        self.env = env
        self.log = os.path.join(args.work, "ckpt.log")

    def __call__(self, *words, timeout=120):
        t = time.monotonic()
        try:
            p = subprocess.run([self.bin, *words], capture_output=True, text=True, env=self.env, timeout=timeout)
        except subprocess.TimeoutExpired as e:
            p = subprocess.CompletedProcess(e.cmd, 124, "", f"(no answer in {timeout} s)")
        wall = time.monotonic() - t
        with open(self.log, "a") as f:
            f.write(f"$ cudaw-ckpt {' '.join(words)} -> rc {p.returncode} ({wall:.3f} s)\n{p.stdout}{p.stderr}")
        return p, wall

    def json(self, *words, timeout=120):
        p, wall = self(*words, timeout=timeout)
        try:
            v = json.loads(p.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            v = None
        return p, wall, v

    def state(self, pid):
        p, _ = self("status", str(pid), "--json", timeout=60)
        m = re.search(r'"state"\s*:\s*"(\w+)"', p.stdout)
        return m.group(1) if m else None

    def rescue(self, pid):
        """Never leave a process paused or released: resume it, whatever state it is in."""
        self("resume", str(pid), timeout=120)


def why(p):
    return (p.stderr.strip() or p.stdout.strip() or "(no output)").splitlines()[-1][-240:]


def migrate(ck, pid, to, gl, frm, dest):
    """`migrate PID --to TO --json`: (problem or None, wall s, JSON)."""
    p, wall, v = ck.json("migrate", str(pid), "--to", to, "--json", timeout=300)
    if p.returncode != 0:
        return f"migrate --to {to}: rc {p.returncode}: {why(p)}", wall, v
    if v is None:
        return f"migrate --to {to}: rc 0 but no JSON line: {p.stdout.strip()[-200:]!r}", wall, v
    moved = v.get("moved") or []
    want = {i: u.lower() for i, u in gl}
    if not any(str(m.get("to", "")).lower() == want[dest] and str(m.get("from", "")).lower() == want[frm]
               for m in moved):
        return (f"migrate --to {to}: the JSON's moved {moved} lacks from {want[frm]} to {want[dest]}"), wall, v
    return None, wall, v


def ms(v, key):
    x = (v or {}).get(key)
    return f"{x:.0f}" if isinstance(x, (int, float)) else "-"


def fs(x):
    return "-" if x is None else f"{x:.3f} s"


# -- 1. the training job -----------------------------------------------------------------

def training_part(args, env, gl, started):
    rng = random.Random(args.seed)
    steps = args.steps
    at = [rng.randint(int(steps * 0.15), int(steps * 0.4)), rng.randint(int(steps * 0.55), int(steps * 0.8))]
    inductor = os.path.join(args.work, "inductor")  # shared: the cudaw run reuses the native run's kernels
    train = ["python3", TRAIN, "--steps", str(steps), "--print-losses", "--hold-gib", f"{args.hold_gib:g}"]
    native_env = dict(os.environ, PYTHONUNBUFFERED="1", TORCHINDUCTOR_CACHE_DIR=inductor, **MULTICAST_OFF,
                      **ONE_GPU)
    t = time.monotonic()
    with open(os.path.join(args.work, "train-native.out"), "w") as out, \
            open(os.path.join(args.work, "train-native.err"), "w") as err:
        try:
            rn = subprocess.run(train, stdout=out, stderr=err, env=native_env, timeout=300).returncode
        except subprocess.TimeoutExpired:
            rn = "timeout"
    print(f"native training run: rc {rn}, {time.monotonic() - t:.1f} s", flush=True)

    ck = Ckpt(args, env)
    pid_file = os.path.join(args.work, "train.pid")
    if os.path.exists(pid_file):
        os.remove(pid_file)
    out_path = os.path.join(args.work, "train-cudaw.out")
    out = open(out_path, "w")
    err = open(os.path.join(args.work, "train-cudaw.err"), "w")
    tenv = dict(env, PYTHONUNBUFFERED="1", TORCHINDUCTOR_CACHE_DIR=inductor, **ONE_GPU)
    proc = subprocess.Popen([os.path.join(args.dist, "bin", "cudaw"), "run", "--", *train, "--pid-file", pid_file],
                            stdout=out, stderr=err, env=tenv)
    problems, moves, places = [], [], []
    pid = None
    uuid0 = dict(gl)[0]

    def lines():
        try:
            with open(out_path) as f:
                return sum(1 for line in f if line.startswith("step "))
        except OSError:
            return 0

    try:
        t0 = time.monotonic()
        while pid is None and proc.poll() is None and time.monotonic() - t0 < 300:
            try:
                pid = int(open(pid_file).read())
            except (OSError, ValueError):
                time.sleep(0.05)
        if pid is None:
            problems.append(f"the trainer wrote no PID (rc {proc.poll()}); see train-cudaw.err")
        # 0 -> 1 by index, 1 -> 0 by UUID: both forms of --to.
        plan = [(at[0], "1", 0, 1), (at[1], uuid0, 1, 0)] if pid else []
        for step, to, frm, dest in plan:
            deadline = time.monotonic() + 240
            while lines() < step and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.01)
            if proc.poll() is not None:
                problems.append(f"training ended (rc {proc.returncode}) before the move at step {step}: raise --steps")
                break
            if lines() < step:
                problems.append(f"step {step} not reached in 240 s (at {lines()})")
                break
            if frm == 0:
                ok, text = placed(pid, gl, 0, 1)
                if not ok:
                    places.append((False, f"before the first move: {text}"))
            step_now = lines()
            problem, wall, v = migrate(ck, pid, to, gl, frm, dest)
            if problem:
                problems.append(f"at step {step_now}: {problem}")
                break
            moves.append((step_now, frm, dest, wall, v))
            ok, text = placed(pid, gl, dest, frm)
            places.append((ok, f"after {frm} -> {dest} at step {step_now}: {text}"))
    except (subprocess.TimeoutExpired, OSError) as e:
        problems.append(f"{type(e).__name__}: {e}")
    finally:
        if pid is not None and problems and proc.poll() is None:
            ck.rescue(pid)
        try:
            rc = proc.wait(timeout=60 if problems else 300)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            rc = "timeout"
        out.close()
        err.close()

    desc = "; ".join(f"{f} -> {d} at step {s} in {w:.3f} s (total_ms {ms(v, 'total_ms')})" for s, f, d, w, v in moves)
    verdict("PASS" if not problems and len(moves) == 2 else "FAIL", "migrate: training job moved 0 -> 1 -> 0 mid-run",
            f"{desc or 'no move done'}; planned at steps {at[0]} and {at[1]} of {steps}; seed {args.seed}"
            + (f"; {'; '.join(problems)}" if problems else ""))
    if places:
        verdict("PASS" if all(ok for ok, _ in places) and len(moves) == 2 else "FAIL",
                "migrate: training job's memory on the new GPU only (nvidia-smi)", "; ".join(t for _, t in places))
    a = open(os.path.join(args.work, "train-native.out")).read()
    b = open(out_path).read()
    same = rn == 0 and rc == 0 and a == b and "intact True" in a
    last = (a.strip().splitlines() or ["(no output)"])[-1]
    verdict("PASS" if same else "FAIL", "migrate: training job bit-identical to the unmoved native run",
            f"native rc {rn}, cudaw rc {rc}; {steps} losses + weights + AdamW state + held buffer "
            + ("identical: " + last if a == b else "DIFFER: " + tpc.first_difference(a, b, [(s, f"move {f} -> {d}") for s, f, d, _, _ in moves])))
    if a != b and rn == 0 and time.monotonic() - started < args.budget_s - 150:
        # The same run under cudaw, not moved: tells a move's fault from a difference that
        # cudaw (or the trainer itself) makes anyway.
        with open(os.path.join(args.work, "train-control.out"), "w") as o, \
                open(os.path.join(args.work, "train-control.err"), "w") as e:
            try:
                rk = subprocess.run([os.path.join(args.dist, "bin", "cudaw"), "run", "--", *train],
                                    stdout=o, stderr=e, env=tenv, timeout=150).returncode
            except subprocess.TimeoutExpired:
                rk = "timeout"
        c = open(os.path.join(args.work, "train-control.out")).read()
        verdict("PASS" if rk == 0 and c == a else "FAIL", "migrate: training under cudaw, not moved, bit-identical to native",
                f"rc {rk}; " + ("identical: the difference above is the moves'" if c == a
                                else "DIFFER: " + tpc.first_difference(a, c, [])))


# -- 2. and 3. processes holding N GiB ---------------------------------------------------

def refusals(args, ck, h, gl):
    """`--to` a GPU that does not exist, and `--to` the one it is on: refused, nothing moved."""
    missing = str(max(7, len(gl)))
    for to, what in ((missing, "no such GPU"), ("0", "the GPU it is on")):
        p, wall = ck("migrate", str(h.pid), "--to", to, timeout=120)
        alive = h.p.poll() is None
        st = ck.state(h.pid) if alive else None
        if alive and st != "running":
            ck.rescue(h.pid)  # a refusal that left it paused: the check fails, the rest goes on
        intact = alive and verify(h)
        ok = p.returncode != 0 and "cudaw-ckpt: error:" in p.stderr and alive and st == "running" and intact
        verdict("PASS" if ok else "FAIL", f"migrate: refused --to {to} ({what})",
                f"rc {p.returncode} in {wall:.3f} s: {why(p)}; process {'running' if alive else 'GONE'}, "
                f"state {st}, data {'intact' if intact else 'NOT intact' if alive else 'lost'}")


def cudaw_holder(args, env, gl, size, first):
    """A holder under cudaw: (refusals,) pause + resume, then 0 -> 1 -> 0."""
    ck = Ckpt(args, env)
    h = Holder([os.path.join(args.dist, "bin", "cudaw"), "run", "--", "python3", "-c", HOLDER, f"{size:g}"],
               dict(env, **ONE_GPU), os.path.join(args.work, f"holder-{size:g}g.err"))
    r = {"problems": [], "moves": [], "places": [], "verified": 0, "plain_ok": False}
    done = False
    try:
        ok, text = placed(h.pid, gl, 0, 1)
        r["places"].append((ok, f"started: {text}"))
        if first and not args.skip_refusals:
            refusals(args, ck, h, gl)
        p, r["pause_s"], r["pause_json"] = ck.json("pause", str(h.pid), "--json")
        q, r["resume_s"], r["resume_json"] = ck.json("resume", str(h.pid), "--json")
        r["plain_ok"] = p.returncode == 0 and q.returncode == 0 and verify(h)
        if not r["plain_ok"]:
            r["problems"].append(f"pause rc {p.returncode}, resume rc {q.returncode}: {why(p)} / {why(q)}")
            ck.rescue(h.pid)
        for to, frm, dest in (("1", 0, 1), ("0", 1, 0)):
            problem, wall, v = migrate(ck, h.pid, to, gl, frm, dest)
            if problem:
                r["problems"].append(problem)
                break
            r["moves"].append((frm, dest, wall, v))
            ok, text = placed(h.pid, gl, dest, frm)
            r["places"].append((ok, f"after {frm} -> {dest}: {text}"))
            if not verify(h):
                r["problems"].append(f"data NOT intact after {frm} -> {dest}")
                break
            r["verified"] += 1
        done = not r["problems"]
    finally:
        if done:
            h.quit()
        else:
            ck.rescue(h.pid)
            h.kill()
    return r


def driver_remap(args, gl, size):
    """The same kind of process run natively, moved 0 -> 1 by NVIDIA's checkpoint alone."""
    env = dict(os.environ, **MULTICAST_OFF)
    h = Holder(["python3", "-c", HOLDER, f"{size:g}"], dict(env, **ONE_GPU),
               os.path.join(args.work, f"holder-{size:g}g-native.err"))
    r = {"ok": False}
    uuids = dict(gl)

    def step(*words):
        t = time.monotonic()
        try:
            p = subprocess.run(["python3", "-c", DRIVER, *words], capture_output=True, text=True, env=env, timeout=180)
        except subprocess.TimeoutExpired as e:
            p = subprocess.CompletedProcess(e.cmd, 124, "", "(no answer in 180 s)")
        wall = time.monotonic() - t
        with open(os.path.join(args.work, "ckpt.log"), "a") as f:
            f.write(f"$ driver_remap {' '.join(words)} ({size:g} GiB) -> rc {p.returncode} ({wall:.3f} s)\n"
                    f"{p.stdout}{p.stderr}")
        r.update({k: float(x) for k, x in re.findall(r"(\w+_s)=([\d.]+)", p.stdout)})
        r.update(dict(re.findall(r"(pairs|refused_first|identity_pairs)=(\S+)", p.stdout)))
        return p, wall

    try:
        p, r["checkpoint_wall_s"] = step("checkpoint", str(h.pid))
        if p.returncode != 0:
            r["error"] = why(p)
            return r
        w = where(h.pid, gl)
        r["checkpointed_mib"] = None if w is None else sum(w.values())
        q, r["restore_wall_s"] = step("restore", str(h.pid), uuids[0], uuids[1])
        if q.returncode != 0:
            r["error"] = why(q)
            return r
        r["placed"] = placed(h.pid, gl, 1, 0)
        r["verified"] = verify(h)
        r["ok"] = r["verified"]
        if not r["verified"]:
            r["error"] = "the driver restored it, but its data is NOT intact"
        else:
            # Once more, restored with every GPU onto itself: does the driver take that?
            # (The move's times are kept.)
            times = {k: v for k, v in r.items() if k.endswith("_s")}
            if step("checkpoint", str(h.pid))[0].returncode == 0:
                step("restore-same", str(h.pid))
                r["ok"] = r["verified"] = verify(h)
            r.update(times)
    finally:
        if r["ok"]:
            h.quit()
        else:
            h.kill()
    return r


def ceiling(args, size):
    try:
        return pausebench.ceiling(types.SimpleNamespace(bin=args.bin, log=os.path.join(args.work, "pinned.log")), size)
    except (OSError, subprocess.TimeoutExpired) as e:
        print(f"pinned copy {size:g} GiB: {type(e).__name__}: {e}", flush=True)
        return None


def sizes_part(args, env, gl):
    for n, size in enumerate(args.sizes):
        key, name = f"{size:g}", f"migrate: {size:g} GiB"
        c = ceiling(args, size)
        try:
            cw = cudaw_holder(args, env, gl, size, n == 0)
        except (RuntimeError, OSError, subprocess.TimeoutExpired) as e:
            verdict("FAIL", name, f"{type(e).__name__}: {e}")
            continue
        try:
            drv = driver_remap(args, gl, size)
        except (RuntimeError, OSError, subprocess.TimeoutExpired) as e:
            drv = {"ok": False, "error": f"{type(e).__name__}: {e}"}

        moves = cw["moves"]
        walls = [w for _, _, w, _ in moves]
        verdict("PASS" if not cw["problems"] and len(moves) == 2 and cw["verified"] == 2 else "FAIL",
                f"{name}: moved 0 -> 1 -> 0, data intact",
                "; ".join(f"{f} -> {d} in {w:.3f} s, verified" for f, d, w, _ in moves[:cw["verified"]])
                + (f"; {'; '.join(cw['problems'])}" if cw["problems"] else ""))
        verdict("PASS" if all(ok for ok, _ in cw["places"]) and len(moves) == 2 else "FAIL",
                f"{name}: memory on the new GPU only (nvidia-smi)", "; ".join(t for _, t in cw["places"]))
        if moves:
            worst = max(walls)
            goal = size <= 8
            phases = "; ".join(f"{f} -> {d}: wall {w:.3f} s, pause {ms(v, 'pause_ms')} + release {ms(v, 'release_ms')}"
                               f" + restore {ms(v, 'restore_ms')} + resume {ms(v, 'resume_ms')} = total {ms(v, 'total_ms')} ms"
                               for f, d, w, v in moves)
            verdict(("PASS" if worst < 1.0 and len(moves) == 2 else "FAIL") if goal else "info",
                    f"{name}: migration under 1 s" if goal else f"{name}: migration time",
                    f"slowest {worst:.3f} s (goal < 1 s at 8 GiB); {phases}")
        plain = (f"pause {fs(cw.get('pause_s'))} + resume {fs(cw.get('resume_s'))} (JSON ms {ms(cw.get('pause_json'), 'ms')}"
                 f" + {ms(cw.get('resume_json'), 'ms')}){'' if cw['plain_ok'] else ' FAILED'}")
        ceil = (f"DtoH {c['dtoh_s']:.3f} s + HtoD {c['htod_s']:.3f} s = {c['dtoh_s'] + c['htod_s']:.3f} s"
                f"{'' if c['ok'] else ' (copy NOT verified)'}" if c else "not measured (pinned_copy missing or failed; see pinned.log)")
        if drv["ok"]:
            dtext = (f"checkpoint {drv.get('lock_s', 0) + drv.get('checkpoint_s', 0):.3f} s (lock {drv.get('lock_s', 0):.3f}) + "
                     f"restore onto GPU 1 {drv.get('restore_s', 0) + drv.get('unlock_s', 0):.3f} s = "
                     f"{drv.get('lock_s', 0) + drv.get('checkpoint_s', 0) + drv.get('restore_s', 0) + drv.get('unlock_s', 0):.3f} s "
                     f"(wall {drv['checkpoint_wall_s'] + drv['restore_wall_s']:.3f} s; {drv.get('pairs', '?')} GPU pair(s)"
                     + (f", 1 pair refused: {drv['refused_first']}" if "refused_first" in drv else "")
                     + (f"; every GPU onto itself: {drv['identity_pairs']}" if "identity_pairs" in drv else "")
                     + f"; {drv['checkpointed_mib']} MiB listed while checkpointed; {drv['placed'][1]})")
        else:
            dtext = f"FAILED: {drv.get('error', '?')}"
        verdict("info", f"{name}: beside it",
                f"pinned copy {ceil}; cudaw {plain}; driver checkpoint + restore with remap: {dtext}")

        cell("pinned copy DtoH + HtoD (the ceiling)", key,
             f"{c['dtoh_s'] + c['htod_s']:.3f} s ({c['dtoh_s']:.3f} + {c['htod_s']:.3f})" if c else "-")
        cell("cudaw pause + resume (context kept)", key,
             f"{cw['pause_s'] + cw['resume_s']:.3f} s ({cw['pause_s']:.3f} + {cw['resume_s']:.3f})"
             if cw["plain_ok"] else "FAILED")
        for f, d, w, v in moves:
            cell(f"cudaw migrate {f} → {d} (wall)", key, f"{w:.3f} s")
        for phase, what in (("pause_ms", "cudaw eviction"), ("release_ms", "driver lock + checkpoint"),
                            ("restore_ms", "driver restore + unlock, GPU pairs"),
                            ("resume_ms", "cudaw memory back on the new GPU"), ("total_ms", "")):
            cell(f"— {phase}{f' ({what})' if what else ''}, 0 → 1 / 1 → 0", key,
                 " / ".join(f"{ms(v, phase)} ms" for _, _, _, v in moves) or "-")
        cell("driver checkpoint + restore with remap 0 → 1", key,
             (f"{drv.get('lock_s', 0) + drv.get('checkpoint_s', 0) + drv.get('restore_s', 0) + drv.get('unlock_s', 0):.3f} s "
              f"({drv.get('lock_s', 0) + drv.get('checkpoint_s', 0):.3f} + {drv.get('restore_s', 0) + drv.get('unlock_s', 0):.3f})")
             if drv["ok"] else "failed")


def print_table(sizes):
    keys = [f"{s:g}" for s in sizes]
    print("\n| | " + " | ".join(f"{k} GiB" for k in keys) + " |")
    print("|---|" + "---|" * len(keys))
    for row in ROWS:
        print(f"| {row} | " + " | ".join(TABLE[row].get(k, "-") for k in keys) + " |")
    print(flush=True)


def main():
    # gpu-check's timeout sends SIGTERM: run the finally blocks (resume, kill) on the way out.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(124))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dist", required=True)
    ap.add_argument("--bin", required=True, help="folder holding pinned_copy (gpu-check.sh compiles it)")
    ap.add_argument("--work", required=True)
    ap.add_argument("--sizes", type=float, nargs="*", default=[8, 32], help="GiB (default: 8 32; none: skip)")
    ap.add_argument("--steps", type=int, default=3000, help="training steps (0: skip the training job)")
    ap.add_argument("--hold-gib", type=float, default=1, help="the training job's held buffer")
    ap.add_argument("--skip-refusals", action="store_true")
    ap.add_argument("--budget-s", type=float, default=400,
                    help="the run's time limit: a control run is only made while it fits")
    ap.add_argument("--seed", type=int, default=int(time.time()))
    ap.add_argument("--arena", action="store_true",
                    help="the processes under cudaw with the host arena (CUDAW_HOST_ARENA=pinned)")
    args = ap.parse_args()
    started = time.monotonic()
    os.makedirs(args.work, exist_ok=True)
    gl = gpus()
    if len(gl) < 2:
        print(f"info | migrate | needs 2 or more GPUs (nvidia-smi lists {len(gl)}): run it on nvidia-h100-x2", flush=True)
        return 0
    env = dict(os.environ, CUDAW_LOG="info", CUDAW_RUN_DIR=os.path.join(args.work, "run"), **MULTICAST_OFF)
    if args.arena:
        env["CUDAW_HOST_ARENA"] = "pinned"
    os.makedirs(env["CUDAW_RUN_DIR"], mode=0o700, exist_ok=True)
    smi = subprocess.run(["nvidia-smi", "--query-gpu=index,name,driver_version,persistence_mode,memory.total",
                          "--format=csv,noheader"], capture_output=True, text=True).stdout.strip().replace("\n", "; ")
    verdict("info", "migrate: GPUs, driver, persistence mode, uid",
            f"{smi}; uid {os.getuid()}; seed {args.seed}{'; host arena pinned' if args.arena else ''}")
    try:
        if args.steps > 0:
            training_part(args, env, gl, started)
        if args.sizes:
            sizes_part(args, env, gl)
    finally:
        if ROWS:
            print_table(args.sizes)
    print(json.dumps({"passed": all(s != "FAIL" for s in results)}), flush=True)
    return 0 if all(s != "FAIL" for s in results) else 1


if __name__ == "__main__":
    sys.exit(main())
