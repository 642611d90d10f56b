//! The process's life under cudaw, on simgpu: a pause that lands while the program exits,
//! signals before the first CUDA call, a pause and a resume sent back to back, and fork.
//!
//! - `tests/cuda/programs/exit_race.cu` exits with device memory in use, reading it back
//!   in an `atexit` handler and a static destructor. Paused at random instants around its
//!   end (a single pause, or pauses in a tight loop, never a resume), it must always exit,
//!   with its output and status: a pause taken before exit begins is undone at exit (the
//!   handler reads the right bytes), one that arrives during exit is refused.
//! - A pause before the first CUDA call is a pause: the process lives on, and its first
//!   CUDA call waits for the resume.
//! - `kill -USR1; kill -USR2` back to back, 100 times: the process always ends resumed.
//! - A child forked after CUDA started exits even while its parent is paused, and a pause
//!   signal sent to the child does not pause the parent.
//!
//! The random schedule's seed is printed; `LIFECYCLE_SEED=N` replays its choices.

mod ckpt_common;

use ckpt_common::{temp_dir, text, Target};
use cudaw_tests::{
    command_under_cudaw, compile_program, compile_text, cudaw_ckpt, expected, nvcc, wait_timeout,
    Addressing, KillOnDrop, Rng,
};
use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::{Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

/// How long a process that must exit may take at most (it takes milliseconds).
const EXIT_LIMIT: Duration = Duration::from_secs(30);

fn kill(pid: u32, sig: i32) {
    // SAFETY: kill has no memory-safety preconditions; the PID is our own child's.
    unsafe { libc::kill(pid as libc::pid_t, sig) };
}

/// `cudaw-ckpt ARGS` with `run_dir` as the run folder.
fn ckpt(run_dir: &Path, args: &[&str]) -> Output {
    Command::new(cudaw_ckpt())
        .args(args)
        .env("CUDAW_RUN_DIR", run_dir)
        .output()
        .expect("running cudaw-ckpt")
}

/// `cudaw-ckpt ARGS`, which must succeed.
fn ckpt_ok(run_dir: &Path, args: &[&str]) {
    let o = ckpt(run_dir, args);
    assert!(
        o.status.success(),
        "cudaw-ckpt {args:?}: {}",
        text(&o.stderr)
    );
}

/// The state `cudaw-ckpt status PID --json` reports.
fn state(run_dir: &Path, pid: &str) -> serde_json::Value {
    let st = ckpt(run_dir, &["status", pid, "--json"]);
    let st: serde_json::Value = serde_json::from_slice(&st.stdout).expect("status --json");
    st["state"].clone()
}

/// Waits for `child` to exit (within [`EXIT_LIMIT`], else `what` fails the test); returns
/// its status, the rest of its output (`out`) and its standard error.
fn finish(child: &mut KillOnDrop, out: &mut impl Read, what: &str) -> (ExitStatus, String, String) {
    let status = wait_timeout(child, EXIT_LIMIT).unwrap_or_else(|| panic!("{what} did not exit"));
    let mut rest = String::new();
    out.read_to_string(&mut rest).unwrap();
    let mut err = String::new();
    if let Some(mut e) = child.stderr.take() {
        e.read_to_string(&mut err).unwrap();
    }
    (status, rest, err)
}

fn seed() -> u64 {
    let seed = std::env::var("LIFECYCLE_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
                | 1
        });
    println!("LIFECYCLE_SEED={seed}");
    seed
}

/// How the test pauses exit_race once its last line is out.
#[derive(Clone, Copy, Debug)]
enum Pauses {
    /// One `SIGUSR1` after `delay_us`; the program lingers 40 ms before it exits.
    Once { delay_us: u64 },
    /// `SIGUSR1` every half millisecond from `delay_us` on until it exits; it lingers 3 ms.
    Loop { delay_us: u64 },
}

/// Runs exit_race once under cudaw, pausing it as `how` says; returns its log. Fails if it
/// does not exit (within [`EXIT_LIMIT`]) with its output and status.
fn exit_race_once(how: Pauses, seed: u64, run: usize) -> String {
    let nvcc = nvcc().expect("nvcc");
    let exe = compile_program(&nvcc, "exit_race");
    let dir = temp_dir(&format!("exit-{run}"));
    let log = dir.0.join("log");
    let linger = match how {
        Pauses::Once { .. } => "40000",
        Pauses::Loop { .. } => "3000",
    };
    let mut cmd = command_under_cudaw(&exe, Addressing::Mapped, &[]);
    cmd.env("CUDAW_LOG", "info")
        .env("CUDAW_RUN_DIR", dir.0.join("run"))
        .env("EXIT_RACE_LINGER_US", linger)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&log).unwrap());
    let mut child = KillOnDrop(cmd.spawn().expect("starting exit_race"));
    let pid = child.id();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut first = String::new();
    out.read_line(&mut first).unwrap();
    let pause_at = |delay_us| Instant::now() + Duration::from_micros(delay_us);
    let status = match how {
        Pauses::Once { delay_us } => {
            std::thread::sleep(pause_at(delay_us).saturating_duration_since(Instant::now()));
            kill(pid, libc::SIGUSR1);
            wait_timeout(&mut child, EXIT_LIMIT)
        }
        Pauses::Loop { delay_us } => {
            std::thread::sleep(pause_at(delay_us).saturating_duration_since(Instant::now()));
            let deadline = Instant::now() + EXIT_LIMIT;
            loop {
                if let Some(s) = child.try_wait().unwrap() {
                    break Some(s);
                }
                if Instant::now() >= deadline {
                    break None;
                }
                kill(pid, libc::SIGUSR1);
                std::thread::sleep(Duration::from_micros(500));
            }
        }
    };
    let mut rest = String::new();
    if status.is_some() {
        out.read_to_string(&mut rest).unwrap();
    }
    let log_text = std::fs::read_to_string(&log).unwrap_or_default();
    let Some(status) = status else {
        panic!(
            "run {run} ({how:?}, LIFECYCLE_SEED={seed}): exit_race did not exit within {} s of a pause; its log:\n{log_text}",
            EXIT_LIMIT.as_secs()
        );
    };
    assert!(
        status.success(),
        "run {run} ({how:?}, LIFECYCLE_SEED={seed}): exit_race failed ({status}); its log:\n{log_text}"
    );
    assert_eq!(
        first + &rest,
        expected("exit_race"),
        "run {run}: {log_text}"
    );
    log_text
}

#[test]
fn a_pause_while_the_program_exits_never_holds_it() {
    if nvcc().is_none() {
        return;
    }
    let seed = seed();
    let mut rng = Rng(seed);
    let runs: usize = std::env::var("EXIT_RACE_RUNS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(120);
    let (mut undone, mut refused) = (0, 0);
    for run in 0..runs {
        let how = if run % 2 == 0 {
            Pauses::Once {
                delay_us: rng.below(50_000),
            }
        } else {
            Pauses::Loop {
                delay_us: rng.below(6_000),
            }
        };
        let log = exit_race_once(how, seed, run);
        undone += usize::from(log.contains("the pause was undone"));
        refused += usize::from(log.contains("the process is exiting: pause refused"));
    }
    println!(
        "{runs} runs exited: {undone} paused before exit and undone at exit, {refused} with pauses refused during exit"
    );
}

/// A pause taken before exit begins (deterministically: the test waits for it) is undone
/// at exit: the program's exit handler and destructor read their device memory back.
#[test]
fn exit_while_paused_undoes_the_pause() {
    let Some(nvcc) = nvcc() else { return };
    let exe = compile_program(&nvcc, "exit_race");
    let dir = temp_dir("exit-paused");
    let mut cmd = command_under_cudaw(&exe, Addressing::Mapped, &[]);
    cmd.env("CUDAW_LOG", "info")
        .env("CUDAW_RUN_DIR", dir.0.join("run"))
        // Long enough for the pause to be taken: the test waits for it, then not at all.
        .env("EXIT_RACE_LINGER_US", "1500000")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = KillOnDrop(cmd.spawn().expect("starting exit_race"));
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut first = String::new();
    out.read_line(&mut first).unwrap();
    let pid = child.id().to_string();
    ckpt_ok(&dir.0.join("run"), &["pause", &pid]);
    let (status, _, log) = finish(&mut child, &mut out, "exit_race paused before exit");
    assert!(
        status.success(),
        "exit_race paused before exit: {status}; its log:\n{log}"
    );
    assert!(
        log.contains("exiting while paused: the pause was undone (524288 bytes restored)"),
        "{log}"
    );
}

/// A pause before the first CUDA call: the process lives on (it died of `SIGUSR1`
/// before), and the first CUDA call waits until the resume. The program is Python calling
/// the runtime through ctypes, as a PyTorch job loads CUDA late (an nvcc-built program
/// registers its kernels, and so starts cudaw, before `main`).
#[test]
fn a_pause_before_the_first_cuda_call_is_a_pause() {
    if nvcc().is_none() {
        return;
    }
    let script = r#"
import ctypes, sys
print("late_start: waiting", flush=True)
sys.stdin.readline()
rt = ctypes.CDLL("libcudart.so.13")
p = ctypes.c_void_p()
assert rt.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(4)) == 0
assert rt.cudaMemset(p, 1, ctypes.c_size_t(4)) == 0
h = ctypes.c_int(0)
assert rt.cudaMemcpy(ctypes.byref(h), p, ctypes.c_size_t(4), 2) == 0
print("late_start: %x" % h.value, flush=True)
"#;
    let python = std::path::Path::new("/usr/bin/python3");
    let dir = temp_dir("late");
    let run_dir = dir.0.join("run");
    let mut cmd = command_under_cudaw(python, Addressing::Mapped, &[]);
    cmd.args(["-c", script])
        .env("CUDAW_LOG", "info")
        .env("CUDAW_RUN_DIR", &run_dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = KillOnDrop(cmd.spawn().expect("starting late_start"));
    let pid = child.id();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line, "late_start: waiting\n");
    // The program waits in read(2): the handler runs before read returns to it. (Before,
    // a pause before the first CUDA call killed the process: exit status 138.)
    kill(pid, libc::SIGUSR1);
    writeln!(child.stdin.as_mut().unwrap(), "go").unwrap();
    // The socket appears at the first CUDA call; the process is paused by then.
    let socket = run_dir.join(format!("{pid}.sock"));
    let deadline = Instant::now() + Duration::from_secs(10);
    while !socket.exists() {
        assert!(
            child.try_wait().unwrap().is_none(),
            "late_start died of the pause before its first CUDA call"
        );
        assert!(Instant::now() < deadline, "no socket {}", socket.display());
        std::thread::sleep(Duration::from_millis(5));
    }
    let pid = pid.to_string();
    assert_eq!(state(&run_dir, &pid), "paused");
    ckpt_ok(&run_dir, &["resume", &pid]);
    let (status, rest, log) = finish(&mut child, &mut out, "late_start, resumed");
    assert!(status.success(), "{status}: {log}");
    assert_eq!(rest, "late_start: 1010101\n", "{log}");
    assert!(
        log.contains("a pause arrived before the first CUDA call: CUDA calls wait for the resume"),
        "{log}"
    );
}

/// A process under cudaw that never calls CUDA (a shell) survives the pause signal.
#[test]
fn a_process_that_never_calls_cuda_survives_a_pause() {
    if nvcc().is_none() {
        return;
    }
    let sh = std::path::Path::new("/bin/sh");
    let mut cmd = command_under_cudaw(sh, Addressing::Mapped, &[]);
    // `cudaw run` takes the program's own arguments after it.
    cmd.args(["-c", "echo ready; read x; echo got $x"])
        .env("CUDAW_LOG", "warn")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = KillOnDrop(cmd.spawn().expect("starting sh under cudaw"));
    let pid = child.id();
    // Its first line comes from `main`: the shim's constructor, which installs the
    // handlers, has run.
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line, "ready\n");
    kill(pid, libc::SIGUSR1);
    kill(pid, libc::SIGUSR2);
    writeln!(child.stdin.as_mut().unwrap(), "here").unwrap();
    let (status, rest, err) = finish(&mut child, &mut out, "sh");
    assert!(
        status.success(),
        "sh under cudaw died of a pause: {status}: {err}"
    );
    assert_eq!(rest, "got here\n");
}

/// `kill -USR1 P; kill -USR2 P` back to back ends resumed, every time.
#[test]
fn a_pause_then_a_resume_back_to_back_ends_resumed() {
    let Some(mut t) = Target::start(Addressing::Mapped, "order") else {
        return;
    };
    let pid: u32 = t.pid.parse().unwrap();
    let resumes = |log: &str| {
        log.matches("] info: resumed: ").count() + log.matches("] info: resume: not paused").count()
    };
    for i in 0..100 {
        let before = resumes(&t.log());
        kill(pid, libc::SIGUSR1);
        kill(pid, libc::SIGUSR2);
        let deadline = Instant::now() + Duration::from_secs(20);
        while resumes(&t.log()) == before {
            assert!(
                Instant::now() < deadline,
                "pair {i}: no resume outcome:\n{}",
                t.log()
            );
            std::thread::sleep(Duration::from_millis(2));
        }
        let st = t.status();
        assert_eq!(st["state"], "running", "pair {i}: {st}\n{}", t.log());
        if i % 25 == 0 {
            t.run(1);
        }
    }
    t.finish();
}

/// A child forked after CUDA started exits through the runtime's exit handlers while its
/// parent is paused (its gate is its own), and a pause signal sent to the child does not
/// pause the parent.
#[test]
fn a_forked_child_exits_and_never_pauses_its_parent() {
    let Some(nvcc) = nvcc() else { return };
    let exe = compile_text(
        &nvcc,
        "fork_child",
        r#"#include "common.h"
#include <string>
#include <iostream>
#include <unistd.h>
#include <sys/wait.h>
#include <ctime>
int main() {
  int* d;
  CHECK(cudaMalloc(&d, sizeof(int)));
  CHECK(cudaMemset(d, 1, sizeof(int)));
  CHECK(cudaDeviceSynchronize());
  std::printf("fork_child: ready\n");
  std::fflush(stdout);
  std::string line;
  std::getline(std::cin, line);  // "fork", sent while this process is paused
  pid_t c = fork();
  if (c == 0) {
    std::printf("fork_child: child %d\n", (int)getpid());
    std::fflush(stdout);
    std::getline(std::cin, line);  // "exit"
    std::exit(0);  // the exit handlers run: the runtime's unregistering among them
  }
  int status = 0;
  waitpid(c, &status, 0);
  std::printf("fork_child: child exited %d\n", WIFEXITED(status) ? WEXITSTATUS(status) : -1);
  std::fflush(stdout);
  int h = 0;
  CHECK(cudaMemcpy(&h, d, sizeof(int), cudaMemcpyDeviceToHost));
  std::printf("fork_child: %x\n", h);
  return 0;
}
"#,
    );
    let dir = temp_dir("fork");
    let run_dir = dir.0.join("run");
    let mut cmd = command_under_cudaw(&exe, Addressing::Mapped, &[]);
    cmd.env("CUDAW_LOG", "info")
        .env("CUDAW_RUN_DIR", &run_dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = KillOnDrop(cmd.spawn().expect("starting fork_child"));
    let pid = child.id().to_string();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line, "fork_child: ready\n");
    ckpt_ok(&run_dir, &["pause", &pid]);
    let stdin = child.stdin.as_mut().unwrap();
    writeln!(stdin, "fork").unwrap();
    stdin.flush().unwrap();
    line.clear();
    out.read_line(&mut line).unwrap();
    let cpid: u32 = line
        .strip_prefix("fork_child: child ")
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or_else(|| panic!("{line:?}"));
    // Signals to the child: its own, never its parent's.
    kill(cpid, libc::SIGUSR2);
    kill(cpid, libc::SIGUSR1);
    writeln!(stdin, "exit").unwrap();
    stdin.flush().unwrap();
    line.clear();
    out.read_line(&mut line).unwrap();
    assert_eq!(line, "fork_child: child exited 0\n");
    // The parent is still paused: the child's resume signal did not reach it.
    assert_eq!(state(&run_dir, &pid), "paused");
    ckpt_ok(&run_dir, &["resume", &pid]);
    let (status, rest, log) = finish(&mut child, &mut out, "fork_child");
    assert!(status.success(), "{status}: {log}");
    assert_eq!(rest, "fork_child: 1010101\n", "{log}");
    let parent_pauses = log.matches(&format!("cudaw[{pid}] info: paused: ")).count();
    assert_eq!(
        parent_pauses, 1,
        "the child's signal paused its parent:\n{log}"
    );
}
