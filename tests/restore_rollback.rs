//! A restore reads its image once, each chunk checked as it is loaded and the digest at
//! the end; whatever fails — a corrupt chunk in the middle of the image or in its last
//! chunk, a file cut short, a changed digest — rolls the load back, and the process holds
//! exactly the bytes it held before: `tests/cuda/programs/ckpt_target.cu` is restored from
//! a damaged copy of an image it made 30 iterations *earlier*, so any byte of the image
//! left on the device would make its own check of every buffer (against the CPU's mirror)
//! fail at the end. Paused (host copies, or the memory in an earlier image) and running.

mod ckpt_common;

use ckpt_common::{images, Target, BYTES};
use cudaw_tests::Addressing;
use serde_json::Value;
use std::path::{Path, PathBuf};

fn s(p: &Path) -> &str {
    p.to_str().expect("UTF-8 test paths")
}

/// The damaged copies of `a` (an image of the target): what each is, its path, and what
/// the failure must say.
fn damaged(t: &Target, a: &Path) -> Vec<(&'static str, PathBuf, &'static str)> {
    let v: Value = t.json(&["inspect", s(a), "--verify"]);
    let allocations = v["allocations"].as_array().expect("allocations");
    assert_eq!(allocations.len(), 6, "{v}");
    let offset = |i: usize| allocations[i]["data_offset"].as_u64().unwrap();
    let len = std::fs::metadata(a).unwrap().len();
    // 7 chunks: four of 64 KiB, the big buffer's two (8 MiB and 1 MiB + 20), the counter's.
    // The big buffer's first chunk is the middle one (24-byte chunk headers); the
    // counter's is the last.
    let middle = t.path("middle.img");
    images::flipped(a, &middle, offset(4) + 24 + (3 << 20));
    let last = t.path("last.img");
    images::flipped(a, &last, offset(5) + 24 + 50);
    let short = t.path("short.img");
    images::truncated(a, &short, (offset(4) + (8 << 20) + 4096) as usize);
    // The trailer: chunk count, allocation bytes, digest, end marker (8 bytes each).
    let digest = t.path("digest.img");
    images::flipped(a, &digest, len - 16 + 3);
    vec![
        (
            "a corrupt middle chunk",
            middle,
            "checksum mismatch in chunk 0 of allocation",
        ),
        (
            "a corrupt last chunk",
            last,
            "checksum mismatch in chunk 0 of allocation",
        ),
        ("a truncated file", short, "image truncated"),
        ("a changed digest", digest, "image digest mismatch"),
    ]
}

/// Every damaged restore fails with exit status 3 and its reason; `after` checks the
/// process after each.
fn every_damaged_restore_fails(t: &Target, a: &Path, after: impl Fn(&str)) {
    for (what, img, why) in damaged(t, a) {
        let err = t.fails(&["restore", &t.pid, "-i", s(&img)], 3, why);
        // The loading failures say that the load was undone (a truncated file is refused
        // before anything is loaded).
        if !why.contains("truncated") {
            assert!(err.contains("rolled back"), "{what}: {err}");
        }
        after(what);
    }
}

fn paused(addressing: Addressing, tag: &str) {
    let Some(mut t) = Target::start(addressing, tag) else {
        return;
    };
    t.run(20);
    t.ok(&["dump", &t.pid, "-o", "a.img", "--leave-running"]);
    let a = t.path("a.img");
    // 30 more iterations: every buffer differs from the image's.
    t.run(30);
    t.ok(&["pause", &t.pid]);
    // Paused with host copies.
    every_damaged_restore_fails(&t, &a, |what| {
        let st = t.status();
        assert_eq!(st["state"], "paused", "{what}: {st}");
        let d = &st["devices"][0];
        assert_eq!(d["evicted"].as_u64(), Some(BYTES), "{what}: {st}");
        assert_eq!(d["in_file"].as_u64(), Some(0), "{what}: {st}");
        assert_eq!(d["mapped"].as_u64(), Some(0), "{what}: {st}");
    });
    t.ok(&["resume", &t.pid]);
    t.run(10);
    // Paused with the memory in an earlier image: that image stays the one, and usable.
    t.ok(&["dump", &t.pid, "-o", "b.img"]);
    let b = t.path("b.img");
    t.assert_paused_in(&b);
    every_damaged_restore_fails(&t, &a, |_| t.assert_paused_in(&b));
    t.ok(&["resume", &t.pid]);
    t.assert_running();
    t.finish();
}

fn running(addressing: Addressing, tag: &str) {
    let Some(mut t) = Target::start(addressing, tag) else {
        return;
    };
    t.run(20);
    t.ok(&["dump", &t.pid, "-o", "a.img", "--leave-running"]);
    let a = t.path("a.img");
    t.run(30);
    // Running (kernels in flight for some of them): the pause the restore begins with is
    // undone, and the program runs on with its own bytes.
    every_damaged_restore_fails(&t, &a, |what| {
        let st = t.status();
        assert_eq!(st["state"], "running", "{what}: {st}");
        assert_eq!(
            st["devices"][0]["resident"].as_u64(),
            Some(BYTES),
            "{what}: {st}"
        );
    });
    t.send_run(40);
    for (what, img, why) in damaged(&t, &a) {
        let err = t.fails(&["restore", &t.pid, "-i", s(&img)], 3, why);
        // A truncated file is refused by `cudaw-ckpt` itself, before asking the process.
        let undone = if why.contains("truncated") {
            "left unchanged"
        } else {
            "the process was resumed"
        };
        assert!(err.contains(undone), "{what}: {err}");
    }
    t.wait_ran();
    t.assert_running();
    t.finish();
}

#[test]
fn a_failed_restore_leaves_a_paused_process_its_own_bytes_mapped() {
    paused(Addressing::Mapped, "rpm");
}

#[test]
fn a_failed_restore_leaves_a_paused_process_its_own_bytes_translated() {
    paused(Addressing::Translated, "rpt");
}

#[test]
fn a_failed_restore_leaves_a_running_process_its_own_bytes_mapped() {
    running(Addressing::Mapped, "rrm");
}

#[test]
fn a_failed_restore_leaves_a_running_process_its_own_bytes_translated() {
    running(Addressing::Translated, "rrt");
}

/// The restore's own account in the process's log: the image read once (about its length,
/// not twice it).
#[test]
fn a_restore_reads_the_image_once() {
    let Some(mut t) = Target::start(Addressing::Mapped, "ro") else {
        return;
    };
    t.run(10);
    t.ok(&["dump", &t.pid, "-o", "a.img"]);
    let len = std::fs::metadata(t.path("a.img")).unwrap().len();
    t.ok(&["restore", &t.pid, "-i", "a.img"]);
    t.wait_log("restored: ");
    let log = t.log();
    let line = log
        .lines()
        .find(|l| l.contains("restored: "))
        .expect("the restore's log line");
    let read: u64 = line
        .split(" bytes of the ")
        .next()
        .and_then(|l| l.rsplit(" (").next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no byte count in {line:?}"));
    assert!(
        line.contains(&format!("of the {len}-byte image read once")),
        "{line}"
    );
    assert!(
        read <= len + 512 && read + 64 >= len,
        "{read} bytes read of a {len}-byte image: {line}"
    );
    // Where the read went: the reader thread's reads, the checks and copies beside them.
    assert!(
        line.contains("the image read in ") && line.contains("checked and copied in "),
        "{line}"
    );
    t.assert_running();
    t.finish();
}
