#!/usr/bin/env python3
"""A data-parallel PyTorch job (examples/ddp_train.py: DDP over NCCL, all-reduce, broadcast
and send/recv) paused, resumed, dumped and restored as a job under cudaw, against the same
job run without cudaw (issue #26's GPU acceptance). Needs two or more GPUs.

  1. native:  torchrun --standalone --nproc_per_node N examples/ddp_train.py --steps S ...
  2. cudaw:   the same under `cudaw run`; while it trains, at random instants (seeded):
              PAUSES `cudaw-ckpt pause --job` / `resume --job` pairs, and DUMPS
              `dump --job -o DIR` + `restore --job -i DIR`. During the first pause every GPU's
              memory use (nvidia-smi, per GPU) is read and another process allocates on each
              GPU more than was free before the pause.
  3. every rank's digests (losses, weights, the p2p ring) and every step's loss must be
     identical to the native run's.

With --bench GIB[,GIB...] it instead times job pauses and resumes of a job whose ranks each
hold GIB GiB (three of each), beside a pinned device-to-host copy of the same size on each
GPU, and prints per-GPU bandwidths.

Prints `PASS | name | detail` / `FAIL | name | detail` / `INFO | name | detail` lines
(gpu-check.sh turns them into table rows) and exits 0 when all passed.
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

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN = os.path.join(ROOT, "examples", "ddp_train.py")
MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                 "NVSHMEM_DISABLE_NVLS": "1"}
ALLOC = """
import sys, torch
n = int(sys.argv[1])
for d in range(torch.cuda.device_count()):
    x = torch.empty(n, dtype=torch.uint8, device=f"cuda:{d}")
    x.fill_(7)
    torch.cuda.synchronize(d)
    del x
print(f"allocated {n >> 20} MiB on each of {torch.cuda.device_count()} GPUs ok")
"""
PINNED = """
import sys, time, torch
gib = float(sys.argv[1])
n = int(gib * (1 << 30))
g = torch.cuda.device_count()
xs = [torch.empty(n, dtype=torch.uint8, device=f"cuda:{d}") for d in range(g)]
hs = [torch.empty(n, dtype=torch.uint8, pin_memory=True) for d in range(g)]
streams = [torch.cuda.Stream(device=d) for d in range(g)]
def copy(ds):
    for d in ds:
        torch.cuda.synchronize(d)
    t = time.perf_counter()
    for d in ds:
        with torch.cuda.stream(streams[d]):
            hs[d].copy_(xs[d], non_blocking=True)
    for d in ds:
        streams[d].synchronize()
    return time.perf_counter() - t
for d in range(g):
    best = min(copy([d]) for _ in range(3))
    print(f"pinned gpu {d} {n / best / 1e9:.2f}")
# Every GPU at once, as a job's ranks evict at once: the host's memory is shared.
best = min(copy(list(range(g))) for _ in range(3))
print(f"pinned all {g} {n / best / 1e9:.2f}")
"""

verdicts = []


def verdict(ok, name, detail):
    if ok is not None:
        verdicts.append(ok)
    word = "INFO" if ok is None else ("PASS" if ok else "FAIL")
    print(f"{word} | {name} | {detail}", flush=True)


def smi():
    """[(used MiB, free MiB)] per GPU, or []."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used,memory.free",
                              "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=30).stdout
        return [tuple(int(x) for x in line.split(",")) for line in out.strip().splitlines()]
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return []


class Job:
    def __init__(self, args, tag, extra, env=None, native=False):
        self.args = args
        self.dir = os.path.join(args.work, tag)
        os.makedirs(self.dir, exist_ok=True)
        self.run_dir = os.path.join(self.dir, "run")
        os.makedirs(self.run_dir, mode=0o700, exist_ok=True)
        self.pid_dir = os.path.join(self.dir, "pids")
        self.env = dict(os.environ, CUDAW_LOG="info", CUDAW_RUN_DIR=self.run_dir, **MULTICAST_OFF, **(env or {}))
        cudaw = [] if native else [os.path.join(args.dist, "bin", "cudaw"), "run", "--"]
        cmd = [*cudaw, *torchrun(args), TRAIN, "--pid-dir", self.pid_dir, *extra]
        self.out = open(os.path.join(self.dir, "job.out"), "w")
        self.err = open(os.path.join(self.dir, "job.err"), "w")
        self.proc = subprocess.Popen(cmd, stdout=self.out, stderr=self.err, env=self.env,
                                     start_new_session=True)
        self.log = open(os.path.join(self.dir, "ckpt.log"), "a")

    def started(self, timeout=300):
        t = time.monotonic()
        while time.monotonic() - t < timeout and self.proc.poll() is None:
            if all(os.path.exists(os.path.join(self.pid_dir, f"rank{r}.pid")) for r in range(self.args.gpus)):
                return True
            time.sleep(0.05)
        return False

    def ckpt(self, *words, timeout=600):
        t = time.monotonic()
        p = subprocess.run([os.path.join(self.args.dist, "bin", "cudaw-ckpt"), *words],
                           capture_output=True, text=True, timeout=timeout, env=self.env)
        self.log.write(f"$ cudaw-ckpt {' '.join(words)} -> rc {p.returncode} ({time.monotonic() - t:.3f} s)\n"
                       f"{p.stdout}{p.stderr}")
        self.log.flush()
        return p

    def job(self, *words):
        p = self.ckpt(*words[:1], str(self.proc.pid), "--job", "--json", *words[1:])
        try:
            return p.returncode, json.loads(p.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            return p.returncode, {"error": (p.stdout + p.stderr)[-300:]}

    def ranks(self):
        pids = []
        for r in range(self.args.gpus):
            with open(os.path.join(self.pid_dir, f"rank{r}.pid")) as f:
                pids.append(int(f.read().split()[0]))
        return pids

    def wait(self, timeout):
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def kill(self):
        # The ranks too, by PID: a rank the driver left checkpointed (a restore that
        # failed) outlived the launcher's group once and held its GPU's memory for the
        # sections after.
        ranks = []
        for r in range(self.args.gpus):
            try:
                with open(os.path.join(self.pid_dir, f"rank{r}.pid")) as f:
                    ranks.append(int(f.read().split()[0]))
            except (OSError, ValueError, IndexError):
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except OSError:
            pass
        for pid in ranks:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        self.proc.wait()
        # The next job must find the GPUs empty: the driver frees a killed process's memory
        # a little after it is gone.
        t = time.monotonic()
        while time.monotonic() - t < 30 and any(u > 2048 for u, _ in smi()):
            time.sleep(0.25)
        left = [u for u, _ in smi() if u > 2048]
        if left:
            print(f"warning: GPU memory still used 30 s after the job was killed: {left} MiB", flush=True)


def torchrun(args):
    return ["torchrun", "--standalone", "--nproc_per_node", str(args.gpus)]


def digest_lines(path):
    """The comparable lines of a job's output: every step's loss and every rank's digests."""
    keep = []
    with open(path) as f:
        for line in f:
            if line.startswith("step ") or line.startswith("rank "):
                keep.append(line.strip())
    return keep


def check(args):
    rng = random.Random(args.seed)
    extra = ["--steps", str(args.steps), "--print-losses", "--hold-gib", str(args.hold_gib),
             "--step-sleep", str(args.step_sleep)]
    t = time.monotonic()
    native_out = os.path.join(args.work, "native.out")
    with open(native_out, "w") as out, open(os.path.join(args.work, "native.err"), "w") as err:
        rn = subprocess.run([*torchrun(args), TRAIN, *extra], stdout=out, stderr=err, timeout=900,
                            env=dict(os.environ, **MULTICAST_OFF)).returncode
    native_s = time.monotonic() - t
    want = digest_lines(native_out)
    verdict(rn == 0 and len(want) > args.steps, "ddp: native run",
            f"rc {rn}, {native_s:.1f} s, {len(want)} digest lines")

    job = Job(args, "cudaw", extra)
    if not job.started():
        verdict(False, "ddp under cudaw: started", f"rc {job.proc.poll()}; see cudaw/job.err")
        job.kill()
        return
    before = smi()
    pauses = dumps = 0
    failures = []
    pause_ms, resume_ms, attempts = [], [], []
    plan = ["pause"] * args.pauses + ["dump"] * args.dumps + ["migrate"] * args.migrates
    rng.shuffle(plan)
    # A migration swaps the ranks' GPUs (reversed order); an even count ends where it began.
    migrated, migrate_failures, migrate_ms = 0, [], []
    swap = ",".join(str(g) for g in reversed(range(args.gpus)))
    freed_checked = False
    try:
        for i, what in enumerate(plan):
            time.sleep(rng.uniform(0.05, args.gap))
            if job.proc.poll() is not None:
                failures.append(f"the job ended before event {i} ({what})")
                break
            if what == "migrate":
                rc, m = job.job("migrate", "--to", swap)
                if rc != 0:
                    # A failed migration leaves the job where it was, running: go on.
                    migrate_failures.append(f"migrate {i}: {m.get('error', m)}")
                else:
                    migrated += 1
                    migrate_ms.append(m["total_ms"])
                continue
            if what == "pause":
                rc, p = job.job("pause", *(["--keep-shared"] if args.keep_shared else []))
                if rc != 0:
                    failures.append(f"pause {i}: {p.get('error', p)}")
                    break
                pause_ms.append(p["ms"])
                attempts.append(p["attempts"])
                if not freed_checked:
                    freed_checked = True
                    during = smi()
                    detail = "; ".join(f"GPU {g}: {b[0]} MiB used before, {d[0]} MiB paused"
                                       for g, (b, d) in enumerate(zip(before, during)))
                    held = int(args.hold_gib * 1024)
                    freed = all(b[0] - d[0] >= held for b, d in zip(before, during)) and during
                    verdict(bool(freed), "ddp: paused job frees each GPU (nvidia-smi)", detail)
                    paused = ", ".join(f"GPU {g} {d[0]} MiB" for g, d in enumerate(during))
                    # What cudaw still maps on the GPUs (allocations, driver handles, shared
                    # buffers): nothing, but with --keep-shared. The rest is the driver's own:
                    # the contexts, their loaded kernels and local memory.
                    _, st = job.job("status")
                    devs = [d for m in st.get("members", []) for d in m.get("devices", [])]
                    mapped = sum(d.get("mapped", 0) for d in devs)
                    resident = sum(d.get("resident", 0) for d in devs)
                    if args.keep_shared:
                        verdict(None, "ddp: paused job's GPU memory (--keep-shared: contexts + NCCL's buffers)",
                                f"{paused}; cudaw maps {mapped} bytes")
                    else:
                        verdict(bool(devs) and mapped == 0 and resident == 0,
                                "ddp: paused job's GPUs hold the contexts alone",
                                f"cudaw maps {mapped} bytes, {resident} resident, on {len(devs)} devices of "
                                f"{len(st.get('members', []))} processes; nvidia-smi: {paused}")
                    if p.get("shared"):
                        verdict(None, "ddp: shared memory evicted with the job",
                                f"{p['shared']['exports']} exports, {p['shared']['imports']} imports, "
                                f"{p['shared']['unpaired']} unpaired")
                    # All that is free while paused but 1 GiB (the allocating process's own
                    # context and its allocator's rounding): more than was free before the pause.
                    if not during or not before:
                        verdict(False, "ddp: another process allocates what the job freed",
                                "nvidia-smi gave no figures")
                        during = before = [(0, 1024)]
                    need = min(d[1] for d in during) - 1024
                    more = need > max(b[1] for b in before)
                    a = subprocess.run([sys.executable, "-c", ALLOC, str(need << 20)], capture_output=True,
                                       text=True, timeout=120, env=dict(os.environ, **MULTICAST_OFF))
                    verdict(a.returncode == 0 and more, "ddp: another process allocates what the job freed",
                            f"{need} MiB on each GPU (free before the pause: "
                            f"{', '.join(str(b[1]) for b in before)} MiB): "
                            f"{(a.stdout + a.stderr).strip()[-160:]}")
                rc, r = job.job("resume")
                if rc != 0:
                    failures.append(f"resume {i}: {r.get('error', r)}")
                    break
                resume_ms.append(r["ms"])
                pauses += 1
            else:
                folder = os.path.join(job.dir, f"image{dumps % 2}")
                rc, d = job.job("dump", "-o", folder)
                if rc != 0:
                    failures.append(f"dump {i}: {d.get('error', d)}")
                    break
                rc, r = job.job("restore", "-i", folder)
                if rc != 0:
                    failures.append(f"restore {i}: {r.get('error', r)}")
                    break
                dumps += 1
    except Exception as e:  # noqa: BLE001 - the job must not stay paused behind a crash
        failures.append(f"the check itself failed: {e!r}")

    if failures:
        # Never leave the job paused behind a failed step: it would wait for ever.
        job.job("resume")
    rc = job.wait(900)
    if rc is None:
        failures.append("the job did not end within 900 s after the events")
        job.kill()
    verdict(not failures and pauses == args.pauses and dumps == args.dumps,
            f"ddp: {args.pauses} job pauses and {args.dumps} dumps/restores at random instants",
            "; ".join(failures)[:300] if failures else
            f"pause median {sorted(pause_ms)[len(pause_ms) // 2]:.0f} ms, resume median "
            f"{sorted(resume_ms)[len(resume_ms) // 2]:.0f} ms, tries per pause max {max(attempts)} "
            f"mean {sum(attempts) / len(attempts):.2f}" if pause_ms else "no pause done")
    if args.migrates:
        verdict(migrated == args.migrates, f"ddp: job migrated {args.migrates} times (ranks swap GPUs)",
                "; ".join(migrate_failures)[:300] if migrate_failures else
                f"migration total ms: {', '.join(f'{x:.0f}' for x in migrate_ms)}")
    got = digest_lines(os.path.join(job.dir, "job.out"))
    same = got == want
    first = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), None)
    verdict(same and rc == 0, "ddp: job under cudaw bit-identical to native",
            f"rc {rc}; {len(got)} lines vs {len(want)}" +
            ("" if same else f"; first difference at line {first}: {got[first] if first is not None else ''!r}"))


def bench(args):
    sizes = [float(x) for x in args.bench.split(",")]
    for gib in sizes:
        p = subprocess.run([sys.executable, "-c", PINNED, str(gib)], capture_output=True, text=True,
                           timeout=300)
        pinned = [float(m) for m in re.findall(r"pinned gpu \d+ ([0-9.]+)", p.stdout)]
        together = [float(m) for m in re.findall(r"pinned all \d+ ([0-9.]+)", p.stdout)]
        mode = " (host arena)" if args.arena else ""
        job = Job(args, f"bench{gib:g}", ["--steps", "1000000", "--hold-gib", str(gib), "--step-sleep", "0.01"],
                  {"CUDAW_HOST_ARENA": "pinned"} if args.arena else {})
        if not job.started():
            verdict(False, f"job pause {args.gpus}x{gib:g} GiB{mode}", "the job did not start; see its job.err")
            job.kill()
            continue
        time.sleep(3)
        if args.arena:
            # The arena is made once the memory holds still: wait until every rank has one.
            t = time.monotonic()
            while time.monotonic() - t < 60:
                rc, s = job.job("status")
                ranks = [m for m in s.get("members", []) if any(d.get("resident", 0) for d in m.get("devices", []))]
                if ranks and all(m.get("arena", 0) >= gib * (1 << 30) for m in ranks):
                    break
                time.sleep(0.5)
        rows = []
        for _ in range(args.reps):
            rc, p = job.job("pause", *(["--keep-shared"] if args.keep_shared else []))
            if rc != 0:
                verdict(False, f"job pause {args.gpus}x{gib:g} GiB", p.get("error", str(p))[:200])
                break
            rc2, r = job.job("resume")
            if rc2 != 0:
                verdict(False, f"job resume {args.gpus}x{gib:g} GiB", r.get("error", str(r))[:200])
                break
            # Per rank: bytes and ms of its own eviction / restore (ranks run in parallel).
            ev = [(m["bytes"], m["ms"]) for m in p["members"] if m["bytes"] > 0]
            rs = [(m["bytes"], m["ms"]) for m in r["members"] if m["bytes"] > 0]
            rows.append((p["ms"], r["ms"], ev, rs))
            time.sleep(1)
        job.kill()
        if not rows:
            continue
        best_p = min(rows, key=lambda x: x[0])
        best_r = min(rows, key=lambda x: x[1])
        gbs = lambda pairs: ", ".join(f"{b / ms / 1e6:.1f}" for b, ms in pairs)
        pin = ", ".join(f"{x:.1f}" for x in pinned) or "n/a"
        ratio = min(b / ms / 1e6 for b, ms in best_p[2]) / min(pinned) if pinned and best_p[2] else float("nan")
        both = f"{together[0]:.1f}" if together else "n/a"
        ratio_all = (min(b / ms / 1e6 for b, ms in best_p[2]) / together[0]
                     if together and best_p[2] else float("nan"))
        verdict(None, f"job pause {args.gpus}x{gib:g} GiB{mode}",
                f"{best_p[0]:.0f} ms (job, best of {len(rows)}); per rank GB/s {gbs(best_p[2])}; "
                f"pinned copy GB/s {pin} alone, {both} each with every GPU copying at once; "
                f"slowest rank / pinned alone {ratio:.2f}, / pinned at once {ratio_all:.2f}")
        verdict(None, f"job resume {args.gpus}x{gib:g} GiB{mode}",
                f"{best_r[1]:.0f} ms (job, best of {len(rows)}); per rank GB/s {gbs(best_r[3])}")
        if args.driver:
            driver_bench(args, gib)


def driver_steps(prog, word, pids, extra=(), timeout=120):
    """Run `driver_checkpoint WORD PID` on every rank at once; ({pid: {key: s}}, error or None)."""
    t = time.monotonic()
    procs = {pid: subprocess.Popen([prog, word, str(pid), *extra], stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True) for pid in pids}
    got, err = {}, None
    for pid, p in procs.items():
        try:
            out, e = p.communicate(timeout=max(1, timeout - (time.monotonic() - t)))
        except subprocess.TimeoutExpired:
            p.kill()
            out, e = p.communicate()
            e = f"timed out after {timeout} s"
        if p.returncode != 0:
            err = err or f"rank PID {pid}: {e.strip()[-200:]}"
            continue
        got[pid] = {k: float(v) for k, v in re.findall(r"(\w+)=([0-9.]+)", out)}
    return got, err, time.monotonic() - t


def driver_bench(args, gib):
    """NVIDIA's cuCheckpointProcess* on the ranks of the same job run natively, every rank at once."""
    name = f"driver cuCheckpointProcess {args.gpus}x{gib:g} GiB"
    job = Job(args, f"driver{gib:g}", ["--steps", "1000000", "--hold-gib", str(gib), "--step-sleep", "0.01"],
              native=True)
    try:
        if not job.started():
            verdict(None, name, "the native job did not start; see its job.err")
            return
        time.sleep(3)
        pids = job.ranks()
        # Every rank at once, as cudaw's job pause does; a rank locked while the other is in
        # a collective keeps that one busy, so a failed try unlocks all and tries again.
        for tries in range(1, 5):
            ck, err, _ = driver_steps(args.driver, "checkpoint", pids, ["5000"])
            rs, err2, _ = driver_steps(args.driver, "restore", list(ck)) if ck else ({}, None, 0)
            if err2:
                slow = max(v.get("lock_s", 0) + v.get("checkpoint_s", 0) for v in ck.values())
                ranks = "every rank" if not err else f"{len(ck)} of {len(pids)} ranks"
                verdict(None, name, f"lock+checkpoint worked on {ranks} ({slow * 1e3:.0f} ms, "
                        f"try {tries}), restore failed: {err2}")
                return
            if not err:
                break
            time.sleep(0.05 * tries)
        if err:
            verdict(None, name, f"does not work on this job ({tries} tries, every rank at once, "
                    f"5 s lock timeout): {err}")
            return
        size = gib * (1 << 30)
        name += f" ({tries} tries)" if tries > 1 else ""
        slow = max(v["lock_s"] + v["checkpoint_s"] for v in ck.values())
        slow_r = max(v["restore_s"] + v["unlock_s"] for v in rs.values())
        verdict(None, name,
                f"lock+checkpoint {slow * 1e3:.0f} ms (slowest rank, {size / slow / 1e9:.1f} GB/s; "
                f"lock {max(v['lock_s'] for v in ck.values()) * 1e3:.0f} ms), "
                f"restore+unlock {slow_r * 1e3:.0f} ms ({size / slow_r / 1e9:.1f} GB/s)")
        # The job must still train after the driver's round trip.
        alive = job.proc.poll() is None
        if not alive:
            verdict(None, name + ": job after restore", f"the native job exited (rc {job.proc.returncode})")
    finally:
        job.kill()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dist", default=os.path.join(ROOT, "dist"))
    ap.add_argument("--work", required=True)
    ap.add_argument("--gpus", type=int, default=2)
    ap.add_argument("--steps", type=int, default=4000)
    ap.add_argument("--step-sleep", type=float, default=0.01,
                    help="seconds each rank sleeps after a step (room for the events; no effect on the numbers)")
    ap.add_argument("--hold-gib", type=float, default=1)
    ap.add_argument("--pauses", type=int, default=20)
    ap.add_argument("--dumps", type=int, default=3)
    ap.add_argument("--migrates", type=int, default=0,
                    help="`cudaw-ckpt migrate --job` events: the ranks swap GPUs (keep it even)")
    ap.add_argument("--gap", type=float, default=1.0, help="longest wait between events, in seconds")
    ap.add_argument("--bench", help="GiB per rank, comma-separated: time job pauses instead")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--arena", action="store_true", help="--bench: the job runs with CUDAW_HOST_ARENA=pinned")
    ap.add_argument("--keep-shared", action="store_true",
                    help="pause with --keep-shared: leave the memory the ranks share (NCCL's buffers) "
                    "on the GPUs")
    ap.add_argument("--driver", help="--bench: driver_checkpoint program (tests/cuda/gpu/pause): "
                    "also time NVIDIA's cuCheckpointProcess* on the ranks of the job run natively")
    ap.add_argument("--seed", type=int, default=int(time.time()))
    args = ap.parse_args()
    os.makedirs(args.work, exist_ok=True)
    print(f"seed {args.seed}", flush=True)
    if args.bench:
        bench(args)
    else:
        check(args)
    return 0 if all(verdicts) else 1


if __name__ == "__main__":
    sys.exit(main())
