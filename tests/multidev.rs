//! One process with memory on two devices, under cudaw on simgpu (`SIMGPU_DEVICES=2`):
//! `tests/cuda/multidev/multidev_peer.cu` keeps buffers on both devices, runs a kernel on
//! GPU 1 that reads GPU 0's `cudaMalloc` memory (peer access enabled after some of it was
//! allocated, before the rest) and copies between them with `cudaMemcpyPeer(Async)`,
//! printing a digest per iteration. Paused and resumed, dumped and restored as the test
//! tells it — between iterations it is told to run — its output must equal an
//! uninterrupted run's under cudaw, and while paused neither device holds its memory.
//!
//! The program is driven line by line through its standard input ("run K"), like
//! `ckpt_target` in `tests/dump.rs`.

use cudaw_tests::{command_under_cudaw, compile, cudaw_ckpt, nvcc, workspace, Addressing};
use serde_json::Value;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The program's allocations: `a`, `b`, `late` on device 0, `c`, `wide` on device 1.
const DEVICE_0: (u64, u64) = (3, 3 * 65536);
const DEVICE_1: (u64, u64) = (2, 65536 + (3 << 20) + 12);
/// Its iterations.
const ITERATIONS: u32 = 48;

/// The variables every run gets: two simulated devices.
const ENV: [(&str, &str); 1] = [("SIMGPU_DEVICES", "2")];

fn program() -> Option<PathBuf> {
    let nvcc = nvcc()?;
    let src = workspace().join("tests/cuda/multidev/multidev_peer.cu");
    Some(compile(&nvcc, "multidev_peer", &src))
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The output of an uninterrupted run under cudaw (no input: it runs straight through).
fn uninterrupted(exe: &Path, addressing: Addressing) -> String {
    let out = command_under_cudaw(exe, addressing, &ENV)
        .env("CUDAW_LOG", "info")
        .env("CUDAW_CONTROL_SOCKET", "off")
        .stdin(Stdio::null())
        .output()
        .expect("running multidev_peer");
    assert!(
        out.status.success(),
        "multidev_peer ({addressing:?}) failed uninterrupted ({}):\n{}{}",
        out.status,
        text(&out.stdout),
        text(&out.stderr)
    );
    let s = text(&out.stdout);
    assert!(
        s.contains("every buffer matches the CPU") && s.lines().count() == ITERATIONS as usize + 2,
        "{s}"
    );
    s
}

/// multidev_peer running under cudaw, with a private run folder and an image folder;
/// killed when dropped unless it finished.
struct Job {
    child: Child,
    pid: String,
    addressing: Addressing,
    run_dir: tempfile::TempDir,
    work: tempfile::TempDir,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
    /// Output lines other than "ran N".
    out: Vec<String>,
    log: Arc<Mutex<String>>,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl Job {
    fn start(exe: &Path, addressing: Addressing) -> Job {
        // Short paths: socket paths are limited to 108 bytes.
        let run_dir = tempfile::Builder::new()
            .prefix("cudaw-md")
            .tempdir()
            .expect("a run folder");
        let work = tempfile::tempdir().expect("an image folder");
        let mut child = command_under_cudaw(exe, addressing, &ENV)
            .env("CUDAW_LOG", "info")
            .env("CUDAW_RUN_DIR", run_dir.path())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting multidev_peer");
        let pid = child.id().to_string();
        let stdin = child.stdin.take();
        let stdout = BufReader::new(child.stdout.take().expect("stdout"));
        let stderr = child.stderr.take().expect("stderr");
        let log = Arc::new(Mutex::new(String::new()));
        let sink = Arc::clone(&log);
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                let mut l = sink.lock().unwrap();
                l.push_str(&line);
                l.push('\n');
            }
        });
        let mut job = Job {
            child,
            pid,
            addressing,
            run_dir,
            work,
            stdin,
            stdout,
            out: Vec::new(),
            log,
            reader: Some(reader),
        };
        let mut first = String::new();
        job.stdout.read_line(&mut first).expect("the first line");
        assert!(
            first.starts_with("multidev_peer: 5 allocations"),
            "{first:?}\n{}",
            job.log()
        );
        job.out.push(first);
        let socket = job.run_dir.path().join(format!("{}.sock", job.pid));
        let deadline = Instant::now() + Duration::from_secs(10);
        while !socket.exists() {
            assert!(Instant::now() < deadline, "no socket {}", socket.display());
            std::thread::sleep(Duration::from_millis(5));
        }
        job
    }

    fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    /// Runs `k` more iterations and waits for them.
    fn run(&mut self, k: u32) {
        let stdin = self.stdin.as_mut().expect("stdin open");
        writeln!(stdin, "run {k}").expect("writing to multidev_peer");
        stdin.flush().unwrap();
        loop {
            let mut line = String::new();
            let n = self.stdout.read_line(&mut line).expect("reading stdout");
            assert!(n > 0, "multidev_peer ended early; its log:\n{}", self.log());
            if line.starts_with("ran ") {
                return;
            }
            self.out.push(line);
        }
    }

    fn ckpt(&self, args: &[&str]) -> Output {
        Command::new(cudaw_ckpt())
            .args(args)
            .env("CUDAW_RUN_DIR", self.run_dir.path())
            .current_dir(self.work.path())
            .output()
            .expect("running cudaw-ckpt")
    }

    /// Runs cudaw-ckpt, asserts it succeeded, returns its stdout.
    fn ok(&self, args: &[&str]) -> String {
        let out = self.ckpt(args);
        assert!(
            out.status.success(),
            "cudaw-ckpt {args:?} failed ({}):\n{}{}\n--- the program's log:\n{}",
            out.status,
            text(&out.stdout),
            text(&out.stderr),
            self.log()
        );
        text(&out.stdout)
    }

    fn json(&self, args: &[&str]) -> Value {
        let mut a = args.to_vec();
        a.push("--json");
        let s = self.ok(&a);
        serde_json::from_str(&s).unwrap_or_else(|e| panic!("{a:?} printed {s:?}: {e}"))
    }

    fn status(&self) -> Value {
        self.json(&["status", &self.pid])
    }

    fn path(&self, name: &str) -> PathBuf {
        self.work.path().join(name)
    }

    /// Asserts the status names both devices, every byte of both off the device (and,
    /// with `in_file`, only in the image).
    fn assert_paused(&self, in_file: bool) {
        let st = self.status();
        assert_eq!(st["state"], "paused", "{st}");
        let devices = st["devices"].as_array().expect("a devices list");
        let ordinals: Vec<u64> = devices
            .iter()
            .filter_map(|d| d["ordinal"].as_u64())
            .collect();
        assert_eq!(ordinals, [0, 1], "{st}");
        for (d, (allocations, bytes)) in devices.iter().zip([DEVICE_0, DEVICE_1]) {
            assert_eq!(d["allocations"].as_u64(), Some(allocations), "{st}");
            assert_eq!(d["evicted"].as_u64(), Some(bytes), "{st}");
            assert_eq!(d["resident"].as_u64(), Some(0), "{st}");
            // The simulated device's memory is given back: nothing of cudaw's mapped.
            assert_eq!(d["mapped"].as_u64(), Some(0), "{st}");
            let held = if in_file { bytes } else { 0 };
            assert_eq!(d["in_file"].as_u64(), Some(held), "{st}");
        }
    }

    fn assert_running(&self) {
        let st = self.status();
        assert_eq!(st["state"], "running", "{st}");
        let devices = st["devices"].as_array().expect("a devices list");
        assert_eq!(devices.len(), 2, "{st}");
        for (d, (_, bytes)) in devices.iter().zip([DEVICE_0, DEVICE_1]) {
            assert_eq!(d["resident"].as_u64(), Some(bytes), "{st}");
            assert!(d["mapped"].as_u64() >= Some(bytes), "{st}");
        }
    }

    /// Lets the program finish; returns its output less the "ran" lines, and its log.
    fn finish(mut self) -> (String, String) {
        let stdin = self.stdin.as_mut().expect("stdin open");
        writeln!(stdin, "end").expect("writing to multidev_peer");
        drop(self.stdin.take());
        let mut rest = String::new();
        self.stdout.read_to_string(&mut rest).expect("stdout");
        let status = self.child.wait().expect("waiting for multidev_peer");
        if let Some(r) = self.reader.take() {
            r.join().expect("the log reader");
        }
        let log = self.log();
        assert!(
            status.success(),
            "multidev_peer ({:?}) failed ({status}):\n{log}",
            self.addressing
        );
        for l in rest.split_inclusive('\n') {
            if !l.starts_with("ran ") {
                self.out.push(l.to_owned());
            }
        }
        (self.out.concat(), log)
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        // A failed test: never leave the program behind (paused, it would wait for ever).
        if self.reader.is_some() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn paused_and_resumed(addressing: Addressing) {
    let Some(exe) = program() else { return };
    let reference = uninterrupted(&exe, addressing);
    let mut job = Job::start(&exe, addressing);
    for round in 0..6 {
        job.run(5);
        let out = job.ok(&["pause", &job.pid]);
        assert!(out.contains("paused"), "round {round}: {out}");
        job.assert_paused(false);
        job.ok(&["resume", &job.pid]);
        job.assert_running();
    }
    let (out, log) = job.finish();
    assert_eq!(
        out, reference,
        "multidev_peer ({addressing:?}) paused and resumed differs from its uninterrupted run; its log:\n{log}"
    );
    assert!(!log.contains("] error: "), "errors in the log:\n{log}");
}

#[test]
fn paused_and_resumed_on_two_devices_it_runs_as_uninterrupted() {
    paused_and_resumed(Addressing::Mapped);
}

#[test]
fn paused_and_resumed_on_two_devices_in_translated_addressing() {
    paused_and_resumed(Addressing::Translated);
}

/// `inspect --verify --json` of an image of the program: format 1.3, both devices named,
/// every allocation on its device.
fn inspect(job: &Job, image: &Path) -> Value {
    let v = job.json(&["inspect", image.to_str().unwrap(), "--verify"]);
    assert_eq!(v["format_version"], "1.3", "{v}");
    assert_eq!(v["gpu"]["ordinal"], 0, "{v}");
    let others = v["other_gpus"].as_array().expect("the other devices");
    assert_eq!(others.len(), 1, "{v}");
    assert_eq!(others[0]["ordinal"], 1, "{v}");
    // Two devices' records: the required flag a 1.2 reader refuses.
    assert_eq!(v["flags"].as_u64().map(|f| f & 2), Some(2), "{v}");
    let on = |d: u64| {
        v["allocations"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|a| a["device"].as_u64() == Some(d))
            .map(|a| a["size"].as_u64().unwrap())
            .fold((0, 0), |(n, b), s| (n + 1, b + s))
    };
    assert_eq!(on(0), DEVICE_0, "{v}");
    assert_eq!(on(1), DEVICE_1, "{v}");
    assert_eq!(v["verified"]["digest"], v["digest"], "{v}");
    v
}

fn dumped_and_restored(addressing: Addressing) {
    let Some(exe) = program() else { return };
    let reference = uninterrupted(&exe, addressing);
    let mut job = Job::start(&exe, addressing);

    // Dump (paused, the bytes of both devices only in the image), resume from it.
    job.run(8);
    let a = job.path("a.img");
    let out = job.ok(&["dump", &job.pid, "-o", "a.img"]);
    let (n, bytes) = (DEVICE_0.0 + DEVICE_1.0, DEVICE_0.1 + DEVICE_1.1);
    assert!(
        out.contains(&format!("{n} allocations, {bytes} bytes")),
        "{out}"
    );
    job.assert_paused(true);
    inspect(&job, &a);
    job.ok(&["resume", &job.pid]);
    job.assert_running();

    // Dump and restore: the process paused, its memory loaded from the image.
    job.run(8);
    job.ok(&["dump", &job.pid, "-o", "b.img"]);
    job.assert_paused(true);
    let out = job.ok(&["restore", &job.pid, "-i", "b.img"]);
    assert!(out.contains("restored"), "{out}");
    job.assert_running();

    // Dump --leave-running, then restore at once (the same bytes), while running.
    job.run(8);
    job.ok(&["dump", &job.pid, "-o", "c.img", "--leave-running"]);
    job.assert_running();
    inspect(&job, &job.path("c.img"));
    job.ok(&["restore", &job.pid, "-i", "c.img"]);
    job.assert_running();

    let (out, log) = job.finish();
    assert_eq!(
        out, reference,
        "multidev_peer ({addressing:?}) dumped and restored differs from its uninterrupted run; its log:\n{log}"
    );
}

#[test]
fn dumped_and_restored_on_two_devices_it_runs_as_uninterrupted() {
    dumped_and_restored(Addressing::Mapped);
}

#[test]
fn dumped_and_restored_on_two_devices_in_translated_addressing() {
    dumped_and_restored(Addressing::Translated);
}

/// A restore from an image whose device-1 data is corrupt: device 0 is loaded first, then
/// device 1 fails its chunk check, and both loads are rolled back: device 0 keeps its own
/// bytes (the image is 8 iterations older than them, so any byte of it left there would
/// change the program's output).
fn corrupt_device_1(addressing: Addressing) {
    let Some(exe) = program() else { return };
    let reference = uninterrupted(&exe, addressing);
    let mut job = Job::start(&exe, addressing);
    job.run(8);
    job.ok(&["dump", &job.pid, "-o", "a.img", "--leave-running"]);
    let v = inspect(&job, &job.path("a.img"));
    job.run(8);
    // Device 1's last allocation (its `wide` buffer), a byte of its first chunk's data.
    let wide = v["allocations"]
        .as_array()
        .unwrap()
        .iter()
        .rfind(|a| a["device"].as_u64() == Some(1))
        .expect("an allocation on device 1");
    let at = wide["data_offset"].as_u64().unwrap() + 24 + 1000;
    let mut bytes = std::fs::read(job.path("a.img")).unwrap();
    bytes[at as usize] ^= 0x5a;
    std::fs::write(job.path("bad.img"), bytes).unwrap();
    for paused in [true, false] {
        if paused {
            job.ok(&["pause", &job.pid]);
        }
        let out = job.ckpt(&["restore", &job.pid, "-i", "bad.img"]);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(3), "{err}");
        for w in [
            "device 1: ",
            "checksum mismatch in chunk 0 of allocation",
            "the devices loaded before it were rolled back too",
        ] {
            assert!(err.contains(w), "{err:?} lacks {w:?}");
        }
        if paused {
            job.assert_paused(false);
            job.ok(&["resume", &job.pid]);
        }
        job.assert_running();
        job.run(4);
    }
    let (out, log) = job.finish();
    assert_eq!(
        out, reference,
        "multidev_peer ({addressing:?}) after failed restores differs from its uninterrupted run; its log:\n{log}"
    );
}

#[test]
fn a_failed_restore_on_device_1_leaves_device_0_its_own_bytes() {
    corrupt_device_1(Addressing::Mapped);
}

#[test]
fn a_failed_restore_on_device_1_leaves_device_0_its_own_bytes_translated() {
    corrupt_device_1(Addressing::Translated);
}
