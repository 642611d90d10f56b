#!/usr/bin/env python3
"""The libraries that bypass the CUDA runtime, under cudaw's driver layer. Each check
prints one line, `PASS | name | detail` or `FAIL | name | detail`; the exit status is 0
only if all passed.

    python3 examples/torch_driver.py step                      # native: prints digests
    CUDAW_KERNEL_COUNTS=counts.txt cudaw run -- python3 examples/torch_driver.py step
    cudaw run -- python3 examples/torch_driver.py pause --ckpt dist/bin/cudaw-ckpt

`step` runs one training-like step whose work goes through cuBLAS (matmuls), cuDNN (a
convolution, deterministic algorithms) and Triton (a torch.compile'd function) and prints
`digest NAME SHA256` for each result, so that a native run and a run under cudaw can be
compared byte for byte; under cudaw it also reads the driver layer's live launch counts
(`cudaw_driver_launch_counts_v1` in the process's libcuda.so.1) and checks that kernels of
each library were counted by name.

`pause` compiles a Triton kernel; a helper process pauses this one through `cudaw-ckpt
pause`, waits 1.5 s and resumes it; meanwhile this process launches the kernel, and checks
that the launch returned only after the resume began, counted once, with the right result.
"""
import argparse
import ctypes
import faulthandler
import hashlib
import json
import os
import subprocess
import sys
import time

# cuBLAS reproducible from run to run (set before torch loads it), as in torch_train.py.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import torch  # noqa: E402

failures = 0


def report(ok, name, detail=""):
    global failures
    if not ok:
        failures += 1
    print(f"{'PASS' if ok else 'FAIL'} | {name} | {detail}", flush=True)


def digest(name, t):
    data = t.detach().reshape(-1).contiguous().cpu().view(torch.uint8).numpy().tobytes()
    print(f"digest {name} {hashlib.sha256(data).hexdigest()}", flush=True)


def driver_counts():
    """The driver layer's launch counts, or None when it is not in the process."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
        f = lib.cudaw_driver_launch_counts_v1
    except (OSError, AttributeError):
        return None
    f.restype = ctypes.c_size_t
    f.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
    n = f(None, 0)
    # The counts may grow between the two calls (another thread launching): ask again
    # with room to spare until the text fits.
    for _ in range(10):
        buf = ctypes.create_string_buffer(n + 4096)
        need = f(buf, len(buf))
        if need < len(buf):
            return json.loads(buf.value.decode())
        n = need
    raise RuntimeError("the driver layer's launch counts kept growing past the buffer")


# Kernel-name patterns of each library (cuBLAS's GEMMs, cuDNN's convolutions, Inductor's
# Triton kernels).
FAMILIES = {
    "cuBLAS matmul": ("gemm", "sm90_xmma", "cutlass", "Kernel2"),
    "cuDNN convolution": ("conv", "fprop", "implicit", "cudnn", "xmma_fprop", "wgrad", "dgrad"),
    "Triton (torch.compile)": ("triton_",),
}
# cuDNN's implicit-GEMM convolutions match the cuBLAS patterns too: they do not count as
# cuBLAS matmuls.
NOT_IN = {"cuBLAS matmul": FAMILIES["cuDNN convolution"]}


def in_family(family, name):
    n = name.lower()
    return (any(p.lower() in n for p in FAMILIES[family])
            and not any(p.lower() in n for p in NOT_IN.get(family, ())))


def step():
    torch.manual_seed(1234)
    # Deterministic kernels (and no Inductor autotuning between reduction orders): the
    # digests of a native run and a run under cudaw must not differ for other reasons.
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dev = "cuda"
    a = torch.randn(512, 768, device=dev)
    b = torch.randn(768, 256, device=dev)
    w = torch.randn(256, 128, device=dev, requires_grad=True)
    img = torch.randn(8, 3, 64, 64, device=dev)
    conv = torch.nn.Conv2d(3, 16, 3, padding=1).to(dev)

    @torch.compile
    def fused(x, y):
        return torch.nn.functional.gelu(x) * torch.sigmoid(y) + x.square().mean()

    before = driver_counts()
    h = a @ b  # cuBLAS
    out = (h @ w).relu()  # cuBLAS
    c = conv(img)  # cuDNN
    f = fused(h, h.flip(0))  # Triton
    loss = out.sum() + c.float().square().mean() + f.mean()
    loss.backward()  # more cuBLAS and cuDNN
    torch.cuda.synchronize()
    for name, t in [("matmul", out), ("conv", c), ("compiled", f), ("loss", loss),
                    ("grad_w", w.grad), ("grad_conv", conv.weight.grad)]:
        digest(name, t)
    after = driver_counts()
    if after is None:
        print("info | driver layer | not in this process (a native run)", flush=True)
        return
    kernels = after["kernels"]
    print(f"info | driver layer | {sum(kernels.values())} launches of {len(kernels)} kernels, "
          f"{after['modules_loaded']} modules loaded", flush=True)
    for family in FAMILIES:
        hits = {k: n for k, n in kernels.items() if in_family(family, k)}
        total = sum(hits.values())
        example = max(hits, key=hits.get)[:70] if hits else "-"
        report(total > 0, f"counted by name: {family}",
               f"{total} launches of {len(hits)} kernels, e.g. {example}")
    report(before is not None and sum(kernels.values()) > sum(before["kernels"].values()),
           "the step's launches were counted", "")


# The helper process that pauses and resumes this one: a Python thread of this process
# cannot, since a thread held at the gate in a call that keeps the GIL (PyTorch's
# current_device(), say) holds every other thread too.
HELPER = """
import subprocess, sys, time
ckpt, pid = sys.argv[1], sys.argv[2]
r = subprocess.run([ckpt, "pause", pid], capture_output=True, text=True, timeout=120)
print("paused", r.returncode, (r.stdout + r.stderr).strip().replace("\\n", " ")[:100], flush=True)
time.sleep(1.5)
t = time.monotonic()
r = subprocess.run([ckpt, "resume", pid], capture_output=True, text=True, timeout=120)
print("resumed", r.returncode, repr(t), flush=True)
"""


def pause(ckpt):
    import triton
    import triton.language as tl

    @triton.jit
    def add_one(x_ptr, n, BLOCK: tl.constexpr):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = i < n
        tl.store(x_ptr + i, tl.load(x_ptr + i, mask=m) + 1.0, mask=m)

    n = 1 << 20
    x = torch.zeros(n, device="cuda")
    add_one[(n // 1024,)](x, n, BLOCK=1024)  # compile and load it
    torch.cuda.synchronize()

    def launches():
        c = driver_counts()
        return None if c is None else sum(v for k, v in c["kernels"].items() if "add_one" in k)

    base = launches()
    report(base == 1, "Triton kernel counted by name", f"add_one launches {base}")
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    helper = subprocess.Popen([sys.executable, "-c", HELPER, ckpt, str(os.getpid())],
                              stdout=subprocess.PIPE, text=True, env=env)
    paused = helper.stdout.readline().split(maxsplit=2)
    report(paused[:2] == ["paused", "0"], "paused through cudaw-ckpt", " ".join(paused[2:]))
    asked = time.monotonic()
    add_one[(n // 1024,)](x, n, BLOCK=1024)  # waits at the gate until the helper resumes
    returned = time.monotonic()
    resumed = helper.stdout.readline().split()
    helper.wait(60)
    report(resumed[:2] == ["resumed", "0"], "resumed through cudaw-ckpt", " ".join(resumed))
    resumed_at = float(resumed[2]) if len(resumed) > 2 else float("inf")
    report(returned >= resumed_at, "Triton launch waits while paused, returns after resume",
           f"returned {(returned - asked) * 1000:.0f} ms after it was made, "
           f"{(returned - resumed_at) * 1000:.1f} ms after the resume began")
    torch.cuda.synchronize()
    report(launches() == base + 1, "launched once", f"{launches()}")
    report(bool((x == 2.0).all()), "Triton result correct", f"x[0]={x[0].item()}")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["step", "pause"])
    p.add_argument("--ckpt", default="cudaw-ckpt")
    p.add_argument("--watchdog", type=float, default=300,
                   help="seconds after which every thread's stack is printed and the run ends")
    args = p.parse_args()
    faulthandler.dump_traceback_later(args.watchdog, exit=True)
    step() if args.mode == "step" else pause(args.ckpt)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
