//! The control socket and `cudaw-ckpt`: `tests/cuda/programs/pause_target.cu` runs under
//! `cudaw run` on simgpu (with its own `CUDAW_RUN_DIR`) while the test drives it with
//! `cudaw-ckpt pause|resume|status`; its output must still equal `pause_target.expected`.
//! Also: `status` with no PID lists it and reports a dead socket as stale, a malformed
//! request line gets an error reply, and `cudaw-ckpt` fails clearly (non-zero) for a PID
//! that does not exist, a process not under cudaw, another user's process (when the test
//! runs as root, which can act as another user) and an unknown option.

use cudaw_tests::{command_under_cudaw, compile_program, cudaw_ckpt, expected, nvcc, Addressing};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::mpsc::channel;
use std::time::{Duration, Instant};

const ALLOCATIONS: u64 = 5;
const BYTES: u64 = 5 * 65536;

/// A private run folder (short: socket paths are limited to 108 bytes), removed when
/// dropped, failed test or not.
struct RunDir(PathBuf);

impl Drop for RunDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn run_dir(tag: &str) -> RunDir {
    let dir = std::env::temp_dir().join(format!("cudaw-ckpt-test-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    RunDir(dir)
}

fn ckpt(dir: &Path, args: &[&str]) -> Output {
    Command::new(cudaw_ckpt())
        .args(args)
        .env("CUDAW_RUN_DIR", dir)
        .output()
        .expect("running cudaw-ckpt")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Runs cudaw-ckpt, asserts it succeeded, returns its stdout.
fn ckpt_ok(dir: &Path, args: &[&str]) -> String {
    let out = ckpt(dir, args);
    assert!(
        out.status.success(),
        "cudaw-ckpt {args:?} failed ({}):\n{}{}",
        out.status,
        text(&out.stdout),
        text(&out.stderr)
    );
    text(&out.stdout)
}

/// Runs cudaw-ckpt, asserts it failed with exit status `code` and a message containing
/// `what`.
fn ckpt_fails(dir: &Path, args: &[&str], code: i32, what: &str) {
    let out = ckpt(dir, args);
    let err = text(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(code),
        "cudaw-ckpt {args:?}: {}{err}",
        text(&out.stdout)
    );
    assert!(
        err.contains(what),
        "cudaw-ckpt {args:?}: {err:?} lacks {what:?}"
    );
}

fn status_json(dir: &Path, pid: &str) -> serde_json::Value {
    let s = ckpt_ok(dir, &["status", pid, "--json"]);
    serde_json::from_str(&s).unwrap_or_else(|e| panic!("status --json {s:?}: {e}"))
}

/// Sends one raw line to a socket, returns the reply line.
fn raw(socket: &Path, line: &[u8]) -> serde_json::Value {
    let mut s = UnixStream::connect(socket).expect("connecting to the control socket");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(line).unwrap();
    s.shutdown(std::net::Shutdown::Write).unwrap();
    let mut reply = String::new();
    BufReader::new(s).read_line(&mut reply).unwrap();
    serde_json::from_str(&reply).unwrap_or_else(|e| panic!("reply {reply:?}: {e}"))
}

fn drive(addressing: Addressing, tag: &str) {
    let Some(nvcc) = nvcc() else { return };
    let exe = compile_program(&nvcc, "pause_target");
    let guard = run_dir(tag);
    let dir = guard.0.clone();
    let mut cmd = command_under_cudaw(&exe, addressing, &[]);
    cmd.env("CUDAW_LOG", "info")
        .env("CUDAW_RUN_DIR", &dir)
        // Held open until the test is done with the program (it waits for the end).
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cudaw_tests::KillOnDrop(cmd.spawn().expect("starting pause_target"));
    let pid = child.id().to_string();
    let socket = dir.join(format!("{pid}.sock"));
    let stdin = child.stdin.take().expect("stdin");
    let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
    let stderr = child.stderr.take().expect("stderr");
    let (tx, log) = channel();
    let reader = std::thread::spawn(move || {
        let mut all = Vec::new();
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            let _ = tx.send(line.clone());
            all.push(line);
        }
        all.join("\n")
    });
    let mut first = String::new();
    stdout.read_line(&mut first).expect("the first line");
    assert!(first.starts_with("pause_target:"), "{first:?}");
    // The socket exists once the shim is initialised, before the first allocation.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !log
        .recv_timeout(deadline.saturating_duration_since(Instant::now()))
        .expect("no `control socket` log line within 10 s")
        .contains("control socket ")
    {}
    let meta = std::fs::metadata(&socket).expect("the socket");
    {
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(meta.permissions().mode() & 0o777, 0o600, "socket mode");
        let d = std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777;
        assert_eq!(d, 0o700, "run folder mode");
    }

    // Pause: every allocation evicted, reported with its bytes.
    let out = ckpt_ok(&dir, &["pause", &pid]);
    assert!(
        out.contains(&format!("paused: {ALLOCATIONS} allocations, {BYTES} bytes"))
            && out.contains(" evicted in "),
        "{out}"
    );
    let st = status_json(&dir, &pid);
    assert_eq!(st["state"], "paused", "{st}");
    assert_eq!(st["pid"].as_u64(), Some(u64::from(child.id())), "{st}");
    assert_eq!(st["addressing"], addressing.as_str(), "{st}");
    assert_eq!(st["devices"][0]["evicted"].as_u64(), Some(BYTES), "{st}");
    assert_eq!(st["devices"][0]["resident"].as_u64(), Some(0), "{st}");
    assert_eq!(st["devices"][0]["mapped"].as_u64(), Some(0), "{st}");
    assert_eq!(
        st["devices"][0]["allocations"].as_u64(),
        Some(ALLOCATIONS),
        "{st}"
    );
    // A second pause changes nothing.
    let out = ckpt_ok(&dir, &["pause", &pid]);
    assert!(out.contains("already paused"), "{out}");

    // Malformed requests get error replies; the server lives on.
    for bad in [
        &b"hello\n"[..],
        b"{\"cmd\":\"explode\"}\n",
        b"{\"cmd\":",
        b"\xff\xfe\n",
    ] {
        let r = raw(&socket, bad);
        assert_eq!(r["ok"], false, "{r}");
        let e = r["error"].as_str().unwrap_or_default();
        assert!(e.contains("malformed") || e.contains("UTF-8"), "{r}");
    }

    // status with no PID lists it; a dead socket (no such process) is reported stale and
    // removed, once.
    let stale = dir.join("4000000000.sock");
    drop(UnixListener::bind(&stale).expect("a stale socket"));
    let out = ckpt(&dir, &["status", "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let all: serde_json::Value = serde_json::from_slice(&out.stdout).expect("status --json");
    let procs = all["processes"].as_array().expect("processes");
    assert!(
        procs
            .iter()
            .any(|p| p["pid"].as_u64() == Some(u64::from(child.id())) && p["state"] == "paused"),
        "{all}"
    );
    assert_eq!(all["stale"], serde_json::json!([4000000000u64]), "{all}");
    assert_eq!(all["removed"], serde_json::json!([4000000000u64]), "{all}");
    assert!(
        text(&out.stderr).contains("removed stale socket"),
        "{}",
        text(&out.stderr)
    );
    assert!(!stale.exists(), "{} left behind", stale.display());
    let out = ckpt(&dir, &["status"]);
    assert!(
        text(&out.stdout).contains(&format!("{pid}: paused")),
        "{out:?}"
    );
    assert!(!text(&out.stderr).contains("stale"), "{out:?}");

    // Another user (when we can act as one) is refused, by the folder's mode and by the
    // server's own uid check.
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        // A copy of cudaw-ckpt that user can run: the clone may sit in a private folder.
        let nobody_ckpt = cudaw_tests::cudaw_ckpt_for_others(tag);
        let as_nobody = |args: &[&str]| {
            Command::new(&nobody_ckpt.exe)
                .args(args)
                .env("CUDAW_RUN_DIR", &dir)
                .uid(65534)
                .gid(65534)
                .output()
                .expect("running cudaw-ckpt as nobody")
        };
        let out = as_nobody(&["pause", &pid]);
        assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
        assert!(
            text(&out.stderr).contains("permission denied"),
            "{}",
            text(&out.stderr)
        );
        use std::os::unix::fs::PermissionsExt;
        let open = |p: &Path, m| std::fs::set_permissions(p, std::fs::Permissions::from_mode(m));
        open(&dir, 0o711).unwrap();
        open(&socket, 0o666).unwrap();
        let out = as_nobody(&["resume", &pid]);
        open(&socket, 0o600).unwrap();
        open(&dir, 0o700).unwrap();
        assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
        let err = text(&out.stderr);
        assert!(
            err.contains("permission denied: uid 65534 may not control"),
            "{err}"
        );
    }

    // Resume: every allocation back.
    let out = ckpt_ok(&dir, &["resume", &pid]);
    assert!(
        out.contains(&format!(
            "resumed: {ALLOCATIONS} allocations, {BYTES} bytes"
        )) && out.contains(" restored in "),
        "{out}"
    );
    assert_eq!(status_json(&dir, &pid)["state"], "running");
    let out = ckpt_ok(&dir, &["resume", &pid]);
    assert!(out.contains("not paused"), "{out}");

    // Done with it: the program finishes.
    drop(stdin);
    let mut rest = String::new();
    stdout.read_to_string(&mut rest).expect("stdout");
    let status = child.wait().expect("waiting for pause_target");
    let all_log = reader.join().expect("the log reader");
    assert!(
        status.success(),
        "pause_target failed ({status}):\n{all_log}"
    );
    assert_eq!(first + &rest, expected("pause_target"), "{all_log}");
    assert!(!socket.exists(), "the socket outlived its process");

    // Gone: the PID no longer exists (or belongs to something else, not under cudaw).
    let out = ckpt(&dir, &["pause", &pid]);
    assert_eq!(out.status.code(), Some(1));
    drop(guard);
}

#[test]
fn ckpt_pause_status_resume_mapped() {
    drive(Addressing::Mapped, "m");
}

#[test]
fn ckpt_pause_status_resume_translated() {
    drive(Addressing::Translated, "t");
}

#[test]
fn ckpt_refuses_what_is_not_under_cudaw() {
    let guard = run_dir("x");
    let dir = guard.0.clone();
    std::fs::create_dir_all(&dir).unwrap();
    // A live process that is not under cudaw: the test itself, and a sleep child.
    let me = std::process::id().to_string();
    ckpt_fails(&dir, &["pause", &me], 1, "is not running under cudaw");
    let mut sleep =
        cudaw_tests::KillOnDrop(Command::new("sleep").arg("30").spawn().expect("sleep"));
    let sp = sleep.id().to_string();
    ckpt_fails(&dir, &["resume", &sp], 1, "is not running under cudaw");
    ckpt_fails(&dir, &["status", &sp], 1, "is not running under cudaw");
    let _ = sleep.kill();
    let _ = sleep.wait();
    // A PID that does not exist (above the kernel's pid_max limit of 2^22).
    ckpt_fails(
        &dir,
        &["pause", "99999999"],
        1,
        "no process with PID 99999999",
    );
    // Usage errors.
    ckpt_fails(&dir, &["pause", "--frobnicate", "1"], 2, "--frobnicate");
    ckpt_fails(&dir, &["pause", "abc"], 2, "invalid value");
    ckpt_fails(&dir, &["pause"], 2, "<PID>");
    // No processes: status says so and succeeds.
    let out = ckpt_ok(&dir, &["status"]);
    assert!(out.contains("no processes under cudaw"), "{out}");
    let help = ckpt_ok(&dir, &["--help"]);
    for word in ["pause", "resume", "status", "CUDAW_RUN_DIR", "Exit status"] {
        assert!(help.contains(word), "--help lacks {word}: {help}");
    }
    drop(guard);
}
