//! `cudaw-ckpt dump | restore | inspect` on simgpu, in both addressing modes:
//! `tests/cuda/programs/ckpt_target.cu` runs under cudaw while the test checkpoints it —
//! often while its kernels run — and its output must still equal the uninterrupted run's
//! (`ckpt_target.expected`; the program checks every buffer against the CPU):
//!
//! - dump, then resume from the image (no host copy held meanwhile); dump --leave-running;
//! - dump, then restore; dump twice while paused; the image file removed before resume;
//! - restore refusing bad images (a bit flipped in the data, in the table; truncated;
//!   another format version; not an image; another process's table; another producer)
//!   through `cudaw-ckpt` and through the socket directly, the process left paused and
//!   intact each time; a damaged image holding the memory refused by resume; `--force`;
//! - inspect and inspect --verify on good and bad images;
//! - many dumps and restores in one run;
//! - clear failures for paths, PIDs and usage; progress lines on the socket;
//! - all of it with the host arena (`CUDAW_HOST_ARENA=pinned`), made while the program
//!   runs: every pause leaves the bytes in the arena, dumps write them from there, resumes and restores
//!   load them back.

mod ckpt_common;

use ckpt_common::{images, raw, raw_lines, text, Target, ALLOCATIONS, BYTES, CHUNKS};
use cudaw_tests::Addressing;
use serde_json::Value;

fn s(p: &std::path::Path) -> &str {
    p.to_str().expect("UTF-8 test paths")
}

/// `inspect FILE --verify --json`, checked against the target.
fn inspect_verified(t: &Target, image: &std::path::Path) -> Value {
    let v = t.json(&["inspect", s(image), "--verify"]);
    assert_eq!(v["format_version"], "1.3", "{v}");
    assert_eq!(v["process"]["pid"].as_u64(), t.pid.parse().ok(), "{v}");
    assert_eq!(v["process"]["addressing"], t.addressing.as_str(), "{v}");
    assert_eq!(v["process"]["cuda_runtime_major"], 13, "{v}");
    assert!(
        v["process"]["executable"]
            .as_str()
            .is_some_and(|e| e.ends_with("/ckpt_target")),
        "{v}"
    );
    assert!(v["process"]["created_unix_nanos"].as_u64() > Some(0), "{v}");
    assert!(
        v["gpu"]["name"]
            .as_str()
            .is_some_and(|n| n.contains("simgpu")),
        "{v}"
    );
    assert_eq!(v["gpu"]["ordinal"], 0, "{v}");
    assert_eq!(v["allocation_count"].as_u64(), Some(ALLOCATIONS), "{v}");
    assert_eq!(v["data_bytes"].as_u64(), Some(BYTES), "{v}");
    assert_eq!(v["chunk_size"].as_u64(), Some(8 << 20), "{v}");
    assert_eq!(v["verified"]["chunks"].as_u64(), Some(CHUNKS), "{v}");
    assert_eq!(v["verified"]["digest"], v["digest"], "{v}");
    // The table is in creation order, and the sizes are the program's.
    let sizes: Vec<u64> = v["allocations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["size"].as_u64().unwrap())
        .collect();
    assert_eq!(
        sizes,
        [65536, 65536, 65536, 65536, (9 << 20) + 20, 100],
        "{v}"
    );
    v
}

fn dump_and_resume(addressing: Addressing, tag: &str) {
    let Some(mut t) = Target::start(addressing, tag) else {
        return;
    };
    let a = t.path("a.img");
    // Dump while kernels are queued: paused, the bytes only in the image.
    t.send_run(60);
    let out = t.ok(&["dump", &t.pid, "-o", "a.img"]);
    assert!(
        out.contains(&format!("{ALLOCATIONS} allocations, {BYTES} bytes"))
            && out.contains(&format!("written to {}", s(&a)))
            && out.contains("paused"),
        "{out}"
    );
    t.assert_paused_in(&a);
    let meta = std::fs::metadata(&a).unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(meta.permissions().mode() & 0o777, 0o600, "image mode");
    }
    let v = inspect_verified(&t, &a);
    assert_eq!(v["file_len"].as_u64(), Some(meta.len()), "{v}");
    // No temporary file left beside it.
    let names: Vec<String> = std::fs::read_dir(&t.work)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, ["a.img"], "{names:?}");
    // Resume loads the image.
    let out = t.ok(&["resume", &t.pid]);
    assert!(
        out.contains(&format!(
            "resumed: {ALLOCATIONS} allocations, {BYTES} bytes"
        )),
        "{out}"
    );
    t.assert_running();
    t.wait_log(&format!("(from {})", s(&a)));
    t.wait_ran();

    // --leave-running: written, and running again.
    t.send_run(60);
    let d = t.json(&["dump", &t.pid, "-o", "b.img", "--leave-running"]);
    assert_eq!(d["state"], "running", "{d}");
    assert_eq!(d["allocations"].as_u64(), Some(ALLOCATIONS), "{d}");
    assert_eq!(d["bytes"].as_u64(), Some(BYTES), "{d}");
    assert_eq!(d["pause"]["changed"], true, "{d}");
    assert_eq!(d["resume"]["bytes"].as_u64(), Some(BYTES), "{d}");
    assert_eq!(d["path"].as_str(), Some(s(&t.path("b.img"))), "{d}");
    t.assert_running();
    t.wait_ran();
    let v = inspect_verified(&t, &t.path("b.img"));
    assert_eq!(v["digest"], d["digest"], "{v}\n{d}");
    t.finish();
}

#[test]
fn dump_then_resume_from_the_image_mapped() {
    dump_and_resume(Addressing::Mapped, "rm");
}

#[test]
fn dump_then_resume_from_the_image_translated() {
    dump_and_resume(Addressing::Translated, "rt");
}

/// Pause, resume, dump and restore with the host arena on: the arena is made while the
/// program runs (its memory holding still), so every pause, the first included, leaves the
/// bytes in it; dumps (leaving the process running or paused) read them from it; the
/// program's output equals the uninterrupted run's.
fn with_the_host_arena(addressing: Addressing, tag: &str) {
    let Some(mut t) = Target::start_with(addressing, tag, &[("CUDAW_HOST_ARENA", "pinned")]) else {
        return;
    };
    let retained = format!("{ALLOCATIONS} of {ALLOCATIONS} allocations left in the host arena");
    let count = |t: &Target| t.log().matches(&retained).count();
    // The log is read on another thread: a line the shim wrote before replying may not be
    // read yet. Waits (up to 10 s) for the n-th line, then checks there is no (n+1)-th.
    let expect = |t: &Target, n: usize| {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while count(t) < n && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert_eq!(count(t), n, "{}", t.log());
    };
    // 7 runs of 30 of the program's 240 iterations.
    // The arena is made while the program runs, once its memory has held still, before any
    // pause: even the first pause leaves the bytes in it.
    t.send_run(30);
    t.wait_ran();
    t.wait_log("page-locked, ready in");
    let log = t.log();
    assert!(
        log.contains("making") && !log.contains("paused: "),
        "made before any pause: {log}"
    );
    // status shows the page-locked memory held (at least the allocations' bytes).
    let st = t.json(&["status", &t.pid]);
    assert!(
        st["arena"].as_u64().is_some_and(|a| a >= BYTES) && st["arena_building"] == 0,
        "{st}"
    );
    assert!(t
        .ok(&["status", &t.pid])
        .contains("page-locked host arena for pauses"));
    // Pauses: into the arena, and back.
    for round in 1..=2 {
        t.send_run(30);
        let out = t.ok(&["pause", &t.pid]);
        assert!(
            out.contains(&format!("{ALLOCATIONS} allocations, {BYTES} bytes")),
            "{out}"
        );
        expect(&t, round);
        t.ok(&["resume", &t.pid]);
        t.assert_running();
        t.wait_ran();
    }
    // A dump that leaves the process running writes from the arena.
    t.send_run(30);
    let d = t.json(&["dump", &t.pid, "-o", "b.img", "--leave-running"]);
    assert_eq!(d["state"], "running", "{d}");
    assert_eq!(d["bytes"].as_u64(), Some(BYTES), "{d}");
    expect(&t, 3);
    t.wait_ran();
    let b = inspect_verified(&t, &t.path("b.img"));
    // Paused into the arena, then dumped: the bytes move to the image; resume reads it.
    t.send_run(30);
    t.ok(&["pause", &t.pid]);
    expect(&t, 4);
    t.ok(&["dump", &t.pid, "-o", "a.img"]);
    let a = t.path("a.img");
    t.assert_paused_in(&a);
    let v = inspect_verified(&t, &a);
    assert_ne!(
        v["digest"], b["digest"],
        "the program ran between the dumps"
    );
    t.ok(&["resume", &t.pid]);
    t.assert_running();
    t.wait_ran();
    // A restore of an image dumped from the arena, and the arena still works afterwards.
    // (The program is idle from the dump to the restore: the image is its state.)
    t.send_run(30);
    t.wait_ran();
    t.ok(&["dump", &t.pid, "-o", "c.img", "--leave-running"]);
    t.ok(&["pause", &t.pid]);
    t.ok(&["restore", &t.pid, "-i", "c.img"]);
    t.assert_running();
    t.send_run(30);
    t.ok(&["pause", &t.pid]);
    t.ok(&["resume", &t.pid]);
    t.wait_ran();
    expect(&t, 7);
    let log = t.finish();
    assert!(
        !log.lines()
            .any(|l| (l.contains("] warn:") || l.contains("] error:"))
                && (l.contains("arena") || l.contains("staging"))),
        "{log}"
    );
}

#[test]
fn with_the_host_arena_mapped() {
    with_the_host_arena(Addressing::Mapped, "am");
}

#[test]
fn with_the_host_arena_translated() {
    with_the_host_arena(Addressing::Translated, "at");
}

fn dump_and_restore(addressing: Addressing, tag: &str) {
    let Some(mut t) = Target::start(addressing, tag) else {
        return;
    };
    t.run(30);
    t.ok(&["dump", &t.pid, "-o", "a.img"]);
    let r = t.json(&["restore", &t.pid, "-i", "a.img"]);
    assert_eq!(r["state"], "running", "{r}");
    assert_eq!(r["allocations"].as_u64(), Some(ALLOCATIONS), "{r}");
    assert_eq!(r["bytes"].as_u64(), Some(BYTES), "{r}");
    assert_eq!(r["pause"]["changed"], false, "{r}");
    t.assert_running();

    // Paused mid-run by a dump; dumped again while paused (from the first image into the
    // second); restored from the second.
    t.send_run(40);
    t.ok(&["dump", &t.pid, "-o", "b.img"]);
    t.assert_paused_in(&t.path("b.img"));
    let d = t.json(&["dump", &t.pid, "-o", "c.img"]);
    assert_eq!(d["pause"]["changed"], false, "{d}");
    assert_eq!(d["state"], "paused", "{d}");
    t.assert_paused_in(&t.path("c.img"));
    // Once more under the same name: written from the open image it replaces.
    t.ok(&["dump", &t.pid, "-o", "c.img"]);
    t.assert_paused_in(&t.path("c.img"));
    std::fs::remove_file(t.path("b.img")).unwrap();
    inspect_verified(&t, &t.path("c.img"));
    let out = t.ok(&["restore", &t.pid, "-i", "c.img"]);
    assert!(
        out.contains(&format!(
            "restored {ALLOCATIONS} allocations, {BYTES} bytes"
        )),
        "{out}"
    );
    t.wait_ran();

    // The image holding the memory may be removed: the process keeps it open.
    t.send_run(40);
    t.ok(&["dump", &t.pid, "-o", "d.img"]);
    std::fs::remove_file(t.path("d.img")).unwrap();
    t.ok(&["resume", &t.pid]);
    t.wait_ran();
    // A running process is paused by restore: restoring the running state's own image
    // right after a dump --leave-running, with nothing run in between, changes nothing.
    t.json(&["dump", &t.pid, "-o", "e.img", "--leave-running"]);
    let r = t.json(&["restore", &t.pid, "-i", "e.img"]);
    assert_eq!(r["pause"]["changed"], true, "{r}");
    t.assert_running();
    t.finish();
}

#[test]
fn dump_then_restore_mapped() {
    dump_and_restore(Addressing::Mapped, "sm");
}

#[test]
fn dump_then_restore_translated() {
    dump_and_restore(Addressing::Translated, "st");
}

/// Every way an image is refused, the process left paused with its memory in `a.img`.
fn refusals(addressing: Addressing, tag: &str) {
    let Some(mut t) = Target::start(addressing, tag) else {
        return;
    };
    t.run(20);
    t.ok(&["dump", &t.pid, "-o", "a.img"]);
    let a = t.path("a.img");
    let v = inspect_verified(&t, &a);
    let alloc = |i: usize, k: &str| v["allocations"][i][k].as_u64().unwrap();
    // The big buffer's second chunk: its data offset + one whole chunk + 32 bytes of
    // framing + the next chunk's 24-byte header.
    let big_second_chunk = alloc(4, "data_offset") + (8 << 20) + 32 + 24 + 5;
    // The size field of the table's last record (the table ends the metadata section).
    let table_byte = alloc(0, "data_offset") - 48 + 16;
    let pid = t.pid.clone();

    let data = t.path("data.img");
    images::flipped(&a, &data, big_second_chunk);
    let table = t.path("table.img");
    images::flipped(&a, &table, table_byte);
    let short = t.path("short.img");
    images::truncated(&a, &short, (big_second_chunk - 1000) as usize);
    let v2 = t.path("v2.img");
    images::with_major(&a, &v2, 2);
    let notes = t.path("notes.txt");
    std::fs::write(&notes, "these are not the bytes you are looking for\n").unwrap();
    let other_table = t.path("other-table.img");
    images::rewritten(&a, &other_table, |_, table| table[5].size = 128);
    let other_pid = t.path("other-pid.img");
    images::rewritten(&a, &other_pid, |meta, _| meta.process.pid = 1);

    // Through cudaw-ckpt: exit status 3, a message naming the fault, nothing touched.
    let cases: [(&std::path::Path, &str); 7] = [
        (&data, "checksum mismatch in chunk 1 of allocation"),
        (&table, "metadata checksum mismatch"),
        (&short, "image truncated"),
        (&v2, "unsupported image format version 2.x"),
        (&notes, "not a cudaw image"),
        (
            &other_table,
            "is 128 bytes in the image, 100 in the process",
        ),
        (&other_pid, "made by process 1 ("),
    ];
    for (img, why) in cases {
        t.fails(&["restore", &pid, "-i", s(img)], 3, why);
        t.assert_paused_in(&a);
    }
    // With --json: the failure on standard output.
    let out = t.ckpt(&["restore", &pid, "-i", s(&data), "--json"]);
    assert_eq!(out.status.code(), Some(3));
    let j: Value = serde_json::from_slice(&out.stdout).expect("--json failure");
    assert_eq!(j["ok"], false, "{j}");
    assert_eq!(j["kind"], "bad_image", "{j}");
    let out = t.ckpt(&["restore", &pid, "-i", s(&other_table), "--json"]);
    let j: Value = serde_json::from_slice(&out.stdout).expect("--json failure");
    assert_eq!(j["kind"], "mismatch", "{j}");

    // The process checks by itself too (cudaw-ckpt refuses some of these before asking).
    let socket = t.socket();
    for (img, kind, why) in [
        (&short, "bad_image", "truncated"),
        (&v2, "bad_image", "unsupported image format version"),
        (&notes, "bad_image", "not a cudaw image"),
        (&table, "bad_image", "metadata checksum mismatch"),
        (&data, "bad_image", "checksum mismatch in chunk 1"),
        (&other_table, "mismatch", "differs from the process's"),
        (&t.path("missing.img"), "io", "cannot open the image"),
    ] {
        let r = raw(
            &socket,
            &format!("{{\"cmd\":\"restore\",\"path\":{:?}}}\n", s(img)),
        );
        assert_eq!(r["ok"], false, "{r}");
        assert_eq!(r["kind"], kind, "{r}");
        let e = r["error"].as_str().unwrap();
        assert!(e.contains(why), "{e:?} lacks {why:?}");
        t.assert_paused_in(&a);
    }
    let r = raw(&socket, "{\"cmd\":\"restore\",\"path\":\"a.img\"}\n");
    assert_eq!(r["kind"], "request", "{r}");
    assert!(r["error"].as_str().unwrap().contains("not absolute"), "{r}");

    // inspect: the header-level faults without --verify, the data's with it.
    t.ok(&["inspect", s(&data)]);
    let err = t.fails(
        &["inspect", s(&data), "--verify"],
        3,
        "checksum mismatch in chunk 1",
    );
    assert!(err.contains(s(&data)), "{err}");
    for (img, why) in [
        (&table, "metadata checksum mismatch"),
        (&short, "image truncated at offset"),
        (&v2, "unsupported image format version 2.x"),
        (&notes, "not a cudaw image: starts with 74 68 65 73"),
    ] {
        t.fails(&["inspect", s(img)], 3, why);
        t.fails(&["inspect", s(img), "--verify"], 3, why);
    }
    let out = t.ckpt(&["inspect", s(&data), "--verify", "--json"]);
    assert_eq!(out.status.code(), Some(3));
    let j: Value = serde_json::from_slice(&out.stdout).expect("--json failure");
    assert_eq!(
        (j["ok"].clone(), j["kind"].clone()),
        (false.into(), "bad_image".into())
    );
    t.fails(&["inspect", "missing.img"], 1, "cannot open");
    t.fails(&["inspect", s(&t.work)], 1, "is a folder");
    let human = t.ok(&["inspect", "a.img"]);
    for w in [
        "cudaw checkpoint image, format 1.3",
        &format!("process   {pid} "),
        "ckpt_target on host",
        &format!("{} addressing", addressing.as_str()),
        "GPU       device 0: simgpu",
        &format!("{ALLOCATIONS} allocations, {BYTES} bytes"),
        "file offset",
    ] {
        assert!(human.contains(w), "inspect lacks {w:?}:\n{human}");
    }

    // The image holding the memory damaged in place: resume refuses (rolled back), and
    // works once the byte is put back.
    images::flip_in_place(&a, big_second_chunk);
    t.fails(&["resume", &pid], 3, "is damaged");
    t.assert_paused_in(&a);
    images::flip_in_place(&a, big_second_chunk);
    t.ok(&["inspect", "a.img", "--verify"]);

    // --force takes another process's image whose table matches (this one holds the
    // same bytes), and the program ends right.
    let r = t.json(&["restore", &pid, "-i", s(&other_pid), "--force"]);
    assert_eq!(r["state"], "running", "{r}");
    t.assert_running();
    t.finish();
}

#[test]
fn bad_images_are_refused_and_the_process_is_intact_mapped() {
    refusals(Addressing::Mapped, "bm");
}

#[test]
fn bad_images_are_refused_and_the_process_is_intact_translated() {
    refusals(Addressing::Translated, "bt");
}

/// A refusal, then resume: the program ends right.
fn refused_then_resumed(addressing: Addressing, tag: &str) {
    let Some(mut t) = Target::start(addressing, tag) else {
        return;
    };
    t.send_run(50);
    t.ok(&["pause", &t.pid]);
    t.ok(&["dump", &t.pid, "-o", "a.img", "--leave-running"]);
    t.ok(&["pause", &t.pid]);
    // Host copies held (not in a file): a corrupt image is refused before any of them
    // is touched.
    let v = t.json(&["inspect", "a.img"]);
    let at = v["allocations"][2]["data_offset"].as_u64().unwrap() + 24 + 100;
    images::flipped(&t.path("a.img"), &t.path("bad.img"), at);
    t.fails(
        &["restore", &t.pid, "-i", "bad.img"],
        3,
        "checksum mismatch",
    );
    let st = t.status();
    assert_eq!(st["state"], "paused", "{st}");
    assert_eq!(st["devices"][0]["in_file"].as_u64(), Some(0), "{st}");
    assert_eq!(st["devices"][0]["evicted"].as_u64(), Some(BYTES), "{st}");
    t.ok(&["resume", &t.pid]);
    t.wait_ran();
    t.finish();
}

#[test]
fn a_refused_restore_then_resume_ends_right_mapped() {
    refused_then_resumed(Addressing::Mapped, "fm");
}

#[test]
fn a_refused_restore_then_resume_ends_right_translated() {
    refused_then_resumed(Addressing::Translated, "ft");
}

/// Twelve checkpoints in one run, every way.
fn many_times(addressing: Addressing, tag: &str) {
    let Some(mut t) = Target::start(addressing, tag) else {
        return;
    };
    for i in 0..12 {
        let img = format!("{i}.img");
        match i % 4 {
            0 => {
                t.send_run(8);
                t.ok(&["dump", &t.pid, "-o", &img]);
                t.ok(&["resume", &t.pid]);
            }
            1 => {
                t.send_run(8);
                t.ok(&["dump", &t.pid, "-o", &img]);
                t.ok(&["inspect", &img, "--verify"]);
                t.ok(&["restore", &t.pid, "-i", &img]);
            }
            2 => {
                t.send_run(8);
                let d = t.json(&["dump", &t.pid, "-o", &img, "--leave-running"]);
                assert_eq!(d["state"], "running", "{d}");
            }
            _ => {
                t.run(8);
                t.ok(&["pause", &t.pid]);
                t.ok(&["dump", &t.pid, "-o", &img]);
                let again = format!("{i}-again.img");
                t.ok(&["dump", &t.pid, "-o", &again]);
                t.assert_paused_in(&t.path(&again));
                t.ok(&["restore", &t.pid, "-i", &again]);
            }
        }
        t.wait_ran();
        t.assert_running();
    }
    let log = t.finish();
    assert_eq!(log.matches("] info: dumped: ").count(), 15, "{log}");
}

#[test]
fn dumped_and_restored_many_times_in_one_run_mapped() {
    many_times(Addressing::Mapped, "nm");
}

#[test]
fn dumped_and_restored_many_times_in_one_run_translated() {
    many_times(Addressing::Translated, "nt");
}

#[test]
fn clear_failures_for_paths_pids_and_usage() {
    let Some(t) = Target::start(Addressing::Mapped, "e") else {
        return;
    };
    let pid = t.pid.clone();
    // Output paths: refused before the process is touched.
    t.fails(
        &["dump", &pid, "-o", "/nonexistent/x.img"],
        1,
        "the folder /nonexistent",
    );
    t.fails(
        &["dump", &pid, "-o", "/proc/cudaw.img"],
        1,
        "cannot create the image /proc/cudaw.img",
    );
    t.fails(&["dump", &pid, "-o", "."], 1, "is a folder");
    t.fails(
        &["dump", &pid, "-o", "/etc/passwd/x.img"],
        1,
        "is not a folder",
    );
    t.fails(&["restore", &pid, "-i", "missing.img"], 1, "cannot open");
    let out = t.ckpt(&["dump", &pid, "-o", "/nonexistent/x.img", "--json"]);
    let j: Value = serde_json::from_slice(&out.stdout).expect("--json failure");
    assert_eq!(j["kind"], "io", "{j}");
    t.assert_running();
    // A refused restore of a running process leaves it running.
    t.ok(&["dump", &pid, "-o", "good.img", "--leave-running"]);
    images::flipped(&t.path("good.img"), &t.path("bad.img"), 2000);
    t.fails(
        &["restore", &pid, "-i", "bad.img"],
        3,
        "the process was resumed",
    );
    t.assert_running();
    // Another user (when we can act as one) may neither dump nor restore.
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        use std::os::unix::process::CommandExt;
        // A copy that user can run: the clone may sit in a private folder.
        let nobody_ckpt = cudaw_tests::cudaw_ckpt_for_others("dump");
        for args in [
            ["dump", &pid, "-o", "/tmp/x.img"],
            ["restore", &pid, "-i", s(&t.path("good.img"))],
        ] {
            let out = std::process::Command::new(&nobody_ckpt.exe)
                .args(args)
                .env("CUDAW_RUN_DIR", &t.run_dir)
                .uid(65534)
                .gid(65534)
                .output()
                .expect("running cudaw-ckpt as nobody");
            assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
            let err = text(&out.stderr);
            assert!(
                err.contains("permission denied") || err.contains("another user"),
                "{err}"
            );
        }
        t.assert_running();
    }
    // PIDs.
    t.fails(
        &["dump", "99999999", "-o", "x.img"],
        1,
        "no process with PID 99999999",
    );
    let me = std::process::id().to_string();
    t.fails(
        &["dump", &me, "-o", "x.img"],
        1,
        "is not running under cudaw",
    );
    t.fails(&["restore", &me, "-i", "x.img"], 1, "cannot open");
    // Usage.
    t.fails(&["dump", &pid], 2, "--output <FILE>");
    t.fails(&["restore", &pid], 2, "--input <FILE>");
    t.fails(&["inspect"], 2, "<FILE>");
    // --help teaches, with examples, for every subcommand.
    for sub in ["pause", "resume", "status", "dump", "restore", "inspect"] {
        let help = t.ok(&[sub, "--help"]);
        assert!(help.contains("Examples:"), "{sub} --help:\n{help}");
        assert!(
            help.contains(&format!("cudaw-ckpt {sub}")),
            "{sub} --help:\n{help}"
        );
    }
    let help = t.ok(&["--help"]);
    for w in [
        "dump",
        "restore",
        "inspect",
        "Exit status",
        "3 when an image is at fault",
    ] {
        assert!(help.contains(w), "--help lacks {w:?}:\n{help}");
    }
    t.finish();
}

#[test]
fn progress_lines_precede_the_reply() {
    let Some(t) = Target::start(Addressing::Mapped, "p") else {
        return;
    };
    let socket = t.socket();
    let phases = |lines: &[Value]| -> Vec<(String, u64, u64)> {
        lines
            .iter()
            .filter_map(|l| l.get("progress"))
            .map(|p| {
                (
                    p["phase"].as_str().unwrap().to_owned(),
                    p["done"].as_u64().unwrap(),
                    p["total"].as_u64().unwrap(),
                )
            })
            .collect()
    };
    let img = s(&t.path("p.img")).to_owned();
    let lines = raw_lines(
        &socket,
        &format!("{{\"cmd\":\"dump\",\"path\":{img:?},\"progress\":true}}\n"),
    );
    let last = lines.last().unwrap();
    assert_eq!(last["ok"], true, "{lines:?}");
    assert_eq!(last["dump"]["state"], "paused", "{last}");
    let p = phases(&lines[..lines.len() - 1]);
    assert_eq!(
        p.len(),
        lines.len() - 1,
        "every line before the reply is progress"
    );
    assert_eq!(p.first(), Some(&("evict".to_owned(), 0, BYTES)), "{p:?}");
    assert!(p.contains(&("evict".to_owned(), BYTES, BYTES)), "{p:?}");
    assert!(p.contains(&("write".to_owned(), 0, BYTES)), "{p:?}");
    assert_eq!(p.last(), Some(&("write".to_owned(), BYTES, BYTES)), "{p:?}");

    let lines = raw_lines(
        &socket,
        &format!("{{\"cmd\":\"restore\",\"path\":{img:?},\"progress\":true}}\n"),
    );
    assert_eq!(lines.last().unwrap()["ok"], true, "{lines:?}");
    let p = phases(&lines);
    // One read of the image: each chunk checked as it is loaded, no verifying pass first.
    assert!(p.iter().all(|(phase, _, _)| phase != "verify"), "{p:?}");
    assert!(p.contains(&("load".to_owned(), 0, BYTES)), "{p:?}");
    assert_eq!(p.last(), Some(&("load".to_owned(), BYTES, BYTES)), "{p:?}");

    // Without "progress": one line, as in the first version of the protocol.
    let lines = raw_lines(&socket, "{\"cmd\":\"pause\"}\n");
    assert_eq!(lines.len(), 1, "{lines:?}");
    let lines = raw_lines(&socket, "{\"cmd\":\"resume\",\"progress\":true}\n");
    let p = phases(&lines);
    assert_eq!(p.last(), Some(&("load".to_owned(), BYTES, BYTES)), "{p:?}");

    // On a terminal, cudaw-ckpt draws bars (`script` gives it one).
    let cmd = format!(
        "{} dump {} -o {img}",
        cudaw_tests::cudaw_ckpt().display(),
        t.pid
    );
    let out = std::process::Command::new("script")
        .args(["-qec", &cmd, "/dev/null"])
        .env("CUDAW_RUN_DIR", &t.run_dir)
        .output();
    match out {
        Ok(out) if out.status.success() => {
            let o = text(&out.stdout);
            assert!(o.contains("evicting") && o.contains("writing"), "{o}");
            t.ok(&["resume", &t.pid]);
        }
        Ok(out) => panic!("cudaw-ckpt under script failed: {}", text(&out.stdout)),
        Err(e) => eprintln!("SKIPPED the terminal check: no `script` ({e})"),
    }
    t.finish();
}
