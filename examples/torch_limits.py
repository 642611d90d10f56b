#!/usr/bin/env python3
"""Memory limits under cudaw, seen from PyTorch. Each check prints one line,
`PASS | name | detail` or `FAIL | name | detail`; the exit status is 0 only if all passed.

One process under a limit (run it with `cudaw run --mem-limit 4G`):

    cudaw run --mem-limit 4G -- python3 examples/torch_limits.py single --limit 4G
    PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True \\
        cudaw run --mem-limit 4G -- python3 examples/torch_limits.py single --limit 4G

  torch.cuda.mem_get_info() and get_device_properties() report the limit as the total;
  allocating more than the limit raises torch.OutOfMemoryError; filling up to the limit
  works; after empty_cache() the process trains. It prints `pid=` and `context_mib=` (what
  the process holds on the GPU beyond PyTorch's reserved memory, from nvidia-smi) for a
  caller that samples nvidia-smi.

Two processes whose limits add up to more than the card (start both, same --sync folder):

    cudaw run --mem-limit 75% -- python3 examples/torch_limits.py share --role hold --sync D
    cudaw run --mem-limit 75% -- python3 examples/torch_limits.py share --role grow --sync D

  `hold` takes 55% of the card and trains until `grow` is done; `grow` takes 1 GiB at a
  time until it gets torch.OutOfMemoryError (the card, shared through cudaw's node ledger,
  is full although its own limit is not reached), then frees and trains; `hold` must keep
  training throughout.
"""
import argparse
import os
import subprocess
import sys
import time

import torch

GIB = 1 << 30
MIB = 1 << 20
failures = 0


def report(ok, name, detail=""):
    global failures
    if not ok:
        failures += 1
    print(f"{'PASS' if ok else 'FAIL'} | {name} | {detail}", flush=True)


def parse_size(s):
    s = s.strip().upper().removesuffix("IB").removesuffix("B")
    for suffix, mult in (("K", 1 << 10), ("M", MIB), ("G", GIB), ("T", 1 << 40)):
        if s.endswith(suffix):
            return int(float(s[:-1]) * mult)
    return int(s)


def smi(query, *extra):
    """nvidia-smi's CSV answer as rows of stripped fields ([] when it cannot be asked)."""
    try:
        out = subprocess.run(["nvidia-smi", f"--query-{query}", "--format=csv,noheader,nounits", *extra],
                             capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [[f.strip() for f in line.split(",")] for line in out.splitlines() if line.strip()]


def my_gpu_mib():
    """This process's used_memory in MiB from nvidia-smi, or None (PID not visible)."""
    for row in smi("compute-apps=pid,used_memory"):
        if row[0] == str(os.getpid()):
            return int(row[1])
    return None


def card_mib():
    rows = smi("gpu=memory.total", "-i", os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0])
    return int(rows[0][0]) if rows else None


class Trainer:
    """A small model (conv, linear layers, Adam) trained on one batch."""

    def __init__(self, width=512):
        torch.manual_seed(0)
        dev = torch.device("cuda")
        self.model = torch.nn.Sequential(
            torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.Flatten(),
            torch.nn.Linear(16 * 32 * 32, width), torch.nn.ReLU(), torch.nn.Linear(width, 10)).to(dev)
        self.opt = torch.optim.Adam(self.model.parameters(), lr=1e-3)
        self.x = torch.randn(64, 3, 32, 32, device=dev)
        self.y = torch.randint(0, 10, (64,), device=dev)

    def steps(self, n):
        """Trains `n` steps; returns the losses (all finite, or it raises)."""
        losses = []
        for _ in range(n):
            self.opt.zero_grad(set_to_none=True)
            loss = torch.nn.functional.cross_entropy(self.model(self.x), self.y)
            loss.backward()
            self.opt.step()
            losses.append(loss.item())
        if not all(abs(v) < 1e6 for v in losses):  # also false for NaN
            raise FloatingPointError(f"losses {losses}")
        return losses


def single(args):
    limit = parse_size(args.limit)
    torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    mine = my_gpu_mib()
    context = None if mine is None else mine - (torch.cuda.memory_reserved() >> 20)
    print(f"pid={os.getpid()} context_mib={context if context is not None else 'unknown'}", flush=True)

    free, total = torch.cuda.mem_get_info()
    report(total == limit, "mem_get_info total is the limit", f"total {total} free {free}, limit {limit}")
    report(free <= total, "mem_get_info free within the limit", f"free {free}")
    props = torch.cuda.get_device_properties(0).total_memory
    report(props == limit, "get_device_properties total_memory is the limit", f"{props}")

    over = parse_size(args.over)
    try:
        t = torch.empty(over, dtype=torch.uint8, device="cuda")
        report(False, f"allocating {args.over} raises OutOfMemoryError", f"got {t.numel()} bytes")
        del t
    except torch.OutOfMemoryError as e:
        report(True, f"allocating {args.over} raises OutOfMemoryError", str(e).splitlines()[0][:90])
    except Exception as e:  # noqa: BLE001 - any other failure is the finding
        report(False, f"allocating {args.over} raises OutOfMemoryError", f"{type(e).__name__}: {e}"[:120])

    # Fill up to the limit in 256 MiB pieces: most of it can be had, none past it.
    held = []
    try:
        while True:
            held.append(torch.ones(256 * MIB, dtype=torch.uint8, device="cuda"))
    except torch.OutOfMemoryError:
        pass
    torch.cuda.synchronize()
    got = len(held) * 256 * MIB
    at_limit = my_gpu_mib()
    time.sleep(1.0)  # for a caller sampling nvidia-smi
    report(limit * 3 // 4 <= got <= limit, "filling up to the limit",
           f"{got >> 20} MiB in 256 MiB tensors (limit {limit >> 20} MiB); nvidia-smi {at_limit} MiB for this process")
    held.clear()
    torch.cuda.empty_cache()

    try:
        losses = Trainer().steps(args.steps)
        report(True, "after OOM and empty_cache, trains", f"{args.steps} steps, loss {losses[0]:.4f} -> {losses[-1]:.4f}")
    except Exception as e:  # noqa: BLE001
        report(False, "after OOM and empty_cache, trains", f"{type(e).__name__}: {e}"[:120])


def put(path, text):
    """Writes a file that appears whole (the other process polls for it)."""
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)


def wait_for(path, seconds):
    end = time.time() + seconds
    while not os.path.exists(path):
        if time.time() > end:
            return False
        time.sleep(0.1)
    return True


def share(args):
    card = card_mib()
    if card is None:
        report(False, f"share ({args.role}): card size", "nvidia-smi --query-gpu=memory.total gave nothing")
        return
    card_b = card * MIB
    held = []
    if args.role == "hold":
        want = int(card_b * args.hold) // GIB
        try:
            for _ in range(want):
                held.append(torch.ones(GIB, dtype=torch.uint8, device="cuda"))
            report(True, "share (hold): takes its part of the card", f"{want} GiB of {card} MiB")
        except torch.OutOfMemoryError as e:
            report(False, "share (hold): takes its part of the card", f"OOM after {len(held)} GiB: {e}"[:120])
        # Warm up before the other process fills the card: the caching allocator keeps
        # what the steps need, as a long-running job's would.
        trainer = Trainer()
        trainer.steps(3)
        put(os.path.join(args.sync, "held"), str(len(held)))
        steps = 0
        deadline = time.time() + 180
        try:
            while not os.path.exists(os.path.join(args.sync, "grown")) and time.time() < deadline:
                trainer.steps(2)
                steps += 2
            losses = trainer.steps(args.steps)
            report(steps > 0, "share (hold): keeps training while the other grows and fails",
                   f"{steps} steps during, {args.steps} after; loss {losses[-1]:.4f}")
        except Exception as e:  # noqa: BLE001
            report(False, "share (hold): keeps training while the other grows and fails",
                   f"after {steps} steps: {type(e).__name__}: {e}"[:140])
        return

    if not wait_for(os.path.join(args.sync, "held"), 120):
        report(False, "share (grow): the other process holds its part", "no sign from it within 120 s")
        return
    with open(os.path.join(args.sync, "held")) as f:
        other = int(f.read() or 0)
    free, total = torch.cuda.mem_get_info()
    report(free <= card_b - other * GIB, "share (grow): mem_get_info leaves out the other's memory",
           f"free {free >> 20} MiB, card {card} MiB, the other holds {other} GiB, own total {total >> 20} MiB")
    error = None
    try:
        while True:
            held.append(torch.ones(GIB, dtype=torch.uint8, device="cuda"))
    except torch.OutOfMemoryError as e:
        error = e
    except Exception as e:  # noqa: BLE001
        report(False, "share (grow): grows until a clean OutOfMemoryError", f"{type(e).__name__}: {e}"[:120])
    grown = len(held)
    if error is not None:
        report(grown + other <= card / 1024 and grown * GIB < total,
               "share (grow): grows until a clean OutOfMemoryError",
               f"OOM at {grown} GiB (own limit {total >> 30} GiB; {other} + {grown} GiB on a {card} MiB card)")
    put(os.path.join(args.sync, "grown"), str(grown))
    held.clear()
    torch.cuda.empty_cache()
    try:
        losses = Trainer().steps(args.steps)
        report(True, "share (grow): trains after its OOM", f"{args.steps} steps, loss {losses[-1]:.4f}")
    except Exception as e:  # noqa: BLE001
        report(False, "share (grow): trains after its OOM", f"{type(e).__name__}: {e}"[:120])


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="mode", required=True)
    s = sub.add_parser("single", help="one process under --mem-limit")
    s.add_argument("--limit", required=True, help="the limit cudaw was given (e.g. 4G)")
    s.add_argument("--over", default="5G", help="an allocation over the limit (default 5G)")
    s.add_argument("--steps", type=int, default=5)
    h = sub.add_parser("share", help="two processes sharing the card")
    h.add_argument("--role", choices=["hold", "grow"], required=True)
    h.add_argument("--sync", required=True, help="a folder both processes see")
    h.add_argument("--hold", type=float, default=0.55, help="share of the card the holder takes")
    h.add_argument("--steps", type=int, default=5)
    args = p.parse_args()
    single(args) if args.mode == "single" else share(args)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
