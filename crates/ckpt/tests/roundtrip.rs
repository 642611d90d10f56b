//! Write then read: equal, whatever the table, contents, chunk size and piece sizes.

mod common;

use std::io::Cursor;

use ckpt::*;
use common::{contents, meta, Rng};
use proptest::prelude::*;

/// Tables of up to 8 allocations (some empty), unique ids, no overlap, any order.
fn tables() -> impl Strategy<Value = Vec<AllocationRecord>> {
    prop::collection::vec((0u64..3000, 0u64..4096, any::<u32>()), 0..8).prop_perturb(
        |specs, mut rng| {
            let mut base = 0x7f00_0000_0000u64 + rng.random_range(0..1u64 << 20) * 256;
            let mut ids: Vec<u64> = Vec::new();
            let mut table = Vec::new();
            for (i, (size, gap, tag)) in specs.into_iter().enumerate() {
                let mut id = rng.random::<u64>() % 1000;
                while ids.contains(&id) {
                    id += 1;
                }
                ids.push(id);
                table.push(AllocationRecord {
                    id,
                    base,
                    size,
                    order: i as u64,
                    tag,
                    handle: None,
                    device: 3,
                });
                base += size + gap;
            }
            // Table order need not be address order.
            for i in (1..table.len()).rev() {
                let j = rng.random_range(0..=i);
                table.swap(i, j);
            }
            table
        },
    )
}

fn write_whole(table: &[AllocationRecord], chunk_size: u64) -> Vec<u8> {
    let mut w =
        ImageWriter::begin(Vec::new(), &meta(), table, WriterOptions { chunk_size }).unwrap();
    for r in table {
        w.write_allocation(r.id, &contents(r)).unwrap();
    }
    w.finish().unwrap()
}

fn write_pieces(table: &[AllocationRecord], chunk_size: u64, seed: u64) -> Vec<u8> {
    let mut rng = Rng(seed);
    let mut w =
        ImageWriter::begin(Vec::new(), &meta(), table, WriterOptions { chunk_size }).unwrap();
    for r in table {
        let data = contents(r);
        let mut off = 0usize;
        while off < data.len() {
            let n = (1 + rng.below(2 * chunk_size + 3) as usize).min(data.len() - off);
            assert_eq!(w.next_expected(), Some((r.id, off as u64)));
            w.write_chunk(r.id, off as u64, &data[off..off + n])
                .unwrap();
            assert_eq!(w.buffered_bytes(), 0);
            off += n;
        }
    }
    assert_eq!(w.next_expected(), None);
    let p = w.progress();
    let out = w.finish().unwrap();
    assert_eq!(p.data_written, p.data_total);
    assert_eq!(out.len() as u64, p.total_bytes);
    out
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn write_then_read_is_equal(table in tables(), chunk_size in 16u64..700, seed in any::<u64>()) {
        let whole = write_whole(&table, chunk_size);
        let pieces = write_pieces(&table, chunk_size, seed);
        prop_assert_eq!(&whole, &pieces, "whole and piece by piece differ");

        let mut r = ImageReader::open(Cursor::new(&whole)).unwrap();
        prop_assert_eq!(r.metadata(), &meta());
        let records: Vec<AllocationRecord> = r.allocations().iter().map(|e| e.record).collect();
        prop_assert_eq!(&records, &table);
        prop_assert!(r.check_against(&table).is_empty());
        let report = r.verify().unwrap();
        prop_assert_eq!(report.data_bytes, table.iter().map(|a| a.size).sum::<u64>());
        prop_assert_eq!(report.digest, r.trailer().digest);

        let mut rng = Rng(seed ^ 1);
        for a in &table {
            let want = contents(a);
            let mut got = vec![0; a.size as usize];
            r.read_allocation(a.id, &mut got).unwrap();
            prop_assert_eq!(&got, &want);
            // Random access: an aligned range, read twice (the reader seeks back).
            let chunks = a.size.div_ceil(chunk_size);
            if chunks > 0 {
                let k = rng.below(chunks);
                let n = 1 + rng.below(chunks - k);
                let start = k * chunk_size;
                let end = ((k + n) * chunk_size).min(a.size);
                let mut part = vec![0; (end - start) as usize];
                for _ in 0..2 {
                    r.read_range(a.id, start, &mut part).unwrap();
                    prop_assert_eq!(&part[..], &want[start as usize..end as usize]);
                }
            }
        }
        let s = r.summary();
        prop_assert_eq!(s.allocation_count, table.len() as u64);
        prop_assert_eq!(s.file_len, whole.len() as u64);
    }
}

#[test]
fn writer_refuses_out_of_order_and_incomplete() {
    let table = common::small_table();
    let mut w = ImageWriter::begin(
        Vec::new(),
        &meta(),
        &table,
        WriterOptions { chunk_size: 64 },
    )
    .unwrap();
    let e = w.write_chunk(9, 0, &[0; 10]).unwrap_err();
    assert!(
        matches!(
            e,
            ImageError::OutOfOrder {
                expected_id: 7,
                expected_offset: 0,
                id: 9,
                ..
            }
        ),
        "{e}"
    );
    w.write_chunk(7, 0, &[0; 10]).unwrap();
    let e = w.write_chunk(7, 20, &[0; 10]).unwrap_err();
    assert!(
        e.to_string().contains("expected allocation 7 at offset 10"),
        "{e}"
    );
    let e = w.write_chunk(7, 10, &[0; 291]).unwrap_err();
    assert!(
        matches!(
            e,
            ImageError::Overrun {
                id: 7,
                size: 300,
                ..
            }
        ),
        "{e}"
    );
    let e = w.write_allocation(9, &[0; 3]).unwrap_err();
    assert!(matches!(e, ImageError::OutOfOrder { .. }), "{e}");
    let e = w.finish().unwrap_err();
    assert_eq!(
        e.to_string(),
        "image incomplete: allocation 7 has 10 of 300 bytes"
    );
}

#[test]
fn writer_refuses_bad_tables_naming_the_allocations() {
    let mut t = common::small_table();
    t[2].base = 0x7f00_0000_0100; // inside allocation 7
    let e = ImageWriter::begin(Vec::new(), &meta(), &t, WriterOptions::default()).unwrap_err();
    assert!(matches!(e, ImageError::Overlap { a: 7, b: 9, .. }), "{e}");
    assert!(
        e.to_string()
            .contains("allocations 7 [0x7f0000000000, 0x7f000000012c) and 9"),
        "{e}"
    );
    let mut t = common::small_table();
    t[1].id = 9;
    let e = ImageWriter::begin(Vec::new(), &meta(), &t, WriterOptions::default()).unwrap_err();
    assert!(matches!(e, ImageError::DuplicateId { id: 9 }), "{e}");
    let t = [AllocationRecord {
        id: 1,
        base: u64::MAX - 5,
        size: 10,
        order: 0,
        tag: 0,
        handle: None,
        device: 3,
    }];
    let e = ImageWriter::begin(Vec::new(), &meta(), &t, WriterOptions::default()).unwrap_err();
    assert!(
        matches!(e, ImageError::AddressOverflow { id: 1, .. }),
        "{e}"
    );
    let e =
        ImageWriter::begin(Vec::new(), &meta(), &[], WriterOptions { chunk_size: 8 }).unwrap_err();
    assert!(matches!(e, ImageError::ChunkSize(8)), "{e}");
}

#[test]
fn empty_table_round_trips() {
    let bytes = write_whole(&[], 64);
    let mut r = ImageReader::open(Cursor::new(&bytes)).unwrap();
    assert!(r.allocations().is_empty());
    assert_eq!(r.verify().unwrap().chunks, 0);
}

#[test]
fn progress_callback_reaches_the_total() {
    use std::sync::{Arc, Mutex};
    let table = common::small_table();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let mut w = ImageWriter::begin(
        Vec::new(),
        &meta(),
        &table,
        WriterOptions { chunk_size: 64 },
    )
    .unwrap();
    let s = Arc::clone(&seen);
    w.on_progress(move |p| s.lock().unwrap().push(*p));
    for r in &table {
        w.write_allocation(r.id, &contents(r)).unwrap();
    }
    let out = w.finish().unwrap();
    let seen = seen.lock().unwrap();
    let last = seen.last().unwrap();
    assert_eq!(last.bytes_written, out.len() as u64);
    assert_eq!(last.bytes_written, last.total_bytes);
    assert_eq!(last.data_written, 429);
    assert!(seen
        .windows(2)
        .all(|w| w[0].bytes_written <= w[1].bytes_written));
}

#[test]
fn reader_range_rules_and_unknown_ids() {
    let table = common::small_table();
    let bytes = common::image(&table, 64);
    let mut r = ImageReader::open(Cursor::new(&bytes)).unwrap();
    let mut b = vec![0; 64];
    assert!(matches!(
        r.read_range(7, 10, &mut b),
        Err(ImageError::BadRange { .. })
    ));
    assert!(matches!(
        r.read_range(7, 0, &mut b[..63]),
        Err(ImageError::BadRange { .. })
    ));
    assert!(matches!(
        r.read_range(7, 320, &mut b[..0]),
        Err(ImageError::BadRange { .. })
    ));
    assert!(matches!(
        r.read_range(1234, 0, &mut b),
        Err(ImageError::UnknownAllocation(1234))
    ));
    let mut tail = vec![0; 300 - 256];
    r.read_range(7, 256, &mut tail).unwrap();
    assert_eq!(tail, contents(&table[0])[256..]);
    assert!(matches!(
        r.read_allocation(7, &mut b),
        Err(ImageError::Inconsistent { .. })
    ));
}

#[test]
fn check_against_lists_every_difference() {
    let table = common::small_table();
    let bytes = common::image(&table, 64);
    let r = ImageReader::open(Cursor::new(&bytes)).unwrap();
    let mut running = table.clone();
    running[0].size = 301; // 7: size
    running[2].base += 0x100; // 9: base
    running[2].order += 1; // 9: creation order
    running.remove(1); // 3: only in the image
    running.push(AllocationRecord {
        id: 11,
        base: 0x1000,
        size: 5,
        order: 9,
        tag: 0,
        handle: None,
        device: 3,
    });
    let d = r.check_against(&running);
    assert_eq!(
        d,
        vec![
            Difference::MissingFromProcess {
                id: 3,
                base: 0x7f00_0000_1000,
                size: 0
            },
            Difference::SizeMismatch {
                id: 7,
                image: 300,
                process: 301
            },
            Difference::BaseMismatch {
                id: 9,
                image: 0x7f00_0000_0200,
                process: 0x7f00_0000_0300
            },
            Difference::OrderMismatch {
                id: 9,
                image: table[2].order,
                process: table[2].order + 1
            },
            Difference::MissingFromImage {
                id: 11,
                base: 0x1000,
                size: 5
            },
        ]
    );
    assert_eq!(
        d[1].to_string(),
        "allocation 7 is 300 bytes in the image, 301 in the process"
    );
    let json = serde_json::to_string(&d[0]).unwrap();
    assert_eq!(
        json,
        r#"{"kind":"missing_from_process","id":3,"base":139637976731648,"size":0}"#
    );
}

#[test]
fn summary_serialises_to_json() {
    let table = common::small_table();
    let bytes = common::image(&table, 64);
    let mut r = ImageReader::open(Cursor::new(&bytes)).unwrap();
    let mut s = r.summary();
    s.verified = Some(r.verify().unwrap());
    let v: serde_json::Value = serde_json::to_value(&s).unwrap();
    assert_eq!(v["format_version"], "1.3");
    assert_eq!(v["process"]["pid"], 4242);
    assert_eq!(v["process"]["addressing"], "mapped");
    assert_eq!(v["gpu"]["ordinal"], 3);
    assert_eq!(v["gpu"]["compute_capability_major"], 9);
    assert_eq!(v["allocations"][2]["id"], 9);
    assert_eq!(v["allocations"][2]["size"], 129);
    assert_eq!(v["allocations"][2]["chunk_count"], 3);
    assert_eq!(v["verified"]["chunks"], 8);
    let back: Summary = serde_json::from_value(v).unwrap();
    assert_eq!(back, s);
}

#[test]
fn driver_handle_ranges_round_trip_and_are_compared() {
    let table = common::table_with_handles();
    let bytes = common::image(&table, 64);
    let mut r = ImageReader::open(Cursor::new(&bytes)).unwrap();
    let records: Vec<_> = r.allocations().iter().map(|e| e.record).collect();
    assert_eq!(records, table);
    for a in &table {
        let mut buf = vec![0; a.size as usize];
        r.read_allocation(a.id, &mut buf).unwrap();
        assert_eq!(buf, common::contents(a));
    }
    let mut s = r.summary();
    s.verified = Some(r.verify().unwrap());
    let v: serde_json::Value = serde_json::to_value(&s).unwrap();
    assert_eq!(v["handle_ranges"], 2);
    assert_eq!(v["allocations"][4]["handle"]["offset"], 256);
    assert!(v["allocations"][0].get("handle").is_none());
    let back: Summary = serde_json::from_value(v).unwrap();
    assert_eq!(back, s);

    assert!(r.check_against(&table).is_empty());
    // The process's handle differs (another handle, properties), or it is not a handle.
    let mut running = table.clone();
    running[3].handle.as_mut().unwrap().handle += 1;
    running[4].handle.as_mut().unwrap().prop[12] = 1;
    running[0].handle = running[4].handle;
    let d = r.check_against(&running);
    assert_eq!(d.len(), 3, "{d:?}");
    let texts: Vec<String> = d.iter().map(|d| d.to_string()).collect();
    assert!(
        texts.iter().any(|t| t == "range 7 is a runtime allocation in the image, driver handle 0xcda0000000000001 in the process"),
        "{texts:?}"
    );
    assert!(
        texts
            .iter()
            .any(|t| t.contains("differs in the handle's size, offset or properties")),
        "{texts:?}"
    );
}

#[test]
fn verify_reports_progress_chunk_by_chunk() {
    let table = common::small_table();
    let bytes = common::image(&table, 64);
    let mut r = ImageReader::open(Cursor::new(&bytes)).unwrap();
    let mut seen = Vec::new();
    let report = r.verify_with_progress(|done| seen.push(done)).unwrap();
    assert_eq!(seen.len() as u64, report.chunks);
    assert!(seen.windows(2).all(|w| w[0] < w[1]), "{seen:?}");
    assert_eq!(seen.last().copied(), Some(report.data_bytes));
}
