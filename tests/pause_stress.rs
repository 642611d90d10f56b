//! Pause/resume/dump/restore under stress, on simgpu, in both addressing modes:
//! `tests/cuda/programs/pause_stress.cu` — four host threads, each with two streams of its
//! own, allocating, setting, launching, copying and freeing in a loop — runs under cudaw
//! while the test pauses and resumes it at random instants, a few hundred times in all:
//!
//! - `kill -USR1` / `kill -USR2`, one at a time and in bursts of repeated signals in any
//!   order (the state is then settled through the socket);
//! - `cudaw-ckpt pause` / `resume`, and the same requests written to the socket directly;
//! - `cudaw-ckpt dump` (the process stays paused, its memory only in the image) followed
//!   by `restore`, and `dump --leave-running`;
//! - a corrupt and a truncated image given to `restore`: refused (exit status 3), the
//!   process left paused with its memory intact, then resumed.
//!
//! While paused, no thread may make progress: the program counts, per thread, the CUDA
//! calls it returned from in a shared file, and no count may grow by more than one (the
//! call a thread had just returned from when the gate closed) before the resume. Every
//! pause must leave no device memory mapped. The program checks every result against the
//! CPU, and its output must equal an uninterrupted run's.
//!
//! The schedule comes from a seeded generator: the seed is printed, and
//! `PAUSE_STRESS_SEED=N` replays its choices (the instants differ: they are the machine's).

mod ckpt_common;

use ckpt_common::{images, raw, temp_dir, text, TempDir};
use cudaw_tests::{command_under_cudaw, compile_program, cudaw_ckpt, nvcc, Addressing, Rng};
use serde_json::Value;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Output, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// The program's host threads (one progress count each).
const THREADS: usize = 4;
/// Iterations each thread is allowed per cycle ("run K").
const PER_CYCLE: u32 = 2;

/// The shim's log, shared with the thread reading it.
#[derive(Default)]
struct Log {
    lines: Mutex<Vec<String>>,
    grew: Condvar,
}

/// The lines the control thread writes once per pause or resume request, whatever its
/// source.
const PAUSED: &str = "] info: paused: ";
const RESUMED: &str = "] info: resumed: ";
const DUMPED: &str = "] info: dumped: ";
const RESTORED: &str = "] info: restored: ";
const REFUSED: &str = "] warn: restore refused: ";

const OUTCOMES: [&str; 4] = [
    "] info: paused: ",
    "] info: pause: already paused",
    "] info: resumed: ",
    "] info: resume: not paused",
];

fn is_outcome(line: &str) -> bool {
    OUTCOMES.iter().any(|o| line.contains(o))
}

struct Stressed {
    child: cudaw_tests::KillOnDrop,
    pid: i32,
    addressing: Addressing,
    stdin: Option<ChildStdin>,
    log: Arc<Log>,
    reader: Option<std::thread::JoinHandle<()>>,
    /// The program's standard output, whole once it ends.
    out: Option<std::thread::JoinHandle<String>>,
    progress: PathBuf,
    run_dir: PathBuf,
    work: PathBuf,
    /// Whether the test believes the process paused (checked against `status`).
    paused: bool,
    /// The progress counts when the current pause was confirmed.
    at_pause: Vec<u64>,
    /// Pauses confirmed, and progress checks made.
    pauses: usize,
    _dirs: (TempDir, TempDir),
}

impl Stressed {
    fn start(exe: &Path, iters: u32, addressing: Addressing, tag: &str) -> Stressed {
        let run = temp_dir(&format!("stress-{tag}-run"));
        let work = temp_dir(&format!("stress-{tag}-img"));
        let progress = work.0.join("progress");
        let mut cmd = command_under_cudaw(exe, addressing, &[]);
        cmd.arg(iters.to_string())
            .env("CUDAW_LOG", "info")
            .env("CUDAW_RUN_DIR", &run.0)
            .env("PAUSE_STRESS_PROGRESS", &progress)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cudaw_tests::KillOnDrop(cmd.spawn().expect("starting pause_stress"));
        let pid = i32::try_from(child.id()).expect("pid");
        let stdin = child.stdin.take();
        let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
        let stderr = child.stderr.take().expect("stderr");
        let log = Arc::new(Log::default());
        let sink = Arc::clone(&log);
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                sink.lines.lock().unwrap().push(line);
                sink.grew.notify_all();
            }
        });
        let mut first = String::new();
        stdout.read_line(&mut first).expect("the first line");
        assert!(
            first.starts_with("pause_stress:"),
            "{first:?}\n{}",
            log.lines.lock().unwrap().join("\n")
        );
        // The rest of the output, read on the side.
        let out = std::thread::spawn(move || {
            let mut rest = first;
            let _ = stdout.read_to_string(&mut rest);
            rest
        });
        let s = Stressed {
            child,
            pid,
            addressing,
            stdin,
            log,
            reader: Some(reader),
            out: Some(out),
            progress,
            run_dir: run.0.clone(),
            work: work.0.clone(),
            paused: false,
            at_pause: Vec::new(),
            pauses: 0,
            _dirs: (run, work),
        };
        s.wait_lines(|l| l.contains("] info: pause on signal"), 1);
        let socket = s.socket();
        let deadline = Instant::now() + Duration::from_secs(10);
        while !socket.exists() {
            assert!(Instant::now() < deadline, "no socket {}", socket.display());
            std::thread::sleep(Duration::from_millis(2));
        }
        s
    }

    fn pid_s(&self) -> String {
        self.pid.to_string()
    }

    fn socket(&self) -> PathBuf {
        self.run_dir.join(format!("{}.sock", self.pid))
    }

    fn log_text(&self) -> String {
        self.log.lines.lock().unwrap().join("\n")
    }

    fn count(&self, what: impl Fn(&str) -> bool) -> usize {
        self.log
            .lines
            .lock()
            .unwrap()
            .iter()
            .filter(|l| what(l))
            .count()
    }

    /// Waits (up to 20 s) until `n` log lines satisfy `what`; returns the last of them.
    fn wait_lines(&self, what: impl Fn(&str) -> bool, n: usize) -> String {
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut lines = self.log.lines.lock().unwrap();
        loop {
            let hits: Vec<&String> = lines.iter().filter(|l| what(l)).collect();
            if hits.len() >= n {
                return hits[n - 1].clone();
            }
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(
                !left.is_zero(),
                "{:?}: waited 20 s for log line {n}; the log:\n{}",
                self.addressing,
                lines.join("\n")
            );
            lines = self.log.grew.wait_timeout(lines, left).unwrap().0;
        }
    }

    /// Runs `f` (a socket request) and waits until the shim's log line for it, the first
    /// containing `marker` after those already there, has been read: the reader has then
    /// caught up with everything the request logged.
    fn logged<T>(&self, marker: &str, f: impl FnOnce() -> T) -> T {
        let before = self.count(|l| l.contains(marker));
        let v = f();
        self.wait_lines(|l| l.contains(marker), before + 1);
        v
    }

    fn send(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().expect("stdin open");
        writeln!(stdin, "{line}").expect("writing to pause_stress");
        stdin.flush().unwrap();
    }

    fn signal(&self, sig: i32) {
        // SAFETY: kill(2) with our own child's pid; no memory is involved.
        let rc = unsafe { libc::kill(self.pid, sig) };
        assert_eq!(rc, 0, "kill({}, {sig}): the target exited early?", self.pid);
    }

    /// Sends one signal and waits for the control thread's answer to it; returns that
    /// line.
    fn signal_and_wait(&self, sig: i32) -> String {
        let before = self.count(is_outcome);
        self.signal(sig);
        self.wait_lines(is_outcome, before + 1)
    }

    fn progress(&self) -> Vec<u64> {
        let b = std::fs::read(&self.progress).expect("reading the progress file");
        assert_eq!(b.len(), THREADS * 8, "progress file length");
        b.chunks(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
            .collect()
    }

    /// Records that a pause was confirmed now.
    fn paused_now(&mut self, line: Option<&str>) {
        if let Some(l) = line {
            assert!(
                l.contains("; 0 bytes of device memory still mapped"),
                "{:?}: the pause left device memory mapped: {l}",
                self.addressing
            );
        }
        self.paused = true;
        self.pauses += 1;
        self.at_pause = self.progress();
    }

    /// Asserts that no thread passed the gate since the pause was confirmed (a count may
    /// grow by one: the call a thread had returned from as the gate closed).
    fn assert_held(&self, what: &str) {
        let now = self.progress();
        for (t, (a, b)) in self.at_pause.iter().zip(&now).enumerate() {
            assert!(
                b >= a && b - a <= 1,
                "{:?}: thread {t} made progress while paused ({what}): {a} -> {b} calls \
                 (all: {:?} -> {now:?}); the log:\n{}",
                self.addressing,
                self.at_pause,
                self.log_text()
            );
        }
    }

    /// Asserts the process's own view of its state.
    fn assert_state(&self) -> Value {
        let st = raw(&self.socket(), "{\"cmd\":\"status\"}\n");
        assert_eq!(st["ok"], true, "{st}");
        let st = st["status"].clone();
        let want = if self.paused { "paused" } else { "running" };
        assert_eq!(
            st["state"],
            want,
            "{:?}: {st}\n{}",
            self.addressing,
            self.log_text()
        );
        if self.paused {
            let d = &st["devices"][0];
            assert_eq!(d["resident"].as_u64(), Some(0), "{st}");
            assert_eq!(d["mapped"].as_u64(), Some(0), "{st}");
        }
        st
    }

    fn ckpt(&self, args: &[&str]) -> Output {
        Command::new(cudaw_ckpt())
            .args(args)
            .env("CUDAW_RUN_DIR", &self.run_dir)
            .current_dir(&self.work)
            .output()
            .expect("running cudaw-ckpt")
    }

    /// cudaw-ckpt ARGS --json, which must succeed; its JSON.
    fn ckpt_json(&self, args: &[&str]) -> Value {
        let mut a = args.to_vec();
        a.push("--json");
        let out = self.ckpt(&a);
        assert!(
            out.status.success(),
            "{:?}: cudaw-ckpt {a:?} failed ({}):\n{}{}\n--- the target's log:\n{}",
            self.addressing,
            out.status,
            text(&out.stdout),
            text(&out.stderr),
            self.log_text()
        );
        serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{a:?} printed {:?}: {e}", text(&out.stdout)))
    }

    /// A socket request written directly; its reply, which must be a success.
    fn request(&self, line: &str) -> Value {
        let v = raw(&self.socket(), line);
        assert_eq!(
            v["ok"],
            true,
            "{:?}: {line} -> {v}\n{}",
            self.addressing,
            self.log_text()
        );
        v
    }

    /// Resumes, by a way `rng` picks, from a confirmed pause.
    fn resume(&mut self, rng: &mut Rng) {
        self.assert_held("before resuming");
        match rng.below(3) {
            0 => {
                let l = self.signal_and_wait(libc::SIGUSR2);
                assert!(l.contains("] info: resumed: "), "{l}");
            }
            1 => {
                let v = self.logged(RESUMED, || self.ckpt_json(&["resume", &self.pid_s()]));
                assert_eq!(v["changed"], true, "{v}");
            }
            _ => {
                let v = self.logged(RESUMED, || self.request("{\"cmd\":\"resume\"}\n"));
                assert_eq!(v["resume"]["changed"], true, "{v}");
            }
        }
        self.paused = false;
        if rng.below(8) == 0 {
            // A resume while running changes nothing.
            let l = self.signal_and_wait(libc::SIGUSR2);
            assert!(l.contains("resume: not paused"), "{l}");
        }
    }

    /// Waits until no outcome line has come for `quiet`.
    fn settle(&self, quiet: Duration) {
        let mut n = self.count(is_outcome);
        loop {
            std::thread::sleep(quiet);
            let m = self.count(is_outcome);
            if m == n {
                return;
            }
            n = m;
        }
    }

    /// Lets the program finish; its output and the shim's log.
    fn finish(mut self) -> (String, String) {
        self.send("end");
        drop(self.stdin.take());
        let deadline = Instant::now() + Duration::from_secs(60);
        let status = loop {
            if let Some(st) = self.child.try_wait().expect("waiting for pause_stress") {
                break st;
            }
            assert!(
                Instant::now() < deadline,
                "{:?}: pause_stress did not finish within 60 s; the log:\n{}",
                self.addressing,
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(5));
        };
        if let Some(r) = self.reader.take() {
            r.join().expect("the log reader");
        }
        assert!(
            status.success(),
            "{:?}: pause_stress failed ({status}); the log:\n{}",
            self.addressing,
            self.log_text()
        );
        let out = self
            .out
            .take()
            .expect("stdout reader")
            .join()
            .expect("stdout");
        (out, self.log_text())
    }
}

impl Drop for Stressed {
    fn drop(&mut self) {
        if self.reader.is_some() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The program's output: the first line and the checksum line.
fn output_of(child: Child) -> (String, std::process::ExitStatus) {
    let out = child.wait_with_output().expect("waiting for pause_stress");
    (text(&out.stdout), out.status)
}

fn s(p: &Path) -> &str {
    p.to_str().expect("UTF-8 test paths")
}

/// Dump (staying paused), refuse a corrupt and a truncated copy when `refusals`, then
/// restore the good image or resume from it.
fn dump_and_restore(t: &mut Stressed, rng: &mut Rng, name: &str, refusals: bool) {
    let was_paused = t.paused;
    let d = t.logged(DUMPED, || t.ckpt_json(&["dump", &t.pid_s(), "-o", name]));
    assert_eq!(d["state"], "paused", "{d}");
    assert_eq!(d["pause"]["changed"], !was_paused, "{d}");
    if !was_paused {
        t.paused_now(None);
    }
    let img = t.work.join(name);
    let st = t.assert_state();
    assert_eq!(st["image"].as_str(), Some(s(&img)), "{st}");
    let d0 = &st["devices"][0];
    assert_eq!(d0["in_file"], d0["evicted"], "{st}");
    assert_eq!(d0["in_file"], d["bytes"], "{st}\n{d}");
    if refusals {
        let v = t.ckpt_json(&["inspect", s(&img)]);
        let at = v["allocations"][0]["data_offset"]
            .as_u64()
            .expect("data_offset")
            + 100;
        let corrupt = t.work.join("corrupt.img");
        images::flipped(&img, &corrupt, at);
        let len = std::fs::metadata(&img).unwrap().len() as usize;
        let short = t.work.join("short.img");
        images::truncated(&img, &short, len / 2);
        // The corrupt image is refused by the process (cudaw-ckpt cannot tell: its header
        // and table are sound), the truncated one by cudaw-ckpt already.
        for (bad, why, by_process) in [
            (&corrupt, "checksum mismatch", true),
            (&short, "image truncated", false),
        ] {
            let restore = || t.ckpt(&["restore", &t.pid_s(), "-i", s(bad)]);
            let out = if by_process {
                t.logged(REFUSED, restore)
            } else {
                restore()
            };
            assert_eq!(
                out.status.code(),
                Some(3),
                "{:?}: restore {} was not refused as a bad image: {}{}",
                t.addressing,
                bad.display(),
                text(&out.stdout),
                text(&out.stderr)
            );
            assert!(text(&out.stderr).contains(why), "{}", text(&out.stderr));
            // Still paused, its memory still in the good image, no thread through.
            let st = t.assert_state();
            assert_eq!(st["image"].as_str(), Some(s(&img)), "{st}");
            t.assert_held("after a refused restore");
        }
    }
    t.assert_held("dumped");
    if rng.below(2) == 0 {
        let r = t.logged(RESTORED, || {
            t.ckpt_json(&["restore", &t.pid_s(), "-i", name])
        });
        assert_eq!(r["state"], "running", "{r}");
        assert_eq!(r["pause"]["changed"], false, "{r}");
        assert_eq!(r["bytes"], d["bytes"], "{r}\n{d}");
        t.paused = false;
    } else {
        t.resume(rng);
    }
    t.assert_state();
}

fn stress(addressing: Addressing, cycles: u32, default_seed: u64) {
    let Some(nvcc) = nvcc() else { return };
    let exe = compile_program(&nvcc, "pause_stress");
    let seed = std::env::var("PAUSE_STRESS_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default_seed);
    eprintln!("pause_stress {addressing:?}: seed {seed} (PAUSE_STRESS_SEED={seed} replays it)");
    let mut rng = Rng(seed | 1);
    let iters = PER_CYCLE * cycles + 8;

    // The uninterrupted run.
    let reference = command_under_cudaw(&exe, addressing, &[("CUDAW_LOG", "warn")])
        .arg(iters.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting pause_stress");
    let (want, status) = output_of(reference);
    assert!(status.success(), "the uninterrupted run failed ({status})");
    assert!(want.contains(" checksum="), "{want}");

    let tag = addressing.as_str();
    let mut t = Stressed::start(&exe, iters, addressing, tag);
    let started = Instant::now();
    let (mut signals, mut socket_pauses, mut dumps, mut bursts) = (0, 0, 0, 0);
    for cycle in 0..cycles {
        t.send(&format!("run {PER_CYCLE}"));
        rng.sleep_us(3000);
        match rng.below(20) {
            // Pause by signal, sometimes twice; resume some way.
            0..=7 => {
                let l = t.signal_and_wait(libc::SIGUSR1);
                assert!(l.contains("] info: paused: "), "{l}");
                t.paused_now(Some(&l));
                signals += 1;
                rng.sleep_us(2000);
                if rng.below(4) == 0 {
                    let l = t.signal_and_wait(libc::SIGUSR1);
                    assert!(l.contains("pause: already paused"), "{l}");
                }
                t.assert_held("paused by a signal");
                t.resume(&mut rng);
            }
            // Pause through the socket: cudaw-ckpt, or a request line.
            8..=13 => {
                let before = t.count(|l| l.contains(PAUSED));
                if rng.below(2) == 0 {
                    let v = t.ckpt_json(&["pause", &t.pid_s()]);
                    assert_eq!(v["changed"], true, "{v}");
                } else {
                    let v = t.request("{\"cmd\":\"pause\"}\n");
                    assert_eq!(v["pause"]["changed"], true, "{v}");
                }
                let l = t.wait_lines(|l| l.contains(PAUSED), before + 1);
                t.paused_now(Some(&l));
                socket_pauses += 1;
                rng.sleep_us(2000);
                if rng.below(3) == 0 {
                    t.assert_state();
                }
                t.assert_held("paused through the socket");
                t.resume(&mut rng);
            }
            // A burst of signals in any order, then the state settled through the socket.
            14..=16 => {
                for _ in 0..2 + rng.below(6) {
                    t.signal(if rng.below(2) == 0 {
                        libc::SIGUSR1
                    } else {
                        libc::SIGUSR2
                    });
                    rng.sleep_us(300);
                }
                t.settle(Duration::from_millis(30));
                bursts += 1;
                let st = raw(&t.socket(), "{\"cmd\":\"status\"}\n");
                if st["status"]["state"] == "paused" {
                    t.paused_now(None);
                    t.assert_state();
                    t.resume(&mut rng);
                } else {
                    // Pause through the socket to check the gate once more.
                    let v = t.logged(PAUSED, || t.request("{\"cmd\":\"pause\"}\n"));
                    assert_eq!(v["pause"]["changed"], true, "{v}");
                    t.paused_now(None);
                    std::thread::sleep(Duration::from_millis(2));
                    t.resume(&mut rng);
                }
            }
            // Dump (staying paused) then restore or resume; every so often the dump finds
            // the process paused already, or bad images are refused first.
            17 | 18 => {
                if rng.below(3) == 0 {
                    let v = t.logged(PAUSED, || t.request("{\"cmd\":\"pause\"}\n"));
                    assert_eq!(v["pause"]["changed"], true, "{v}");
                    t.paused_now(None);
                }
                dump_and_restore(&mut t, &mut rng, "job.img", dumps % 4 == 1);
                dumps += 1;
            }
            // Checkpoint and carry on.
            _ => {
                let d = t.logged(DUMPED, || {
                    t.ckpt_json(&["dump", &t.pid_s(), "-o", "live.img", "--leave-running"])
                });
                assert_eq!(d["state"], "running", "{d}");
                assert_eq!(d["pause"]["changed"], true, "{d}");
                t.assert_state();
                dumps += 1;
            }
        }
        if cycle % 25 == 24 {
            t.assert_state();
        }
    }
    // Bad images refused at least once, whatever the schedule drew.
    dump_and_restore(&mut t, &mut rng, "last.img", true);
    let pauses = t.pauses;
    let elapsed = started.elapsed();
    t.assert_state();
    let (got, log) = t.finish();
    eprintln!(
        "pause_stress {addressing:?}: {pauses} pauses ({signals} by signal, {socket_pauses} \
         through the socket, {bursts} bursts of signals, {dumps} dumps) in {:.1} s",
        elapsed.as_secs_f64()
    );
    assert!(
        pauses as u32 >= cycles * 3 / 4,
        "{pauses} pauses in {cycles} cycles"
    );
    assert!(
        !log.contains("] error: "),
        "{addressing:?}: the shim logged errors:\n{log}"
    );
    assert_eq!(
        got, want,
        "{addressing:?}: the output differs from the uninterrupted run's"
    );
}

#[test]
fn stress_mapped() {
    stress(Addressing::Mapped, 250, 0x5eed_5001);
}

#[test]
fn stress_translated() {
    stress(Addressing::Translated, 250, 0x5eed_5002);
}
