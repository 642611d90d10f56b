#!/usr/bin/env python3
"""GPU check: a PyTorch process with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
(its memory from cuMemCreate + cuMemMap through cudaGetDriverEntryPoint) paused with
cudaw-ckpt: nvidia-smi's GPU memory use must drop by at least 90% of the tensors' bytes,
`cudaw-ckpt status` must show 0 bytes mapped beyond what it reports held, and after resume
the tensors must be bit-identical. Then a dump (the image must hold the expandable
segments' handle ranges, the GPU memory released while the process waits on the image), a
resume from the image, a dump --leave-running and a restore of it: the tensors intact after
each. Last, the same tensors in a process without expandable segments (`cudaMalloc`
memory) are paused and resumed as many times: the expandable resume's median must be
within 10% of it (issue 27). Prints `PASS | name | detail` / `FAIL | ...` lines.

    python3 scripts/torch_expandable_check.py --dist dist --gib 4 --cycles 3

Exits 0 only when every check passed. The image goes to a temporary folder and is removed.
"""
import argparse, json, os, subprocess, sys, tempfile, time

from lines import Lines

CHILD = r'''
import sys, torch
gib = int(sys.argv[1])
n = gib * (1 << 30) // 4 // 8
ts = [torch.arange(n, dtype=torch.int32, device="cuda") * (i + 3) for i in range(8)]
sums = [int(t.sum(dtype=torch.int64)) for t in ts]
torch.cuda.synchronize()
print("ready", flush=True)
for line in sys.stdin:
    ok = all(int(t.sum(dtype=torch.int64)) == s for t, s in zip(ts, sums))
    print("ok" if ok else "bad", flush=True)
'''


def used_mib():
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=30).stdout
        return int(out.split()[0])
    except Exception:
        return None


verdicts = []


def verdict(ok, name, detail):
    verdicts.append(ok)
    print(f"{'PASS' if ok else 'FAIL'} | {name} | {detail}", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dist", required=True)
    ap.add_argument("--gib", type=int, default=4)
    ap.add_argument("--cycles", type=int, default=3)
    a = ap.parse_args()
    p, next_line = start(a, expandable=True)
    ckpt = lambda *w: subprocess.run([os.path.join(a.dist, "bin", "cudaw-ckpt"), *w, "--json"],
                                     capture_output=True, text=True, timeout=300)
    work = tempfile.mkdtemp(prefix="cudaw-expandable-")
    img = os.path.join(work, "expandable.img")
    resumes = []
    try:
        if next_line() != "ready":
            verdict(False, "expandable: start", "the PyTorch process did not get ready")
            return 1
        time.sleep(1)
        for c in range(a.cycles):
            before = used_mib()
            r = ckpt("pause", str(p.pid))
            time.sleep(1)
            during = used_mib()
            st = ckpt("status", str(p.pid))
            try:
                dev = json.loads(st.stdout)["devices"][0]
            except Exception:
                dev = {}
            freed = (before - during) if before is not None and during is not None else None
            want = a.gib * 1024 * 0.9
            verdict(r.returncode == 0 and freed is not None and freed >= want,
                    f"expandable: pause {c} frees memory (nvidia-smi)",
                    f"{before} -> {during} MiB used, freed {freed} MiB (want >= {want:.0f}); {r.stdout.strip()[:120]}")
            verdict(dev.get("mapped", -1) == dev.get("held", 0) and dev.get("handles", 0) > 0,
                    f"expandable: pause {c} status",
                    f"handles {dev.get('handles')}, mapped {dev.get('mapped')}, held {dev.get('held')}, evicted {dev.get('evicted')}")
            r = ckpt("resume", str(p.pid))
            p.stdin.write("check\n"); p.stdin.flush()
            line = next_line()
            verdict(r.returncode == 0 and line == "ok", f"expandable: resume {c} intact", f"{line}; {r.stdout.strip()[:120]}")
            resumes.append(ms_of(r))
        def check(name, r):
            p.stdin.write("check\n"); p.stdin.flush()
            line = next_line()
            verdict(r.returncode == 0 and line == "ok", name, f"{line}; {r.stdout.strip()[:160]}")

        before = used_mib()
        t0 = time.time()
        d = ckpt("dump", str(p.pid), "-o", img)
        dump_s = time.time() - t0
        during = used_mib()
        i = ckpt("inspect", img)
        try:
            v = json.loads(i.stdout)
        except Exception:
            v = {}
        freed = (before - during) if before is not None and during is not None else None
        want = a.gib * 1024 * 0.9
        verdict(d.returncode == 0 and v.get("handle_ranges", 0) > 0 and v.get("handle_bytes", 0) >= a.gib << 30
                and freed is not None and freed >= want,
                "expandable: dump holds the handles",
                f"{v.get('handle_ranges')} ranges, {v.get('handle_bytes')} bytes in {dump_s:.1f} s; "
                f"{before} -> {during} MiB used (want freed >= {want:.0f}); {d.stdout.strip()[:120]}")
        check("expandable: resume from the image intact", ckpt("resume", str(p.pid)))
        d = ckpt("dump", str(p.pid), "-o", img, "--leave-running")
        check("expandable: dump --leave-running intact", d)
        t0 = time.time()
        r = ckpt("restore", str(p.pid), "-i", img)
        check(f"expandable: restore intact ({time.time() - t0:.1f} s)", r)
    except Exception as e:  # noqa: BLE001 - a failure is a verdict; the child must not be left behind
        verdict(False, "expandable: the check ran to its end", f"{type(e).__name__}: {e}")
    finally:
        end(a, p)
        try:
            os.remove(img)
            os.rmdir(work)
        except OSError:
            pass
    if resumes and None not in resumes:
        plain = plain_resumes(a, ckpt)
        if plain:
            e, c = median(resumes), median(plain)
            verdict(e <= 1.1 * c, "expandable: resume within 10% of cudaMalloc memory's",
                    f"median {e:.1f} ms against {c:.1f} ms = {e / c:.2f}x over {len(resumes)} resumes each "
                    f"(expandable {', '.join(f'{x:.0f}' for x in resumes)}; cudaMalloc {', '.join(f'{x:.0f}' for x in plain)} ms)")
    return 0 if verdicts and all(verdicts) else 1


def ms_of(r):
    """The `ms` of a pause or resume's JSON answer, or None."""
    try:
        return float(json.loads(r.stdout.strip().splitlines()[-1])["ms"])
    except (ValueError, KeyError, IndexError, TypeError):
        return None


def median(xs):
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2


def plain_resumes(a, ckpt):
    """The same tensors from cudaMalloc (no expandable segments), paused and resumed
    `a.cycles` times: each resume's ms, or [] (with a FAIL) when it did not run through."""
    p, next_line = start(a, expandable=False)
    out = []
    try:
        if next_line() != "ready":
            verdict(False, "expandable: the cudaMalloc process", "did not get ready")
            return []
        time.sleep(1)
        for _ in range(a.cycles):
            r = ckpt("pause", str(p.pid))
            if r.returncode != 0:
                verdict(False, "expandable: the cudaMalloc process paused", r.stdout.strip()[:160] + r.stderr.strip()[:160])
                return []
            time.sleep(1)
            r = ckpt("resume", str(p.pid))
            p.stdin.write("check\n"); p.stdin.flush()
            line = next_line()
            if r.returncode != 0 or line != "ok" or ms_of(r) is None:
                verdict(False, "expandable: the cudaMalloc process resumed intact", f"{line}; {r.stdout.strip()[:160]}")
                return []
            out.append(ms_of(r))
        return out
    except Exception as e:  # noqa: BLE001 - a failure is a verdict; the child must not be left behind
        verdict(False, "expandable: the cudaMalloc comparison ran to its end", f"{type(e).__name__}: {e}")
        return []
    finally:
        end(a, p)


def start(a, expandable):
    """The child under cudaw, with PyTorch's expandable segments or without: the process
    and its next-line reader."""
    conf = f"expandable_segments:{expandable}"
    env = dict(os.environ, PYTORCH_CUDA_ALLOC_CONF=conf, CUDAW_LOG="info")
    p = subprocess.Popen([os.path.join(a.dist, "bin", "cudaw"), "run", "--", sys.executable, "-c", CHILD, str(a.gib)],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    return p, Lines(p.stdout).next


def end(a, p):
    """Ends a child: never left paused (it would wait for ever), so resumed first; its
    input closed (it then exits), killed if it has not within two minutes."""
    if p.poll() is None:
        subprocess.run([os.path.join(a.dist, "bin", "cudaw-ckpt"), "resume", str(p.pid)],
                       capture_output=True, timeout=300)
    try:
        p.stdin.close()
    except OSError:
        pass
    try:
        p.wait(timeout=120)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()


sys.exit(main())
