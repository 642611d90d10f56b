"""What the driver's own checkpoint of a PyTorch context costs, and what freeing the
context's stack memory (cuCtxSetLimit(CU_LIMIT_STACK_SIZE, 0)) before it saves: the
measurement behind crates/engine/src/slim.rs. GPU only, no cudaw involved.

    python3 scripts/context_checkpoint_probe.py

A child process makes a PyTorch context (matmuls, a 1 GiB tensor); this process checkpoints
and restores it twice with cuCheckpointProcess* (nvidia-smi's MiB while checkpointed), has
the child set its stack limit to 0, does the same twice more, then has the child set the
limit back and run a matmul. Prints one line per step."""
import ctypes, os, subprocess, sys, time

def smi(pid):
    out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True).stdout
    for l in out.splitlines():
        p, m = [x.strip() for x in l.split(",")]
        if int(p) == pid:
            return int(m)
    return 0

def target(d):
    import torch
    x = torch.randn(4096, 4096, device="cuda")
    for _ in range(3):
        y = x @ x
    big = torch.empty(1 << 28, dtype=torch.float32, device="cuda")  # 1 GiB
    torch.cuda.synchronize()
    cu = ctypes.CDLL("libcuda.so.1")
    v = ctypes.c_size_t()
    for lim, name in [(0, "stack"), (1, "printf"), (2, "heap")]:
        cu.cuCtxGetLimit(ctypes.byref(v), lim)
        print(f"target: limit {name} {v.value}", flush=True)
    open(f"{d}/ready", "w").close()
    while not os.path.exists(f"{d}/shrink"):
        time.sleep(0.01)
    cu.cuCtxGetLimit(ctypes.byref(v), 0); old = v.value
    for want in (0, 16):
        r = cu.cuCtxSetLimit(0, ctypes.c_size_t(want))
        cu.cuCtxGetLimit(ctypes.byref(v), 0)
        print(f"target: set stack {want}: rc {r}, now {v.value}", flush=True)
    open(f"{d}/shrunk", "w").close()
    while not os.path.exists(f"{d}/grow"):
        time.sleep(0.01)
    r = cu.cuCtxSetLimit(0, ctypes.c_size_t(old))
    y = x @ x
    torch.cuda.synchronize()
    print(f"target: stack back to {old}: rc {r}; matmul ok {bool(torch.isfinite(y).all())}", flush=True)
    open(f"{d}/grown", "w").close()
    while not os.path.exists(f"{d}/end"):
        time.sleep(0.01)

def wait(p):
    while not os.path.exists(p):
        time.sleep(0.01)

def cycle(cu, pid, label):
    a = (ctypes.c_uint64 * 8)()
    t0 = time.time(); r1 = cu.cuCheckpointProcessLock(pid, a)
    t1 = time.time(); r2 = cu.cuCheckpointProcessCheckpoint(pid, (ctypes.c_uint64 * 8)())
    t2 = time.time(); m = smi(pid)
    t3 = time.time(); r3 = cu.cuCheckpointProcessRestore(pid, (ctypes.c_uint64 * 8)())
    t4 = time.time(); r4 = cu.cuCheckpointProcessUnlock(pid, (ctypes.c_uint64 * 8)())
    t5 = time.time()
    print(f"{label}: rc {r1} {r2} {r3} {r4}; lock {1e3*(t1-t0):.0f} ms, checkpoint {1e3*(t2-t1):.0f} ms, "
          f"restore {1e3*(t4-t3):.0f} ms, unlock {1e3*(t5-t4):.0f} ms; MiB while checkpointed {m}", flush=True)

def ctl():
    d = f"/tmp/ctxprobe.{os.getpid()}"
    os.makedirs(d, mode=0o700)
    t = subprocess.Popen([sys.executable, __file__, "target", d])
    wait(f"{d}/ready")
    cu = ctypes.CDLL("libcuda.so.1")
    t0 = time.time(); r = cu.cuInit(0); print(f"ctl: cuInit rc {r} {1e3*(time.time()-t0):.0f} ms", flush=True)
    print(f"ctl: target MiB {smi(t.pid)}", flush=True)
    cycle(cu, t.pid, "default")
    cycle(cu, t.pid, "default again")
    open(f"{d}/shrink", "w").close(); wait(f"{d}/shrunk")
    time.sleep(0.2)
    print(f"ctl: target MiB after stack shrink {smi(t.pid)}", flush=True)
    cycle(cu, t.pid, "shrunk")
    cycle(cu, t.pid, "shrunk again")
    open(f"{d}/grow", "w").close(); wait(f"{d}/grown")
    print(f"ctl: target MiB after stack back {smi(t.pid)}", flush=True)
    open(f"{d}/end", "w").close()
    t.wait()

if __name__ == "__main__":
    target(sys.argv[2]) if len(sys.argv) > 1 and sys.argv[1] == "target" else ctl()
