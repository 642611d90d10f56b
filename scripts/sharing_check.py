#!/usr/bin/env python3
"""`cudaw node` sharing one GPU between PyTorch jobs (gpu-check.sh's `sharing` and `swap`
sections, issue #28), in one run each:

  --parts overhead fairness limit   (the `sharing` section, about 5.5 minutes)
  1. Solo: one compute-bound job (examples/torch_spin.py: steps of bf16 8192x8192 matmuls,
     its step rate read from its one-line-a-second progress) alone, without the daemon
     (plain `cudaw run`, its own run folder) and under the daemon with request 1.0, in
     turn: plain, daemon, plain, daemon, plain (--pairs 2). Each daemon run is set against
     the mean of the plain runs either side of it (the GPU's clock drifts over minutes).
     Overhead: the median of those ratios >= 0.99. The plain runs' mean is "solo" below.
  2. Fairness: jobs run together under the daemon for --seconds, started at one instant
     (each warms up, then waits for a go file), measured over the window in which all of
     them run (from 2 s after the start to the first one's end). A job's share = its step
     rate together / solo. Judged on the shares normalised by their sum when the sum is
     below 1 (the shares of the GPU the jobs got between them; the raw shares otherwise):
       0.25 / 0.75   each within +-0.05 (absolute);
       0.10 / 0.90   each within +-10% of its target (relative: 0.09-0.11 and 0.81-0.99;
                     +-0.10 absolute would pass 0.0-0.2, a band HAMi's 1:6-8 falls in);
       4 x 0.25      each within +-0.05 (absolute), when the budget leaves time.
     The daemon's own accounting (`achieved_share` of `cudaw node status --json`, read in
     the window; normalised by the jobs' sum: it is a share of the last minute, which
     began before the jobs did) is judged the same way; its Prometheus /metrics must list
     cudaw_node_gpu_share for every job. Aggregate throughput: the raw shares' sum >= 0.95
     for each pair (running them one after the other is 1.0); 4 jobs: information.
  3. Limit: one job alone with request 0, limit 0.3: its rate <= 0.33 of solo.

  --parts swap                       (the `swap` section, about 5 minutes)
  4. Three training jobs (torch_spin.py --train: an MLP, deterministic; each holding
     --hold-gib GiB of a known pattern, checked at the end) on one GPU that holds two:
     each alone first (plain `cudaw run`, --swap-seconds of training: the steps it took
     are the steps of the shared run); then under the daemon, started one after another
     (each once the previous one holds its memory; `--alloc-wait 120s`): all finish, each
     bit-identical to its solo run (every 100th loss and the final one as exact hex
     floats, the weights' SHA-256, the held buffer), aggregate throughput = the solo runs'
     spans (first GPU work to the end) summed / the shared run's span >= 0.80. Then
     without the daemon (plain `cudaw run`, no --alloc-wait): two jobs hold their memory,
     the third fails with out-of-memory (its error line shown).

Every phase's daemon runs with its own configuration and run folder (`cudaw node --config
FILE --run-dir DIR --socket DIR/node.sock --metrics 127.0.0.1:PORT`; the jobs find the
socket in their run folder, CUDAW_RUN_DIR) and is stopped with SIGTERM at the phase's end;
its log is daemon-PHASE.log in --work. Every child is killed in finally blocks.

Prints `PASS | name | detail`, `FAIL | ...` and `info | ...` lines, then a markdown table
(target against measured), and exits 0 when none failed. Run from the repository root on a
GPU machine with dist/ built by scripts/package.sh:

  scripts/sharing_check.py --dist dist --work /tmp/w --parts overhead fairness limit
  scripts/sharing_check.py --dist dist --work /tmp/w --parts swap --hold-gib 35
"""
import argparse
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from lines import ENDED, NO_ANSWER, Lines  # noqa: E402
from pausebench import gpu_used_mib  # noqa: E402
import torch_pause_check as tpc  # noqa: E402  (first_difference)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SPIN = os.path.join(ROOT, "examples", "torch_spin.py")
PROGRESS = re.compile(r"^t=([\d.]+) steps=(\d+) at=([\d.]+)")
# The lines two runs of one training job must print identically.
DIGEST = re.compile(r"^(loss |held |final )")
SKIP_S = 2.0  # the start of a window left out: the jobs' first quanta

results = []
TABLE = []  # (check, target, measured, verdict)
CHILDREN = []  # every Job and Daemon started, killed on the way out


def verdict(status, name, detail):
    results.append(status)
    print(f"{status} | {name} | {detail}", flush=True)


def judged(name, ok, detail, check=None, target="", measured=""):
    st = "PASS" if ok else "FAIL"
    verdict(st, name, detail)
    if check:
        TABLE.append((check, target, measured, st))
    return ok


def cell(check, target, measured, st="info"):
    TABLE.append((check, target, measured, st))


def fmt(x, digits=3):
    return "none" if x is None else f"{x:.{digits}f}"


class Job:
    """A job under `cudaw run`, its stdout read on a thread of its own (Lines) and kept in
    WORK/NAME.out, its stderr in WORK/NAME.err. `cudaw run` keeps the program's PID."""

    def __init__(self, args, name, cmd, env):
        self.name = name
        self.out = open(os.path.join(args.work, f"{name}.out"), "w")
        self.err_path = os.path.join(args.work, f"{name}.err")
        self.err = open(self.err_path, "w")
        self.cmd = cmd
        self.p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                  stderr=self.err, text=True, env=env)
        CHILDREN.append(self)
        self.pid = self.p.pid
        self.lines = Lines(self.p.stdout, 600)
        self.seen = []
        self.ended = False
        self.out.write(" ".join(cmd) + "\n")

    def _take(self, timeout):
        """One more line (kept), or None once it ended or nothing came in time."""
        if self.ended:
            return None
        line = self.lines.next(max(timeout, 0.01))
        if line == ENDED:
            self.ended = True
            return None
        if line == NO_ANSWER:
            return None
        self.seen.append(line)
        self.out.write(line + "\n")
        self.out.flush()
        return line

    def wait_for(self, pattern, timeout):
        """The match of the first line (seen before or now) matching `pattern`, waited for
        at most `timeout` seconds; None when the job ended or nothing matched in time."""
        rx = re.compile(pattern)
        for line in self.seen:
            m = rx.search(line)
            if m:
                return m
        deadline = time.monotonic() + timeout
        while not self.ended and time.monotonic() < deadline:
            line = self._take(deadline - time.monotonic())
            if line is not None:
                m = rx.search(line)
                if m:
                    return m
        return None

    def finish(self, timeout):
        """Every line up to the end and the exit status; None when it runs on past
        `timeout` seconds (it is left running: kill() ends it)."""
        deadline = time.monotonic() + timeout
        while not self.ended and time.monotonic() < deadline:
            self._take(deadline - time.monotonic())
        if not self.ended:
            return None
        try:
            return self.p.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            return None

    def last(self):
        return self.seen[-1] if self.seen else "(no output)"

    def err_tail(self, n=300):
        try:
            return open(self.err_path).read().strip()[-n:]
        except OSError:
            return ""

    def progress(self):
        """[(unix time, steps)] from its `t= steps= at=` lines."""
        out = []
        for line in self.seen:
            m = PROGRESS.search(line)
            if m:
                out.append((float(m.group(3)), int(m.group(2))))
        return out

    def kill(self):
        if self.p.poll() is None:
            self.p.kill()
        try:
            self.p.wait(timeout=60)
        except subprocess.TimeoutExpired:
            pass
        for f in (self.out, self.err):
            if not f.closed:
                f.close()


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def config_text(args, jobs):
    """The daemon's TOML: the quanta, the default, and one [[job]] per (id, request, limit)."""
    q, mn, mx = args.quanta
    text = [f'quantum = "{q}"', f'min_quantum = "{mn}"', f'max_quantum = "{mx}"', "",
            "[default]", "request = 0.0", "limit = 1.0"]
    for jid, req, lim, *memory in jobs:
        text += ["", "[[job]]", f'id = "{jid}"', f"request = {req}", f"limit = {lim}"]
        text += [f'memory = "{m}"' for m in memory]
    return "\n".join(text) + "\n"


class Daemon:
    """`cudaw node` for one phase: its own configuration, run folder and socket; its log in
    WORK/daemon-TAG.log. Ready once `cudaw node status --json` answers."""

    def __init__(self, args, tag, jobs, run_dir, env):
        self.args = args
        self.cudaw = os.path.join(args.dist, "bin", "cudaw")
        self.config = os.path.join(args.work, f"node-{tag}.toml")
        with open(self.config, "w") as f:
            f.write(config_text(args, jobs))
        self.sock = os.path.join(run_dir, "node.sock")
        self.port = free_port()
        self.log_path = os.path.join(args.work, f"daemon-{tag}.log")
        self.log = open(self.log_path, "w")
        cmd = [self.cudaw, "node", "--config", self.config, "--run-dir", run_dir, "--socket", self.sock,
               "--metrics", f"127.0.0.1:{self.port}"]
        self.log.write(" ".join(cmd) + "\n")
        self.log.flush()
        self.p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT, env=env)
        CHILDREN.append(self)
        deadline = time.monotonic() + 30
        while self.status() is None:
            if self.p.poll() is not None:
                raise RuntimeError(f"cudaw node exited (rc {self.p.returncode}) before it answered: {self.tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"cudaw node did not answer `node status` within 30 s: {self.tail()}")
            time.sleep(0.2)

    def tail(self, n=300):
        try:
            return open(self.log_path).read().strip()[-n:]
        except OSError:
            return ""

    def status(self):
        """`cudaw node status --json`, parsed; None without an answer."""
        try:
            p = subprocess.run([self.cudaw, "node", "status", "--json", "--socket", self.sock],
                               capture_output=True, text=True, timeout=10)
            return json.loads(p.stdout) if p.returncode == 0 else None
        except (OSError, ValueError, subprocess.TimeoutExpired):
            return None

    def jobs(self, status=None):
        """{job id: its entry} over every GPU of a status."""
        s = status if status is not None else self.status()
        out = {}
        for g in (s or {}).get("gpus", []):
            for j in g.get("jobs", []):
                out[j.get("id")] = j
        return out

    def metrics(self):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=5) as r:
                return r.read().decode("utf-8", "replace")
        except (OSError, ValueError):
            return None

    def stop(self):
        """SIGTERM (the daemon releases every gated process on its way out); a daemon
        still there after 30 s is killed. Returns what happened, for the log and a row."""
        if self.p.poll() is not None:
            what = f"had exited already (rc {self.p.returncode})"
        else:
            self.p.send_signal(signal.SIGTERM)
            try:
                what = f"exited on SIGTERM (rc {self.p.wait(timeout=30)})"
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()
                what = "did not exit within 30 s of SIGTERM: killed"
        if not self.log.closed:
            self.log.write(f"# sharing_check: the daemon {what}\n")
            self.log.close()
        return what

    def kill(self):
        self.stop()


class Sampler(threading.Thread):
    """The daemon's status (and its /metrics) once a second, with the time, until stopped."""

    def __init__(self, daemon):
        super().__init__(daemon=True)
        self.d = daemon
        self.samples = []  # (unix time, {job id: entry}, metrics text or None)
        self.halt = threading.Event()

    def run(self):
        while not self.halt.is_set():
            s = self.d.status()
            if s is not None:
                self.samples.append((time.time(), self.d.jobs(s), self.d.metrics()))
            self.halt.wait(1.0)

    def stop(self):
        self.halt.set()
        if self.is_alive():
            self.join(timeout=30)

    def at(self, t):
        """The last sample taken at or before unix time t, or None."""
        best = None
        for s in self.samples:
            if s[0] <= t:
                best = s
        return best

    def most(self, jid, key):
        return max((s[1].get(jid, {}).get(key) or 0 for s in self.samples), default=0)


def steps_at(prog, t):
    """A job's steps at unix time t, interpolated between its progress lines."""
    for (a, sa), (b, sb) in zip(prog, prog[1:]):
        if a <= t <= b:
            return sa + (sb - sa) * ((t - a) / (b - a) if b > a else 1.0)
    return None


def env_for(base, run_dir):
    os.makedirs(run_dir, mode=0o700, exist_ok=True)
    return dict(base, CUDAW_RUN_DIR=run_dir)


def spin_cmd(args, jid, seconds, go):
    return [os.path.join(args.dist, "bin", "cudaw"), "run", "--job", jid, "--", "python3", args.spin,
            "--seconds", f"{seconds:g}", "--go", go, "--size", str(args.size), "--matmuls", str(args.matmuls)]


def spin_group(args, base, tag, jobs, seconds, daemon):
    """Spin jobs [(id, request, limit)] run together for `seconds`, under a daemon of their
    own (`daemon`) or plain; their step rates over the window in which all ran. Returns a
    dict: rates {id: steps/s}, window (s), startup_s, and with the daemon: joined, shares
    (achieved_share in the window) {id: x}, metrics (text), daemon_stop."""
    run_dir = os.path.join(args.work, f"run-{tag}")
    env = env_for(base, run_dir)
    go = os.path.join(args.work, f"go-{tag}")
    if os.path.exists(go):
        os.remove(go)
    res = {"rates": {}, "window": 0.0, "error": None}
    d, sampler, procs = None, None, []
    try:
        if daemon:
            d = Daemon(args, tag, jobs, run_dir, env)
        t0 = time.monotonic()
        procs = [Job(args, f"{tag}-{jid}", spin_cmd(args, jid, seconds, go), env) for jid, _, _ in jobs]
        for j in procs:
            if not j.wait_for(r"^ready pid=", 240):
                raise RuntimeError(f"{j.name} did not get ready in 240 s: {j.last()}; {j.err_tail(200)}")
        res["startup_s"] = time.monotonic() - t0
        if d:
            # Every job's process listed by the daemon before the clocks start.
            deadline = time.monotonic() + 20
            while True:
                seen = d.jobs()
                res["joined"] = all(j.pid in (seen.get(jid, {}).get("pids") or []) for (jid, _, _), j in zip(jobs, procs))
                if res["joined"] or time.monotonic() > deadline:
                    res["listed"] = {k: v.get("pids") for k, v in seen.items()}
                    break
                time.sleep(0.5)
            sampler = Sampler(d)
            sampler.start()
        with open(go, "w"):
            pass
        for j in procs:
            rc = j.finish(seconds + 120)
            if rc != 0:
                raise RuntimeError(f"{j.name} ended with rc {rc} (None: still running): {j.last()}; {j.err_tail(200)}")
        progs = {jid: j.progress() for (jid, _, _), j in zip(jobs, procs)}
        if any(len(p) < 2 for p in progs.values()):
            raise RuntimeError(f"too few progress lines: {({k: len(v) for k, v in progs.items()})}")
        w0 = max(p[0][0] for p in progs.values()) + SKIP_S
        w1 = min(p[-1][0] for p in progs.values()) - 0.5
        res["window"] = w1 - w0
        if w1 - w0 < 5:
            raise RuntimeError(f"the jobs ran together for {w1 - w0:.1f} s only: no window to measure")
        for jid, p in progs.items():
            res["rates"][jid] = (steps_at(p, w1) - steps_at(p, w0)) / (w1 - w0)
        for (jid, _, _), j in zip(jobs, procs):
            m = j.wait_for(r"^steps_ms (.*)$", 0)
            if m:
                res.setdefault("steps_ms", {})[jid] = m.group(1)
        if sampler:
            sampler.stop()
            s = sampler.at(w1)
            if s is not None and s[0] >= w0:
                res["shares"] = {jid: s[1].get(jid, {}).get("achieved_share") for jid, _, _ in jobs}
                res["sample_at"] = s[0] - w0
            res["metrics"] = next((m for t, _, m in reversed(sampler.samples) if m and t <= w1), None)
            res["waits"] = {jid: sampler.most(jid, "waits") for jid, _, _ in jobs}
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as e:
        res["error"] = f"{type(e).__name__}: {e}"
    finally:
        for j in procs:
            j.kill()
        if sampler:
            sampler.stop()
        if d:
            res["daemon_stop"] = d.stop()
    return res


def budget_left(args):
    return args.budget_s - (time.monotonic() - args.started)


def phase_fits(args, name, seconds, startup):
    need = startup + seconds + 20
    if budget_left(args) - 15 < need:
        verdict("info", name, f"skipped: {budget_left(args):.0f} s left of --budget-s {args.budget_s:g}, "
                f"the phase needs about {need:.0f} s")
        cell(name, "", "skipped (time)")
        return False
    return True


def solo_part(args, base):
    """Plain and daemon solo runs in turn; returns (solo rate, startup s) or (None, _)."""
    kinds = ["plain", "daemon"] * args.pairs + ["plain"]
    rates, startup = [], 10.0
    for i, kind in enumerate(kinds):
        r = spin_group(args, base, f"solo{i}-{kind}", [("solo", 1.0, 1.0)], args.solo_seconds, kind == "daemon")
        rate = r["rates"].get("solo")
        # A run the daemon never saw measures nothing of it.
        unseen = kind == "daemon" and not r.get("joined")
        rates.append(None if unseen else rate)
        startup = max(startup, r.get("startup_s", 0))
        verdict("info" if rate and not unseen else "FAIL", f"sharing: solo run {i + 1} ({kind})",
                f"{fmt(rate, 2)} steps/s over {r['window']:.1f} s (startup {r.get('startup_s', 0):.1f} s)"
                + (f"; NOT listed by the daemon with its PID within 20 s of being ready: {r.get('listed')}" if unseen else "")
                + (f"; step ms {r['steps_ms']['solo']}" if "solo" in r.get("steps_ms", {}) else "")
                + (f"; daemon {r['daemon_stop']}" if "daemon_stop" in r else "")
                + (f"; {r['error']}" if r["error"] else ""))
    plain = [r for k, r in zip(kinds, rates) if k == "plain" and r]
    if not plain:
        verdict("FAIL", "sharing: solo rate", "no plain run gave a rate: nothing to measure shares against")
        return None, startup
    solo = statistics.mean(plain)
    verdict("info", "sharing: solo rate (plain cudaw run, the base of every share)",
            f"{solo:.2f} steps/s (mean of {len(plain)}: {', '.join(f'{r:.2f}' for r in plain)}; "
            f"spread {(max(plain) - min(plain)) / solo * 100:.1f}%); {args.matmuls} bf16 matmuls "
            f"{args.size}x{args.size} a step = {solo * args.matmuls * 2 * args.size ** 3 / 1e12:.0f} TFLOP/s")
    if "overhead" in args.parts and args.pairs == 0:
        verdict("info", "sharing: overhead, one job alone under the daemon (request 1.0)", "not measured: --pairs 0")
    if "overhead" in args.parts and args.pairs > 0:
        ratios = []
        for i, (k, r) in enumerate(zip(kinds, rates)):
            if k == "daemon" and r and rates[i - 1] and rates[i + 1]:
                ratios.append(r / ((rates[i - 1] + rates[i + 1]) / 2))
        if ratios:
            med = statistics.median(ratios)
            judged("sharing: overhead, one job alone under the daemon (request 1.0)", med >= 0.99,
                   f"rate ratio {med:.4f} (median of {len(ratios)}: {', '.join(f'{x:.4f}' for x in ratios)}; each "
                   f"against the plain runs either side of it); goal >= 0.99",
                   "overhead: one job alone, daemon / no daemon", ">= 0.99", f"{med:.4f}")
        else:
            judged("sharing: overhead, one job alone under the daemon (request 1.0)", False,
                   f"no daemon run with plain runs either side gave rates ({rates})",
                   "overhead: one job alone, daemon / no daemon", ">= 0.99", "none")
    return solo, startup


def shares_of(rates, solo):
    raw = {k: v / solo for k, v in rates.items()}
    total = sum(raw.values())
    norm = {k: v / total for k, v in raw.items()} if total < 1 and total > 0 else dict(raw)
    return raw, total, norm


def fairness(args, base, solo, startup, tag, targets, tol, relative, label, aggregate=True, context=""):
    """One group of jobs together under the daemon, judged against their targets."""
    name = f"sharing: {label}"
    if not phase_fits(args, name, args.seconds, startup):
        return
    jobs = [(jid, req, 1.0) for jid, req in targets]
    r = spin_group(args, base, tag, jobs, args.seconds, True)
    if r["error"] or len(r["rates"]) != len(jobs):
        judged(name, False, f"no shares: {r['error']} (see {tag}-*.err, daemon-{tag}.log)", label, "", "failed")
        return
    if not r.get("joined"):
        verdict("FAIL", f"{name}: every job joined the daemon",
                f"not all listed with their PIDs within 20 s of being ready: {r.get('listed')}")
    raw, total, norm = shares_of(r["rates"], solo)
    normalised = total < 1
    band = (lambda t: tol * t) if relative else (lambda t: tol)
    rows = []
    for jid, target in targets:
        ok = abs(norm[jid] - target) <= band(target)
        rows.append(ok)
        judged(f"{name}: job {jid} (request {target:g})", ok,
               f"share {norm[jid]:.3f} ("
               + (f"normalised by their sum {total:.3f}; raw {raw[jid]:.3f}: " if normalised else "raw: their sum >= 1; ")
               + f"{r['rates'][jid]:.2f} of {solo:.2f} steps/s over {r['window']:.1f} s); target {target:g} +- {band(target):.3f}; waits {r.get('waits', {}).get(jid)}",
               f"{label}: job {jid}", f"{target:g} ± {band(target):.3f}",
               f"{norm[jid]:.3f} (raw {raw[jid]:.3f})")
    # The daemon's accounting, in the same window.
    ds = r.get("shares") or {}
    if ds and all(isinstance(v, (int, float)) for v in ds.values()) and sum(ds.values()) > 0:
        dsum = sum(ds.values())
        dnorm = {k: v / dsum for k, v in ds.items()}
        ok = all(abs(dnorm[jid] - t) <= band(t) for jid, t in targets)
        judged(f"{name}: the daemon's achieved_share", ok,
               "; ".join(f"{jid} {ds[jid]:.3f} -> {dnorm[jid]:.3f}" for jid, _ in targets)
               + f" (normalised by their sum {dsum:.3f}; read {r.get('sample_at', 0):.1f} s into the window)",
               f"{label}: daemon's achieved_share", " / ".join(f"{t:g}" for _, t in targets),
               " / ".join(f"{dnorm[jid]:.3f}" for jid, _ in targets))
    else:
        judged(f"{name}: the daemon's achieved_share", False,
               f"no reading in the window from `cudaw node status --json` ({ds}); see daemon-{tag}.log",
               f"{label}: daemon's achieved_share", " / ".join(f"{t:g}" for _, t in targets), "none")
    m = r.get("metrics") or ""
    series = {}
    for line in m.splitlines():
        mm = re.match(r'^cudaw_node_gpu_share\{([^}]*)\}\s+(\S+)', line)
        if mm:
            j = re.search(r'job="([^"]*)"', mm.group(1))
            if j:
                series[j.group(1)] = mm.group(2)
    judged(f"{name}: Prometheus /metrics", all(jid in series for jid, _ in targets),
           f"cudaw_node_gpu_share: {series or 'none'}; {len([x for x in m.splitlines() if x.startswith('cudaw_node_')])} "
           f"cudaw_node_ series" + ("" if m else " (no /metrics answer)"))
    if context:
        small = min(norm.values())
        big = max(norm.values())
        verdict("info", f"{name}: ratio", f"1:{big / small:.2f} asked 1:{max(t for _, t in targets) / min(t for _, t in targets):.0f}; {context}"
                if small > 0 else f"the small job got nothing; {context}")
    if aggregate:
        judged(f"{name}: aggregate throughput", total >= 0.95,
               f"sum of raw shares {total:.3f} (1.0: the jobs one after the other); goal >= 0.95",
               f"aggregate throughput, {label}", ">= 0.95", f"{total:.3f}")
    else:
        verdict("info", f"{name}: aggregate throughput", f"sum of raw shares {total:.3f}")
        cell(f"aggregate throughput, {label}", "(information)", f"{total:.3f}")
    # What a step took: a step that waited for the other jobs' quanta is the latency the
    # quantum costs (the reason not to make it long).
    steps = r.get("steps_ms") or {}
    verdict("info", f"{name}: step time (ms)", "; ".join(f"{jid} {steps.get(jid, 'none')}" for jid, _ in targets)
            + f"; quanta {' '.join(args.quanta)}")
    verdict("info", f"{name}: daemon", r.get("daemon_stop", "?"))


def limit_part(args, base, solo, startup):
    name = "sharing: limit 0.3, one job alone"
    if not phase_fits(args, name, args.limit_seconds, startup):
        return
    r = spin_group(args, base, "limit", [("lim", 0.0, 0.3)], args.limit_seconds, True)
    rate = r["rates"].get("lim")
    if rate is None:
        judged(name, False, f"no rate: {r['error']} (see limit-lim.err, daemon-limit.log)",
               "limit 0.3, one job alone: rate / solo", "<= 0.33", "failed")
        return
    share = rate / solo
    ds = (r.get("shares") or {}).get("lim")
    judged(name, share <= 0.33,
           f"rate {rate:.2f} of solo {solo:.2f} steps/s = {share:.3f} over {r['window']:.1f} s (goal <= 0.33; "
           f"not starved: {'yes' if share >= 0.25 else 'NO'}, >= 0.25 expected); daemon's achieved_share "
           f"{fmt(ds)}; daemon {r.get('daemon_stop')}",
           "limit 0.3, one job alone: rate / solo", "<= 0.33", f"{share:.3f} (daemon {fmt(ds)})")


def sharing(args, base):
    solo, startup = solo_part(args, base)
    if solo is None:
        return
    if "fairness" in args.parts:
        fairness(args, base, solo, startup, "fair25", [("a", 0.25), ("b", 0.75)], 0.05, False, "0.25 / 0.75")
        fairness(args, base, solo, startup, "fair10", [("a", 0.1), ("b", 0.9)], 0.10, True, "0.1 / 0.9",
                 context="HAMi's limiter gives 1:6-8 where 1:9 is asked")
        if args.four:
            fairness(args, base, solo, startup, "four", [(f"q{i}", 0.25) for i in range(1, 5)], 0.05, False,
                     "4 x 0.25", aggregate=False)
    if "limit" in args.parts:
        limit_part(args, base, solo, startup)


# -- swap ----------------------------------------------------------------------------------

def train_cmd(args, seed, how, job=None, wait=False):
    cmd = [os.path.join(args.dist, "bin", "cudaw"), "run"]
    if job:
        cmd += ["--job", job]
    if wait:
        cmd += ["--alloc-wait", "120s"]
    return cmd + ["--", "python3", args.spin, "--train", "--hold-gib", f"{args.hold_gib:g}", "--seed", str(seed), *how]


def span(job):
    """(begin, end) unix times of a training job's GPU work, from its lines."""
    b = job.wait_for(r"^begin pid=\d+ at=([\d.]+)", 0)
    e = job.wait_for(r"^end at=([\d.]+)", 0)
    return (float(b.group(1)) if b else None, float(e.group(1)) if e else None)


def digest(job):
    return [line for line in job.seen if DIGEST.match(line)]


def swap_part(args, base):
    n = args.swap_jobs
    smi = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True).stdout.strip().splitlines()
    total = int(smi[0].split(",")[-1]) if smi else 0
    need = args.hold_gib * 1024 + 2600  # MiB a job: the held buffer, ~2 GiB of training, its context
    fits = int(total // need) if need else 0
    verdict("info", "swap: the card and the jobs",
            f"{smi[0] if smi else 'no nvidia-smi reading'} MiB; {n} jobs of about {need:.0f} MiB "
            f"({args.hold_gib:g} GiB held + training + context): {fits} fit at once"
            + ("" if fits < n else f" - all {n} fit, nothing needs swapping: raise --hold-gib"))
    plain_env = env_for(base, os.path.join(args.work, "run-swap-plain"))

    # Each alone: its digest, its steps, its span.
    solos = []
    for k in range(1, n + 1):
        j = Job(args, f"swap-solo{k}", train_cmd(args, k, ["--seconds", f"{args.swap_seconds:g}"]), plain_env)
        try:
            rc = j.finish(args.swap_seconds + 300)
        finally:
            j.kill()
        steps = j.wait_for(r"^final .* steps=(\d+)", 0)
        b, e = span(j)
        if rc != 0 or not steps or b is None or e is None:
            judged(f"swap: job {k} alone", False, f"rc {rc}: {j.last()}; {j.err_tail(200)}",
                   "swap: the jobs alone", "finish", f"job {k} failed")
            return
        solos.append({"steps": int(steps.group(1)), "digest": digest(j), "span": e - b})
        verdict("info", f"swap: job {k} alone", f"{solos[-1]['steps']} steps, span {e - b:.1f} s; "
                + " ".join(digest(j)[-2:]))
    seq = sum(s["span"] for s in solos)

    # Together under the daemon, started one after another.
    run_dir = os.path.join(args.work, "run-swap")
    env = env_for(base, run_dir)
    d, sampler, procs = None, None, []
    rcs, third_mib = [], {}
    try:
        d = Daemon(args, "swap", [(f"s{k}", round(1.0 / n - 0.005, 2), 1.0) for k in range(1, n + 1)], run_dir, env)
        sampler = Sampler(d)
        sampler.start()
        for k in range(1, n + 1):
            j = Job(args, f"swap-shared{k}", train_cmd(args, k, ["--steps", str(solos[k - 1]["steps"])], f"s{k}", True), env)
            procs.append(j)
            if k < n and not j.wait_for(r"^holding ", 240):
                verdict("info", f"swap: job {k} under the daemon", f"no `holding` line in 240 s ({j.last()}); starting the next anyway")
        # nvidia-smi once the last one is up (its first allocations wait for room).
        procs[-1].wait_for(r"^begin ", 120)
        time.sleep(3)
        third_mib = {j.name: gpu_used_mib(j.pid) for j in procs}
        deadline = time.monotonic() + max(60.0, budget_left(args) - 90)
        for j in procs:
            rcs.append(j.finish(max(1.0, deadline - time.monotonic())))
    except (RuntimeError, OSError) as e:
        verdict("FAIL", "swap: under the daemon", f"{type(e).__name__}: {e}")
    finally:
        for j in procs:
            j.kill()
        if sampler:
            sampler.stop()
        stop = d.stop() if d else "not started"
    finished = sum(1 for rc in rcs if rc == 0)
    judged(f"swap: {n} jobs of {args.hold_gib:g} GiB all finish under the daemon", finished == n and len(rcs) == n,
           f"exit statuses {rcs} (None: still running at the deadline); daemon {stop}; nvidia-smi MiB 3 s after "
           f"the last one's CUDA start: {third_mib}",
           f"swap: {n} x {args.hold_gib:g} GiB all finish", f"{n} / {n}", f"{finished} / {n}")
    same = 0
    for k, j in enumerate(procs, 1):
        a, b = solos[k - 1]["digest"], digest(j)
        ok = a == b and any("intact True" in x for x in a)
        same += ok
        waited = None
        m0, m1 = j.wait_for(r"^begin pid=\d+ at=([\d.]+)", 0), j.wait_for(r"^holding \S+ GiB at=([\d.]+)", 0)
        if m0 and m1:
            waited = float(m1.group(1)) - float(m0.group(1))
        judged(f"swap: job {k} bit-identical to its solo run", ok,
               (f"{len(a)} digest lines identical" if ok else
                "DIFFER: " + tpc.first_difference("\n".join(a), "\n".join(b), []))
               + f"; its memory in after {fmt(waited, 1)} s; the daemon's swaps {sampler.most(f's{k}', 'swaps') if sampler else '?'}, "
               f"most swapped {(sampler.most(f's{k}', 'swapped_bytes') if sampler else 0) / 2**30:.1f} GiB, waits "
               f"{sampler.most(f's{k}', 'waits') if sampler else '?'}")
    cell("swap: each bit-identical to its solo run", f"{n} / {n}", f"{same} / {n}", "PASS" if same == n else "FAIL")
    spans = [span(j) for j in procs]
    if finished == n and all(b is not None and e is not None for b, e in spans):
        shared = max(e for _, e in spans) - min(b for b, _ in spans)
        tp = seq / shared
        judged("swap: aggregate throughput against one after another", tp >= 0.80,
               f"{seq:.1f} s alone in turn / {shared:.1f} s together = {tp:.3f} (spans: first GPU work to the end); "
               f"goal >= 0.80", "swap: throughput against one after another", ">= 0.80", f"{tp:.3f}")
    else:
        judged("swap: aggregate throughput against one after another", False, "not every job finished",
               "swap: throughput against one after another", ">= 0.80", "none")


def oom_part(args, base):
    """Without the daemon: two jobs hold their memory, the third fails with out-of-memory."""
    name = "swap: without the daemon, the third job fails with out-of-memory"
    env = env_for(base, os.path.join(args.work, "run-oom"))
    if os.path.exists("/run/cudaw/node.sock"):
        verdict("info", name, "/run/cudaw/node.sock exists: the jobs would find a daemon there and wait 30 s")
    procs, rc, line, waited, took = [], None, None, None, None
    try:
        for k in range(1, args.swap_jobs):
            j = Job(args, f"oom{k}", train_cmd(args, k, ["--seconds", "600"]), env)
            procs.append(j)
            if not j.wait_for(r"^holding ", 240):
                raise RuntimeError(f"job {k} did not hold its memory in 240 s: {j.last()}; {j.err_tail(200)}")
        t = time.monotonic()
        last = Job(args, f"oom{args.swap_jobs}", train_cmd(args, args.swap_jobs, ["--seconds", "600"]), env)
        procs.append(last)
        rc = last.finish(180)
        took = time.monotonic() - t
        held = last.wait_for(r"^holding ", 0)
        # PyTorch's own error line first (cudaw's log may say "out of memory" too).
        errs = open(last.err_path).read().splitlines()
        ooms = ([x for x in errs if "OutOfMemoryError" in x]
                or [x for x in errs if re.search(r"out of memory", x, re.I)])
        line = ooms[-1].strip() if ooms else None
        waited = held is not None
    except (RuntimeError, OSError) as e:
        verdict("FAIL", name, f"{type(e).__name__}: {e}")
        cell("swap: without the daemon, the third", "out of memory", "failed to set up", "FAIL")
        return
    finally:
        for j in procs:
            j.kill()
    ok = rc not in (0, None) and line is not None and not waited
    judged(name, ok, f"rc {rc} after {fmt(took, 1)} s: {(line or 'no out-of-memory line in oom3.err')[:240]}",
           "swap: without the daemon, the third", "out of memory", (line or f"rc {rc}")[:120])


def memlimit_part(args, base):
    """A job's `memory` in the daemon's configuration is its process's limit: a training
    job whose job has 2G cannot hold a 4 GiB buffer (PyTorch's out-of-memory), one whose
    job has 8G can; the daemon's log says it limited both."""
    name = "limit: a job's memory is its process's limit"
    run_dir = os.path.join(args.work, "run-memlimit")
    env = env_for(base, run_dir)
    d, jobs = None, []
    try:
        d = Daemon(args, "memlimit", [("small", 0.0, 1.0, "2G"), ("big", 0.0, 1.0, "8G")], run_dir, env)
        results_of = {}
        for jid in ("small", "big"):
            cmd = train_cmd(args, 1, ["--seconds", "3"], job=jid)
            cmd[cmd.index("--hold-gib") + 1] = "4"
            j = Job(args, f"memlimit-{jid}", cmd, env)
            jobs.append(j)
            rc = j.finish(240)
            errs = open(j.err_path).read()
            results_of[jid] = (rc, "OutOfMemoryError" in errs, j.wait_for(r"^holding ", 0) is not None)
        log = open(d.log_path).read()
        limited = log.count("memory limited to")
        (rs, oom_s, held_s), (rb, oom_b, held_b) = results_of["small"], results_of["big"]
        ok = rs not in (0, None) and oom_s and not held_s and rb == 0 and held_b and not oom_b and limited >= 2
        judged(name, ok,
               f"memory 2G, 4 GiB buffer: rc {rs}, out of memory {oom_s}; memory 8G: rc {rb}, held {held_b}; "
               f"'memory limited to' {limited} times in the daemon's log",
               "limit: job memory 2G / 8G, a 4 GiB buffer", "refused / held",
               f"{'refused' if oom_s else 'not refused'} / {'held' if held_b else 'not held'}")
    except (RuntimeError, OSError) as e:
        verdict("FAIL", name, f"{type(e).__name__}: {e}")
    finally:
        for j in jobs:
            j.kill()
        if d is not None:
            d.stop()


def print_table():
    print("\n| check | target | measured | verdict |")
    print("|---|---|---|---|")
    for check, target, measured, st in TABLE:
        print(f"| {check} | {target} | {measured} | {st} |")
    print(flush=True)


def main():
    # gpu-check's timeout sends SIGTERM: run the finally blocks (kill, stop the daemon) on the way out.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(124))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dist", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--parts", nargs="+", default=["overhead", "fairness", "limit"],
                    choices=["overhead", "fairness", "limit", "memlimit", "swap"])
    ap.add_argument("--seconds", type=float, default=40, help="jobs together, each fairness phase (default 40)")
    ap.add_argument("--solo-seconds", type=float, default=12, help="each solo run (default 12)")
    ap.add_argument("--pairs", type=int, default=2, help="daemon solo runs, each between two plain ones (default 2)")
    ap.add_argument("--limit-seconds", type=float, default=20, help="the limit phase (default 20)")
    ap.add_argument("--no-four", dest="four", action="store_false", help="skip the four-job phase")
    ap.add_argument("--size", type=int, default=8192, help="the spin's matrices (default 8192)")
    ap.add_argument("--matmuls", type=int, default=4, help="the spin's matmuls a step (default 4)")
    ap.add_argument("--quanta", nargs=3, default=["50ms", "10ms", "200ms"], metavar=("QUANTUM", "MIN", "MAX"),
                    help="the daemon's quantum, min_quantum, max_quantum (default 50ms 10ms 200ms)")
    ap.add_argument("--hold-gib", type=float, default=35, help="swap: GiB each training job holds (default 35)")
    ap.add_argument("--swap-jobs", type=int, default=3, help="swap: jobs (default 3)")
    ap.add_argument("--swap-seconds", type=float, default=25, help="swap: each job's training alone (default 25)")
    ap.add_argument("--spin", default=SPIN, help="the job program (default examples/torch_spin.py)")
    ap.add_argument("--budget-s", type=float, default=500,
                    help="the run's time limit: phases that would not fit are skipped (default 500)")
    args = ap.parse_args()
    args.started = time.monotonic()
    os.makedirs(args.work, exist_ok=True)
    if args.swap_jobs < 2:
        ap.error(f"--swap-jobs {args.swap_jobs}: expected 2 or more")
    base = dict(os.environ, CUDAW_LOG="info", PYTHONUNBUFFERED="1")
    for k in ("CUDAW_NODE_SOCKET", "CUDAW_ALLOC_WAIT", "CUDAW_JOB", "CUDAW_RUN_DIR"):
        base.pop(k, None)
    cudaw = os.path.join(args.dist, "bin", "cudaw")
    smi = subprocess.run(["nvidia-smi", "--query-gpu=index,name,driver_version,memory.total", "--format=csv,noheader"],
                         capture_output=True, text=True).stdout.strip().replace("\n", "; ")
    verdict("info", f"{'swap' if args.parts == ['swap'] else 'sharing'}: GPUs, driver, uid", f"{smi}; uid {os.getuid()}; quanta {' '.join(args.quanta)}")
    try:
        h = subprocess.run([cudaw, "node", "--help"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        h = subprocess.CompletedProcess([], 127, "", str(e))
    if h.returncode != 0:
        verdict("FAIL", "sharing: cudaw node", f"`cudaw node --help` rc {h.returncode}: {(h.stderr or h.stdout).strip()[-200:]}")
        print(json.dumps({"passed": False}), flush=True)
        return 1
    try:
        if set(args.parts) & {"overhead", "fairness", "limit"}:
            sharing(args, base)
        if "memlimit" in args.parts:
            memlimit_part(args, base)
        if "swap" in args.parts:
            swap_part(args, base)
            oom_part(args, base)
    finally:
        for c in reversed(CHILDREN):
            try:
                c.kill()
            except Exception:  # noqa: BLE001  (the way out: every child, whatever one of them does)
                pass
        if TABLE:
            print_table()
    print(json.dumps({"passed": all(s != "FAIL" for s in results)}), flush=True)
    return 0 if all(s != "FAIL" for s in results) else 1


if __name__ == "__main__":
    sys.exit(main())
