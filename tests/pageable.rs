//! Copies with pageable host memory through cudaw's pinned staging
//! (`crates/engine/src/pageable.rs`), on simgpu: `tests/cuda/programs/pageable_copy.cu`
//! copies `malloc` buffers of several sizes, below and above the threshold, at odd sizes and
//! offsets, both ways, synchronously and on a non-blocking stream with kernels before and
//! after, and checks every byte on the CPU as soon as CUDA promises it. Its output is the
//! same natively (simgpu playing the runtime), under cudaw with staged copies (the default
//! threshold, a 4 KiB one, both addressings) and with them off; the exit summary says how
//! many copies went through the staging. simgpu's streams run on worker threads, and
//! `SIMGPU_COPY_DELAY_US` makes every driver copy slow on its stream, so a staged copy not
//! ordered with the program's stream would be seen (a kernel would read or a copy return
//! the bytes from before it).
//!
//! A pause while the program runs round after round of staged copies completes, and so
//! does the program, with the same output.

use cudaw_tests::{
    command_under_cudaw, compile_program, expected, nvcc, run_natively, run_under_cudaw,
    Addressing, KillOnDrop, Rng,
};
use std::io::{BufRead, BufReader, Read};
use std::process::Stdio;
use std::sync::mpsc::channel;
use std::time::{Duration, Instant};

const NAME: &str = "pageable_copy";

/// Copies the program makes of at least the default threshold (1 MiB): four cases of
/// seven copies, and one whole-buffer copy of the case just under 1 MiB.
const STAGED_BY_DEFAULT: u64 = 29;
/// ... and of at least 4 KiB: six cases of seven copies.
const STAGED_FROM_4K: u64 = 42;

/// The exit summary's count of staged copies (0 when it has none).
fn staged_copies(log: &str) -> u64 {
    log.lines()
        .find_map(|l| l.split("through the pinned staging: ").nth(1))
        .and_then(|rest| rest.split(' ').next())
        .map_or(0, |n| n.parse().expect("a count of staged copies"))
}

fn under_cudaw(addressing: Addressing, env: &[(&str, &str)], staged: u64) {
    let Some(nvcc) = nvcc() else { return };
    let exe = compile_program(&nvcc, NAME);
    let run = run_under_cudaw(&exe, addressing, env);
    let what = format!("{NAME} ({addressing:?}, {env:?})");
    run.assert_success(&what);
    assert_eq!(run.stdout(), expected(NAME), "{what}: output differs");
    assert_eq!(
        staged_copies(&run.stderr()),
        staged,
        "{what}: copies through the staging; log:\n{}",
        run.stderr()
    );
}

#[test]
fn native_run_matches_the_expected_output() {
    let Some(nvcc) = nvcc() else { return };
    let exe = compile_program(&nvcc, NAME);
    // The program links libcudart.so.13: natively, simgpu plays it.
    let run = run_natively(&exe);
    run.assert_success("pageable_copy natively");
    assert_eq!(run.stdout(), expected(NAME));
}

#[test]
fn staged_copies_by_default_give_the_same_output() {
    under_cudaw(Addressing::Mapped, &[], STAGED_BY_DEFAULT);
}

#[test]
fn staged_copies_off_give_the_same_output() {
    under_cudaw(Addressing::Mapped, &[("CUDAW_STAGED_COPY_MIN", "off")], 0);
}

#[test]
fn slow_device_copies_stay_in_stream_order_mapped() {
    under_cudaw(
        Addressing::Mapped,
        &[
            ("CUDAW_STAGED_COPY_MIN", "4K"),
            ("SIMGPU_COPY_DELAY_US", "2000"),
        ],
        STAGED_FROM_4K,
    );
}

#[test]
fn slow_device_copies_stay_in_stream_order_translated() {
    under_cudaw(
        Addressing::Translated,
        &[
            ("CUDAW_STAGED_COPY_MIN", "4K"),
            ("SIMGPU_COPY_DELAY_US", "2000"),
        ],
        STAGED_FROM_4K,
    );
}

/// `CUDAW_STAGING_PROFILE=on`: one line per staged copy saying where its time went, each
/// direction's bytes adding up to what the staging moved; the output unchanged.
#[test]
fn a_profiled_run_says_where_each_staged_copy_went() {
    let Some(nvcc) = nvcc() else { return };
    let exe = compile_program(&nvcc, NAME);
    let run = run_under_cudaw(&exe, Addressing::Mapped, &[("CUDAW_STAGING_PROFILE", "on")]);
    run.assert_success("pageable_copy profiled");
    assert_eq!(run.stdout(), expected(NAME));
    let log = run.stderr();
    let lines: Vec<&str> = log
        .lines()
        .filter_map(|l| l.strip_prefix("cudaw staging profile: "))
        .collect();
    // Copies of a buffer's worth or less are spread over the parties too: every staged
    // copy is one line (one batch, on the calling thread alone, none).
    assert!(!lines.is_empty(), "{log}");
    assert!(lines.len() as u64 <= staged_copies(&log), "{log}");
    for l in &lines {
        assert!(
            l.starts_with("to device ") || l.starts_with("to host "),
            "{l}"
        );
        for part in [
            "bytes in",
            "batches",
            "parties, the last started at",
            "device copies issued from",
            "per party: waiting",
            "for the device, copying",
            "issuing",
        ] {
            assert!(l.contains(part), "{part:?} missing: {l}");
        }
    }
}

#[test]
fn a_bad_threshold_is_reported_and_the_default_used() {
    let Some(nvcc) = nvcc() else { return };
    let exe = compile_program(&nvcc, NAME);
    let run = run_under_cudaw(
        &exe,
        Addressing::Mapped,
        &[("CUDAW_STAGED_COPY_MIN", "lots")],
    );
    run.assert_success("pageable_copy with a bad threshold");
    let log = run.stderr();
    assert!(
        log.contains(
            "CUDAW_STAGED_COPY_MIN=\"lots\" is neither a size (like 1M or 262144) nor `off`; using 1024K"
        ),
        "{log}"
    );
    assert_eq!(staged_copies(&log), STAGED_BY_DEFAULT, "{log}");
}

/// Pauses and resumes (signals) at random instants while the program runs rounds of staged
/// copies: every pause completes (no copy holding the staging blocks it), and the output
/// is the uninterrupted run's.
#[test]
fn pauses_during_staged_copies_complete() {
    let Some(nvcc) = nvcc() else { return };
    let exe = compile_program(&nvcc, NAME);
    let mut cmd = command_under_cudaw(
        &exe,
        Addressing::Mapped,
        &[
            ("CUDAW_STAGED_COPY_MIN", "4K"),
            ("SIMGPU_COPY_DELAY_US", "300"),
            ("CUDAW_LOG", "info"),
        ],
    );
    cmd.arg("8")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = KillOnDrop(cmd.spawn().expect("starting pageable_copy"));
    let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
    let stderr = child.stderr.take().expect("stderr");
    let (tx, log) = channel();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut seen = Vec::new();
    let wait_for = |what: &str, seen: &mut Vec<String>| {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match log.recv_timeout(left) {
                Ok(line) => {
                    let hit = line.contains(what);
                    seen.push(line);
                    if hit {
                        return;
                    }
                }
                Err(_) => panic!(
                    "no log line with {what:?} within 20 s (a pause stuck behind a staged copy?); the log:\n{}",
                    seen.join("\n")
                ),
            }
        }
    };
    let mut first = String::new();
    stdout
        .read_line(&mut first)
        .expect("reading the first line");
    assert_eq!(first, "pageable_copy: ready\n");
    wait_for("pause on signal", &mut seen);
    let pid = i32::try_from(child.id()).expect("pid");
    let signal = |sig: i32| {
        // SAFETY: kill(2) of our own child; no memory is involved.
        let rc = unsafe { libc::kill(pid, sig) };
        assert_eq!(rc, 0, "kill({pid}, {sig}): the program exited early?");
    };
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    // The first pause waits until copies have gone through the staging.
    let mut pauses = 0;
    for _ in 0..5 {
        rng.sleep_us(150_000);
        signal(libc::SIGUSR1);
        wait_for("] info: paused: ", &mut seen);
        pauses += 1;
        rng.sleep_us(20_000);
        signal(libc::SIGUSR2);
        wait_for("] info: resumed: ", &mut seen);
    }
    let mut rest = String::new();
    stdout.read_to_string(&mut rest).expect("reading stdout");
    let status = child.wait().expect("waiting for pageable_copy");
    seen.extend(log.iter());
    reader.join().expect("the log reader");
    let log = seen.join("\n");
    assert!(status.success(), "pageable_copy failed ({status}):\n{log}");
    assert_eq!(
        first + &rest,
        expected(NAME),
        "output after {pauses} pauses"
    );
    assert!(staged_copies(&log) >= STAGED_FROM_4K, "{log}");
}
