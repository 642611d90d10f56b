//! `cudaw node` end to end on simgpu: two `ckpt_target` programs under `cudaw run`, each
//! with its private run folder, and a daemon looking in both, with its own status socket
//! and metrics port. The daemon's log is read on a thread; every child is killed on drop.

mod ckpt_common;

use ckpt_common::{Target, TempDir};
use cudaw_tests::{cudaw, wait_timeout, Addressing, KillOnDrop};
use std::io::{BufRead, BufReader, Read, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A `cudaw node` daemon under test.
struct Daemon {
    child: KillOnDrop,
    log: Arc<Mutex<String>>,
    socket: PathBuf,
    config: PathBuf,
    metrics: String,
    _dir: TempDir,
}

impl Daemon {
    /// Starts `cudaw node` looking in the targets' run folders, with `config` as its
    /// configuration file.
    fn start(tag: &str, targets: &[&Target], config: &str) -> Daemon {
        let dirs: Vec<PathBuf> = targets.iter().map(|t| t.run_dir.clone()).collect();
        Daemon::start_in(tag, &dirs, config)
    }

    /// Starts `cudaw node` looking in the run folders `dirs` (which may not exist yet).
    fn start_in(tag: &str, dirs: &[PathBuf], config: &str) -> Daemon {
        let dir = ckpt_common::temp_dir(&format!("node-{tag}"));
        let cfg = dir.0.join("node.toml");
        std::fs::write(&cfg, config).unwrap();
        let socket = dir.0.join("node.sock");
        // A free port: bound and let go (the daemon binds it right after).
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let metrics = format!("127.0.0.1:{port}");
        let mut cmd = Command::new(cudaw());
        cmd.args(["node", "--config"])
            .arg(&cfg)
            .arg("--socket")
            .arg(&socket)
            .args(["--metrics", &metrics, "--interval", "20ms"])
            .env("CUDAW_LOG", "info")
            .env("CUDAW_TRACE", "timeline")
            .env("CUDAW_TRACE_FILE", dir.0.join("node.trace.json"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        for d in dirs {
            cmd.arg("--run-dir").arg(d);
        }
        let mut child = KillOnDrop(cmd.spawn().expect("starting cudaw node"));
        let stderr = child.stderr.take().expect("stderr");
        let log = Arc::new(Mutex::new(String::new()));
        let sink = Arc::clone(&log);
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                let mut l = sink.lock().unwrap();
                l.push_str(&line);
                l.push('\n');
            }
        });
        Daemon {
            child,
            log,
            socket,
            config: cfg,
            metrics,
            _dir: dir,
        }
    }

    /// The timeline the daemon wrote when it stopped: its slices, (name, job).
    fn slices(&self) -> Vec<(String, String)> {
        let path = self.config.with_file_name("node.trace.json");
        let text = std::fs::read(&path)
            .unwrap_or_else(|e| panic!("{}: {e}\n{}", path.display(), self.log()));
        let v: serde_json::Value = serde_json::from_slice(&text).expect("the timeline's JSON");
        v["traceEvents"]
            .as_array()
            .expect("traceEvents")
            .iter()
            .filter(|e| e["ph"] == "X")
            .map(|e| {
                (
                    e["name"].as_str().unwrap_or("").to_owned(),
                    e["args"]["job"].as_str().unwrap_or("").to_owned(),
                )
            })
            .collect()
    }

    fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    /// Waits (up to 20 s) for the daemon's log to contain `what`.
    fn wait_log(&self, what: &str) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while !self.log().contains(what) {
            assert!(
                Instant::now() < deadline,
                "no {what:?} in the daemon's log within 20 s:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// `cudaw node status --json --socket S`.
    fn status(&self) -> Result<serde_json::Value, String> {
        let out = Command::new(cudaw())
            .args(["node", "status", "--json", "--socket"])
            .arg(&self.socket)
            .output()
            .expect("running cudaw node status");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        if !out.status.success() {
            return Err(format!(
                "{}: {text}{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        serde_json::from_str(&text).map_err(|e| format!("{text:?}: {e}"))
    }

    /// Waits (up to 20 s) for the status to satisfy `pred`; returns it.
    fn status_until(
        &self,
        what: &str,
        pred: impl Fn(&serde_json::Value) -> bool,
    ) -> serde_json::Value {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let st = self.status();
            if let Ok(v) = &st {
                if pred(v) {
                    return v.clone();
                }
            }
            assert!(
                Instant::now() < deadline,
                "{what}: not within 20 s; the status: {st:?}\nthe daemon's log:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// A plain HTTP GET of `path` on the metrics port: the whole answer.
    fn get(&self, path: &str) -> String {
        let mut s = std::net::TcpStream::connect(&self.metrics).expect("connecting to --metrics");
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        write!(s, "GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").unwrap();
        let mut r = String::new();
        s.read_to_string(&mut r).expect("reading the metrics");
        r
    }

    /// Rewrites the configuration (a new file renamed over it, as editors do).
    fn configure(&self, text: &str) {
        let tmp = self.config.with_extension("new");
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, &self.config).unwrap();
    }

    /// SIGTERM; waits (up to 60 s) for the exit and returns its status.
    fn terminate(&mut self) -> std::process::ExitStatus {
        let pid = self.child.id().to_string();
        let ok = Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .expect("running kill");
        assert!(ok.success());
        wait_timeout(&mut self.child, Duration::from_secs(60)).unwrap_or_else(|| {
            panic!(
                "cudaw node did not exit within 60 s of SIGTERM:\n{}",
                self.log()
            )
        })
    }
}

/// The job of `pid` in a status, with the GPU it is listed under.
fn job<'a>(
    st: &'a serde_json::Value,
    id: &str,
) -> Option<(&'a serde_json::Value, &'a serde_json::Value)> {
    st["gpus"].as_array()?.iter().find_map(|g| {
        g["jobs"]
            .as_array()?
            .iter()
            .find(|j| j["id"] == id)
            .map(|j| (g, j))
    })
}

/// The process's own status (`cudaw-ckpt status PID --json`): running, its gate open.
fn assert_ungated(t: &Target) {
    let st = t.status();
    assert_eq!(st["state"], "running", "{st}");
}

fn start_two(tag: &str) -> Option<(Target, Target)> {
    let a = Target::start(Addressing::Mapped, &format!("{tag}-a"))?;
    let b = Target::start(Addressing::Mapped, &format!("{tag}-b"))?;
    Some((a, b))
}

fn job_id(t: &Target) -> String {
    format!("pid-{}", t.pid)
}

#[test]
fn the_daemon_finds_both_jobs_reloads_and_lets_go() {
    let Some((mut a, mut b)) = start_two("find") else {
        eprintln!("skipped: no nvcc");
        return;
    };
    let mut d = Daemon::start("find", &[&a, &b], "quantum = \"20ms\"\n");
    let (ja, jb) = (job_id(&a), job_id(&b));

    // Both discovered, each under its pid's job, on the one simulated GPU.
    let st = d.status_until("both jobs listed", |st| {
        job(st, &ja).is_some() && job(st, &jb).is_some()
    });
    let (ga, a_row) = job(&st, &ja).unwrap();
    let (gb, b_row) = job(&st, &jb).unwrap();
    assert_eq!(ga["uuid"], gb["uuid"], "{st}");
    assert!(ga["uuid"].as_str().unwrap().starts_with("GPU-"), "{st}");
    assert_eq!(
        a_row["pids"],
        serde_json::json!([a.pid.parse::<u32>().unwrap()])
    );
    assert_eq!(
        b_row["pids"],
        serde_json::json!([b.pid.parse::<u32>().unwrap()])
    );
    // In the bytes the node ledger counts: the process's own `used` (its allocations
    // rounded to the VMM's granules).
    assert_eq!(
        a_row["resident_bytes"].as_u64(),
        a.status()["devices"][0]["used"].as_u64(),
        "{st}"
    );
    assert_eq!(st["config"]["error"], serde_json::Value::Null, "{st}");
    d.wait_log(&format!("job {ja} (PID {}): joined GPU", a.pid));

    // Both run under the daemon: their work goes on, in turns.
    a.send_run(20);
    b.send_run(20);
    a.wait_ran();
    b.wait_ran();

    // A reload applies; a bad edit is refused with its line, the last good one kept.
    d.configure(&format!(
        "quantum = \"20ms\"\n\n[[job]]\nid = \"{ja}\"\nrequest = 0.25\nlimit = 1.0\n"
    ));
    d.wait_log("reloaded");
    d.status_until("the new request", |st| {
        job(st, &ja).is_some_and(|(_, j)| j["request"].as_f64() == Some(0.25))
    });
    d.configure(&format!(
        "quantum = \"20ms\"\n\n[[job]]\nid = \"{ja}\"\nrequest = 7\n"
    ));
    let st = d.status_until("the refusal", |st| st["config"]["error"].is_string());
    let e = st["config"]["error"].as_str().unwrap();
    assert!(e.contains("line "), "{st}");
    assert!(
        e.ends_with("keeping the configuration loaded before"),
        "{st}"
    );
    assert_eq!(
        job(&st, &ja).unwrap().1["request"].as_f64(),
        Some(0.25),
        "{st}"
    );
    d.wait_log("configuration refused: ");

    // The metrics.
    let m = d.get("/metrics");
    assert!(m.contains(" 200 "), "{m}");
    assert!(m.contains("cudaw_node_jobs{gpu=\"GPU-"), "{m}");
    assert!(
        m.contains(&format!("cudaw_node_gpu_share{{job=\"{ja}\",gpu=\"GPU-")),
        "{m}"
    );
    assert!(
        m.contains(&format!("cudaw_node_request{{job=\"{ja}\",gpu=\"GPU-")),
        "{m}"
    );
    assert!(m.contains("cudaw_node_config_refused 1"), "{m}");
    // Counters: launches (through cudaw's driver layer), GPU time, swaps' bytes, waits.
    let launches = a.status()["launches"].as_u64().unwrap_or(0);
    assert!(launches > 0, "{}", a.status());
    for family in [
        "cudaw_node_launches_total",
        "cudaw_node_gpu_seconds_total",
        "cudaw_node_swapped_out_bytes_total",
        "cudaw_node_memory_waits_total",
    ] {
        assert!(
            m.contains(&format!("{family}{{job=\"{ja}\",gpu=\"GPU-")),
            "{family}: {m}"
        );
    }
    assert!(d.get("/").contains(" 404 "));

    // SIGTERM: the daemon lets both go, and exits 0; both run on, ungated.
    let status = d.terminate();
    assert!(status.success(), "{status}\n{}", d.log());
    assert!(
        d.log().contains("stopping: letting 2 processes go"),
        "{}",
        d.log()
    );
    assert!(!d.socket.exists(), "the status socket outlived the daemon");
    assert_ungated(&a);
    assert_ungated(&b);
    a.run(5);
    b.run(5);
    a.finish();
    b.finish();
}

#[test]
fn a_job_that_exits_leaves_and_the_other_runs_on() {
    let Some((a, mut b)) = start_two("exit") else {
        eprintln!("skipped: no nvcc");
        return;
    };
    let mut d = Daemon::start("exit", &[&a, &b], "quantum = \"20ms\"\n");
    let (ja, jb) = (job_id(&a), job_id(&b));
    d.status_until("both jobs listed", |st| {
        job(st, &ja).is_some() && job(st, &jb).is_some()
    });
    a.finish();
    d.status_until("the job gone", |st| {
        job(st, &ja).is_none() && job(st, &jb).is_some()
    });
    d.wait_log(&format!("job {ja} (PID"));
    b.run(30);
    let status = d.terminate();
    assert!(status.success(), "{status}");
    assert_ungated(&b);
    b.finish();
}

#[test]
fn status_without_a_daemon_says_so() {
    let dir = ckpt_common::temp_dir("node-none");
    let socket = dir.0.join("node.sock");
    let out = Command::new(cudaw())
        .args(["node", "status", "--socket"])
        .arg(&socket)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("no cudaw node daemon serves {}", socket.display())),
        "{err}"
    );
    assert!(
        err.contains("start one with `cudaw node --config FILE`"),
        "{err}"
    );
}

#[test]
fn a_missing_configuration_is_a_usage_error() {
    let dir = ckpt_common::temp_dir("node-cfg");
    let out = Command::new(cudaw())
        .args(["node", "--socket"])
        .arg(dir.0.join("node.sock"))
        .args(["--run-dir"])
        .arg(&dir.0)
        .arg("--config")
        .arg(dir.0.join("none.toml"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("configuration refused: "), "{err}");
    assert!(err.contains("none.toml: No such file"), "{err}");
}

/// A private folder for a node ledger of the tests' own (`CUDAW_NODE_DIR`); `None`, said,
/// without nvcc (the targets cannot be built).
fn private_ledger_dir(tag: &str) -> Option<TempDir> {
    if cudaw_tests::nvcc().is_none() {
        eprintln!("skipped: no nvcc");
        return None;
    }
    let node = ckpt_common::temp_dir(tag);
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&node.0, std::fs::Permissions::from_mode(0o700)).unwrap();
    Some(node)
}

/// The environment of targets that do not fit the simulated card together (the node
/// ledger in `nd`: 24 MiB, each target about 14 MiB), waiting up to 60 s for room.
fn tight_env(nd: &str, log: bool) -> Vec<(&str, &str)> {
    let mut env = vec![
        ("SIMGPU_MEM", "24M"),
        ("CUDAW_NODE_DIR", nd),
        ("CUDAW_ALLOC_WAIT", "60s"),
    ];
    if log {
        env.push(("CUDAW_LOG", "info"));
    }
    env
}

/// Waits (up to 20 s) until `t` is paused by the node daemon (swapped out).
fn until_swapped_out(t: &Target) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let st = t.status();
        if st["state"] == "paused" && st["paused_by"] == "cudaw-node" {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "not swapped out by the node: {st}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The run folder `Target::start_with` gives the target of `tag` (known before it starts).
fn run_dir_of(tag: &str) -> PathBuf {
    std::env::temp_dir().join(format!("cudaw-dump-{}-{tag}-run", std::process::id()))
}

/// Swap instead of OOM, end to end: two jobs whose memory does not fit the card together
/// (the node ledger's 24 MiB, each job about 14 MiB) under the daemon. The second's first
/// allocation waits for room (CUDAW_ALLOC_WAIT) instead of failing; the daemon swaps the
/// first out, and from then on the two take turns, each swapped in for its turn. Both
/// run to their expected output.
#[test]
fn jobs_that_do_not_fit_together_take_turns_by_swapping() {
    let Some(node) = private_ledger_dir("node-swap-ledger") else {
        return;
    };
    let nd = node.0.to_str().unwrap().to_owned();
    let env = tight_env(&nd, true);
    let (ta, tb) = ("swap-a", "swap-b");
    let mut d = Daemon::start_in(
        "swap",
        &[run_dir_of(ta), run_dir_of(tb)],
        "quantum = \"20ms\"\n",
    );
    let mut a = Target::start_with(Addressing::Mapped, ta, &env).expect("nvcc was found");
    let ja = job_id(&a);
    d.status_until("the first job listed", |st| job(st, &ja).is_some());
    a.run(3);
    // The second cannot allocate beside the first: it waits, the daemon swaps the first
    // out, and its first line comes once its memory is allocated.
    let mut b = Target::start_with(Addressing::Mapped, tb, &env).expect("nvcc was found");
    assert!(
        b.log()
            .contains("waiting up to 60.0 s for the node scheduler to make room"),
        "{}",
        b.log()
    );
    // Its one waiting allocation counts once among the refused, not once per retry.
    let refused = b.status()["devices"][0]["refused"].as_u64();
    assert_eq!(refused, Some(1), "{}", b.status());
    let jb = job_id(&b);
    d.status_until("the first job swapped out once", |st| {
        job(st, &ja).is_some_and(|(_, j)| j["swaps"].as_u64().unwrap_or(0) >= 1)
    });
    // Both work: each is swapped in for its turn, the other out.
    for _ in 0..3 {
        a.send_run(5);
        b.send_run(5);
        a.wait_ran();
        b.wait_ran();
    }
    let st = d.status().expect("the daemon's status");
    assert!(
        job(&st, &jb).is_some_and(|(_, j)| j["swaps"].as_u64().unwrap_or(0) >= 1),
        "both jobs were swapped out at some point: {st}\n{}",
        d.log()
    );
    // The first ends under the daemon (swapped in for its last turn); the second then has
    // the card to itself, and the daemon lets it go swapped in and ungated.
    a.finish();
    d.status_until("the first job gone", |st| job(st, &ja).is_none());
    b.run(2);
    let status = d.terminate();
    assert!(status.success(), "{status}");
    // The daemon's decisions, as slices per job: turns, holds, swaps out and in.
    let slices = d.slices();
    for (what, j) in [
        ("turn", &ja),
        ("turn", &jb),
        ("swap out", &ja),
        ("swap in", &ja),
    ] {
        assert!(
            slices.iter().any(|(n, sj)| n == what && sj == j),
            "no {what} slice of {j} in the daemon's timeline: {slices:?}"
        );
    }
    assert!(d.log().contains("timeline: "), "{}", d.log());
    assert_ungated(&b);
    b.run(2);
    b.finish();
}

/// A process paused by someone else (an operator, a migration) is not the daemon's: it
/// leaves the schedule (the other job runs on), is never resumed by the daemon, and
/// comes back into the schedule once its owner resumes it.
#[test]
fn an_operators_pause_is_left_alone_and_the_other_job_runs_on() {
    let Some((mut a, mut b)) = start_two("foreign") else {
        eprintln!("skipped: no nvcc");
        return;
    };
    let mut d = Daemon::start("foreign", &[&a, &b], "quantum = \"20ms\"\n");
    let (ja, jb) = (job_id(&a), job_id(&b));
    d.status_until("both jobs listed", |st| {
        job(st, &ja).is_some() && job(st, &jb).is_some()
    });
    a.ok(&["pause", &a.pid]);
    d.wait_log(&format!("{ja} (PID {}): paused by someone else", a.pid));
    d.status_until("the paused job out of the schedule", |st| {
        job(st, &ja).is_none() && job(st, &jb).is_some()
    });
    b.run(5);
    // Still paused: the daemon did not resume it.
    assert_eq!(a.status()["state"], "paused");
    a.ok(&["resume", &a.pid]);
    d.status_until("the resumed job back in the schedule", |st| {
        job(st, &ja).is_some()
    });
    a.run(3);
    b.run(3);
    let status = d.terminate();
    assert!(status.success(), "{status}");
    a.finish();
    b.finish();
}

/// The process's own limit on device 0 (`cudaw-ckpt status --json`), waited for (up to
/// 10 s) until it is `want`.
fn limit_until(t: &Target, want: Option<u64>) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let st = t.status();
        let got = st["devices"][0]["limit"].as_u64();
        if got == want {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the process's limit is {got:?}, not {want:?}: {st}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A job's `memory` reaches its processes as their limit, live: set below what the
/// process holds (nothing is taken back, it runs on), as a share of the card, lifted when
/// the configuration drops it, and lifted when the daemon stops.
#[test]
fn a_jobs_memory_limit_reaches_its_process_live_and_is_lifted_at_the_end() {
    let Some(mut a) = Target::start(Addressing::Mapped, "limit-a") else {
        eprintln!("skipped: no nvcc");
        return;
    };
    let mut d = Daemon::start("limit", &[&a], "quantum = \"20ms\"\n");
    let ja = job_id(&a);
    let st = d.status_until("the job listed", |st| job(st, &ja).is_some());
    let capacity = job(&st, &ja).unwrap().0["capacity"]
        .as_u64()
        .expect("the card's capacity");
    let used = a.status()["devices"][0]["used"].as_u64().unwrap();
    assert!(used > 4 << 20, "the target holds more than the limit below");
    limit_until(&a, None);

    d.configure(&format!(
        "quantum = \"20ms\"\n\n[[job]]\nid = \"{ja}\"\nmemory = \"4M\"\n"
    ));
    limit_until(&a, Some(4 << 20));
    d.wait_log(&format!("job {ja} (PID {}): memory limited to", a.pid));
    // Above its limit, it runs on: nothing is taken back; paused and resumed, all of
    // what it held comes back (the limit does not apply to a resume).
    a.run(2);
    assert_eq!(a.status()["devices"][0]["used"].as_u64(), Some(used));
    a.ok(&["pause", &a.pid]);
    a.ok(&["resume", &a.pid]);
    assert_eq!(a.status()["devices"][0]["used"].as_u64(), Some(used));
    assert_eq!(a.status()["devices"][0]["limit"].as_u64(), Some(4 << 20));
    a.run(2);

    d.configure(&format!(
        "quantum = \"20ms\"\n\n[[job]]\nid = \"{ja}\"\nmemory = \"50%\"\n"
    ));
    limit_until(&a, Some(capacity / 2));
    d.configure("quantum = \"20ms\"\n");
    limit_until(&a, None);
    d.wait_log("memory limit lifted");

    d.configure(&format!(
        "quantum = \"20ms\"\n\n[[job]]\nid = \"{ja}\"\nmemory = \"4M\"\n"
    ));
    limit_until(&a, Some(4 << 20));
    let status = d.terminate();
    assert!(status.success(), "{status}\n{}", d.log());
    limit_until(&a, None);
    a.run(2);
    a.finish();
}

/// The daemon restarting loses no job: a daemon killed (SIGKILL) while it has a job swapped
/// out leaves that job paused, its pause marked as the node's (`paused_by`); the next
/// daemon takes the swap over and swaps the job in at its turn, and swaps it in again if
/// it stops first.
#[test]
fn a_daemon_started_after_one_died_swaps_in_what_that_one_swapped_out() {
    let Some(node) = private_ledger_dir("node-adopt-ledger") else {
        return;
    };
    let nd = node.0.to_str().unwrap().to_owned();
    let env = tight_env(&nd, false);
    let (ta, tb) = ("adopt-a", "adopt-b");
    let dirs = [run_dir_of(ta), run_dir_of(tb)];
    let mut d1 = Daemon::start_in("adopt1", &dirs, "quantum = \"20ms\"\n");
    let mut a = Target::start_with(Addressing::Mapped, ta, &env).expect("nvcc was found");
    let ja = job_id(&a);
    d1.status_until("the first job listed", |st| job(st, &ja).is_some());
    a.run(2);
    // The second does not fit beside the first: the daemon swaps the first (idle from
    // then on: it stays swapped out) out for it.
    let mut b = Target::start_with(Addressing::Mapped, tb, &env).expect("nvcc was found");
    b.run(2);
    until_swapped_out(&a);
    // The daemon dies; the first job stays swapped out, the second runs on ungated (its
    // hold's lease ends).
    d1.child.kill().unwrap();
    let _ = d1.child.wait();
    b.run(2);
    assert_eq!(a.status()["paused_by"], "cudaw-node", "{}", a.status());

    let mut d2 = Daemon::start_in("adopt2", &dirs, "quantum = \"20ms\"\n");
    d2.wait_log(&format!(
        "job {ja} (PID {}): found swapped out by an earlier daemon",
        a.pid
    ));
    // The first job wants the GPU: swapped in at its turn, the second out.
    for _ in 0..2 {
        a.send_run(3);
        b.send_run(3);
        let daemon = || {
            let st = d2.status().map_or_else(|e| e, |s| s.to_string());
            format!("\nthe daemon's status: {st}\nits log:\n{}", d2.log())
        };
        a.wait_ran_or(daemon);
        b.wait_ran_or(daemon);
    }
    // The second ends; the daemon stops: the first is swapped in (it fits now) and goes
    // on ungated. (One that did not fit would stay paused, its pause the node's, for the
    // next daemon.)
    let jb = job_id(&b);
    b.finish();
    d2.status_until("the second job gone", |st| job(st, &jb).is_none());
    let status = d2.terminate();
    assert!(status.success(), "{status}\n{}", d2.log());
    assert_ungated(&a);
    assert_eq!(a.status()["paused_by"], serde_json::Value::Null);
    a.run(2);
    a.finish();
}

/// A job's `gpus` keep its processes to those GPUs: `cudaw run --job` asks the daemon and
/// sets CUDA_VISIBLE_DEVICES (with nvidia-smi's order where it names indexes), unless the
/// caller set it; a job the configuration does not name gets `[default]`'s.
#[test]
fn a_jobs_gpus_become_its_visible_devices() {
    let uuid = "GPU-12345678-1234-1234-1234-123456789abc";
    let d = Daemon::start_in(
        "gpus",
        &[],
        &format!(
            "[default]\ngpus = [\"0\"]\n\n[[job]]\nid = \"pinned\"\ngpus = [\"{uuid}\", \"1\"]\n"
        ),
    );
    d.status_until("the daemon answers", |_| true);
    let env_of = |job: &str, visible: Option<&str>| -> String {
        let mut cmd = Command::new(cudaw());
        cmd.args(["run", "--job", job, "--print-env", "--", "true"])
            .env("CUDAW_NODE_SOCKET", &d.socket)
            .env_remove("CUDA_VISIBLE_DEVICES")
            .env_remove("CUDA_DEVICE_ORDER");
        if let Some(v) = visible {
            cmd.env("CUDA_VISIBLE_DEVICES", v);
        }
        let out = cmd.output().expect("cudaw run --print-env");
        assert!(out.status.success(), "{out:?}");
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    };
    let env = env_of("pinned", None);
    assert!(
        env.contains(&format!("CUDA_VISIBLE_DEVICES={uuid},1\n")),
        "{env}"
    );
    assert!(env.contains("CUDA_DEVICE_ORDER=PCI_BUS_ID\n"), "{env}");
    // The caller's choice stands; a job the configuration does not name gets the
    // default's.
    assert!(!env_of("pinned", Some("0")).contains("CUDA_VISIBLE_DEVICES"));
    assert!(env_of("other", None).contains("CUDA_VISIBLE_DEVICES=0\n"));
}

/// Two daemons never manage the same processes: the second finds the run folder held by
/// the first (a lock on the folder), says so, and leaves its processes alone.
#[test]
fn a_second_daemon_leaves_the_first_ones_processes_alone() {
    let Some(mut a) = Target::start(Addressing::Mapped, "two-a") else {
        eprintln!("skipped: no nvcc");
        return;
    };
    let mut d1 = Daemon::start("two1", &[&a], "quantum = \"20ms\"\n");
    let ja = job_id(&a);
    d1.status_until("the job listed", |st| job(st, &ja).is_some());
    let mut d2 = Daemon::start("two2", &[&a], "quantum = \"20ms\"\n");
    d2.wait_log("another cudaw node daemon manages it");
    let st = d2.status().expect("the second daemon's status");
    assert!(job(&st, &ja).is_none(), "{st}");
    assert_eq!(st["processes"], serde_json::json!([]), "{st}");
    a.run(2);
    assert!(d2.terminate().success());
    assert!(d1.terminate().success());
    a.run(2);
    a.finish();
}

/// An operator who pauses a job the daemon has swapped out takes the pause over: the
/// daemon leaves it paused (it wants the GPU, and is not swapped in) until the operator
/// resumes it.
#[test]
fn an_operator_pausing_a_swapped_out_job_takes_the_pause_over() {
    let Some(node) = private_ledger_dir("node-take-ledger") else {
        return;
    };
    let nd = node.0.to_str().unwrap().to_owned();
    let env = tight_env(&nd, false);
    let (ta, tb) = ("take-a", "take-b");
    let mut d = Daemon::start_in(
        "take",
        &[run_dir_of(ta), run_dir_of(tb)],
        "quantum = \"20ms\"\n",
    );
    let mut a = Target::start_with(Addressing::Mapped, ta, &env).expect("nvcc was found");
    let ja = job_id(&a);
    d.status_until("the first job listed", |st| job(st, &ja).is_some());
    a.run(2);
    let mut b = Target::start_with(Addressing::Mapped, tb, &env).expect("nvcc was found");
    b.run(2);
    until_swapped_out(&a);
    // The operator's pause of the swapped-out job: it was paused already; the pause is
    // the operator's now.
    a.ok(&["pause", &a.pid]);
    assert_eq!(a.status()["paused_by"], "", "{}", a.status());
    d.wait_log(&format!(
        "job {ja} (PID {}): paused by someone else while swapped out",
        a.pid
    ));
    // It wants the GPU; the daemon leaves it paused, and the other job runs on.
    a.send_run(2);
    b.run(2);
    assert_eq!(a.status()["state"], "paused", "{}", a.status());
    // The other ends; the operator resumes it (there is room now): it runs, and joins
    // the schedule again.
    let jb = job_id(&b);
    b.finish();
    d.status_until("the second job gone", |st| job(st, &jb).is_none());
    a.ok(&["resume", &a.pid]);
    a.wait_ran();
    a.run(2);
    let status = d.terminate();
    assert!(status.success(), "{status}\n{}", d.log());
    assert_ungated(&a);
    a.finish();
}
