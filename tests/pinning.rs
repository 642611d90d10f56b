//! Smart pinning (`CUDAW_PIN`, `crates/engine/src/pinning.rs`, the host-memory interposer
//! `crates/hostmem`) on simgpu: `tests/cuda/programs/pin_copy.cu` copies 16 MiB pageable
//! buffers round after round both ways, checking every element, then gives them back in
//! every way a program does (`free`, `munmap`, `realloc`) and uses the address again.
//!
//! Under `CUDAW_PIN=auto` each buffer is page-locked once hot (simgpu's
//! `cudaPointerGetAttributes` then says "host"), and unregistered before the program gives
//! it back (the memory that comes back is never page-locked). Asynchronous copies keep
//! pageable memory's promises (the program overwrites the source and reads the result as
//! soon as each returns) with simgpu's DMA made slow. The output is the same as
//! natively and without pinning. A profile written by one run pins the next run's hot
//! copies from their first time.

use cudaw_tests::{compile_program, expected, nvcc, run_natively, run_under_cudaw, Addressing};
use std::collections::BTreeMap;

const NAME: &str = "pin_copy";

/// One pin_copy at a time: each moves gigabytes through simgpu, and five at once on a
/// two-core machine only test the machine.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

/// The program's `pin_copy: TYPE WHAT N` lines: cudaPointerGetAttributes' type per buffer.
fn types(stderr: &str) -> BTreeMap<String, i32> {
    stderr
        .lines()
        .filter_map(|l| {
            let rest = l.split("pin_copy: TYPE ").nth(1)?;
            let (what, t) = rest.split_once(' ')?;
            Some((what.to_owned(), t.trim().parse().ok()?))
        })
        .collect()
}

/// pin_copy's exit summary under smart pinning: its seven pinned buffers (the two heap
/// neighbours at once, side by side) each unregistered when given back, none at exit.
fn assert_all_given_back(run: &cudaw_tests::Run, what: &str) {
    let summary = run
        .after("smart pinning: ")
        .unwrap_or_else(|| panic!("{what}: no pinning summary:\n{}", run.stderr()));
    assert!(
        summary.contains("0 ranges (0 MiB) pinned at exit, at most 32 MiB, 7 released"),
        "{what}: {summary}"
    );
}

/// Every buffer's type natively or without pinning: unregistered, but the one the program
/// page-locks itself.
fn all_unregistered() -> BTreeMap<String, i32> {
    [
        "malloc-after-rounds",
        "malloc-again",
        "mmap-after-rounds",
        "mmap-again",
        "realloc-before",
        "realloc-after",
        "program-registered",
        "driver-registered",
        "heap-x",
        "heap-y",
    ]
    .into_iter()
    .map(|w| {
        let registered = w == "program-registered" || w == "driver-registered";
        (w.to_owned(), i32::from(registered))
    })
    .collect()
}

#[test]
fn native_run_pins_nothing() {
    let Some(nvcc) = nvcc() else { return };
    let _one = one_at_a_time();
    let exe = compile_program(&nvcc, NAME);
    let run = run_natively(&exe);
    run.assert_success("pin_copy natively");
    assert_eq!(run.stdout(), expected(NAME));
    assert_eq!(types(&run.stderr()), all_unregistered());
}

#[test]
fn without_cudaw_pin_nothing_is_pinned() {
    let Some(nvcc) = nvcc() else { return };
    let _one = one_at_a_time();
    let exe = compile_program(&nvcc, NAME);
    let run = run_under_cudaw(&exe, Addressing::Mapped, &[]);
    run.assert_success("pin_copy without CUDAW_PIN");
    assert_eq!(run.stdout(), expected(NAME));
    assert_eq!(types(&run.stderr()), all_unregistered());
    assert!(!run.stderr().contains("smart pinning"), "{}", run.stderr());
}

#[test]
fn hot_buffers_are_pinned_and_unpinned_before_they_are_given_back() {
    let Some(nvcc) = nvcc() else { return };
    let _one = one_at_a_time();
    let exe = compile_program(&nvcc, NAME);
    for addressing in [Addressing::Mapped, Addressing::Translated] {
        // Slow simulated DMA: an asynchronous copy not waited for would be caught.
        let run = run_under_cudaw(
            &exe,
            addressing,
            &[
                ("CUDAW_PIN", "auto"),
                ("SIMGPU_COPY_DELAY_US", "3000"),
                ("CUDAW_TRACE", "metrics"),
            ],
        );
        let what = format!("pin_copy under CUDAW_PIN=auto ({addressing:?})");
        run.assert_success(&what);
        assert_eq!(run.stdout(), expected(NAME), "{what}");
        let got = types(&run.stderr());
        let want: BTreeMap<String, i32> = [
            ("malloc-after-rounds", 1),
            ("malloc-again", 0),
            ("mmap-after-rounds", 1),
            ("mmap-again", 0),
            ("realloc-before", 1),
            ("realloc-after", 0),
            ("program-registered", 1),
            ("driver-registered", 1),
            ("heap-x", 1),
            ("heap-y", 1),
        ]
        .into_iter()
        .map(|(w, t)| (w.to_owned(), t))
        .collect();
        assert_eq!(got, want, "{what}; log:\n{}", run.stderr());
        // Seven buffers pinned, each unregistered when given back (or page-locked by the
        // program, through the runtime or the driver); none left at exit. The two heap neighbours were pinned at once: their
        // registrations side by side, the page they share in one of them.
        assert_all_given_back(&run, &what);
        // Tracing's statistics (cudaw-ckpt stats, Prometheus) count the same.
        let traced = run
            .after("trace: smart pinning: ")
            .unwrap_or_else(|| panic!("{what}: no traced pinning line:\n{}", run.stderr()));
        assert!(
            traced.contains("at most 32.0 MiB; 7 released, 0 refused"),
            "{what}: {traced}"
        );
    }
}

#[test]
fn a_profile_pins_the_next_runs_hot_copies_from_the_start() {
    let Some(nvcc) = nvcc() else { return };
    let _one = one_at_a_time();
    let exe = compile_program(&nvcc, NAME);
    let dir = tempfile::tempdir().expect("a private folder");
    let file = dir.path().join("pin-profile.json");
    let profile = format!("profile:{}", file.display());
    let first = run_under_cudaw(&exe, Addressing::Mapped, &[("CUDAW_PIN", &profile)]);
    first.assert_success("pin_copy writing a profile");
    let text = std::fs::read_to_string(&file).expect("the profile was written");
    let json: serde_json::Value = serde_json::from_str(&text).expect("the profile is JSON");
    assert_eq!(json["format"], "cudaw-pin-profile-1");
    let hot = json["signatures"]
        .as_array()
        .expect("signatures")
        .iter()
        .filter(|s| s["hot"] == true)
        .count();
    assert!(hot >= 1, "{text}");

    // The next run pins on the first copy: more of its copies come from pinned ranges.
    let hot_copies = |run: &cudaw_tests::Run| -> u64 {
        run.after("smart pinning: ")
            .and_then(|s| s.split(' ').next()?.parse().ok())
            .unwrap_or_else(|| panic!("no pinning summary:\n{}", run.stderr()))
    };
    let use_it = format!("use:{}", file.display());
    let second = run_under_cudaw(&exe, Addressing::Mapped, &[("CUDAW_PIN", &use_it)]);
    second.assert_success("pin_copy using a profile");
    assert_eq!(second.stdout(), expected(NAME));
    assert!(
        hot_copies(&second) > hot_copies(&first),
        "first:\n{}\nsecond:\n{}",
        first.stderr(),
        second.stderr()
    );
}

#[test]
fn pinning_decisions_are_on_the_timeline() {
    let Some(nvcc) = nvcc() else { return };
    let _one = one_at_a_time();
    let exe = compile_program(&nvcc, NAME);
    let dir = tempfile::tempdir().expect("a private folder");
    let file = dir.path().join("pin.trace.json");
    let file_env = file.display().to_string();
    let run = run_under_cudaw(
        &exe,
        Addressing::Mapped,
        &[
            ("CUDAW_PIN", "auto"),
            ("CUDAW_TRACE", "timeline"),
            ("CUDAW_TRACE_FILE", &file_env),
        ],
    );
    run.assert_success("pin_copy under a timeline");
    let trace: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&file).expect("the timeline was written"))
            .expect("the timeline is JSON");
    let names: Vec<String> = trace["traceEvents"]
        .as_array()
        .expect("events")
        .iter()
        .filter(|e| e["cat"] == "pinning")
        .map(|e| e["name"].as_str().unwrap_or("").to_owned())
        .collect();
    // Seven buffers got hot; each was unpinned when given back (or page-locked by the
    // program itself), in that order: the first five one at a time, then the two heap
    // neighbours together (pinned in turn, given back in turn).
    let pins = names.iter().filter(|n| n.starts_with("pin ")).count();
    let unpins = names.iter().filter(|n| n.starts_with("unpin ")).count();
    assert_eq!((pins, unpins), (7, 7), "{names:?}");
    for pair in names[..10].chunks(2) {
        assert!(
            pair[0].starts_with("pin ") && pair[1].starts_with("unpin "),
            "{names:?}"
        );
    }
    let last: Vec<&str> = names[10..]
        .iter()
        .map(|n| &n[..n.find(' ').unwrap_or(0)])
        .collect();
    assert_eq!(last, ["pin", "pin", "unpin", "unpin"], "{names:?}");
}

/// Copies below the staged copies' threshold still count for smart pinning: with
/// `CUDAW_STAGED_COPY_MIN` above pin_copy's 16 MiB buffers, none is staged, they go to the
/// driver, and the hot ones are pinned all the same.
#[test]
fn copies_too_small_to_stage_are_pinned_when_hot() {
    let Some(nvcc) = nvcc() else { return };
    let _one = one_at_a_time();
    let exe = compile_program(&nvcc, NAME);
    let run = run_under_cudaw(
        &exe,
        Addressing::Mapped,
        &[("CUDAW_PIN", "auto"), ("CUDAW_STAGED_COPY_MIN", "64M")],
    );
    let what = "pin_copy under CUDAW_PIN=auto, CUDAW_STAGED_COPY_MIN=64M";
    run.assert_success(what);
    assert_eq!(run.stdout(), expected(NAME), "{what}");
    let got = types(&run.stderr());
    assert_eq!(got.get("malloc-after-rounds"), Some(&1), "{what}: {got:?}");
    assert_eq!(got.get("heap-x"), Some(&1), "{what}: {got:?}");
    assert_eq!(got.get("malloc-again"), Some(&0), "{what}: {got:?}");
    // Nothing staged (the exit summary leaves the staging out), everything given back.
    assert_all_given_back(&run, what);
    assert!(
        !run.stderr().contains("through the pinned staging"),
        "{what}: something was staged:\n{}",
        run.stderr()
    );
}

/// `pin_driver_copy.cu`: a buffer the runtime's copies made hot, then copied through the
/// driver API as a library calling the driver directly would (the driver layer asks the
/// runtime shim about the host side, `crates/driver-shim/src/copies.rs`): copies from
/// inside cudaw's registration past its end (the driver refuses that as such), and one
/// across two registrations and their pageable neighbours, are issued in pieces;
/// asynchronous copies wait for their stream before returning, as pageable memory's do
/// (simgpu's DMA slowed, the source overwritten and the result read as soon as each
/// returns).
#[test]
fn driver_api_copies_of_a_pinned_buffer_keep_pageable_rules() {
    let Some(nvcc) = nvcc() else { return };
    let _one = one_at_a_time();
    let name = "pin_driver_copy";
    let exe = compile_program(&nvcc, name);
    let native = run_natively(&exe);
    native.assert_success("pin_driver_copy natively");
    assert!(
        native.stderr().contains("pin_driver_copy: TYPE x 0"),
        "{}",
        native.stderr()
    );
    let run = run_under_cudaw(
        &exe,
        Addressing::Mapped,
        &[("CUDAW_PIN", "auto"), ("SIMGPU_COPY_DELAY_US", "3000")],
    );
    let what = "pin_driver_copy under CUDAW_PIN=auto";
    run.assert_success(what);
    assert_eq!(run.stdout(), expected(name), "{what}");
    assert_eq!(run.stdout(), native.stdout(), "{what}");
    for buffer in ["x", "y", "x-again"] {
        assert!(
            run.stderr()
                .contains(&format!("pin_driver_copy: TYPE {buffer} 1")),
            "{what}: {buffer} was not pinned, nothing was tested:\n{}",
            run.stderr()
        );
    }
}
