//! Memory limits that hold: `tests/cuda/limits/mem_shell.cu` (a shell over every way a
//! program takes device memory, and every way it asks how much there is), compiled by the
//! real nvcc, run under cudaw on simgpu (a 4 GiB card) through `cudaw run`, driven one
//! command a line.
//!
//! - the limit in every unit, and the memory reports (`cudaMemGetInfo`,
//!   `cudaGetDeviceProperties`, `cuMemGetInfo`, `cuDeviceTotalMem`) saying the limit;
//! - every allocation path counted against one limit, granule rounding included, refused
//!   with the out-of-memory error at it, and the program freeing and going on;
//! - threads racing at the limit: never past it, not by one granule;
//! - two processes sharing the card through the node ledger, and a killed one's share
//!   reclaimed;
//! - `cudaw-ckpt status` showing limit, use and peak;
//! - pauses beside the limits: a paused process lends its share of the card, and a pause
//!   that cannot finish by its deadline (`CUDAW_PAUSE_TIMEOUT`) is given up;
//! - and, since the shell reaches cudaw's memory, legacy IPC of it refused with a reason;
//! - failing closed: a `CUDAW_MEM_LIMIT` that cannot be enforced refuses every allocation,
//!   and the node ledger holds against damaged, truncated, emptied, immutable, forged,
//!   saturating and zombie entries, between two users on one card, and in a folder another
//!   user made.

use cudaw_tests::{compile, cudaw, cudaw_ckpt, nvcc, shims, simgpu, workspace, Addressing};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::Duration;

const M: u64 = 1 << 20;
const G: u64 = 1 << 30;
/// simgpu's granularity: what cudaw rounds physical memory to.
const GRANULE: u64 = 2 * M;

/// A private folder of the test's own, removed when dropped: the run folder (control
/// sockets, logs) and, unless the test says otherwise, the node ledger's folder.
fn run_dir(name: &str) -> tempfile::TempDir {
    use std::os::unix::fs::PermissionsExt;
    tempfile::Builder::new()
        .prefix(&format!("cudaw-limits-{name}-"))
        // Private: a run folder that others may read and that holds other files (the
        // logs) is refused.
        .permissions(std::fs::Permissions::from_mode(0o700))
        .tempdir()
        .expect("creating the run folder")
}

fn mem_shell() -> Option<PathBuf> {
    let nvcc = nvcc()?;
    let src = workspace().join("tests/cuda/limits/mem_shell.cu");
    Some(compile(&nvcc, "mem_shell", &src))
}

/// `mem_shell` running under cudaw, answering one line per command.
struct Shell {
    child: Child,
    stdin: ChildStdin,
    lines: Receiver<String>,
    log: PathBuf,
    pid: u32,
}

impl Shell {
    /// Starts `exe` with `cudaw run [run_args] --addressing MODE -- exe` on a 4 GiB simgpu,
    /// sharing `dir` as its run folder and node ledger folder, with `env`.
    fn start(
        exe: &Path,
        dir: &Path,
        addressing: Addressing,
        run_args: &[&str],
        env: &[(&str, &str)],
    ) -> Shell {
        Self::start_as(&Tools::built(), None, exe, dir, addressing, run_args, env)
    }

    /// As [`Shell::start`], with `tools`, as user `uid` if given.
    fn start_as(
        tools: &Tools,
        uid: Option<u32>,
        exe: &Path,
        dir: &Path,
        addressing: Addressing,
        run_args: &[&str],
        env: &[(&str, &str)],
    ) -> Shell {
        let sim = &tools.sim;
        let log = dir.join(format!(
            "shell-{}.log",
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .expect("clock")
                .as_nanos()
        ));
        let mut cmd = Command::new(&tools.cudaw);
        cmd.arg("run")
            .arg("--lib-dir")
            .arg(&tools.shims)
            .arg("--real-cudart")
            .arg(sim)
            .args(run_args)
            .args(["--addressing", addressing.as_str(), "--"])
            .arg(exe)
            .env("CUDAW_LIBCUDA", sim)
            .env("CUDAW_LOG", "info")
            .env("CUDAW_RUN_DIR", dir)
            .env("CUDAW_NODE_DIR", dir)
            .env("SIMGPU_MEM", "4G")
            .env_remove("CUDAW_MEM_LIMIT")
            .env_remove("LD_PRELOAD")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).expect("creating the log"));
        for (k, v) in env {
            cmd.env(k, v);
        }
        if let Some(uid) = uid {
            use std::os::unix::process::CommandExt;
            cmd.uid(uid).gid(uid);
        }
        let mut child = cmd.spawn().expect("starting mem_shell under cudaw");
        let stdin = child.stdin.take().expect("stdin");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, rx) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut s = Shell {
            pid: 0,
            child,
            stdin,
            lines: rx,
            log,
        };
        let pid = s.cmd("pid");
        s.pid = pid
            .strip_prefix("pid ")
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("pid: {pid}"));
        assert_eq!(s.pid, s.child.id(), "cudaw run keeps the program's PID");
        s
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Sends one command; returns its answer.
    fn cmd(&mut self, line: &str) -> String {
        writeln!(self.stdin, "{line}")
            .and_then(|()| self.stdin.flush())
            .unwrap_or_else(|e| panic!("sending {line:?}: {e}\nlog:\n{}", self.log()));
        match self.lines.recv_timeout(Duration::from_secs(60)) {
            Ok(answer) => answer,
            Err(_) => panic!("no answer to {line:?} within 60 s; log:\n{}", self.log()),
        }
    }

    /// Sends a command whose answer must start with `want`.
    fn expect(&mut self, line: &str, want: &str) -> String {
        let answer = self.cmd(line);
        assert!(
            answer.starts_with(want),
            "{line:?} answered {answer:?}, expected {want:?}...; log:\n{}",
            self.log()
        );
        answer
    }

    /// `alloc KIND SIZE` that must succeed: the block's id.
    fn alloc(&mut self, kind: &str, size: u64) -> u32 {
        let a = self.expect(&format!("alloc {kind} {size}"), "alloc ok ");
        a["alloc ok ".len()..].parse().expect("block id")
    }

    /// `(free, total)` from `cudaMemGetInfo`.
    fn info(&mut self) -> (u64, u64) {
        let a = self.expect("info", "info ");
        (field(&a, "free"), field(&a, "total"))
    }

    /// `cudaw-ckpt status PID --json`: the device 0 entry.
    fn status(&self) -> serde_json::Value {
        let out = Command::new(cudaw_ckpt())
            .args(["status", &self.pid.to_string(), "--json"])
            .env("CUDAW_RUN_DIR", self.log.parent().expect("run folder"))
            .output()
            .expect("running cudaw-ckpt");
        assert!(
            out.status.success(),
            "cudaw-ckpt status: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("status JSON");
        v["devices"][0].clone()
    }

    /// Asks the program to exit and checks it did, cleanly.
    fn quit(mut self) -> String {
        writeln!(self.stdin, "quit").expect("sending quit");
        let status = self.child.wait().expect("waiting for mem_shell");
        let log = self.log();
        assert!(status.success(), "mem_shell exited {status}; log:\n{log}");
        log
    }
}

/// What `cudaw run` on simgpu needs: the CLI, the shims' folder, simgpu.
struct Tools {
    cudaw: PathBuf,
    shims: PathBuf,
    sim: PathBuf,
}

impl Tools {
    /// The ones the build made.
    fn built() -> Tools {
        Tools {
            cudaw: cudaw(),
            shims: shims(),
            sim: simgpu(),
        }
    }
}

impl Drop for Shell {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The number after `NAME=` in an answer.
fn field(answer: &str, name: &str) -> u64 {
    answer
        .split_whitespace()
        .find_map(|w| w.strip_prefix(&format!("{name}=")))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {name}= in {answer:?}"))
}

fn json_u64(v: &serde_json::Value, key: &str) -> u64 {
    v[key].as_u64().unwrap_or_else(|| panic!("no {key} in {v}"))
}

/// Every memory report of a shell: cudaMemGetInfo's total and free,
/// cudaGetDeviceProperties' totalGlobalMem, cuMemGetInfo's total, cuDeviceTotalMem.
fn reports(s: &mut Shell) -> [u64; 5] {
    let (free, total) = s.info();
    let props = field(&s.expect("props", "props "), "total");
    let drv = field(&s.expect("drvinfo", "drvinfo "), "total");
    let drv_total = field(&s.expect("drvtotal", "drvtotal "), "total");
    [total, free, props, drv, drv_total]
}

#[test]
fn limits_in_every_unit_are_what_the_program_sees() {
    let Some(exe) = mem_shell() else { return };
    let tmp = run_dir("units");
    let dir = tmp.path();
    for limit in [
        "1073741824",
        "1G",
        "1GiB",
        "1024M",
        "1048576K",
        "25%",
        "0:1G",
        "2G,0:1G",
        "1:2G,0:25%",
    ] {
        let mut s = Shell::start(
            &exe,
            dir,
            Addressing::Mapped,
            &[],
            &[("CUDAW_MEM_LIMIT", limit)],
        );
        assert_eq!(reports(&mut s), [G; 5], "CUDAW_MEM_LIMIT={limit}");
        s.quit();
    }
    // The same through `cudaw run --mem-limit`.
    let mut s = Shell::start(&exe, dir, Addressing::Mapped, &["--mem-limit", "25%"], &[]);
    assert_eq!(reports(&mut s), [G; 5]);
    s.quit();
    // A limit for another device only: device 0 shows the whole card.
    let mut s = Shell::start(&exe, dir, Addressing::Mapped, &["--mem-limit", "1:1G"], &[]);
    assert_eq!(reports(&mut s), [4 * G; 5]);
    s.quit();
    // A limit above the card: the card.
    let mut s = Shell::start(&exe, dir, Addressing::Mapped, &["--mem-limit", "64G"], &[]);
    assert_eq!(reports(&mut s), [4 * G; 5]);
    s.quit();
}

/// `cudaw run OPTIONS -- true` refuses an option's value before running anything: exit 2,
/// `why` in its message.
fn refused_by_cudaw_run(options: &[&str], why: &str) {
    let out = Command::new(cudaw())
        .arg("run")
        .args(options)
        .args(["--", "true"])
        .output()
        .expect("running cudaw");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(why), "{err}");
}

#[test]
fn a_bad_limit_is_refused_by_cudaw_run_and_refuses_every_allocation_in_the_variable() {
    let bad = [
        ("garbage", "\"garbage\" is not a size"),
        ("0", "a limit of 0 bytes"),
        ("-1", "\"-1\": a limit must be above 0"),
        ("200%", "at most 100"),
        ("0:8G,,1:4G", "has an empty item"),
        ("0:8G,0:4G", "gives device 0 two limits"),
    ];
    // One validation: `cudaw run --mem-limit` refuses each before running anything, and
    // says what is valid.
    for (value, why) in bad {
        refused_by_cudaw_run(&["--mem-limit", value], why);
        refused_by_cudaw_run(&["--mem-limit", value], "(valid: a size above 0");
    }
    // The drop-in runtime cannot refuse to start the program: every allocation fails with
    // the out-of-memory error, and one error line says why, naming the value and the syntax.
    let Some(exe) = mem_shell() else { return };
    let tmp = run_dir("bad");
    let dir = tmp.path();
    for (n, (value, why)) in bad.into_iter().enumerate() {
        let mut s = Shell::start(
            &exe,
            dir,
            Addressing::Mapped,
            &[],
            &[("CUDAW_MEM_LIMIT", value)],
        );
        s.expect("alloc malloc 1048576", "alloc err 2");
        if n == 0 {
            // Every way of taking device memory.
            for kind in [
                "pitch",
                "3d",
                "async",
                "managed",
                "drvalloc",
                "create",
                "createmap",
            ] {
                s.expect(&format!("alloc {kind} 4194304"), "alloc err 2");
            }
            assert_eq!(s.info(), (0, 4 * G), "nothing may be taken");
            s.expect("alloc malloc 1", "alloc err 2");
        }
        let log = s.quit();
        assert!(
            log.contains(&format!(
                "bytes refused: CUDAW_MEM_LIMIT={value:?} cannot be enforced (the error"
            )),
            "{log}"
        );
        let line = format!("CUDAW_MEM_LIMIT={value:?} cannot be enforced: ");
        let said: Vec<&str> = log.lines().filter(|l| l.contains(&line)).collect();
        assert_eq!(said.len(), 1, "said once: {value}\n{log}");
        assert!(
            said[0].contains("error")
                && said[0].contains(why)
                && said[0].contains("every device allocation fails with out of memory")
                && said[0].contains("(valid: a size above 0"),
            "{value}: {}",
            said[0]
        );
    }
}

/// Fills the limit through `kind`, checks the count (granule rounding counted) and the
/// error, then frees everything and takes memory again.
fn fill_and_recover(s: &mut Shell, limit: u64, kind: &str, size: u64, charged: u64) {
    let answer = s.expect(&format!("fill {kind} {size}"), &format!("fill {kind} "));
    let count = limit / charged;
    assert_eq!(
        (field(&answer, "count"), field(&answer, "err")),
        (count, 2),
        "{kind} {size}: {answer} (each charged {charged})"
    );
    assert_eq!(s.info(), (limit - count * charged, limit), "{kind}");
    s.expect("freeall", &format!("freeall {count} bad=0"));
    assert_eq!(s.info(), (limit, limit), "{kind}: after freeing");
}

fn every_path_counts(addressing: Addressing) {
    let Some(exe) = mem_shell() else { return };
    let tmp = run_dir(&format!("paths-{}", addressing.as_str()));
    let dir = tmp.path();
    let limit = 64 * M;
    let mut s = Shell::start(&exe, dir, addressing, &["--mem-limit", "64M"], &[]);
    let three = 3 * M;
    // Mapped addressing rounds each allocation to the 2 MiB granule; translated to 256 B.
    let rounded = match addressing {
        Addressing::Mapped => three.next_multiple_of(GRANULE),
        Addressing::Translated => three,
    };
    for kind in ["malloc", "pitch", "3d", "async", "drvalloc"] {
        fill_and_recover(&mut s, limit, kind, three, rounded);
    }
    // Managed memory counts in 2 MiB pages; cuMemCreate takes whole granules.
    fill_and_recover(&mut s, limit, "managed", three, 4 * M);
    fill_and_recover(&mut s, limit, "create", 4 * M, 4 * M);
    fill_and_recover(&mut s, limit, "createmap", 4 * M, 4 * M);

    // One limit over every path together.
    s.alloc("malloc", 32 * M);
    s.alloc("managed", 16 * M);
    let a = s.expect("fill create 2097152", "fill create ");
    assert_eq!((field(&a, "count"), field(&a, "err")), (8, 2), "{a}");
    s.expect("alloc malloc 1", "alloc err 2");
    s.expect("alloc drvalloc 1", "alloc err 2");
    // A handle released while mapped stays counted until it is unmapped.
    s.expect("freeall", "freeall 10 bad=0");
    let id = s.alloc("createmap", 8 * M);
    assert_eq!(s.info().0, limit - 8 * M);
    s.expect(&format!("free {id}"), "free ok");
    assert_eq!(s.info().0, limit);

    // Exactly the limit in one allocation, usable; one byte more is refused.
    let id = s.alloc("malloc", limit);
    s.expect(&format!("touch {id}"), "touch ok");
    s.expect("alloc malloc 1", "alloc err 2");
    s.expect(&format!("free {id}"), "free ok");
    s.expect(&format!("alloc malloc {}", limit + 1), "alloc err 2");
    let id = s.alloc("malloc", 1000);
    s.expect(&format!("touch {id}"), "touch ok");
    let st = s.status();
    assert_eq!(json_u64(&st, "limit"), limit);
    assert_eq!(json_u64(&st, "peak"), limit);
    assert!(json_u64(&st, "refused") > 0);
    let log = s.quit();
    assert!(
        log.contains("bytes refused: the process's limit is 67108864 bytes"),
        "{log}"
    );
}

#[test]
fn every_path_counts_against_one_limit_and_the_program_recovers_mapped() {
    every_path_counts(Addressing::Mapped);
}

#[test]
fn every_path_counts_against_one_limit_and_the_program_recovers_translated() {
    every_path_counts(Addressing::Translated);
}

#[test]
fn racing_threads_never_pass_the_limit_by_one_granule() {
    let Some(exe) = mem_shell() else { return };
    let tmp = run_dir("race");
    let dir = tmp.path();
    // Not a whole number of granules: the last part can never be used.
    let limit = 100 * M + M - 1;
    let mut s = Shell::start(
        &exe,
        dir,
        Addressing::Mapped,
        &["--mem-limit", &limit.to_string()],
        &[],
    );
    for (round, (kind, size, charged)) in [
        ("mix", GRANULE, GRANULE),
        ("malloc", GRANULE, GRANULE),
        ("create", GRANULE, GRANULE),
        ("malloc", 3 * M, 4 * M),
        ("mix", GRANULE, GRANULE),
        ("managed", M, GRANULE),
    ]
    .into_iter()
    .enumerate()
    {
        let a = s.expect(&format!("race 8 {kind} {size}"), "race ");
        let count = limit / charged;
        assert_eq!(
            (field(&a, "count"), field(&a, "bad")),
            (count, 0),
            "round {round}: 8 threads taking {kind} {size}: {a}"
        );
        assert_eq!(s.info(), (limit - count * charged, limit), "round {round}");
        let st = s.status();
        assert_eq!(
            json_u64(&st, "used"),
            count * charged,
            "round {round}: {st}"
        );
        assert!(json_u64(&st, "peak") <= limit, "round {round}: {st}");
        s.expect("freeall", &format!("freeall {count} bad=0"));
        assert_eq!(json_u64(&s.status(), "used"), 0, "round {round}");
    }
    s.quit();
}

#[test]
fn two_processes_share_one_card_and_a_killed_ones_share_comes_back() {
    let Some(exe) = mem_shell() else { return };
    let tmp = run_dir("share");
    let dir = tmp.path();
    // Limits of 3 GiB each on a 4 GiB card: 6 GiB promised, never more than 4 taken.
    let mut a = Shell::start(&exe, dir, Addressing::Mapped, &["--mem-limit", "3G"], &[]);
    let mut b = Shell::start(
        &exe,
        dir,
        Addressing::Translated,
        &["--mem-limit", "3G"],
        &[],
    );
    let held = a.alloc("malloc", 3 * G);
    // b sees what is left of the card, though its limit is 3 GiB.
    assert_eq!(b.info(), (G, 3 * G));
    assert_eq!(field(&b.expect("drvinfo", "drvinfo "), "free"), G);
    b.expect(&format!("alloc malloc {}", 2 * G), "alloc err 2");
    b.expect(&format!("alloc create {}", 2 * G), "alloc err 2");
    b.alloc("malloc", G - 2 * M);
    b.alloc("create", 2 * M);
    b.expect("alloc managed 1", "alloc err 2");
    assert_eq!(b.info().0, 0);
    let sb = b.status();
    assert_eq!(
        (
            json_u64(&sb, "used"),
            json_u64(&sb, "node_used"),
            json_u64(&sb, "node_capacity")
        ),
        (G, 4 * G, 4 * G),
        "{sb}"
    );
    let log = b.log();
    assert!(
        log.contains("bytes refused: the card's 4294967296 bytes (4.00 GiB) are shared, other processes under cudaw hold 3221225472"),
        "{log}"
    );
    // a gives 1 GiB back: b may take it.
    a.expect(&format!("free {held}"), "free ok");
    a.alloc("malloc", 2 * G);
    b.alloc("malloc", G);
    b.expect("alloc malloc 1", "alloc err 2");

    // a dies without a word: its 2 GiB come back to the card.
    let a_pid = a.pid;
    a.child.kill().expect("killing a");
    a.child.wait().expect("reaping a");
    assert!(
        std::fs::metadata(format!("/proc/{a_pid}")).is_err(),
        "a is gone"
    );
    // b holds 2 GiB against its 3 GiB limit; the card has 2 GiB for it again.
    assert_eq!(b.info(), (G, 3 * G));
    b.alloc("malloc", G);
    assert_eq!(json_u64(&b.status(), "node_used"), 3 * G);
    let mut c = Shell::start(&exe, dir, Addressing::Mapped, &["--mem-limit", "3G"], &[]);
    assert_eq!(c.info(), (G, 3 * G));
    c.alloc("create", G);
    c.expect("alloc create 2097152", "alloc err 2");
    // A clean exit leaves the ledger at once.
    b.quit();
    assert_eq!(c.info(), (2 * G, 3 * G));
    c.quit();
    // The killed one's entry went when c joined; the others left at exit.
    assert_eq!(entries(dir).len(), 0, "{:?}", entries(dir));
}

#[test]
fn status_shows_limit_use_and_peak() {
    let Some(exe) = mem_shell() else { return };
    let tmp = run_dir("status");
    let dir = tmp.path();
    let mut s = Shell::start(&exe, dir, Addressing::Mapped, &["--mem-limit", "1G"], &[]);
    let id = s.alloc("malloc", 100 * M);
    s.alloc("create", 50 * M);
    s.expect(&format!("free {id}"), "free ok");
    let out = Command::new(cudaw_ckpt())
        .args(["status", &s.pid.to_string()])
        .env("CUDAW_RUN_DIR", dir)
        .output()
        .expect("running cudaw-ckpt");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("device 0: limit 1024.0 MiB, use 50.0 MiB, peak 150.0 MiB"),
        "{text}"
    );
    assert!(
        text.contains("the GPU's processes under cudaw hold 50.0 MiB of its 4096.0 MiB"),
        "{text}"
    );
    let st = s.status();
    assert_eq!(
        (
            json_u64(&st, "limit"),
            json_u64(&st, "used"),
            json_u64(&st, "peak")
        ),
        (G, 50 * M, 150 * M),
        "{st}"
    );
    s.quit();
}

/// `cudaw-ckpt ACTION PID` in `dir`: (success, stdout + stderr).
fn ckpt(dir: &Path, action: &str, pid: u32) -> (bool, String) {
    let out = Command::new(cudaw_ckpt())
        .args([action, &pid.to_string()])
        .env("CUDAW_RUN_DIR", dir)
        .output()
        .expect("running cudaw-ckpt");
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[test]
fn a_pause_that_cannot_finish_by_its_deadline_is_given_up_and_the_program_runs_on() {
    let Some(exe) = mem_shell() else { return };
    let tmp = run_dir("pause-timeout");
    let dir = tmp.path();
    // A bad value is refused before anything runs.
    refused_by_cudaw_run(&["--pause-timeout", "soon"], "\"soon\" is not a time");
    let mut s = Shell::start(
        &exe,
        dir,
        Addressing::Mapped,
        &["--pause-timeout", "300ms"],
        &[],
    );
    let held = s.alloc("malloc", 8 * M);
    // A kernel that runs far longer than the pause may wait (a collective waiting for a
    // rank that is paused would run for ever).
    s.expect("spin 4000", "spin rc=0");
    let out = Command::new(cudaw_ckpt())
        .args(["pause", &s.pid.to_string(), "--json"])
        .env("CUDAW_RUN_DIR", dir)
        .output()
        .expect("running cudaw-ckpt");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "pause --json: {e}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    assert_eq!(out.status.code(), Some(1), "{v}");
    assert_eq!(v["ok"], false, "{v}");
    assert_eq!(v["kind"], "timeout", "{v}");
    let why = v["error"].as_str().unwrap_or_default();
    assert!(
        why.contains("still running")
            && why.contains("CUDAW_PAUSE_TIMEOUT")
            && why.contains("runs on"),
        "{why}"
    );
    // Given up before anything was evicted: the program runs on, its memory in place.
    let st = s.status();
    assert_eq!(json_u64(&st, "evicted"), 0, "{st}");
    assert_eq!(json_u64(&st, "resident"), 8 * M, "{st}");
    s.expect("sync", "sync rc=0");
    s.expect(&format!("touch {held}"), "touch ok");
    // Idle, it pauses and resumes.
    let (ok, out) = ckpt(dir, "pause", s.pid);
    assert!(ok, "{out}");
    let (ok, out) = ckpt(dir, "resume", s.pid);
    assert!(ok, "{out}");
    s.expect(&format!("touch {held}"), "touch ok");
    let log = s.quit();
    assert!(log.contains("the pause was given up"), "{log}");
}

#[test]
fn host_copies_are_kept_from_a_resume_for_the_next_pause() {
    let Some(exe) = mem_shell() else { return };
    for (reuse, tag) in [("on", "reuse-on"), ("off", "reuse-off")] {
        let tmp = run_dir(tag);
        let dir = tmp.path();
        let mut s = Shell::start(
            &exe,
            dir,
            Addressing::Mapped,
            &[],
            &[("CUDAW_HOST_REUSE", reuse)],
        );
        let ids = [s.alloc("malloc", 8 * M), s.alloc("malloc", 6 * M)];
        for cycle in 0..3u8 {
            // New contents each cycle: the kept memory holds the last cycle's bytes, which
            // must never reach the device.
            for (k, id) in ids.iter().enumerate() {
                s.expect(&format!("set {id} {}", 10 * cycle + k as u8), "set rc=0");
            }
            let (ok, out) = ckpt(dir, "pause", s.pid);
            assert!(ok, "{out}");
            let (ok, out) = ckpt(dir, "resume", s.pid);
            assert!(ok, "{out}");
            for (k, id) in ids.iter().enumerate() {
                s.expect(&format!("check {id} {}", 10 * cycle + k as u8), "check ok");
            }
        }
        // Running again, the process keeps the last resume's host copies for the next
        // pause, and says so.
        let out = Command::new(cudaw_ckpt())
            .args(["status", &s.pid.to_string(), "--json"])
            .env("CUDAW_RUN_DIR", dir)
            .output()
            .expect("running cudaw-ckpt");
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("status JSON");
        let kept = json_u64(&v, "kept_host");
        let text = ckpt(dir, "status", s.pid).1;
        if reuse == "on" {
            assert_eq!(kept, 14 * M, "{v}");
            assert!(
                text.contains("host memory kept for the next pause: 14.0 MiB"),
                "{text}"
            );
        } else {
            assert_eq!(kept, 0, "{v}");
            assert!(!text.contains("host memory kept"), "{text}");
        }
        let log = s.quit();
        let reused: Vec<u64> = log
            .lines()
            .filter_map(|l| {
                l.split("pause: ")
                    .nth(1)?
                    .strip_suffix(" bytes went into host memory kept from the last resume")?
                    .parse()
                    .ok()
            })
            .collect();
        if reuse == "on" {
            // The first pause has nothing kept; the two after it reuse all 14 MiB.
            assert_eq!(reused, vec![14 * M, 14 * M], "{log}");
        } else {
            assert!(reused.is_empty(), "{log}");
        }
    }
}

#[test]
fn sharing_cudaws_memory_through_legacy_ipc_is_refused_with_a_reason() {
    let Some(exe) = mem_shell() else { return };
    let tmp = run_dir("ipc");
    let dir = tmp.path();
    let mut s = Shell::start(&exe, dir, Addressing::Mapped, &[], &[]);
    let id = s.alloc("malloc", M);
    let answer = s.expect(&format!("ipc {id}"), "ipc rc=");
    assert_ne!(
        answer, "ipc rc=0",
        "legacy IPC of cudaw's memory cannot work"
    );
    s.expect(&format!("ipc {id}"), "ipc rc=");
    let log = s.quit();
    let said = log
        .matches("cannot be shared with another process through legacy CUDA IPC")
        .count();
    assert_eq!(said, 1, "said once, however often it is asked:\n{log}");
}

#[test]
fn a_paused_process_lends_its_share_and_resumes_once_the_card_has_room() {
    let Some(exe) = mem_shell() else { return };
    let tmp = run_dir("pause");
    let dir = tmp.path();
    let card = [("SIMGPU_MEM", "256M")];
    let mut a = Shell::start(
        &exe,
        dir,
        Addressing::Mapped,
        &["--mem-limit", "192M"],
        &card,
    );
    let mut b = Shell::start(
        &exe,
        dir,
        Addressing::Mapped,
        &["--mem-limit", "192M"],
        &card,
    );
    let held = a.alloc("malloc", 160 * M);
    b.expect(&format!("alloc malloc {}", 160 * M), "alloc err 2");
    // Paused, a holds no device memory: its share of the card is free for b.
    let (ok, out) = ckpt(dir, "pause", a.pid);
    assert!(ok, "{out}");
    let lent = b.alloc("malloc", 160 * M);
    let (ok, out) = ckpt(dir, "resume", a.pid);
    assert!(!ok, "resumed on a full card: {out}");
    assert!(
        out.contains("node-wide budget refused") && out.contains("staying paused"),
        "{out}"
    );
    b.expect(&format!("free {lent}"), "free ok");
    let (ok, out) = ckpt(dir, "resume", a.pid);
    assert!(ok, "{out}");
    a.expect(&format!("touch {held}"), "touch ok");
    assert_eq!(json_u64(&a.status(), "used"), 160 * M);
    b.expect(&format!("alloc malloc {}", 160 * M), "alloc err 2");
    a.quit();
    b.quit();
}

#[test]
fn a_process_out_of_the_ledger_is_bound_by_its_limit_alone() {
    let Some(exe) = mem_shell() else { return };
    let tmp = run_dir("no-ledger");
    let dir = tmp.path();
    let mut a = Shell::start(&exe, dir, Addressing::Mapped, &["--mem-limit", "3G"], &[]);
    a.alloc("malloc", 3 * G);
    let mut b = Shell::start(
        &exe,
        dir,
        Addressing::Mapped,
        &["--mem-limit", "3G"],
        &[("CUDAW_LEDGER", "off")],
    );
    // simgpu gives each process a card of its own: only the ledger joined them.
    assert_eq!(b.info(), (3 * G, 3 * G));
    b.alloc("malloc", 3 * G);
    assert!(b.status().get("node_used").is_none());
    b.quit();
    a.quit();
}

/// The node ledger's entry files in `dir`.
fn entries(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("node folder")
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with(cudaw_ledger::ledger::PREFIX)
        })
        .map(|e| e.path())
        .collect();
    v.sort();
    v
}

/// The parts of an entry file's name: (GPU key, PID).
fn entry_name(p: &Path) -> (String, u32) {
    let name = p.file_name().expect("name").to_string_lossy().into_owned();
    let parts: Vec<&str> = name.split('.').collect();
    (
        parts[1].to_owned(),
        parts[2].parse().expect("the PID in an entry's name"),
    )
}

/// Process `pid`'s entry files in `dir`.
fn entries_of(dir: &Path, pid: u32) -> Vec<PathBuf> {
    entries(dir)
        .into_iter()
        .filter(|p| entry_name(p).1 == pid)
        .collect()
}

/// `chattr FLAG PATH`: whether it worked, or why not.
fn chattr(flag: &str, path: &Path) -> Result<(), String> {
    let out = Command::new("chattr")
        .arg(flag)
        .arg(path)
        .output()
        .map_err(|e| format!("chattr: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim().to_owned())
    }
}

/// Takes the immutable flag off again, whatever happened, so that the folder can go.
struct Mutable(PathBuf);

impl Drop for Mutable {
    fn drop(&mut self) {
        let _ = chattr("-i", &self.0);
    }
}

#[test]
fn a_damaged_or_immutable_entry_never_lets_the_card_be_promised_twice() {
    let Some(exe) = mem_shell() else { return };
    let tmp = run_dir("damage");
    let dir = tmp.path();
    let mut a = Shell::start(&exe, dir, Addressing::Mapped, &["--mem-limit", "3G"], &[]);
    let mut b = Shell::start(&exe, dir, Addressing::Mapped, &["--mem-limit", "3G"], &[]);
    a.alloc("malloc", 2 * G);
    assert_eq!(b.info(), (2 * G, 3 * G));
    type Damage = fn(&Path);
    let damages: [(&str, Damage); 4] = [
        ("one byte flipped", |p| {
            let mut bytes = std::fs::read(p).expect("reading the entry");
            bytes[40] ^= 0xff;
            std::fs::write(p, bytes).expect("writing the entry");
        }),
        ("truncated", |p| {
            let f = std::fs::OpenOptions::new()
                .write(true)
                .open(p)
                .expect("entry");
            f.set_len(50).expect("truncating");
        }),
        ("emptied", |p| {
            let f = std::fs::OpenOptions::new()
                .write(true)
                .open(p)
                .expect("entry");
            f.set_len(0).expect("truncating");
        }),
        ("overwritten", |p| {
            std::fs::write(p, b"not a ledger").expect("writing")
        }),
    ];
    for (what, damage) in damages {
        let mine = entries_of(dir, a.pid);
        assert_eq!(mine.len(), 1, "{what}: {mine:?}");
        damage(&mine[0]);
        // Before: b took what a holds (a 4 GiB card promised 5). Now: refused, as what a
        // holds is unknown.
        b.expect(&format!("alloc malloc {}", 2 * G), "alloc err 2");
        assert_eq!(b.info().0, 0, "{what}");
        let said = format!("the entry of live process {} cannot be read", a.pid);
        assert!(b.log().contains(&said), "{what}:\n{}", b.log());
        // a's next call writes its entry again: the card is shared as before.
        a.info();
        assert_eq!(b.info(), (2 * G, 3 * G), "{what}");
        b.expect(&format!("alloc malloc {}", 3 * G), "alloc err 2");
    }
    // Immutable: a cannot write its entry, so it writes a new one; the old one stays and
    // the newer counts.
    let old = entries_of(dir, a.pid).remove(0);
    match chattr("+i", &old) {
        Err(why) => println!("skipped the immutable entry: chattr +i failed ({why})"),
        Ok(()) => {
            let _undo = Mutable(old.clone());
            a.alloc("malloc", 512 * M);
            let now = entries_of(dir, a.pid);
            assert_eq!(now.len(), 2, "{now:?}");
            assert_eq!(b.info(), (G + 512 * M, 3 * G));
            b.expect(&format!("alloc malloc {}", 2 * G), "alloc err 2");
            b.alloc("malloc", G);
            let a_pid = a.pid;
            let log = a.quit();
            assert!(
                log.contains("could not be removed") && log.contains("the newer entry counts"),
                "{log}"
            );
            // Only the immutable, dead one is left; it does not count.
            assert_eq!(entries_of(dir, a_pid), vec![old.clone()]);
            b.alloc("malloc", G);
        }
    }
    b.quit();
}

/// Kills and reaps a child when dropped, whatever happened.
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Writes an entry of `id` for GPU `key` holding `used` bytes into `dir`, as the test's
/// user (or, given, as `owner`).
fn forge(dir: &Path, key: &str, id: cudaw_ledger::ProcessId, used: u64, owner: Option<u32>) {
    let rec = cudaw_ledger::Record {
        process: id,
        seq: 1,
        used,
        pending: 0,
        peak: used,
        limit: None,
        capacity: 4 * G,
        key: {
            let mut k = [0u8; cudaw_ledger::ledger::KEY_BYTES];
            k[..key.len()].copy_from_slice(key.as_bytes());
            k
        },
    };
    let path = dir.join(cudaw_ledger::ledger::file_name(key, id, 0x5eed));
    std::fs::write(&path, rec.encode()).expect("forging an entry");
    if let Some(uid) = owner {
        std::os::unix::fs::chown(&path, Some(uid), Some(uid)).expect("chown");
    }
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

#[test]
fn forged_saturating_and_zombie_entries_grant_nothing() {
    let Some(exe) = mem_shell() else { return };
    let tmp = run_dir("forged");
    let dir = tmp.path();
    let mut b = Shell::start(&exe, dir, Addressing::Mapped, &["--mem-limit", "3G"], &[]);
    assert_eq!(b.info(), (3 * G, 3 * G));
    let (key, _) = entry_name(&entries_of(dir, b.pid)[0]);
    // PID 1 with start time 0, claiming the card: counted for ever before; never now.
    forge(
        dir,
        &key,
        cudaw_ledger::ProcessId { pid: 1, start: 0 },
        4 * G,
        None,
    );
    // PID 1 with its real start time, written by a user who is not PID 1's.
    let pid1 = cudaw_ledger::process::start_time(1);
    match pid1 {
        Some(start) if is_root() => forge(
            dir,
            &key,
            cudaw_ledger::ProcessId { pid: 1, start },
            4 * G,
            Some(65534),
        ),
        _ => println!("skipped the other user's entry for PID 1: needs root and /proc/1"),
    }
    assert_eq!(b.info(), (3 * G, 3 * G));
    // Two live processes' entries of 2^63 bytes each: their sum wrapped to 0 and granted.
    let sleepers: Vec<Reaped> = (0..2)
        .map(|_| Reaped(Command::new("sleep").arg("600").spawn().expect("sleep")))
        .collect();
    for s in &sleepers {
        let pid = s.0.id();
        let start = cudaw_ledger::process::start_time(pid).expect("the sleeper's start");
        forge(
            dir,
            &key,
            cudaw_ledger::ProcessId { pid, start },
            1 << 63,
            None,
        );
    }
    b.expect("alloc malloc 1048576", "alloc err 2");
    assert!(
        b.log()
            .contains("other processes under cudaw hold 18446744073709551615"),
        "{}",
        b.log()
    );
    drop(sleepers);
    // A process killed but not reaped (a zombie) keeps no share.
    let mut a = Shell::start(&exe, dir, Addressing::Mapped, &["--mem-limit", "3G"], &[]);
    a.alloc("malloc", 3 * G);
    b.expect(&format!("alloc malloc {}", 2 * G), "alloc err 2");
    // SAFETY: kill has no memory preconditions; a.pid is our own child, not yet reaped.
    assert_eq!(unsafe { libc::kill(a.pid as i32, libc::SIGKILL) }, 0);
    let stat = format!("/proc/{}/stat", a.pid);
    let status = format!("/proc/{}/status", a.pid);
    // A zombie as the ledger sees one: the state is Z and no thread is still exiting (the
    // group leader shows Z while its other threads are torn down).
    let zombie = || {
        let state_z = std::fs::read_to_string(&stat)
            .ok()
            .and_then(|s| {
                s.rsplit_once(')')
                    .map(|(_, r)| r.trim_start().starts_with('Z'))
            })
            .unwrap_or(false);
        let threads = std::fs::read_to_string(&status).ok().and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Threads:"))
                .and_then(|n| n.trim().parse::<u64>().ok())
        });
        state_z && threads.is_none_or(|n| n <= 1)
    };
    // A bounded wait for the kernel to finish the kill (an event, not a timing).
    for _ in 0..2000 {
        if zombie() {
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(zombie(), "a is a zombie");
    let id = b.alloc("malloc", 2 * G);
    assert!(zombie(), "still unreaped while b took its share");
    b.expect(&format!("free {id}"), "free ok");
    drop(a);
    b.quit();
}

/// Copies `from` to `to` with mode `mode`.
fn copy_mode(from: &Path, to: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::copy(from, to).unwrap_or_else(|e| panic!("copying {}: {e}", from.display()));
    std::fs::set_permissions(to, std::fs::Permissions::from_mode(mode)).expect("chmod");
}

fn mkdir_mode(d: &Path, mode: u32, owner: Option<u32>) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir(d).expect("mkdir");
    std::fs::set_permissions(d, std::fs::Permissions::from_mode(mode)).expect("chmod");
    if let Some(uid) = owner {
        std::os::unix::fs::chown(d, Some(uid), Some(uid)).expect("chown");
    }
}

#[test]
fn two_users_share_one_card_and_a_folder_of_another_users_is_refused() {
    let Some(exe) = mem_shell() else { return };
    if !is_root() {
        println!("skipped: running a second process as another user (uid 65534) needs root");
        return;
    }
    const NOBODY: u32 = 65534;
    // Everything uid 65534 runs or reads, in a folder it can reach wherever the clone sits.
    let top = tempfile::Builder::new()
        .prefix("cudaw-limits-users-")
        .tempdir()
        .expect("temp folder");
    let top = top.path();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(top, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    }
    let bin = top.join("bin");
    mkdir_mode(&bin, 0o755, None);
    mkdir_mode(&bin.join("shims"), 0o755, None);
    let built = Tools::built();
    for f in std::fs::read_dir(&built.shims).expect("shims").flatten() {
        copy_mode(&f.path(), &bin.join("shims").join(f.file_name()), 0o755);
    }
    let tools = Tools {
        cudaw: bin.join("cudaw"),
        shims: bin.join("shims"),
        sim: bin.join("libsimgpu.so"),
    };
    copy_mode(&built.cudaw, &tools.cudaw, 0o755);
    copy_mode(&built.sim, &tools.sim, 0o755);
    let shell = bin.join("mem_shell");
    copy_mode(&exe, &shell, 0o755);
    // The node folder, root's, sticky and world-writable; a private run folder each.
    let node = top.join("node");
    mkdir_mode(&node, 0o1777, None);
    let (run_a, run_b) = (top.join("run-a"), top.join("run-b"));
    mkdir_mode(&run_a, 0o700, None);
    mkdir_mode(&run_b, 0o700, Some(NOBODY));
    let node_env = [("CUDAW_NODE_DIR", node.to_str().expect("path"))];
    let mut a = Shell::start_as(
        &tools,
        None,
        &shell,
        &run_a,
        Addressing::Mapped,
        &["--mem-limit", "3G"],
        &node_env,
    );
    let mut b = Shell::start_as(
        &tools,
        Some(NOBODY),
        &shell,
        &run_b,
        Addressing::Mapped,
        &["--mem-limit", "3G"],
        &node_env,
    );
    // Before: each user had a ledger of their own, and each took 3 GiB of the 4 GiB card.
    a.alloc("malloc", 3 * G);
    assert_eq!(b.info(), (G, 3 * G));
    b.expect(&format!("alloc malloc {}", 2 * G), "alloc err 2");
    b.alloc("malloc", G);
    b.expect("alloc malloc 1", "alloc err 2");
    let owners: Vec<u32> = entries(&node)
        .iter()
        .map(|p| std::os::unix::fs::MetadataExt::uid(&std::fs::metadata(p).expect("entry")))
        .collect();
    assert_eq!(owners.len(), 2, "one entry each");
    assert!(
        owners.contains(&0) && owners.contains(&NOBODY),
        "{owners:?}"
    );
    assert!(
        b.log()
            .contains("other processes under cudaw hold 3221225472"),
        "{}",
        b.log()
    );
    b.quit();
    a.quit();

    // A node folder that uid 65534 made first: root's process will not trust it (65534
    // could remove root's entries from it), and refuses allocations, saying why.
    let squat = top.join("squat");
    mkdir_mode(&squat, 0o1777, Some(NOBODY));
    let mut v = Shell::start_as(
        &tools,
        None,
        &shell,
        &run_a,
        Addressing::Mapped,
        &[],
        &[("CUDAW_NODE_DIR", squat.to_str().expect("path"))],
    );
    v.expect("alloc malloc 1048576", "alloc err 2");
    assert_eq!(v.info().0, 0);
    let log = v.quit();
    assert!(
        log.contains("cannot be trusted") && log.contains("is owned by uid 65534"),
        "{log}"
    );
    let said = log
        .lines()
        .filter(|l| l.contains("error: device 0: the node ledger cannot be joined"))
        .count();
    assert_eq!(said, 1, "said once:\n{log}");
    // A node folder uid 65534 cannot write: refused, saying why.
    let closed = top.join("closed");
    mkdir_mode(&closed, 0o755, None);
    let mut c = Shell::start_as(
        &tools,
        Some(NOBODY),
        &shell,
        &run_b,
        Addressing::Mapped,
        &[],
        &[("CUDAW_NODE_DIR", closed.to_str().expect("path"))],
    );
    c.expect("alloc malloc 1048576", "alloc err 2");
    let log = c.quit();
    assert!(
        log.contains("the node ledger cannot be joined") && log.contains("Permission denied"),
        "{log}"
    );
}

#[test]
fn the_default_node_folder_is_the_systems_own_which_no_user_can_make_first() {
    let Some(exe) = mem_shell() else { return };
    let tmp = run_dir("default-node");
    let dir = tmp.path();
    let mut s = Shell::start(
        &exe,
        dir,
        Addressing::Mapped,
        &["--mem-limit", "64M"],
        &[("CUDAW_NODE_DIR", "")],
    );
    s.alloc("malloc", 2 * M);
    let log = s.quit();
    let default = ["/dev/shm", "/tmp"]
        .into_iter()
        .map(Path::new)
        .find(|d| d.is_dir())
        .expect("a default node folder");
    let said = format!("node ledger {}/cudaw-ledger.", default.display());
    assert!(log.contains(&said), "{log}");
    // Root's, sticky: no user made it, and none can remove another's entries.
    let m = std::fs::metadata(default).expect("the default folder");
    use std::os::unix::fs::MetadataExt;
    assert_eq!(
        (m.uid(), m.mode() & 0o1000),
        (0, 0o1000),
        "{}",
        default.display()
    );
}
