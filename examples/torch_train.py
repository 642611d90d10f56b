#!/usr/bin/env python3
"""A small deterministic PyTorch training loop, for checking cudaw against a native run.

It touches what a real job touches: cuBLAS matmuls, a cuDNN convolution, a torch.compile'd
(Triton) function, the caching allocator, and optimizer state. With --print-losses it prints
each step's loss as an exact hexadecimal float, so two runs can be compared bit for bit.
With --bench it times steps after a warm-up and prints ms per step (the fastest block of 50).

    python3 examples/torch_train.py --steps 20 --print-losses
    PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True python3 examples/torch_train.py
    python3 examples/torch_train.py --bench --steps 200
    CUDAW_TRACE=metrics cudaw run -- python3 examples/torch_train.py --trace-ab --steps 2000

With --trace-ab (under cudaw, started with CUDAW_TRACE) it times blocks of steps with
tracing switched on and off in turn, in one process (cudaw's cudaw_trace_active_v1), and
prints the median of the per-round ratios traced / untraced.
"""
import argparse
import hashlib
import os
import sys
import time

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
import torch  # noqa: E402


class Net(torch.nn.Module):
    def __init__(self, width):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 16, 3, padding=1)
        self.fc1 = torch.nn.Linear(16 * 32 * 32, width)
        self.fc2 = torch.nn.Linear(width, width)
        self.out = torch.nn.Linear(width, 10)

    def forward(self, x, act):
        x = torch.relu(self.conv(x))
        x = x.flatten(1)
        x = act(self.fc1(x))
        x = act(self.fc2(x))
        return self.out(x)


def scaled_gelu(x):
    return torch.nn.functional.gelu(x) * 1.5 - 0.25 * x


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--width", type=int, default=1024)
    p.add_argument("--no-compile", action="store_true", help="skip torch.compile (no Triton)")
    p.add_argument("--print-losses", action="store_true")
    p.add_argument("--bench", action="store_true", help="time steps after 10 warm-up steps")
    p.add_argument("--trace-ab", action="store_true",
                   help="under cudaw with CUDAW_TRACE: time blocks of steps traced and untraced in turn")
    p.add_argument("--block", type=int, default=5,
                   help="steps per timed block (--trace-ab; short blocks pair the two states closely: "
                        "the host's speed drifts over a few 25-step blocks)")
    p.add_argument("--keep-gc", action="store_true",
                   help="--trace-ab: leave Python's garbage collector on while timing (by default it is "
                        "off then: a collection landing in one block of the pair moves its ratio by "
                        "several percent)")
    p.add_argument("--ab-null", action="store_true",
                   help="--trace-ab control: the 'on' blocks switch tracing on and straight off again, so "
                        "both halves run untraced and the ratio shows what the switching alone costs "
                        "(1.0 when it costs nothing)")
    p.add_argument("--ab-raw", help="--trace-ab: also write every block's figures here, one JSON "
                   "object a line (round, on, wall, process CPU and system ms a step, the block's "
                   "minor page faults and context switches, CLOCK_MONOTONIC at its start and end: "
                   "perf record -k CLOCK_MONOTONIC samples split by block)")
    p.add_argument("--hold-gib", type=float, default=0,
                   help="also hold a buffer of this many GiB (a known pattern, checked at the end)")
    p.add_argument("--pid-file", help="write this process's PID here once training starts")
    args = p.parse_args()

    torch.manual_seed(0)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.use_deterministic_algorithms(True)

    dev = torch.device("cuda")
    model = Net(args.width).to(dev)
    act = scaled_gelu if args.no_compile else torch.compile(scaled_gelu)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1)
    data = torch.randn(8, args.batch, 3, 32, 32, generator=g).to(dev)
    labels = torch.randint(0, 10, (8, args.batch), generator=g).to(dev)

    def step(i):
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(model(data[i % 8], act), labels[i % 8])
        loss.backward()
        opt.step()
        return loss

    if args.trace_ab:
        trace_ab(args, step)
        return

    if args.bench:
        for i in range(10):
            step(i)
        torch.cuda.synchronize()
        # The steps run in blocks of 50, each timed to the device's completion: the fastest
        # block is the figure (a slow phase of the shared host is left out); the mean of all
        # the steps follows it.
        per = min(50, args.steps)
        blocks = []
        t_all = time.perf_counter()
        for b in range(max(1, args.steps // per)):
            t0 = time.perf_counter()
            for i in range(per):
                step(b * per + i)
            torch.cuda.synchronize()
            blocks.append((time.perf_counter() - t0) * 1000 / per)
        mean = (time.perf_counter() - t_all) * 1000 / (per * len(blocks))
        print(f"bench ms_per_step={min(blocks):.4f} mean_ms={mean:.4f} steps={per * len(blocks)}")
        return

    held = None
    if args.hold_gib > 0:
        n = int(args.hold_gib * (1 << 30)) // 8
        held = torch.arange(n, dtype=torch.int64, device=dev) * 2654435761 % (1 << 61)
        torch.cuda.synchronize()
    if args.pid_file:
        with open(args.pid_file + ".tmp", "w") as f:
            f.write(f"{os.getpid()}\n")
        os.replace(args.pid_file + ".tmp", args.pid_file)

    losses = []
    for i in range(args.steps):
        loss = step(i)
        losses.append(loss.item())
        if args.print_losses:
            print(f"step {i} loss {losses[-1].hex()}")
    h = hashlib.sha256()
    for t in model.state_dict().values():
        h.update(t.detach().cpu().numpy().tobytes())
    if held is not None:
        n = held.numel()
        want = torch.arange(n, dtype=torch.int64, device=dev) * 2654435761 % (1 << 61)
        print(f"held {args.hold_gib:g} GiB intact {bool(torch.equal(held, want))}")
        del want
    print(f"final loss {losses[-1]:.6f} weights_sha256 {h.hexdigest()[:16]}")
    print(f"allocator {torch.cuda.memory_allocated() >> 20} MiB allocated, "
          f"{torch.cuda.memory_reserved() >> 20} MiB reserved", file=sys.stderr)


def tracing_switch():
    """cudaw's cudaw_trace_active_v1 in the libcudart this process loaded, or None."""
    import ctypes
    paths = []
    with open("/proc/self/maps") as f:
        for line in f:
            path = line.split()[-1] if len(line.split()) >= 6 else ""
            if "libcudart.so" in path and path not in paths:
                paths.append(path)
    for path in paths:
        try:
            fn = ctypes.CDLL(path).cudaw_trace_active_v1
        except (OSError, AttributeError):
            continue
        fn.argtypes = [ctypes.c_int]
        fn.restype = ctypes.c_int
        return fn
    return None


def trace_ab(args, step):
    """Blocks of steps with tracing on and off in turn (the order alternates each round)."""
    import resource
    import statistics
    sw = tracing_switch()
    if sw is None or sw(1) < 0:
        print("trace_ab unavailable: not under cudaw, or started without CUDAW_TRACE")
        sys.exit(2)
    for i in range(10):
        step(i)
    torch.cuda.synchronize()
    if not args.keep_gc:
        import gc
        gc.collect()
        gc.disable()
    per = max(1, args.block)
    rounds = max(1, args.steps // (2 * per))
    ratios, ms, cpu = [], {0: [], 1: []}, {0: [], 1: []}
    raw = open(args.ab_raw, "w") if args.ab_raw else None
    n = 0
    for r in range(rounds):
        t = {}
        for k in range(2):
            on = (r + k) % 2
            sw(on)
            if args.ab_null and on:
                sw(0)
            torch.cuda.synchronize()
            u0 = resource.getrusage(resource.RUSAGE_SELF) if raw else None
            m0, c0, t0 = time.monotonic(), time.process_time(), time.perf_counter()
            for i in range(per):
                step(n)
                n += 1
            torch.cuda.synchronize()
            t[on] = (time.perf_counter() - t0) * 1000 / per
            c = (time.process_time() - c0) * 1000 / per
            ms[on].append(t[on])
            cpu[on].append(c)
            if raw:
                u = resource.getrusage(resource.RUSAGE_SELF)
                raw.write(f'{{"round": {r}, "on": {on}, "wall_ms": {t[on]:.5f}, "cpu_ms": {c:.5f}, '
                          f'"sys_ms": {(u.ru_stime - u0.ru_stime) * 1000 / per:.5f}, '
                          f'"minflt": {u.ru_minflt - u0.ru_minflt}, "nvcsw": {u.ru_nvcsw - u0.ru_nvcsw}, '
                          f'"nivcsw": {u.ru_nivcsw - u0.ru_nivcsw}, '
                          f'"monotonic": [{m0:.6f}, {time.monotonic():.6f}]}}\n')
        ratios.append(t[1] / t[0])
    sw(1)
    if raw:
        raw.close()
    total = sum(ms[1]) / sum(ms[0])
    cpu_ratio = statistics.median(a / b for a, b in zip(cpu[1], cpu[0]))
    print(f"trace_ab ratio={statistics.median(ratios):.4f} on_ms={statistics.median(ms[1]):.4f} "
          f"off_ms={statistics.median(ms[0]):.4f} total_ratio={total:.4f} cpu_ratio={cpu_ratio:.4f} rounds={rounds} steps_per_block={per} "
          f"ratios_p25={statistics.quantiles(ratios, n=4)[0] if rounds > 1 else ratios[0]:.4f} "
          f"ratios_p75={statistics.quantiles(ratios, n=4)[2] if rounds > 1 else ratios[0]:.4f}")


if __name__ == "__main__":
    main()
