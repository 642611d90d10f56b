#!/usr/bin/env python3
"""A compute-bound PyTorch job, for the node scheduler's checks (scripts/sharing_check.py,
gpu-check.sh's `sharing` and `swap` sections).

Spin (the default): steps of --matmuls bf16 matmuls of --size x --size on the GPU, each
step waited for, for --seconds of wall time or --steps steps. One line a second,
`t=<s> steps=<n> at=<unix s>` (the first at t=0, the last at the end), then
`rate=<steps/s> steps=<n> seconds=<s>`: a job's share of the GPU is its rate beside
others against its rate alone; then `steps_ms p50=<ms> p99=<ms> max=<ms>`, what its steps
took (a step that waited for other jobs' quanta takes longer: the latency a quantum costs).

--train: a small deterministic training loop instead (an MLP of --depth layers of
--width, TF32 matmuls, SGD with momentum, deterministic algorithms, seeded by --seed): the
loss every 100 steps and at the end as exact hex floats and the weights' SHA-256, so two
runs with the same --seed and --steps print the same `loss`, `held` and `final` lines, bit
for bit. With --seconds it trains that long and says how many steps it took (`final ...
steps=<n>`): run it again with --steps N to compare.

--hold-gib N: first hold N GiB (int64 chunks of 1 GiB, a known pattern made in place, so
no transient copy needs room), checked word for word at the end (`held N GiB intact True`).

--go FILE: after the warm-up print `ready pid=<pid> at=<unix s>` and wait until FILE exists
before the clock starts, so that several jobs start their measured work together.

    python3 examples/torch_spin.py --seconds 20
    python3 examples/torch_spin.py --seconds 40 --go /tmp/go
    python3 examples/torch_spin.py --train --hold-gib 35 --seed 1 --seconds 25
    python3 examples/torch_spin.py --train --hold-gib 35 --seed 1 --steps 4000
"""
import argparse
import hashlib
import os
import sys
import time

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
import torch  # noqa: E402

CHUNK = 1 << 27  # int64 words: 1 GiB
MULT = 2654435761
VERIFY = 1 << 25  # int64 words compared at a time: 256 MiB of scratch


def say(text):
    print(text, flush=True)


def hold(gib, dev):
    """GiB of int64 chunks, word j of chunk i = j * MULT + i, made in place."""
    chunks, left = [], int(gib * (1 << 30)) // 8
    while left > 0:
        k = min(left, CHUNK)
        chunks.append(torch.arange(k, dtype=torch.int64, device=dev).mul_(MULT).add_(len(chunks)))
        left -= k
    torch.cuda.synchronize()
    return chunks


def intact(chunks, dev):
    ok = True
    for i, t in enumerate(chunks):
        for s in range(0, t.numel(), VERIFY):
            e = min(s + VERIFY, t.numel())
            want = torch.arange(s, e, dtype=torch.int64, device=dev).mul_(MULT).add_(i)
            ok &= bool(torch.equal(t[s:e], want))
            del want
    return ok


class Clock:
    """Steps against wall time: a line a second, the first at 0 and the last at the end."""

    def __init__(self, args):
        self.args = args
        self.t0 = time.monotonic()
        self.next = 1.0
        self.steps = 0
        self.line()

    def line(self):
        say(f"t={time.monotonic() - self.t0:.3f} steps={self.steps} at={time.time():.3f}")

    def tick(self):
        """One more step done; False once the job's steps or seconds are used up."""
        self.steps += 1
        el = time.monotonic() - self.t0
        if el >= self.next:
            self.line()
            self.next = int(el) + 1.0
        if self.args.steps is not None:
            return self.steps < self.args.steps
        return el < self.args.seconds

    def end(self):
        el = time.monotonic() - self.t0
        self.line()
        return el


def wait_go(args):
    say(f"ready pid={os.getpid()} at={time.time():.3f}")
    if not args.go:
        return
    deadline = time.monotonic() + args.go_timeout
    while not os.path.exists(args.go):
        if time.monotonic() > deadline:
            sys.exit(f"torch_spin: {args.go} did not appear within {args.go_timeout:g} s")
        time.sleep(0.01)


def spin(args, dev):
    a = torch.randn(args.size, args.size, device=dev, dtype=torch.bfloat16)
    b = torch.randn(args.size, args.size, device=dev, dtype=torch.bfloat16)
    c = torch.empty_like(a)

    def step():
        for _ in range(args.matmuls):
            torch.matmul(a, b, out=c)
        torch.cuda.synchronize()

    for _ in range(3):
        step()
    wait_go(args)
    clock = Clock(args)
    took = []
    while True:
        t = time.monotonic()
        step()
        took.append(time.monotonic() - t)
        if not clock.tick():
            break
    el = clock.end()
    say(f"rate={clock.steps / el:.4f} steps={clock.steps} seconds={el:.3f}")
    say(step_times(took))


def step_times(took):
    """`steps_ms p50=<ms> p99=<ms> max=<ms>`: what a step took, waits for other jobs'
    quanta included (the latency the scheduler's quantum costs a job)."""
    took = sorted(took)

    def at(q):
        return 1e3 * took[min(len(took) - 1, int(q * len(took)))]

    return f"steps_ms p50={at(0.5):.2f} p99={at(0.99):.2f} max={1e3 * took[-1]:.2f}"


def train(args, dev):
    torch.manual_seed(args.seed)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.use_deterministic_algorithms(True)
    layers = []
    for _ in range(args.depth):
        layers += [torch.nn.Linear(args.width, args.width, device=dev), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers[:-1])
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    g = torch.Generator(device=dev).manual_seed(args.seed)
    x = torch.randn(4, args.batch, args.width, device=dev, generator=g)
    y = torch.randn(4, args.batch, args.width, device=dev, generator=g)
    wait_go(args)
    clock = Clock(args)
    loss = None
    while True:
        i = clock.steps
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(model(x[i % 4]), y[i % 4])
        loss.backward()
        opt.step()
        if (i + 1) % 100 == 0:
            say(f"loss {i + 1} {loss.item().hex()}")
        if not clock.tick():
            break
    torch.cuda.synchronize()
    h = hashlib.sha256()
    for t in model.state_dict().values():
        h.update(t.detach().cpu().numpy().tobytes())
    return clock, loss.item(), h.hexdigest()[:16]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=20.0, help="wall time of the measured work (default 20)")
    p.add_argument("--steps", type=int, default=None, help="steps instead of --seconds")
    p.add_argument("--size", type=int, default=8192, help="spin: the matrices' side (default 8192)")
    p.add_argument("--matmuls", type=int, default=4, help="spin: matmuls a step (default 4)")
    p.add_argument("--train", action="store_true", help="a deterministic training loop instead of the spin")
    p.add_argument("--width", type=int, default=4096, help="--train: layer width (default 4096)")
    p.add_argument("--depth", type=int, default=3, help="--train: layers (default 3)")
    p.add_argument("--batch", type=int, default=4096, help="--train: batch (default 4096)")
    p.add_argument("--seed", type=int, default=0, help="--train: the model's and the data's seed")
    p.add_argument("--hold-gib", type=float, default=0, help="first hold this many GiB, checked at the end")
    p.add_argument("--go", help="after the warm-up, wait for this file before the clock starts")
    p.add_argument("--go-timeout", type=float, default=600, help="seconds to wait for --go (default 600)")
    args = p.parse_args()
    if args.steps is not None and args.steps < 1:
        p.error(f"--steps {args.steps}: expected 1 or more")

    dev = torch.device("cuda")
    torch.zeros(1, device=dev)
    torch.cuda.synchronize()
    say(f"begin pid={os.getpid()} at={time.time():.3f}")
    held = hold(args.hold_gib, dev) if args.hold_gib > 0 else None
    if held is not None:
        say(f"holding {args.hold_gib:g} GiB at={time.time():.3f}")
    if args.train:
        clock, last, digest = train(args, dev)
    else:
        spin(args, dev)
    if held is not None:
        say(f"held {args.hold_gib:g} GiB intact {intact(held, dev)}")
    if args.train:
        el = clock.end()
        say(f"final loss {last.hex()} weights_sha256 {digest} steps={clock.steps}")
        say(f"train_s={el:.3f} rate={clock.steps / el:.4f}")
    say(f"end at={time.time():.3f}")


if __name__ == "__main__":
    main()
