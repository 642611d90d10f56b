//! Pause and resume by signal: `tests/cuda/programs/pause_target.cu` runs under cudaw on
//! simgpu while the test sends it `SIGUSR1` (pause) and `SIGUSR2` (resume) at random
//! instants (fixed seed). Its output must equal the uninterrupted run's
//! (`pause_target.expected`: the program also checks every result against the CPU), every
//! pause must hand all of its device memory back (the shim's `paused:` log line says what
//! it evicted and what stays mapped), and a second pause or a resume without a pause must
//! change nothing.

use cudaw_tests::{command_under_cudaw, compile_program, expected, nvcc, Addressing};
use std::io::{BufRead, BufReader, Read};
use std::process::Stdio;
use std::sync::mpsc::{channel, Receiver};
use std::time::{Duration, Instant};

/// The program's device memory: five buffers of 64 KiB.
const ALLOCATIONS: u64 = 5;
const BYTES: u64 = 5 * 65536;

/// xorshift64*: a fixed-seed source of sleeps.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n
    }

    fn sleep_ms(&mut self, max: u64) {
        std::thread::sleep(Duration::from_micros(self.below(max * 1000)));
    }
}

struct Target {
    child: cudaw_tests::KillOnDrop,
    /// The shim's log, line by line.
    log: Receiver<String>,
    /// Every log line read so far.
    seen: Vec<String>,
}

impl Target {
    fn signal(&self, sig: i32) {
        let pid = i32::try_from(self.child.id()).expect("pid");
        // SAFETY: kill(2) with our own child's pid; no memory is involved.
        let rc = unsafe { libc::kill(pid, sig) };
        assert_eq!(rc, 0, "kill({pid}, {sig}): the target exited early?");
    }

    /// Waits for a log line containing `what`; returns it.
    fn wait_for(&mut self, what: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.log.recv_timeout(left) {
                Ok(line) => {
                    self.seen.push(line.clone());
                    if line.contains(what) {
                        return line;
                    }
                }
                Err(_) => panic!(
                    "no log line with {what:?} within 10 s; the log so far:\n{}",
                    self.seen.join("\n")
                ),
            }
        }
    }
}

/// `paused: N allocations, X bytes evicted in T ms; M bytes of device memory still mapped`
/// as (N, X, M).
fn parse_paused(line: &str) -> (u64, u64, u64) {
    let rest = line.split_once("paused: ").expect("a paused line").1;
    let words: Vec<&str> = rest.split_whitespace().collect();
    let num = |i: usize| -> u64 {
        words[i]
            .trim_end_matches([',', ';'])
            .parse()
            .unwrap_or_else(|_| panic!("word {i} of {line:?}"))
    };
    let mapped_at = words
        .iter()
        .position(|w| *w == "still")
        .expect("still mapped")
        - 5;
    (num(0), num(2), num(mapped_at))
}

fn pause_and_resume(addressing: Addressing, pairs: usize, seed: u64) {
    let Some(nvcc) = nvcc() else { return };
    let exe = compile_program(&nvcc, "pause_target");
    let mut cmd = command_under_cudaw(&exe, addressing, &[]);
    cmd.env("CUDAW_LOG", "info")
        // Held open until the test is done with the program (it waits for the end).
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cudaw_tests::KillOnDrop(cmd.spawn().expect("starting pause_target"));
    let stdin = child.stdin.take().expect("stdin");
    let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
    let stderr = child.stderr.take().expect("stderr");
    let (tx, rx) = channel();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut t = Target {
        child,
        log: rx,
        seen: Vec::new(),
    };
    // The first line comes once the program's memory is allocated: the shim, and with it
    // the signal handlers, are in place.
    let mut first = String::new();
    stdout
        .read_line(&mut first)
        .expect("reading the first line");
    assert!(
        first.starts_with("pause_target:"),
        "unexpected first line {first:?}"
    );
    t.wait_for("pause on signal");

    // A resume without a pause is harmless.
    t.signal(libc::SIGUSR2);
    t.wait_for("resume: not paused");

    let mut rng = Rng(seed);
    for pair in 0..pairs {
        rng.sleep_ms(8);
        t.signal(libc::SIGUSR1);
        let line = t.wait_for("paused: ");
        let (allocations, bytes, mapped) = parse_paused(&line);
        assert_eq!(
            (allocations, bytes, mapped),
            (ALLOCATIONS, BYTES, 0),
            "pause {pair}: {line}"
        );
        if pair % 5 == 2 {
            // A second pause while paused does nothing.
            t.signal(libc::SIGUSR1);
            t.wait_for("pause: already paused");
        }
        rng.sleep_ms(10);
        t.signal(libc::SIGUSR2);
        let line = t.wait_for("resumed: ");
        assert!(
            line.contains(&format!(
                "{ALLOCATIONS} allocations, {BYTES} bytes restored"
            )),
            "resume {pair}: {line}"
        );
    }

    // Done with it: the program finishes.
    drop(stdin);
    let mut rest = String::new();
    stdout.read_to_string(&mut rest).expect("reading stdout");
    let status = t.child.wait().expect("waiting for pause_target");
    for line in t.log.iter() {
        t.seen.push(line);
    }
    reader.join().expect("the log reader");
    assert!(
        status.success(),
        "pause_target ({addressing:?}) failed ({status}); its log:\n{}",
        t.seen.join("\n")
    );
    assert_eq!(
        first + &rest,
        expected("pause_target"),
        "pause_target ({addressing:?}) output differs from the uninterrupted run"
    );
    let pauses = t
        .seen
        .iter()
        .filter(|l| l.contains("] info: paused: "))
        .count();
    assert_eq!(pauses, pairs, "pauses logged");
}

#[test]
fn signals_pause_and_resume_mapped() {
    pause_and_resume(Addressing::Mapped, 30, 0x5eed_0001);
}

#[test]
fn signals_pause_and_resume_translated() {
    pause_and_resume(Addressing::Translated, 10, 0x5eed_0002);
}
