//! The fast path through the real trampolines, in a process of its own (the test runs
//! its own binary again): the dispatch table points a few exports at functions of the
//! test, which nest calls, so that the counts and times can be checked exactly.

use cudart_shim::dispatch::{self, idx, DISPATCH};
use cudart_shim::tracing;
use std::process::Command;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

const CHILD: &str = "CUDAW_TRACING_TEST_CHILD";
const THREADS: u64 = 8;
const ROUNDS: u64 = 5000;
/// Calls deeper than the shadow stack (32) run untimed.
const DEEP: i32 = 40;
const SPIN: Duration = Duration::from_micros(2);

#[repr(C)]
#[derive(Debug, PartialEq)]
struct Pair {
    a: u64,
    b: u64,
}

// The trampolines, declared with the signatures of the test's targets (they pass any).
extern "C" {
    fn cudaPeekAtLastError() -> u32;
    fn cudaGetLastError() -> u32;
    /// Not in `REGISTER_ARGS` (it returns a string): timed through the shadow stack.
    fn cudaGetErrorString(depth: *mut i32) -> u32;
    fn cudaMemsetAsync(p: usize, v: i32, n: usize, s: usize) -> u32;
    fn cudaEventElapsedTime(a: u64, b: u64) -> Pair;
    fn cudaEventQuery(x: f64, y: f64, k: i32) -> f64;
    fn cudaEventSynchronize() -> u32;
    fn cudaStreamQuery() -> u32;
}

/// Spins for SPIN, then makes two nested calls.
extern "C" fn outer() -> u32 {
    let t = Instant::now();
    while t.elapsed() < SPIN {
        std::hint::spin_loop();
    }
    // SAFETY: the trampolines go to the test's targets.
    unsafe { cudaGetLastError() + cudaGetLastError() + 7 }
}
extern "C" fn inner() -> u32 {
    1
}
/// Recurses through the trampoline until `*depth` is 0.
extern "C" fn deep(depth: *mut i32) -> u32 {
    // SAFETY: the test passes a valid pointer.
    unsafe {
        *depth -= 1;
        if *depth > 0 {
            cudaGetErrorString(depth)
        } else {
            0
        }
    }
}
/// An in-flight export: checks every argument, nests one call.
extern "C" fn memset(p: usize, v: i32, n: usize, s: usize) -> u32 {
    assert_eq!((p, v, n, s), (0x1000, -3, 77, 0x2000));
    // SAFETY: as above.
    unsafe { cudaGetLastError() + 10 }
}
/// Makes exactly as many nested calls as the thread's timeline buffer has room for,
/// so that this call (made from the fast path's frame) returns to a full buffer.
extern "C" fn fill() -> u32 {
    let room = tracing::timeline_room();
    for _ in 0..room {
        // SAFETY: the trampoline goes to `inner`.
        unsafe { cudaStreamQuery() };
    }
    u32::try_from(room).unwrap()
}
extern "C" fn pair(a: u64, b: u64) -> Pair {
    Pair { a: a + 1, b: b * 2 }
}
extern "C" fn float(x: f64, y: f64, k: i32) -> f64 {
    x * y + f64::from(k)
}

#[test]
fn fast_path_counts_and_times_threads_and_nested_calls() {
    run_child("metrics", "1", "on");
}

/// The exports whose arguments travel in registers are called from the fast path's
/// frame by default; with `CUDAW_TRACE_DIRECT=off` every timed call swaps its return
/// address, and the counts, times and returned values are the same.
#[test]
fn fast_path_without_direct_calls() {
    run_child("metrics", "1", "off");
}

#[test]
fn sampled_fast_path_counts_every_call() {
    run_child("metrics", "16", "on");
}

/// Under the timeline the fast path writes every call into its thread's buffer: the
/// timeline written at the end holds exactly the calls counted, batches moved into the
/// ring and those still in the buffers alike.
#[test]
fn timeline_fast_path_records_every_call() {
    run_child("timeline", "1", "on");
}

/// Runs [`child`] with `CUDAW_TRACE=mode`, `CUDAW_TRACE_SAMPLE=sample` and
/// `CUDAW_TRACE_DIRECT=direct`.
fn run_child(mode: &str, sample: &str, direct: &str) {
    if std::env::var_os(CHILD).is_some() {
        return;
    }
    let at_exit = std::env::temp_dir().join(format!(
        "cudaw-tracing-test-{}-{mode}-{sample}.trace.json",
        std::process::id()
    ));
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child", "--ignored", "--nocapture"])
        .env(CHILD, "1")
        .env("CUDAW_TRACE", mode)
        // The timeline written at exit goes to a temporary file, not the crate's folder.
        .env("CUDAW_TRACE_FILE", &at_exit)
        .env("CUDAW_TRACE_SAMPLE", sample)
        .env("CUDAW_TRACE_DIRECT", direct)
        .env("CUDAW_LOG", "error")
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = std::fs::remove_file(&at_exit);
    assert!(out.status.success(), "the child failed:\n{text}");
    assert!(
        text.contains("child checked"),
        "the child did not run:\n{text}"
    );
}

#[test]
#[ignore = "run by the tests above, in a process of its own"]
fn child() {
    if std::env::var_os(CHILD).is_none() {
        return;
    }
    dispatch::skip_initialise_for_test();
    tracing::init(&[]);
    cudart_shim::gate::mark_initialised();
    assert_eq!(
        cudart_shim::gate::GATE.load(Ordering::SeqCst),
        cudart_shim::gate::TRACING
    );
    for (i, f) in [
        (idx::cudaPeekAtLastError, outer as *const () as usize),
        (idx::cudaGetLastError, inner as *const () as usize),
        (idx::cudaGetErrorString, deep as *const () as usize),
        (idx::cudaMemsetAsync, memset as *const () as usize),
        (idx::cudaEventElapsedTime, pair as *const () as usize),
        (idx::cudaEventQuery, float as *const () as usize),
    ] {
        DISPATCH.set(i, f);
    }
    let threads: Vec<_> = (0..THREADS)
        .map(|t| {
            std::thread::spawn(move || {
                for r in 0..ROUNDS {
                    // SAFETY: the trampolines go to the targets above.
                    unsafe {
                        assert_eq!(cudaPeekAtLastError(), 9);
                        assert_eq!(cudaMemsetAsync(0x1000, -3, 77, 0x2000), 11);
                        assert_eq!(cudaEventElapsedTime(t, r), Pair { a: t + 1, b: r * 2 });
                        assert_eq!(cudaEventQuery(1.5, r as f64, 2), 1.5 * r as f64 + 2.0);
                        if r % 100 == 0 {
                            let mut d = DEEP;
                            assert_eq!(cudaGetErrorString(&mut d), 0);
                            assert_eq!(d, 0);
                        }
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    if tracing::mode() == cudaw_trace::Mode::Timeline {
        // A call from the fast path's frame that returns to a full buffer hands its
        // event to Rust (check_timeline below finds it with the others).
        DISPATCH.set(idx::cudaEventSynchronize, fill as *const () as usize);
        DISPATCH.set(idx::cudaStreamQuery, inner as *const () as usize);
        // This thread's first traced call makes its block (on the Rust path).
        // SAFETY: the trampoline goes to `inner`.
        unsafe { cudaStreamQuery() };
        let before = tracing::direct_full_calls();
        // SAFETY: the trampoline goes to `fill`.
        assert!(unsafe { cudaEventSynchronize() } >= 1);
        // (No fast path on other architectures: the call is timed in Rust.)
        #[cfg(target_arch = "x86_64")]
        assert_eq!(tracing::direct_full_calls(), before + 1);
        #[cfg(not(target_arch = "x86_64"))]
        let _ = before;
    }
    let stats = cudaw_engine::trace::stats(0).unwrap();
    let get = |name: &str| {
        stats
            .calls
            .iter()
            .find(|c| c.name == name)
            .unwrap_or_else(|| panic!("{name} not counted: {:?}", stats.calls))
            .clone()
    };
    let n = THREADS * ROUNDS;
    let outer = get("cudaPeekAtLastError");
    let inner = get("cudaGetLastError");
    assert_eq!(outer.count, n);
    assert_eq!(
        inner.count,
        3 * n,
        "two inside each outer call, one inside each memset"
    );
    assert_eq!(get("cudaMemsetAsync").count, n);
    assert_eq!(get("cudaEventElapsedTime").count, n);
    assert_eq!(get("cudaEventQuery").count, n);
    assert_eq!(get("cudaGetErrorString").count, THREADS * ROUNDS / 100 * 32);
    let spin = SPIN.as_nanos() as f64;
    for c in &stats.calls {
        assert!(c.max_ns >= c.mean_ns && c.mean_ns > 0.0, "{c:?}");
        assert!(c.max_ns < 1e9, "{c:?}");
    }
    // The outer call holds the spin and its two nested calls. Lower bounds only: a call
    // the scheduler preempts takes any time (on a loaded 2-core CI machine one sampled
    // cudaGetLastError took 22 ms, which put the nested calls' mean above the spin's
    // quarter that an upper bound here asked for).
    assert!(outer.mean_ns >= spin, "{outer:?}");
    assert!(outer.total_ns >= spin * n as f64, "{outer:?}");
    assert!(inner.mean_ns > 0.0, "{inner:?}");
    // The Rust path: each thread's first call and first call in flight, and the calls
    // past the shadow stack's depth; the fast path every other.
    // With sampling, the recursion's calls are timed only when cudaGetErrorString's count
    // allows, so the calls past the stack's depth reach Rust less often.
    let slow = tracing::rust_enters();
    let deep = THREADS * ROUNDS / 100 * (DEEP as u64 - 32);
    if cfg!(not(target_arch = "x86_64")) {
        // No assembly fast path here: every call takes the Rust path (those past the
        // stack's depth too, untimed and uncounted), whatever the sampling.
        let counted: u64 = stats.calls.iter().map(|c| c.count).sum();
        assert_eq!(slow, counted + deep, "calls timed in Rust");
        if tracing::mode() == cudaw_trace::Mode::Timeline {
            check_timeline(&stats);
        }
    } else if tracing::mode() == cudaw_trace::Mode::Timeline {
        // Every call timed, none sampled out; a full call buffer sends one call of
        // each 1025 to Rust, which empties it.
        let timed: u64 = stats.calls.iter().map(|c| c.count).sum();
        let most = 2 * THREADS + deep + timed / tracing::EVENTS as u64 + THREADS;
        assert!(
            (2 * THREADS + deep..=most).contains(&slow),
            "calls timed in Rust: {slow}, expected at most {most}"
        );
        check_timeline(&stats);
    } else if cudart_shim::config::get().trace_sample == 1 {
        assert_eq!(slow, 2 * THREADS + deep, "calls timed in Rust");
    } else {
        assert!(slow <= 2 * THREADS + deep, "calls timed in Rust: {slow}");
    }
    println!(
        "child checked: {outer:?} {inner:?} ({slow} calls timed in Rust, {} direct calls \
         returned to a full buffer)",
        tracing::direct_full_calls()
    );
}

/// The timeline written now holds one call event per call counted, with sane times.
fn check_timeline(stats: &cudaw_trace::Stats) {
    let path = std::env::temp_dir().join(format!("cudaw-tracing-test-{}.json", std::process::id()));
    let written = cudaw_engine::trace::write_timeline(&path, tracing::pending_calls)
        .expect("writing the timeline");
    let text = std::fs::read_to_string(&path).unwrap();
    let _ = std::fs::remove_file(&path);
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    let mut by_name = std::collections::HashMap::<String, u64>::new();
    for e in json["traceEvents"].as_array().unwrap() {
        if e["cat"] == "call" {
            assert!(e["dur"].as_f64().unwrap() >= 0.0, "{e}");
            *by_name
                .entry(e["name"].as_str().unwrap().to_owned())
                .or_default() += 1;
        }
    }
    for c in &stats.calls {
        assert_eq!(
            by_name.get(&c.name).copied().unwrap_or(0),
            c.count,
            "{}: call events in the timeline ({} events, {} dropped)",
            c.name,
            written.events,
            written.dropped
        );
    }
}
