//! Dump and restore as functions, in this process, on simgpu: images written and read by
//! the engine itself, through the control module; refused restores leave the process as it
//! was.

mod common;
use ckpt::{ImageReader, ImageWriter, WriterOptions};
use common::*;
use cudaw_control::{ErrorKind, State};
use cudaw_engine::{state, Host};
use std::fs::File;
use std::path::Path;
use vmm::Residency;

const SIZES: [u64; 4] = [3, 70_001, 2 << 20, (4 << 20) + 5];

#[test]
fn a_dump_then_a_restore_brings_back_the_bytes_of_the_dump() {
    let _turn = setup();
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("job.img");
    let allocs = fill(&SIZES, 100);

    let r = dump(&img, true);
    ok(&r, "dump --leave-running");
    let d = r.dump.expect("a dump's figures");
    assert_eq!(
        (d.allocations, d.bytes),
        (SIZES.len() as u64, SIZES.iter().sum())
    );
    assert_eq!(d.state, State::Running);
    assert!(!state::is_paused() && !HOST.gate_closed());
    assert_filled(&allocs, 100);

    // The program goes on and changes its memory; the restore brings back the dump's.
    for (i, a) in allocs.iter().enumerate() {
        write(a.base, &pattern(a.size as usize, 900 + i as u64));
    }
    let r = restore(&img, false);
    ok(&r, "restore");
    let rs = r.restore.expect("a restore's figures");
    assert_eq!(rs.bytes, d.bytes);
    assert_eq!(rs.state, State::Running);
    assert!(!state::is_paused() && !HOST.gate_closed());
    assert_filled(&allocs, 100);
    free(allocs);
}

#[test]
fn a_dump_without_leave_running_stays_paused_and_resumes_from_the_image() {
    let _turn = setup();
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("paused.img");
    let allocs = fill(&SIZES, 200);

    let r = dump(&img, false);
    ok(&r, "dump");
    assert_eq!(r.dump.unwrap().state, State::Paused);
    assert!(state::is_paused() && HOST.gate_closed());
    assert_eq!(state::image_path().as_deref(), Some(img.as_path()));
    let m = device();
    for a in &allocs {
        assert!(
            matches!(
                m.vmm.allocation(a.id).unwrap().residency,
                Residency::InFile { .. }
            ),
            "allocation at {:#x}: its bytes should live in the image only",
            a.base
        );
    }

    ok(&resume(), "resume from the image");
    assert!(!state::is_paused() && state::image_path().is_none());
    assert_filled(&allocs, 200);
    free(allocs);
}

/// Flips one byte of the image's data (the middle of its largest allocation).
fn damage(img: &Path) {
    let reader = ImageReader::open(File::open(img).unwrap()).unwrap();
    let e = reader
        .allocations()
        .iter()
        .max_by_key(|e| e.record.size)
        .unwrap();
    let at = e.data_offset + e.record.size / 2;
    let mut bytes = std::fs::read(img).unwrap();
    bytes[at as usize] ^= 0x5a;
    std::fs::write(img, bytes).unwrap();
}

#[test]
fn a_damaged_image_is_refused_and_the_process_runs_on_as_it_was() {
    let _turn = setup();
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("damaged.img");
    let allocs = fill(&SIZES, 300);
    ok(&dump(&img, true), "dump --leave-running");
    for (i, a) in allocs.iter().enumerate() {
        write(a.base, &pattern(a.size as usize, 350 + i as u64));
    }
    damage(&img);

    let r = restore(&img, false);
    let e = error_of(&r, "a restore of a damaged image");
    assert_eq!(r.kind, Some(ErrorKind::BadImage), "{e}");
    assert!(e.contains("the process was resumed"), "{e}");
    // Running, its memory the program's, not the image's.
    assert!(!state::is_paused() && !HOST.gate_closed());
    assert_filled(&allocs, 350);

    // A paused process stays paused, its memory where it was.
    ok(&pause(), "pause");
    let r = restore(&img, false);
    let e = error_of(&r, "a restore of a damaged image while paused");
    assert!(e.contains("the process is still paused"), "{e}");
    assert!(state::is_paused() && HOST.gate_closed());
    ok(&resume(), "resume");
    assert_filled(&allocs, 350);
    free(allocs);
}

/// Writes a copy of `img` that says another process (PID + 1) made it.
fn as_foreign(img: &Path, out: &Path) {
    let mut reader = ImageReader::open(File::open(img).unwrap()).unwrap();
    let mut meta = reader.metadata().clone();
    meta.process.pid += 1;
    let table: Vec<_> = reader.allocations().iter().map(|e| e.record).collect();
    let f = File::create(out).unwrap();
    let mut w = ImageWriter::begin(f, &meta, &table, WriterOptions::default()).unwrap();
    for r in &table {
        let mut bytes = vec![0u8; r.size as usize];
        reader.read_range(r.id, 0, &mut bytes).unwrap();
        w.write_chunk(r.id, 0, &bytes).unwrap();
    }
    w.finish().unwrap();
}

#[test]
fn another_process_image_is_refused_unless_forced() {
    let _turn = setup();
    let dir = tempfile::tempdir().unwrap();
    let (img, foreign) = (dir.path().join("mine.img"), dir.path().join("theirs.img"));
    let allocs = fill(&SIZES, 400);
    ok(&dump(&img, true), "dump --leave-running");
    as_foreign(&img, &foreign);
    for (i, a) in allocs.iter().enumerate() {
        write(a.base, &pattern(a.size as usize, 450 + i as u64));
    }

    let r = restore(&foreign, false);
    let e = error_of(&r, "a restore of another process's image");
    assert_eq!(r.kind, Some(ErrorKind::Mismatch), "{e}");
    assert!(e.contains("--force would restore it"), "{e}");
    assert!(!state::is_paused() && !HOST.gate_closed());
    assert_filled(&allocs, 450);

    ok(&restore(&foreign, true), "restore --force");
    assert_filled(&allocs, 400);
    free(allocs);
}

#[test]
fn an_image_of_another_allocation_table_is_refused() {
    let _turn = setup();
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("before.img");
    let allocs = fill(&SIZES, 500);
    ok(&dump(&img, true), "dump --leave-running");
    // One more allocation: the image no longer describes the process.
    let extra = fill(&[1 << 20], 550);

    let r = restore(&img, false);
    let e = error_of(&r, "a restore of an image with another table");
    assert_eq!(r.kind, Some(ErrorKind::Mismatch), "{e}");
    assert!(e.contains("1 is only in the process"), "{e}");
    assert!(!state::is_paused() && !HOST.gate_closed());
    assert_filled(&allocs, 500);
    assert_filled(&extra, 550);
    free(extra);
    free(allocs);
}
