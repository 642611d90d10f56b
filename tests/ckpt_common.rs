//! The harness of the dump/restore tests: `tests/cuda/programs/ckpt_target.cu` under
//! `cudaw run` on simgpu, with a private `CUDAW_RUN_DIR`, driven line by line through its
//! standard input ("run K") while the test runs `cudaw-ckpt` against it.

#![allow(dead_code)]

use cudaw_tests::{command_under_cudaw, compile_program, cudaw_ckpt, expected, nvcc, Addressing};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// ckpt_target's allocations and their bytes: three 64 KiB buffers, the 64 KiB `y`, the
/// 9 MiB + 20 byte buffer and the 100 byte counter.
pub const ALLOCATIONS: u64 = 6;
pub const BYTES: u64 = 4 * 65536 + (9 << 20) + 20 + 100;
/// Their chunks in an image (8 MiB chunks: the big buffer takes two).
pub const CHUNKS: u64 = 7;

/// A private folder (short: socket paths are limited to 108 bytes), removed when dropped,
/// failed test or not.
pub struct TempDir(pub PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub fn temp_dir(tag: &str) -> TempDir {
    let dir = std::env::temp_dir().join(format!("cudaw-dump-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("creating a test folder");
    TempDir(dir)
}

pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Runs cudaw-ckpt with `CUDAW_RUN_DIR=run_dir`, in the folder `cwd`.
pub fn ckpt_in(run_dir: &Path, cwd: &Path, args: &[&str]) -> Output {
    Command::new(cudaw_ckpt())
        .args(args)
        .env("CUDAW_RUN_DIR", run_dir)
        .current_dir(cwd)
        .output()
        .expect("running cudaw-ckpt")
}

/// Sends one raw request line to a socket; returns every line of the answer, parsed.
pub fn raw_lines(socket: &Path, line: &str) -> Vec<serde_json::Value> {
    let mut s = UnixStream::connect(socket).expect("connecting to the control socket");
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    s.write_all(line.as_bytes()).unwrap();
    let mut out = Vec::new();
    for l in BufReader::new(s).lines() {
        let l = l.expect("reading the answer");
        out.push(serde_json::from_str(&l).unwrap_or_else(|e| panic!("line {l:?}: {e}")));
    }
    out
}

/// One raw request's reply (its only line).
pub fn raw(socket: &Path, line: &str) -> serde_json::Value {
    let mut lines = raw_lines(socket, line);
    assert_eq!(lines.len(), 1, "one reply line expected: {lines:?}");
    lines.remove(0)
}

/// How long a run sent to ckpt_target may take before the test fails (a few ms each
/// normally; a hang must fail the test, not hold the suite).
pub const RAN_WITHIN: Duration = Duration::from_secs(120);

/// ckpt_target running under cudaw.
pub struct Target {
    pub child: Child,
    pub pid: String,
    pub addressing: Addressing,
    /// Its run folder (private).
    pub run_dir: PathBuf,
    /// A folder for images, the working folder of `cudaw-ckpt`.
    pub work: PathBuf,
    stdin: Option<ChildStdin>,
    /// Its standard output's lines, read on a thread of their own (a wait for one has a
    /// deadline: a hung run fails the test instead of hanging the suite).
    lines: std::sync::mpsc::Receiver<String>,
    /// Output lines other than "ran N".
    out: Vec<String>,
    /// "run" lines sent whose "ran" line is not read yet.
    pending: usize,
    log: Arc<Mutex<String>>,
    reader: Option<std::thread::JoinHandle<()>>,
    _dirs: (TempDir, TempDir),
}

impl Target {
    /// Starts ckpt_target (`None` without nvcc: the test is skipped).
    pub fn start(addressing: Addressing, tag: &str) -> Option<Target> {
        Target::start_with(addressing, tag, &[])
    }

    /// Starts ckpt_target with these variables set too.
    pub fn start_with(addressing: Addressing, tag: &str, env: &[(&str, &str)]) -> Option<Target> {
        let nvcc = nvcc()?;
        let exe = compile_program(&nvcc, "ckpt_target");
        let run = temp_dir(&format!("{tag}-run"));
        let work = temp_dir(&format!("{tag}-img"));
        let mut cmd = command_under_cudaw(&exe, addressing, env);
        cmd.env("CUDAW_LOG", "info")
            .env("CUDAW_RUN_DIR", &run.0)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("starting ckpt_target");
        let pid = child.id().to_string();
        let stdin = child.stdin.take();
        let stdout = BufReader::new(child.stdout.take().expect("stdout"));
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in stdout.lines() {
                let Ok(line) = line else { break };
                if tx.send(line + "\n").is_err() {
                    break;
                }
            }
        });
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
        let first = lines
            .recv_timeout(Duration::from_secs(120))
            .unwrap_or_default();
        assert!(
            first.starts_with("ckpt_target:"),
            "{first:?}\n{}",
            log.lock().unwrap()
        );
        // The socket exists once the shim is initialised, before the first allocation.
        let socket = run.0.join(format!("{pid}.sock"));
        let deadline = Instant::now() + Duration::from_secs(10);
        while !socket.exists() {
            assert!(Instant::now() < deadline, "no socket {}", socket.display());
            std::thread::sleep(Duration::from_millis(5));
        }
        Some(Target {
            child,
            pid,
            addressing,
            run_dir: run.0.clone(),
            work: work.0.clone(),
            stdin,
            lines,
            out: vec![first],
            pending: 0,
            log,
            reader: Some(reader),
            _dirs: (run, work),
        })
    }

    /// The shim's log so far.
    pub fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    /// Waits (up to 10 s) until the shim's log contains `what` (the log is read on
    /// another thread: a line the shim wrote before replying may not be read yet).
    pub fn wait_log(&self, what: &str) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !self.log().contains(what) {
            assert!(
                Instant::now() < deadline,
                "no {what:?} in the log within 10 s:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Its control socket.
    pub fn socket(&self) -> PathBuf {
        self.run_dir.join(format!("{}.sock", self.pid))
    }

    /// A path in the image folder.
    pub fn path(&self, name: &str) -> PathBuf {
        self.work.join(name)
    }

    /// Tells the program to run `k` more iterations, without waiting.
    pub fn send_run(&mut self, k: u32) {
        let stdin = self.stdin.as_mut().expect("stdin open");
        writeln!(stdin, "run {k}").expect("writing to ckpt_target");
        stdin.flush().unwrap();
        self.pending += 1;
    }

    /// Waits for the "ran" lines of the runs sent (the program must be running), at most
    /// [`RAN_WITHIN`] for each.
    pub fn wait_ran(&mut self) {
        self.wait_ran_or(String::new);
    }

    /// [`Target::wait_ran`], with `context()` (a daemon's log, say) in the failure.
    pub fn wait_ran_or(&mut self, context: impl Fn() -> String) {
        use std::sync::mpsc::RecvTimeoutError;
        while self.pending > 0 {
            match self.lines.recv_timeout(RAN_WITHIN) {
                Ok(line) if line.starts_with("ran ") => self.pending -= 1,
                Ok(line) => self.out.push(line),
                Err(RecvTimeoutError::Disconnected) => {
                    panic!(
                        "ckpt_target ended early; its log:\n{}{}",
                        self.log(),
                        context()
                    )
                }
                Err(RecvTimeoutError::Timeout) => {
                    let status = self.ckpt(&["status", &self.pid]);
                    panic!(
                        "ckpt_target ran nothing for {} s; its status: {}\nits log:\n{}{}",
                        RAN_WITHIN.as_secs(),
                        String::from_utf8_lossy(&status.stdout),
                        self.log(),
                        context()
                    )
                }
            }
        }
    }

    /// Runs `k` more iterations and waits for them.
    pub fn run(&mut self, k: u32) {
        self.send_run(k);
        self.wait_ran();
    }

    /// cudaw-ckpt with this target's run folder, in its image folder.
    pub fn ckpt(&self, args: &[&str]) -> Output {
        ckpt_in(&self.run_dir, &self.work, args)
    }

    /// Runs cudaw-ckpt, asserts it succeeded, returns its stdout.
    pub fn ok(&self, args: &[&str]) -> String {
        let out = self.ckpt(args);
        assert!(
            out.status.success(),
            "cudaw-ckpt {args:?} failed ({}):\n{}{}\n--- the target's log:\n{}",
            out.status,
            text(&out.stdout),
            text(&out.stderr),
            self.log()
        );
        text(&out.stdout)
    }

    /// Runs cudaw-ckpt with `--json`, asserts it succeeded, returns its JSON.
    pub fn json(&self, args: &[&str]) -> serde_json::Value {
        let mut a = args.to_vec();
        a.push("--json");
        let s = self.ok(&a);
        serde_json::from_str(&s).unwrap_or_else(|e| panic!("{a:?} printed {s:?}: {e}"))
    }

    /// Runs cudaw-ckpt, asserts it failed with exit status `code` and a message
    /// containing `what`; returns the message.
    pub fn fails(&self, args: &[&str], code: i32, what: &str) -> String {
        let out = self.ckpt(args);
        let err = text(&out.stderr);
        assert_eq!(
            out.status.code(),
            Some(code),
            "cudaw-ckpt {args:?}: {}{err}\n--- the target's log:\n{}",
            text(&out.stdout),
            self.log()
        );
        assert!(
            err.contains(what),
            "cudaw-ckpt {args:?}: {err:?} lacks {what:?}"
        );
        err
    }

    /// `status PID --json`.
    pub fn status(&self) -> serde_json::Value {
        self.json(&["status", &self.pid])
    }

    /// Asserts the process is paused with every allocation's bytes only in `image`.
    pub fn assert_paused_in(&self, image: &Path) {
        let st = self.status();
        assert_eq!(st["state"], "paused", "{st}");
        assert_eq!(st["image"].as_str(), image.to_str(), "{st}");
        let d = &st["devices"][0];
        assert_eq!(d["allocations"].as_u64(), Some(ALLOCATIONS), "{st}");
        assert_eq!(d["evicted"].as_u64(), Some(BYTES), "{st}");
        assert_eq!(d["in_file"].as_u64(), Some(BYTES), "{st}");
        assert_eq!(d["resident"].as_u64(), Some(0), "{st}");
        assert_eq!(d["mapped"].as_u64(), Some(0), "{st}");
    }

    /// Asserts the process runs with every allocation on the device.
    pub fn assert_running(&self) {
        let st = self.status();
        assert_eq!(st["state"], "running", "{st}");
        assert!(st.get("image").is_none(), "{st}");
        let d = &st["devices"][0];
        assert_eq!(d["resident"].as_u64(), Some(BYTES), "{st}");
        assert_eq!(d["in_file"].as_u64(), Some(0), "{st}");
    }

    /// Lets the program finish; its output (less the "ran" lines) must equal the
    /// uninterrupted run's (`ckpt_target.expected`). Returns the shim's log.
    pub fn finish(mut self) -> String {
        let stdin = self.stdin.as_mut().expect("stdin open");
        writeln!(stdin, "end").expect("writing to ckpt_target");
        drop(self.stdin.take());
        while let Ok(l) = self.lines.recv_timeout(RAN_WITHIN) {
            if !l.starts_with("ran ") {
                self.out.push(l);
            }
        }
        let status = self.child.wait().expect("waiting for ckpt_target");
        if let Some(r) = self.reader.take() {
            r.join().expect("the log reader");
        }
        let log = self.log();
        assert!(
            status.success(),
            "ckpt_target ({:?}) failed ({status}):\n{log}",
            self.addressing
        );
        assert_eq!(
            self.out.concat(),
            expected("ckpt_target"),
            "ckpt_target ({:?}) output differs from the uninterrupted run; its log:\n{log}",
            self.addressing
        );
        assert!(!self.socket().exists(), "the socket outlived its process");
        log
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        // A failed test: do not leave the program behind (paused, it would wait forever).
        if self.reader.is_some() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Image surgery for the corruption tests.
pub mod images {
    use std::path::Path;

    /// The image with the byte at `at` inverted, written to `to`.
    pub fn flipped(from: &Path, to: &Path, at: u64) {
        let mut b = std::fs::read(from).expect("reading the image");
        b[at as usize] ^= 0xff;
        std::fs::write(to, b).expect("writing the corrupt copy");
    }

    /// Inverts the byte at `at` in place.
    pub fn flip_in_place(path: &Path, at: u64) {
        use std::io::{Read, Seek, SeekFrom, Write};
        let mut f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .expect("opening the image");
        let mut b = [0u8];
        f.seek(SeekFrom::Start(at)).unwrap();
        f.read_exact(&mut b).unwrap();
        b[0] ^= 0xff;
        f.seek(SeekFrom::Start(at)).unwrap();
        f.write_all(&b).unwrap();
        f.sync_all().unwrap();
    }

    /// The first `len` bytes of the image, written to `to`.
    pub fn truncated(from: &Path, to: &Path, len: usize) {
        let b = std::fs::read(from).expect("reading the image");
        std::fs::write(to, &b[..len]).expect("writing the truncated copy");
    }

    /// The image with format major version `major` (header checksum left as it was).
    pub fn with_major(from: &Path, to: &Path, major: u16) {
        let mut b = std::fs::read(from).expect("reading the image");
        b[8..10].copy_from_slice(&major.to_le_bytes());
        std::fs::write(to, b).expect("writing the copy");
    }

    /// A copy of the image written anew through `ckpt::ImageWriter` with the process
    /// description and table changed by `edit` (allocation data copied where the size is
    /// unchanged, zeros elsewhere): another process's image.
    pub fn rewritten(
        from: &Path,
        to: &Path,
        edit: impl FnOnce(&mut ckpt::ImageMetadata, &mut Vec<ckpt::AllocationRecord>),
    ) {
        let mut r = ckpt::ImageReader::open(std::fs::File::open(from).unwrap()).unwrap();
        let mut meta = r.metadata().clone();
        let old: Vec<ckpt::AllocationRecord> = r.allocations().iter().map(|e| e.record).collect();
        let mut table = old.clone();
        edit(&mut meta, &mut table);
        let out = std::fs::File::create(to).unwrap();
        let mut w =
            ckpt::ImageWriter::begin(out, &meta, &table, ckpt::WriterOptions::default()).unwrap();
        for rec in &table {
            let mut buf = vec![0u8; rec.size as usize];
            if old.iter().any(|o| o.id == rec.id && o.size == rec.size) {
                r.read_allocation(rec.id, &mut buf).unwrap();
            }
            w.write_allocation(rec.id, &buf).unwrap();
        }
        w.finish().unwrap();
    }
}
