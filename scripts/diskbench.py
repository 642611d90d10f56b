#!/usr/bin/env python3
"""Checkpoints to disk against the disk itself (issue #27's figures): a process holding SIZE
GiB under cudaw (tests/cuda/gpu/pause/pause_target.cu) is dumped to a folder, resumed from
the image, and restored from it, each timed beside the disk's own ceiling in the same run:

  dump      `cudaw-ckpt dump PID -o DIR/img.cudaw` of the paused process (its write_ms)
            against `dd if=/dev/zero of=DIR/dd.bin bs=16M count=.. conv=fsync` (same size,
            same folder): the goal is >= 90% of dd's throughput.
  resume    `cudaw-ckpt resume PID` loading the memory back from the image.
  restore   `cudaw-ckpt restore PID -i DIR/img.cudaw` (one read: each chunk checked as it
            loads, the digest at the end) against one read of the image (`dd if=img of=/dev/null bs=16M`): the goal is <= 1.1x that read.
            The page cache is dropped before each read where this user may
            (/proc/sys/vm/drop_caches), else reads use O_DIRECT and the rows say so.

After every step the process checks every word of its memory ("verified ok").
Prints `PASS | name | detail` / `FAIL | ...` / `INFO | ...` lines and exits 0 when all passed.

    scripts/diskbench.py --bin DIR_WITH_pause_target --dist dist --dir /scratch --gib 16
"""
import argparse
import json
import os
import subprocess
import sys
import time

verdicts = []


def verdict(ok, name, detail):
    if ok is not None:
        verdicts.append(ok)
    word = "INFO" if ok is None else ("PASS" if ok else "FAIL")
    print(f"{word} | {name} | {detail}", flush=True)


def drop_caches():
    """Drops the page cache: True if done (root), False if this user may not."""
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def timed(cmd, env=None):
    t = time.monotonic()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)
    return time.monotonic() - t, p


class Target:
    """pause_target under cudaw, spoken to over stdin/stdout."""

    def __init__(self, args, env):
        self.p = subprocess.Popen([os.path.join(args.dist, "bin", "cudaw"), "run", "--",
                                   os.path.join(args.bin, "pause_target"), str(args.gib)],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=open(os.path.join(args.dir, "target.err"), "w"),
                                  text=True, env=env)
        line = self.p.stdout.readline()
        if not line.startswith("ready"):
            raise RuntimeError(f"pause_target did not start: {line!r}")

    def ask(self, word):
        self.p.stdin.write(word + "\n")
        self.p.stdin.flush()
        return self.p.stdout.readline().strip()

    def end(self):
        """Asks it to quit without waiting for an answer (a process left paused by a failed
        step never answers); killed if it has not ended within a minute."""
        try:
            self.p.stdin.write("quit\n")
            self.p.stdin.close()
            self.p.wait(timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            self.p.kill()
            self.p.wait()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", required=True, help="folder with pause_target")
    ap.add_argument("--dist", required=True)
    ap.add_argument("--dir", required=True, help="the folder on the disk to measure")
    ap.add_argument("--gib", type=float, default=16)
    args = ap.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    run_dir = os.path.join(args.dir, "run")
    os.makedirs(run_dir, mode=0o700, exist_ok=True)
    env = dict(os.environ, CUDAW_RUN_DIR=run_dir, CUDAW_LOG="info")
    ckpt = os.path.join(args.dist, "bin", "cudaw-ckpt")
    img = os.path.join(args.dir, "img.cudaw")
    size = int(args.gib * (1 << 30))
    gib = f"{args.gib:g} GiB"

    # The disk's write ceiling: dd of the same size into the same folder, fsync'ed.
    dd_out = os.path.join(args.dir, "dd.bin")
    s, p = timed(["dd", "if=/dev/zero", f"of={dd_out}", "bs=16M", f"count={size >> 24}", "conv=fsync"])
    os.unlink(dd_out)
    dd_write = size / s / 1e9
    verdict(p.returncode == 0, f"dd conv=fsync {gib} (the write ceiling)", f"{s:.2f} s, {dd_write:.2f} GB/s")

    try:
        t = Target(args, env)
    except (OSError, RuntimeError) as e:
        verdict(False, f"pause_target {gib} under cudaw", f"{e}; see target.err")
        return
    try:
        pid = str(t.p.pid)

        def ok(r):
            try:
                return json.loads(r.stdout.strip().splitlines()[-1]) if r.returncode == 0 else None
            except (ValueError, IndexError):
                return None
        p = subprocess.run([ckpt, "pause", pid, "--json"], capture_output=True, text=True, env=env)
        if p.returncode != 0:
            verdict(False, "pause", p.stdout + p.stderr)
            return
        # Dump of the paused process: only the write is timed (write_ms).
        s, p = timed([ckpt, "dump", pid, "-o", img, "--json"], env)
        d = ok(p)
        if d is None:
            verdict(False, f"dump {gib}", (p.stdout + p.stderr)[-300:])
            return
        w = d["image_bytes"] / (d["write_ms"] / 1e3) / 1e9
        verdict(w >= 0.9 * dd_write, f"dump {gib}: >= 90% of dd",
                f"write {d['write_ms'] / 1e3:.2f} s, {w:.2f} GB/s = {w / dd_write:.2f} of dd "
                f"({dd_write:.2f} GB/s); whole request {s:.2f} s")
        # One read of the image: the read ceiling.
        dropped = drop_caches()
        read_cmd = ["dd", f"if={img}", "of=/dev/null", "bs=16M"] + ([] if dropped else ["iflag=direct"])
        s_read, p = timed(read_cmd)
        how = "page cache dropped" if dropped else "O_DIRECT (caches could not be dropped)"
        verdict(p.returncode == 0, "one read of the image (the read ceiling)",
                f"{s_read:.2f} s, {d['image_bytes'] / s_read / 1e9:.2f} GB/s ({how})")
        # Resume from the image (the memory is only there after the dump).
        drop_caches()
        s, p = timed([ckpt, "resume", pid, "--json"], env)
        r = ok(p)
        verdict(r is not None and t.ask("verify") == "verified ok", f"resume {gib} from the image",
                f"{s:.2f} s = {s / s_read:.2f}x one read" if r else (p.stdout + p.stderr)[-300:])
        # Restore (one read, checked as it loads): against one read.
        drop_caches()
        s, p = timed([ckpt, "restore", pid, "-i", img, "--json"], env)
        r = ok(p)
        if r is None:
            verdict(False, f"restore {gib}", (p.stdout + p.stderr)[-300:])
            return
        intact = t.ask("verify") == "verified ok"
        verdict(intact, f"restore {gib}: memory intact", "verified ok" if intact else "verify failed")
        verdict(s <= 1.1 * s_read, f"restore {gib}: <= 1.1x one read",
                f"{s:.2f} s = {s / s_read:.2f}x one read ({s_read:.2f} s); digest check {r['verify_ms'] / 1e3:.2f} s, "
                f"load {r['load_ms'] / 1e3:.2f} s, pause {(r.get('pause') or {}).get('ms', 0) / 1e3:.2f} s")
    finally:
        t.end()
        try:
            os.unlink(img)
        except OSError:
            pass


if __name__ == "__main__":
    main()
    sys.exit(0 if verdicts and all(verdicts) else 1)
