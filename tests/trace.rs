//! Tracing (`CUDAW_TRACE`): `tests/cuda/programs/hotcold.cu` (2 hot buffers copied in and
//! out 175 times each and given to `add_into` every round, 25 cold buffers copied in once
//! and given to `fill` once) runs under cudaw on simgpu, waits, and the test reads it live
//! through `cudaw-ckpt stats` (text, `--json`, `--prometheus`) and `cudaw-ckpt trace`:
//!
//! - the call counts equal the calls the program makes; kernels by demangled name; copies
//!   per direction with their bytes;
//! - the memory history: the two hot buffers are the hottest (175 copies each way, 175
//!   launches of `add_into`), the 25 cold ones the coldest (one copy in, one `fill`), each
//!   made by `cudaMalloc` from the program itself;
//! - the timeline is valid trace-event JSON holding the kernels by name with the
//!   allocations each received, copies, allocations, frees, pauses and resumes; the file
//!   written at exit holds the frees too; a small ring drops its oldest events;
//! - the Prometheus text parses line by line;
//! - the summary at exit in the log.

use cudaw_tests::{command_under_cudaw, compile_program, cudaw_ckpt, nvcc, Addressing};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{ChildStdin, Command, Output, Stdio};

const ROUNDS: u64 = 175;
const COLD: u64 = 25;
const HOT_BYTES: u64 = 4096 * 4;
const COLD_BYTES: u64 = 1024 * 4;
const ADD_INTO: &str = "add_into(int const*, int*, int)";
const FILL: &str = "fill(int*, int, int)";

/// A folder of the test's own (run folder, trace files), emptied.
fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("cudaw-trace-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("creating the scratch folder");
    // Private: it is also the run folder, which holds other files (the traces).
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o700))
        .expect("making the scratch folder private");
    d
}

/// `hotcold wait` under cudaw, stopped at `ready`.
struct Target {
    child: cudaw_tests::KillOnDrop,
    stdin: ChildStdin,
    stdout: BufReader<std::process::ChildStdout>,
    dir: PathBuf,
}

impl Target {
    fn start(name: &str, addressing: Addressing, env: &[(&str, &str)]) -> Option<Target> {
        let nvcc = nvcc()?;
        let exe = compile_program(&nvcc, "hotcold");
        let (t, line) = Target::spawn(name, &exe, &["wait"], addressing, env);
        assert_eq!(
            line,
            "ready\n",
            "hotcold did not get ready; log:\n{}",
            t.log()
        );
        Some(t)
    }

    /// `exe ARGS` under cudaw, with its first line of output.
    fn spawn(
        name: &str,
        exe: &Path,
        args: &[&str],
        addressing: Addressing,
        env: &[(&str, &str)],
    ) -> (Target, String) {
        let dir = scratch(name);
        let log = std::fs::File::create(dir.join("log")).expect("creating the log");
        let mut cmd = command_under_cudaw(exe, addressing, env);
        cmd.args(args)
            .env("CUDAW_LOG", "info")
            .env("CUDAW_RUN_DIR", &dir)
            .current_dir(&dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(log);
        let mut child =
            cudaw_tests::KillOnDrop(cmd.spawn().expect("starting the program under cudaw"));
        let stdin = child.stdin.take().expect("stdin");
        let stdout = BufReader::new(child.stdout.take().expect("stdout"));
        let mut t = Target {
            child,
            stdin,
            stdout,
            dir,
        };
        let line = t.line();
        (t, line)
    }

    /// The program's next line of output.
    fn line(&mut self) -> String {
        let mut line = String::new();
        self.stdout
            .read_line(&mut line)
            .expect("reading the program's output");
        line
    }

    /// Lets the program go on past a stop; its next line.
    fn go_on(&mut self) -> String {
        self.stdin.write_all(b"\n").expect("writing to the program");
        self.line()
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("log")).unwrap_or_default()
    }

    fn ckpt(&self, args: &[&str]) -> Output {
        Command::new(cudaw_ckpt())
            .args(args)
            .env("CUDAW_RUN_DIR", &self.dir)
            .output()
            .expect("running cudaw-ckpt")
    }

    /// `cudaw-ckpt ARGS` that must succeed; its standard output.
    fn ckpt_ok(&self, args: &[&str]) -> String {
        let out = self.ckpt(args);
        assert!(
            out.status.success(),
            "cudaw-ckpt {args:?} failed: {}{}\nlog:\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            self.log()
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn stats(&self) -> Value {
        let pid = self.pid().to_string();
        serde_json::from_str(&self.ckpt_ok(&["stats", &pid, "--json", "--top", "30"]))
            .expect("stats --json is JSON")
    }

    /// Lets the program free everything and exit; its last line and the log.
    fn finish(mut self) -> (String, String) {
        self.stdin.write_all(b"\n").expect("writing to hotcold");
        let mut rest = String::new();
        self.stdout
            .read_line(&mut rest)
            .expect("hotcold's last line");
        let status = self.child.wait().expect("waiting for hotcold");
        let log = self.log();
        assert!(status.success(), "hotcold failed ({status}):\n{log}");
        (rest, log)
    }
}

fn calls(stats: &Value) -> BTreeMap<String, u64> {
    stats["calls"]
        .as_array()
        .expect("calls")
        .iter()
        .map(|c| {
            (
                c["name"].as_str().unwrap().to_owned(),
                c["count"].as_u64().unwrap(),
            )
        })
        .collect()
}

/// The launches per kernel (demangled name) in `stats`.
fn kernel_launches(stats: &Value) -> BTreeMap<&str, u64> {
    stats["kernels"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| (k["name"].as_str().unwrap(), k["launches"].as_u64().unwrap()))
        .collect()
}

fn check_counts(stats: &Value) {
    let c = calls(stats);
    let launches = ROUNDS + COLD;
    let launch_calls = c.get("__cudaLaunchKernel").copied().unwrap_or(0)
        + c.get("cudaLaunchKernel").copied().unwrap_or(0);
    for (name, want) in [
        ("cudaMalloc", 2 + COLD),
        ("cudaMemcpy", COLD + 4 * ROUNDS),
        ("__cudaPushCallConfiguration", launches),
        ("__cudaPopCallConfiguration", launches),
        ("cudaGetLastError", launches),
    ] {
        assert_eq!(c.get(name).copied(), Some(want), "{name}: {c:?}");
    }
    assert_eq!(launch_calls, launches, "{c:?}");
    assert_eq!(c.get("cudaFree"), None, "nothing is freed yet: {c:?}");
    for call in stats["calls"].as_array().unwrap() {
        let (total, mean, max) = (
            call["total_ns"].as_f64().unwrap(),
            call["mean_ns"].as_f64().unwrap(),
            call["max_ns"].as_f64().unwrap(),
        );
        assert!(
            total > 0.0 && mean > 0.0 && max >= mean && max <= total,
            "{call}"
        );
    }
    let kernels = kernel_launches(stats);
    assert_eq!(
        kernels,
        BTreeMap::from([(ADD_INTO, ROUNDS), (FILL, COLD)]),
        "{stats}"
    );
    let copies: BTreeMap<&str, (u64, u64)> = stats["copies"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| {
            (
                k["direction"].as_str().unwrap(),
                (k["count"].as_u64().unwrap(), k["bytes"].as_u64().unwrap()),
            )
        })
        .collect();
    assert_eq!(
        copies,
        BTreeMap::from([
            (
                "HtoD",
                (
                    COLD + 2 * ROUNDS,
                    COLD * COLD_BYTES + 2 * ROUNDS * HOT_BYTES
                )
            ),
            ("DtoH", (2 * ROUNDS, 2 * ROUNDS * HOT_BYTES)),
        ])
    );
}

/// The hottest are the two hot buffers, the coldest the 25 cold ones; returns the hot
/// buffers' and the cold buffers' addresses.
fn check_history(stats: &Value) -> (Vec<String>, Vec<String>) {
    check_history_sited(stats, serde_json::json!("hotcold"))
}

/// [`check_history`], with `site` as the cold buffers' creation site (null where calls are
/// not traced: the site is read from the allocating call's frame).
fn check_history_sited(stats: &Value, site: Value) -> (Vec<String>, Vec<String>) {
    let m = &stats["memory"];
    assert_eq!(m["live"], 2 + COLD, "{m}");
    assert_eq!(m["live_bytes"], 2 * HOT_BYTES + COLD * COLD_BYTES, "{m}");
    let hottest = m["hottest"].as_array().unwrap();
    let hot: Vec<&Value> = hottest.iter().take(2).collect();
    for h in &hot {
        assert_eq!(
            (
                h["copies_in"].as_u64(),
                h["copies_out"].as_u64(),
                h["launches"].as_u64(),
                h["size"].as_u64()
            ),
            (Some(ROUNDS), Some(ROUNDS), Some(ROUNDS), Some(HOT_BYTES)),
            "{h}"
        );
        assert_eq!(h["bytes_in"].as_u64(), Some(ROUNDS * HOT_BYTES));
        assert_eq!(h["kernels"], serde_json::json!([ADD_INTO]));
    }
    let orders: BTreeSet<u64> = hot.iter().map(|h| h["order"].as_u64().unwrap()).collect();
    assert_eq!(
        orders,
        BTreeSet::from([0, 1]),
        "the hot buffers were made first"
    );
    // Every cold buffer: below the hot ones in the hottest list, first in the coldest.
    let coldest = m["coldest"].as_array().unwrap();
    assert!(coldest.len() >= COLD as usize, "{m}");
    let cold: Vec<&Value> = coldest.iter().take(COLD as usize).collect();
    for (i, c) in cold.iter().enumerate() {
        assert_eq!(
            (
                c["copies_in"].as_u64(),
                c["copies_out"].as_u64(),
                c["launches"].as_u64(),
                c["size"].as_u64(),
                c["order"].as_u64()
            ),
            (
                Some(1),
                Some(0),
                Some(1),
                Some(COLD_BYTES),
                Some(2 + i as u64)
            ),
            "{c}"
        );
        assert_eq!(c["kernels"], serde_json::json!([FILL]));
        assert_eq!(c["api"], "cudaMalloc");
        assert_eq!(c["site"], site, "made by the program itself: {c}");
    }
    let addr = |v: &[&Value]| -> Vec<String> {
        v.iter()
            .map(|a| a["base"].as_str().unwrap().to_owned())
            .collect()
    };
    (addr(&hot), addr(&cold))
}

/// Checks one line of the Prometheus text format: a comment or `name{labels} value`.
fn check_prometheus(text: &str) -> BTreeMap<String, f64> {
    let mut samples = BTreeMap::new();
    for line in text.lines() {
        if let Some(c) = line.strip_prefix("# ") {
            let mut w = c.split_whitespace();
            let kind = w.next().unwrap();
            assert!(kind == "HELP" || kind == "TYPE", "{line}");
            let name = w.next().unwrap();
            assert!(name.starts_with("cudaw_"), "{line}");
            if kind == "TYPE" {
                assert!(matches!(w.next(), Some("counter" | "gauge")), "{line}");
            }
            continue;
        }
        let (series, value) = line.rsplit_once(' ').unwrap_or_else(|| panic!("{line}"));
        let value: f64 = value.parse().unwrap_or_else(|_| panic!("value of {line}"));
        let (name, labels) = series.split_once('{').unwrap_or_else(|| panic!("{line}"));
        assert!(
            name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'),
            "{line}"
        );
        let labels = labels.strip_suffix('}').unwrap_or_else(|| panic!("{line}"));
        // label="value" pairs, values with \" \\ \n escapes.
        let mut rest = labels;
        let mut key = String::new();
        while !rest.is_empty() {
            let (k, after) = rest.split_once("=\"").unwrap_or_else(|| panic!("{line}"));
            assert!(
                k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'),
                "{line}"
            );
            let mut chars = after.char_indices();
            let mut end = None;
            while let Some((i, ch)) = chars.next() {
                match ch {
                    '\\' => {
                        chars.next();
                    }
                    '"' => {
                        end = Some(i);
                        break;
                    }
                    _ => {}
                }
            }
            let end = end.unwrap_or_else(|| panic!("unterminated label in {line}"));
            key.push_str(&format!("{k}={},", &after[..end]));
            rest = after[end + 1..]
                .strip_prefix(',')
                .unwrap_or(&after[end + 1..]);
        }
        samples.insert(format!("{name}{{{key}}}"), value);
    }
    samples
}

fn read_json(path: &Path) -> Value {
    let text =
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{} is not JSON: {e}", path.display()))
}

/// Checks a timeline: valid trace events, the launches by name with their buffers.
fn check_timeline(t: &Value, hot: &[String], cold: &[String]) -> Vec<Value> {
    let events = t["traceEvents"].as_array().expect("traceEvents");
    for e in events {
        let ph = e["ph"].as_str().expect("ph");
        assert!(e["name"].is_string() && e["pid"].is_u64(), "{e}");
        match ph {
            "X" => assert!(
                e["ts"].is_number() && e["dur"].as_f64().unwrap() >= 0.0,
                "{e}"
            ),
            "i" | "M" => {}
            other => panic!("unexpected phase {other}: {e}"),
        }
    }
    let kernel = |name: &str| -> Vec<&Value> {
        events
            .iter()
            .filter(|e| e["cat"] == "kernel" && e["name"] == name)
            .collect()
    };
    let adds = kernel(ADD_INTO);
    assert_eq!(
        adds.len() as u64,
        ROUNDS,
        "add_into launches in the timeline"
    );
    for a in &adds {
        let bufs: Vec<(u64, String)> = a["args"]["buffers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| {
                (
                    b["param"].as_u64().unwrap(),
                    b["base"].as_str().unwrap().to_owned(),
                )
            })
            .collect();
        assert_eq!(bufs, vec![(0, hot[0].clone()), (1, hot[1].clone())], "{a}");
        assert_eq!(a["args"]["grid"], serde_json::json!([16, 1, 1]));
        assert_eq!(a["args"]["block"], serde_json::json!([256, 1, 1]));
        assert_eq!(a["args"]["kernel"], "_Z8add_intoPKiPii");
    }
    let fills = kernel(FILL);
    assert_eq!(fills.len() as u64, COLD);
    for (f, c) in fills.iter().zip(cold) {
        assert_eq!(f["args"]["buffers"][0]["base"], c.as_str(), "{f}");
    }
    let copies = events.iter().filter(|e| e["cat"] == "copy").count() as u64;
    assert_eq!(copies, COLD + 4 * ROUNDS);
    let allocs = events
        .iter()
        .filter(|e| e["cat"] == "memory" && e["args"]["api"] == "cudaMalloc")
        .count() as u64;
    assert_eq!(allocs, 2 + COLD);
    let memcpy_calls = events
        .iter()
        .filter(|e| e["cat"] == "call" && e["name"] == "cudaMemcpy")
        .count() as u64;
    assert_eq!(memcpy_calls, COLD + 4 * ROUNDS);
    events.clone()
}

fn metrics(addressing: Addressing) {
    let Some(t) = Target::start(
        &format!("metrics-{addressing:?}"),
        addressing,
        &[
            ("CUDAW_TRACE", "metrics"),
            // Every launch's buffers read: the history's launch counts are exact.
            ("CUDAW_TRACE_BUFFER_SAMPLE", "1"),
        ],
    ) else {
        return;
    };
    let stats = t.stats();
    assert_eq!(stats["mode"], "metrics");
    assert_eq!(stats["pid"], t.pid());
    check_counts(&stats);
    check_history(&stats);
    assert!(stats.get("timeline").is_none(), "{stats}");

    let pid = t.pid().to_string();
    let text = t.ckpt_ok(&["stats", &pid]);
    assert!(
        text.contains(ADD_INTO) && text.contains("hottest:") && text.contains("coldest:"),
        "{text}"
    );
    let prom = check_prometheus(&t.ckpt_ok(&["stats", &pid, "--prometheus"]));
    let p = |k: &str| {
        prom.get(k)
            .copied()
            .unwrap_or_else(|| panic!("no {k} in {prom:?}"))
    };
    assert_eq!(
        p(&format!(
            "cudaw_calls_total{{pid={pid},function=cudaMemcpy,}}"
        )),
        (COLD + 4 * ROUNDS) as f64
    );
    assert_eq!(
        p(&format!(
            "cudaw_kernel_launches_total{{pid={pid},kernel={ADD_INTO},}}"
        )),
        ROUNDS as f64
    );
    assert_eq!(
        p(&format!("cudaw_copies_total{{pid={pid},direction=DtoH,}}")),
        (2 * ROUNDS) as f64
    );
    assert_eq!(
        p(&format!("cudaw_live_allocations{{pid={pid},}}")),
        (2 + COLD) as f64
    );

    // Metrics keep no timeline: the trace request says so.
    let out = t.ckpt(&["trace", &pid, "-o", "/tmp/never.json", "--json"]);
    assert!(!out.status.success());
    let v: Value = serde_json::from_slice(&out.stdout).expect("--json failure");
    assert!(
        v["error"]
            .as_str()
            .unwrap()
            .contains("CUDAW_TRACE=timeline"),
        "{v}"
    );
    let (last, log) = t.finish();
    assert!(last.starts_with("hotcold hot=2 cold=25"), "{last}");
    assert!(
        log.contains("trace: trace (metrics):")
            && log.contains(&format!("trace:          175  {ADD_INTO}")),
        "the summary at exit:\n{log}"
    );
    assert!(log.contains("27 made, 27 freed"), "{log}");
}

#[test]
fn metrics_counts_and_memory_history_mapped() {
    metrics(Addressing::Mapped);
}

#[test]
fn metrics_counts_and_memory_history_translated() {
    metrics(Addressing::Translated);
}

/// `CUDAW_TRACE_CALLS=off`: no call is counted, while launches per kernel, copies and the
/// memory history are recorded as with calls on (but for the creation site, read from the
/// allocating call's frame).
#[test]
fn metrics_without_calls_keep_launches_copies_and_the_history() {
    let Some(t) = Target::start(
        "metrics-no-calls",
        Addressing::Mapped,
        &[
            ("CUDAW_TRACE", "metrics"),
            ("CUDAW_TRACE_CALLS", "off"),
            ("CUDAW_TRACE_BUFFER_SAMPLE", "1"),
        ],
    ) else {
        return;
    };
    let stats = t.stats();
    assert_eq!(calls(&stats), BTreeMap::new(), "{stats}");
    let kernels = kernel_launches(&stats);
    assert_eq!(kernels, BTreeMap::from([(ADD_INTO, ROUNDS), (FILL, COLD)]));
    check_history_sited(&stats, Value::Null);
    let (last, _) = t.finish();
    assert!(last.starts_with("hotcold hot=2 cold=25"), "{last}");
}

/// The memory history as buffer sampling of one launch in `n` of each kernel leaves it (per
/// thread, the first included, looked up and counted `n` times): the two hot buffers are
/// still the hottest (`add_into`'s 175 launches read as 176 with `n` = 16, 11 sampled; as
/// 192 with 64, 3 sampled), and of the cold buffers only those given to a sampled `fill`
/// (with 16 the 1st and the 17th; with 64 the 1st) show a launch. Returns the hot buffers'
/// and the cold buffers' addresses (the cold ones in creation order).
fn check_history_sampled(stats: &Value, n: u64) -> (Vec<String>, Vec<String>) {
    let m = &stats["memory"];
    let hottest = m["hottest"].as_array().unwrap();
    let hot: Vec<String> = hottest
        .iter()
        .take(2)
        .map(|h| {
            assert_eq!(
                (
                    h["launches"].as_u64(),
                    h["copies_in"].as_u64(),
                    h["copies_out"].as_u64()
                ),
                (Some(ROUNDS.div_ceil(n) * n), Some(ROUNDS), Some(ROUNDS)),
                "{h}"
            );
            assert_eq!(h["kernels"], serde_json::json!([ADD_INTO]));
            h["base"].as_str().unwrap().to_owned()
        })
        .collect();
    let coldest = m["coldest"].as_array().unwrap();
    let mut cold: Vec<&Value> = coldest
        .iter()
        .filter(|c| c["size"].as_u64() == Some(COLD_BYTES))
        .collect();
    assert_eq!(cold.len() as u64, COLD, "{m}");
    cold.sort_by_key(|c| c["order"].as_u64());
    let sampled: BTreeSet<u64> = cold
        .iter()
        .filter(|c| c["launches"].as_u64() == Some(n))
        .map(|c| {
            assert_eq!(c["kernels"], serde_json::json!([FILL]), "{c}");
            c["order"].as_u64().unwrap()
        })
        .collect();
    // The cold buffers are made after the two hot ones (orders 0 and 1).
    let expected: BTreeSet<u64> = (0..COLD).step_by(n as usize).map(|k| 2 + k).collect();
    assert_eq!(sampled, expected, "{m}");
    for c in cold.iter().filter(|c| c["launches"].as_u64() != Some(n)) {
        assert_eq!(
            (c["launches"].as_u64(), c["copies_in"].as_u64()),
            (Some(0), Some(1)),
            "{c}"
        );
    }
    let cold = cold
        .iter()
        .map(|c| c["base"].as_str().unwrap().to_owned())
        .collect();
    (hot, cold)
}

/// `metrics` by default reads the buffers of one launch in 64 of each kernel: the
/// launches per kernel and the copies stay exact, the history is sampled
/// ([`check_history_sampled`]).
#[test]
fn metrics_read_the_buffers_of_one_launch_in_64_by_default() {
    let Some(t) = Target::start(
        "metrics-sampled",
        Addressing::Mapped,
        &[("CUDAW_TRACE", "metrics")],
    ) else {
        return;
    };
    let stats = t.stats();
    check_counts(&stats);
    check_history_sampled(&stats, 64);
    let (last, _) = t.finish();
    assert!(last.starts_with("hotcold hot=2 cold=25"), "{last}");
}

/// `timeline`: the counts, the history (exact with `exact`, else sampled one launch in 16),
/// a live `cudaw-ckpt trace` and the file written at exit, every launch in both with the
/// allocations it received (the timeline keeps every launch's words, whatever the
/// history's sampling).
fn timeline(addressing: Addressing, exact: bool) {
    let name = format!("timeline-{addressing:?}");
    let at_exit = std::env::temp_dir().join(format!(
        "cudaw-trace-{}-{name}-exit.json",
        std::process::id()
    ));
    let _ = std::fs::remove_file(&at_exit);
    let Some(t) = Target::start(
        &name,
        addressing,
        &[
            ("CUDAW_TRACE", "timeline"),
            ("CUDAW_TRACE_FILE", at_exit.to_str().unwrap()),
            ("CUDAW_TRACE_BUFFER_SAMPLE", if exact { "1" } else { "16" }),
        ],
    ) else {
        return;
    };
    let pid = t.pid().to_string();
    let stats = t.stats();
    assert_eq!(stats["mode"], "timeline");
    check_counts(&stats);
    let (hot, cold) = if exact {
        check_history(&stats)
    } else {
        check_history_sampled(&stats, 16)
    };
    // A pause and a resume show in the timeline and the stats.
    t.ckpt_ok(&["pause", &pid]);
    t.ckpt_ok(&["resume", &pid]);
    let live = t.dir.join("live.trace.json");
    let out: Value =
        serde_json::from_str(&t.ckpt_ok(&["trace", &pid, "-o", live.to_str().unwrap(), "--json"]))
            .expect("trace --json");
    assert_eq!(out["path"], live.to_str().unwrap());
    assert_eq!(out["dropped"], 0);
    let tl = read_json(&live);
    let events = check_timeline(&tl, &hot, &cold);
    assert_eq!(out["events"].as_u64(), tl["otherData"]["events"].as_u64());
    let pauses: Vec<&str> = events
        .iter()
        .filter(|e| e["cat"] == "pause")
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    assert_eq!(pauses, ["pause", "resume"]);
    let paused = t.stats();
    assert_eq!(
        (&paused["pauses"]["pauses"], &paused["pauses"]["resumes"]),
        (&Value::from(1), &Value::from(1))
    );
    let (_, log) = t.finish();
    assert!(log.contains("trace: timeline of"), "{log}");
    // The file written at exit: everything above, and the frees.
    let tl = read_json(&at_exit);
    let events = check_timeline(&tl, &hot, &cold);
    let frees = events
        .iter()
        .filter(|e| e["cat"] == "memory" && e["name"].as_str().unwrap().starts_with("free"))
        .count();
    assert_eq!(frees as u64, 2 + COLD);
    let free_calls = events
        .iter()
        .filter(|e| e["cat"] == "call" && e["name"] == "cudaFree")
        .count();
    assert_eq!(free_calls as u64, 2 + COLD);
}

#[test]
fn timeline_mapped() {
    timeline(Addressing::Mapped, false);
}

#[test]
fn timeline_translated() {
    timeline(Addressing::Translated, true);
}

#[test]
fn a_small_ring_keeps_the_latest_events() {
    let Some(t) = Target::start(
        "ring",
        Addressing::Mapped,
        &[("CUDAW_TRACE", "timeline"), ("CUDAW_TRACE_EVENTS", "100")],
    ) else {
        return;
    };
    let pid = t.pid().to_string();
    let path = t.dir.join("ring.json");
    t.ckpt_ok(&["trace", &pid, "-o", path.to_str().unwrap()]);
    let tl = read_json(&path);
    let events = tl["traceEvents"].as_array().unwrap();
    let real: Vec<&Value> = events.iter().filter(|e| e["ph"] != "M").collect();
    assert_eq!(real.len(), 100);
    assert!(
        tl["otherData"]["dropped"].as_u64().unwrap() > 1000,
        "{}",
        tl["otherData"]
    );
    // The latest events: the last round's copies back.
    assert!(real.iter().rev().take(10).any(|e| e["name"] == "copy DtoH"));
    let stats = t.stats();
    check_counts(&stats);
    assert_eq!(stats["timeline"]["capacity"], 100);
    t.finish();
}

#[test]
fn tracing_off_answers_clearly() {
    let Some(t) = Target::start("off", Addressing::Mapped, &[]) else {
        return;
    };
    let pid = t.pid().to_string();
    let out = t.ckpt(&["stats", &pid]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("tracing is off") && err.contains("CUDAW_TRACE=metrics"),
        "{err}"
    );
    let (_, log) = t.finish();
    assert!(!log.contains("trace:"), "{log}");
}

/// `tests/cuda/trace/trace_switch.cu`, compiled.
fn trace_switch() -> Option<PathBuf> {
    let nvcc = nvcc()?;
    let src = cudaw_tests::workspace().join("tests/cuda/trace/trace_switch.cu");
    Some(cudaw_tests::compile(&nvcc, "trace_switch", &src))
}

/// A demangled kernel name without its argument list.
fn short(name: &str) -> String {
    name.split('(').next().unwrap_or(name).to_owned()
}

/// The launches per kernel (by [`short`] name) in `stats`.
fn launches(stats: &Value) -> BTreeMap<String, u64> {
    stats["kernels"]
        .as_array()
        .expect("kernels")
        .iter()
        .map(|k| {
            (
                short(k["name"].as_str().unwrap()),
                k["launches"].as_u64().unwrap(),
            )
        })
        .collect()
}

/// Tracing switched off and on while the program runs, by the program itself
/// (`cudaw_trace_active_v1`) and by `cudaw-ckpt tracing`: what runs while it is off is not
/// recorded, what was recorded stays readable, recording resumes when it is back on.
fn switching(addressing: Addressing, mode: &str) {
    let Some(exe) = trace_switch() else { return };
    let (mut t, line) = Target::spawn(
        &format!("switch-{mode}-{addressing:?}"),
        &exe,
        &[],
        addressing,
        &[("CUDAW_TRACE", mode)],
    );
    // Each switch returns whether tracing was on before.
    assert_eq!(line, "ready 1 off=1 on=0 again=1\n", "log:\n{}", t.log());
    let s = t.stats();
    let k = launches(&s);
    assert_eq!(k.get("add_into"), Some(&10), "{k:?}");
    assert_eq!(k.get("fill"), None, "launched while off: {k:?}");
    assert_eq!(k.get("scale"), Some(&30), "{k:?}");
    let c = calls(&s);
    assert_eq!(c.get("cudaGetLastError"), Some(&40), "{c:?}");
    assert_eq!(
        c.get("cudaMemset"),
        Some(&1),
        "five memsets ran while off: {c:?}"
    );

    let pid = t.pid().to_string();
    let v: Value =
        serde_json::from_str(&t.ckpt_ok(&["tracing", &pid, "off", "--json"])).expect("JSON");
    assert_eq!(
        (v["mode"].as_str(), v["on"].as_bool(), v["was_on"].as_bool()),
        (Some(mode), Some(false), Some(true)),
        "{v}"
    );
    let text = t.ckpt_ok(&["tracing", &pid, "off"]);
    assert_eq!(text, format!("{pid}: tracing ({mode}) was already off\n"));
    // add_into's launches and cudaGetLastError's calls counted so far.
    let counted = |s: &Value, add_into: u64, get_last_error: u64| {
        assert_eq!(launches(s).get("add_into"), Some(&add_into), "{s}");
        assert_eq!(
            calls(s).get("cudaGetLastError"),
            Some(&get_last_error),
            "{s}"
        );
    };
    assert_eq!(t.go_on(), "ready 2\n");
    // Off: the 7 launches of add_into are not counted, and what was recorded is still there.
    counted(&t.stats(), 10, 40);
    let text = t.ckpt_ok(&["tracing", &pid, "on"]);
    assert_eq!(text, format!("{pid}: tracing ({mode}) switched on\n"));
    assert_eq!(t.go_on(), "ready 3\n");
    counted(&t.stats(), 14, 44);
    if mode == "timeline" {
        let out = t.dir.join("switch.json");
        t.ckpt_ok(&["trace", &pid, "-o", out.to_str().unwrap()]);
        let tl = read_json(&out);
        let kernels: BTreeMap<String, usize> = tl["traceEvents"]
            .as_array()
            .expect("traceEvents")
            .iter()
            .filter(|e| e["cat"] == "kernel")
            .fold(BTreeMap::new(), |mut m, e| {
                *m.entry(short(e["name"].as_str().unwrap_or("")))
                    .or_default() += 1;
                m
            });
        assert_eq!(
            kernels,
            BTreeMap::from([("add_into".to_owned(), 14), ("scale".to_owned(), 30)]),
            "the timeline's kernels"
        );
    }
    let (last, log) = t.finish();
    assert_eq!(last, "trace_switch done acc=21 f=1073741824\n", "{log}");
    assert!(
        log.contains("tracing switched off") && log.contains("tracing switched on"),
        "{log}"
    );
}

#[test]
fn switching_tracing_off_and_on_metrics_mapped() {
    switching(Addressing::Mapped, "metrics");
}

#[test]
fn switching_tracing_off_and_on_metrics_translated() {
    switching(Addressing::Translated, "metrics");
}

#[test]
fn switching_tracing_off_and_on_timeline_mapped() {
    switching(Addressing::Mapped, "timeline");
}

/// Without `CUDAW_TRACE` nothing can be switched: the program's switch answers -1 and
/// `cudaw-ckpt tracing` says why.
#[test]
fn switching_needs_tracing_at_start() {
    let Some(exe) = trace_switch() else { return };
    let (mut t, line) = Target::spawn("switch-off", &exe, &[], Addressing::Mapped, &[]);
    assert_eq!(line, "ready 1 off=-1 on=-1 again=-1\n", "log:\n{}", t.log());
    let pid = t.pid().to_string();
    let out = t.ckpt(&["tracing", &pid, "on"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("tracing is off in this process") && err.contains("CUDAW_TRACE=metrics"),
        "{err}"
    );
    assert_eq!(t.go_on(), "ready 2\n");
    assert_eq!(t.go_on(), "ready 3\n");
    let (last, _) = t.finish();
    assert_eq!(last, "trace_switch done acc=21 f=1073741824\n");
}

/// `tests/cuda/gpu/launch_ab.cu` (gpu-check's in-process benchmark) under
/// `CUDAW_TRACE=metrics` also times its launches with tracing switched on and off: its
/// traced line is there, with figures; with `CUDAW_TRACE_SELF=1` the summary at exit
/// gives the phases of a traced launch.
#[test]
fn launch_ab_times_tracing_on_and_off() {
    let Some(nvcc) = nvcc() else { return };
    let src = cudaw_tests::workspace().join("tests/cuda/gpu/launch_ab.cu");
    let exe = cudaw_tests::compile(&nvcc, "launch_ab", &src);
    let mut cmd = command_under_cudaw(
        &exe,
        Addressing::Mapped,
        &[
            ("CUDAW_TRACE", "metrics"),
            ("CUDAW_TRACE_SELF", "1"),
            ("CUDAW_TRACE_SELF_WARMUP", "10"),
        ],
    );
    let out = cmd
        .arg("5")
        .env("CUDAW_LOG", "info")
        .output()
        .expect("running launch_ab");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}{stderr}");
    let traced = stdout
        .lines()
        .find(|l| l.starts_with("launch_ab traced rounds=5 "))
        .unwrap_or_else(|| panic!("no traced line:\n{stdout}{stderr}"));
    let figure = |name: &str| -> f64 {
        let at = traced.find(&format!("{name}=")).expect(name) + name.len() + 1;
        traced[at..].split(' ').next().unwrap().parse().expect(name)
    };
    assert!(figure("trace_rt_added_ns").is_finite(), "{traced}");
    assert!(figure("trace_call_added_ns").is_finite(), "{traced}");
    assert!(
        stderr.contains("tracing switched off") && stderr.contains("tracing switched on"),
        "{stderr}"
    );
    assert!(
        stdout.lines().any(|l| l.starts_with("launch_ab rounds=5 ")),
        "{stdout}"
    );
    // CUDAW_TRACE_SELF=1: the phases of the traced launches after the warm-up, at exit.
    // Under `metrics` the runtime's launches, which reach the driver layer (simgpu's runtime
    // launches through it, as the real one does), are that layer's to count: it records
    // one in 64 (those its self cost times) and the runtime layer times none.
    let own = stderr
        .lines()
        .find(|l| l.contains("self cost of a traced launch (driver layer, mean of "))
        .unwrap_or_else(|| panic!("no self-cost line:\n{stderr}"));
    for phase in ["kernel id", "layout", "argument words", "record", "in all"] {
        assert!(own.contains(&format!(" {phase} ")), "{own}");
    }
    assert!(own.contains("after 10)"), "{own}");
    assert!(
        !stderr.contains("self cost of a traced launch (runtime layer"),
        "{stderr}"
    );
    assert!(
        stderr.contains("__cudaLaunchKernel: the real runtime's launches reach cudaw's driver layer, which marks them in flight: the export now goes straight to the real runtime")
            || stderr.contains("cudaLaunchKernel: the real runtime's launches reach cudaw's driver layer, which marks them in flight: the export now goes straight to the real runtime"),
        "{stderr}"
    );
}

/// `tests/cuda/gpu/trace_victim.cu` (gpu-check's benchmark of what tracing costs the
/// program's own work) runs under each mode and prints its figures; natively (no tracing
/// switch) it says it skipped.
#[test]
fn trace_victim_prints_its_figures() {
    let Some(nvcc) = nvcc() else { return };
    let src = cudaw_tests::workspace().join("tests/cuda/gpu/trace_victim.cu");
    let exe = cudaw_tests::compile(&nvcc, "trace_victim", &src);
    for mode in ["metrics", "timeline"] {
        let file = std::env::temp_dir().join(format!("cudaw-victim-{}.json", std::process::id()));
        let mut cmd = command_under_cudaw(
            &exe,
            Addressing::Mapped,
            &[
                ("CUDAW_TRACE", mode),
                ("CUDAW_TRACE_FILE", file.to_str().unwrap()),
                ("VICTIM_BLOCK", "2"),
            ],
        );
        let out = cmd.arg("6").output().expect("running trace_victim");
        let _ = std::fs::remove_file(&file);
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{stdout}{stderr}");
        // Its launches succeed (a kernel simgpu runs) and are recorded, traced or not.
        let launches = stderr
            .lines()
            .find_map(|l| l.split("trace: kernels: ").nth(1))
            .and_then(|l| l.split(' ').next())
            .and_then(|n| n.parse::<u64>().ok())
            .unwrap_or_else(|| panic!("{mode}: no kernel summary:\n{stderr}"));
        assert!(launches > 0, "{mode}: no launch recorded:\n{stderr}");
        let line = stdout
            .lines()
            .find(|l| l.starts_with("trace_victim work_added_ns="))
            .unwrap_or_else(|| panic!("{mode}: no figures:\n{stdout}"));
        assert!(line.contains(" rounds=6 "), "{line}");
    }
    let mut cmd = command_under_cudaw(&exe, Addressing::Mapped, &[]);
    let out = cmd.arg("2").output().expect("running trace_victim");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("trace_victim skipped"), "{stdout}");
}
