//! The format as the crate docs describe it, written by hand here: the writer's output must
//! equal it byte for byte, and a newer minor version (longer header, extra fields, longer
//! records, bytes after the table, a gap before the data, a longer trailer, an optional
//! flag) must be readable.

mod common;

use std::io::Cursor;

use ckpt::*;
use common::{contents, meta, small_table};
use xxhash_rust::xxh3::{xxh3_64, Xxh3Default};

/// What a newer writer might add (or an older one lack).
struct Extras {
    minor: u16,
    /// Writes the 1.1 device ordinal (a 1.0 writer did not).
    ordinal: bool,
    flags: u64,
    header: usize,
    blocks: bool,
    record: usize,
    /// Writes 48-byte records (1.0 and 1.1: no handle fields).
    short_records: bool,
    /// Writes 104-byte records (1.2: no device ordinal).
    records_1_2: bool,
    /// The other devices (1.3).
    other_gpus: Vec<GpuInfo>,
    after_table: usize,
    gap: usize,
    trailer: usize,
}

impl Default for Extras {
    fn default() -> Self {
        Extras {
            minor: 3,
            ordinal: true,
            flags: 0,
            header: 0,
            blocks: false,
            record: 0,
            short_records: false,
            records_1_2: false,
            other_gpus: Vec::new(),
            after_table: 0,
            gap: 0,
            trailer: 0,
        }
    }
}

fn string(v: &mut Vec<u8>, s: &str) {
    v.extend_from_slice(&(s.len() as u32).to_le_bytes());
    v.extend_from_slice(s.as_bytes());
}

fn block(v: &mut Vec<u8>, inner: Vec<u8>) {
    v.extend_from_slice(&(inner.len() as u32).to_le_bytes());
    v.extend_from_slice(&inner);
}

/// An image written from the documentation alone.
fn by_hand(table: &[AllocationRecord], chunk_size: u64, x: &Extras) -> Vec<u8> {
    let m = meta();
    let p = &m.process;
    let mut pb = Vec::new();
    pb.extend_from_slice(&p.pid.to_le_bytes());
    string(&mut pb, &p.executable);
    string(&mut pb, &p.hostname);
    string(&mut pb, &p.cudaw_version);
    pb.extend_from_slice(&p.created_unix_nanos.to_le_bytes());
    pb.extend_from_slice(&p.cuda_runtime_major.to_le_bytes());
    pb.push(0); // mapped
    if x.blocks {
        pb.extend_from_slice(&0xdead_beef_u64.to_le_bytes());
    }
    let gpu = |g: &GpuInfo| {
        let mut gb = Vec::new();
        string(&mut gb, &g.name);
        string(&mut gb, &g.uuid);
        gb.extend_from_slice(&g.compute_capability_major.to_le_bytes());
        gb.extend_from_slice(&g.compute_capability_minor.to_le_bytes());
        gb.extend_from_slice(&g.total_memory.to_le_bytes());
        if x.ordinal {
            gb.extend_from_slice(&g.ordinal.unwrap_or(u32::MAX).to_le_bytes());
        }
        gb
    };
    let mut gb = gpu(&m.gpu);
    if x.minor >= 3 {
        gb.extend_from_slice(&(x.other_gpus.len() as u32).to_le_bytes());
        for g in &x.other_gpus {
            block(&mut gb, gpu(g));
        }
    }
    if x.blocks {
        string(&mut gb, "a field from the future");
    }
    let mut md = Vec::new();
    block(&mut md, pb);
    block(&mut md, gb);
    let record_len = match (x.short_records, x.records_1_2) {
        (true, _) => 48,
        (false, true) => 104,
        (false, false) => 112,
    } + x.record;
    let header_len = 128 + x.header;
    let metadata_len = md.len() + 12 + record_len * table.len() + x.after_table;
    let data_offset = (header_len + metadata_len + x.gap) as u64;

    // Data and the table's data offsets.
    let mut data = Vec::new();
    let mut sums = Vec::new();
    let mut offsets = Vec::new();
    for r in table {
        offsets.push(data_offset + data.len() as u64);
        let bytes = contents(r);
        for (k, payload) in bytes.chunks(chunk_size as usize).enumerate() {
            let mut c = Vec::new();
            c.extend_from_slice(&r.id.to_le_bytes());
            c.extend_from_slice(&(k as u64 * chunk_size).to_le_bytes());
            c.extend_from_slice(&(payload.len() as u64).to_le_bytes());
            c.extend_from_slice(payload);
            let sum = xxh3_64(&c);
            c.extend_from_slice(&sum.to_le_bytes());
            sums.push(sum);
            data.extend_from_slice(&c);
        }
    }
    md.extend_from_slice(&(table.len() as u64).to_le_bytes());
    md.extend_from_slice(&(record_len as u32).to_le_bytes());
    for (r, off) in table.iter().zip(&offsets) {
        for v in [r.id, r.base, r.size, r.order] {
            md.extend_from_slice(&v.to_le_bytes());
        }
        md.extend_from_slice(&r.tag.to_le_bytes());
        // Record kind: 0 a runtime allocation, 1 a driver-handle range (reserved 0 in 1.1).
        md.extend_from_slice(&u32::from(r.handle.is_some()).to_le_bytes());
        md.extend_from_slice(&off.to_le_bytes());
        if !x.short_records {
            let h = r.handle.unwrap_or(HandleRange {
                handle: 0,
                handle_size: 0,
                offset: 0,
                prop: [0; 32],
            });
            for v in [h.handle, h.handle_size, h.offset] {
                md.extend_from_slice(&v.to_le_bytes());
            }
            md.extend_from_slice(&h.prop);
        }
        if !x.short_records && !x.records_1_2 {
            md.extend_from_slice(&r.device.to_le_bytes());
            md.extend_from_slice(&0u32.to_le_bytes());
        }
        md.extend(std::iter::repeat_n(0xab, x.record));
    }
    md.extend(std::iter::repeat_n(0xcd, x.after_table));
    assert_eq!(md.len(), metadata_len);

    let trailer_len = 32 + x.trailer;
    let trailer_offset = data_offset + data.len() as u64;
    let file_len = trailer_offset + trailer_len as u64;
    let mut h = Vec::new();
    h.extend_from_slice(b"CUDAWIMG");
    h.extend_from_slice(&1u16.to_le_bytes());
    h.extend_from_slice(&x.minor.to_le_bytes());
    h.extend_from_slice(&(header_len as u32).to_le_bytes());
    let chunk_count = sums.len() as u64;
    let handles = u64::from(table.iter().any(|r| r.handle.is_some()));
    let devices = 2 * u64::from(table.windows(2).any(|w| w[0].device != w[1].device));
    for v in [
        x.flags | handles | devices,
        chunk_size,
        header_len as u64,
        metadata_len as u64,
        data_offset,
        data.len() as u64,
        trailer_offset,
        trailer_len as u64,
        file_len,
        xxh3_64(&md),
        table.len() as u64,
        chunk_count,
        0,
    ] {
        h.extend_from_slice(&v.to_le_bytes());
    }
    h.extend(std::iter::repeat_n(0x11, x.header));
    let hs = xxh3_64(&h);
    h.extend_from_slice(&hs.to_le_bytes());
    assert_eq!(h.len(), header_len);

    let mut digest = Xxh3Default::new();
    digest.update(&h);
    digest.update(&md);
    for s in &sums {
        digest.update(&s.to_le_bytes());
    }
    let mut img = h;
    img.extend_from_slice(&md);
    img.extend(std::iter::repeat_n(0xee, x.gap));
    img.extend_from_slice(&data);
    img.extend_from_slice(&chunk_count.to_le_bytes());
    let data_bytes: u64 = table.iter().map(|r| r.size).sum();
    img.extend_from_slice(&data_bytes.to_le_bytes());
    img.extend_from_slice(&digest.digest().to_le_bytes());
    img.extend(std::iter::repeat_n(0x22, x.trailer));
    img.extend_from_slice(b"CUDAWEND");
    assert_eq!(img.len() as u64, file_len);
    img
}

#[test]
fn writer_output_is_the_documented_format() {
    for chunk_size in [16, 64, 100, 1 << 20] {
        let table = small_table();
        assert_eq!(
            common::image(&table, chunk_size),
            by_hand(&table, chunk_size, &Extras::default()),
            "chunk size {chunk_size}"
        );
    }
}

#[test]
fn writer_output_with_driver_handle_ranges_is_the_documented_format() {
    for chunk_size in [16, 64, 1 << 20] {
        let table = common::table_with_handles();
        let img = common::image(&table, chunk_size);
        assert_eq!(
            img,
            by_hand(&table, chunk_size, &Extras::default()),
            "chunk size {chunk_size}"
        );
        // The required flag: a 1.0 or 1.1 reader refuses the image.
        assert_eq!(u64::from_le_bytes(img[16..24].try_into().unwrap()), 1);
        let mut r = ImageReader::open(Cursor::new(&img)).expect("opens");
        let records: Vec<_> = r.allocations().iter().map(|e| e.record).collect();
        assert_eq!(records, table);
        r.verify().expect("verifies");
        let s = r.summary();
        assert_eq!((s.handle_ranges, s.handle_bytes), (2, 256 + 64));
    }
    // Without handle ranges the flag stays clear: a 1.1 reader reads the image.
    let img = common::image(&small_table(), 64);
    assert_eq!(u64::from_le_bytes(img[16..24].try_into().unwrap()), 0);
}

#[test]
fn format_1_1_with_48_byte_records_is_read() {
    let table = small_table();
    let x = Extras {
        minor: 1,
        short_records: true,
        ..Extras::default()
    };
    let img = by_hand(&table, 64, &x);
    let mut r = ImageReader::open(Cursor::new(&img)).expect("a 1.1 image opens");
    let records: Vec<_> = r.allocations().iter().map(|e| e.record).collect();
    assert_eq!(records, table);
    r.verify().expect("verifies");
    assert_eq!(r.summary().format_version, "1.1");
}

#[test]
fn driver_handle_ranges_and_their_flag_must_agree() {
    let with = common::table_with_handles();
    // Ranges without the flag (a writer that forgot it): refused.
    let mut img = by_hand(&with, 64, &Extras::default());
    img[16] = 0;
    common::reseal(&mut img);
    let e = ImageReader::open(Cursor::new(&img)).unwrap_err();
    assert!(matches!(e, ImageError::Inconsistent { .. }), "{e}");
    // The flag without ranges: refused.
    let img = by_hand(
        &small_table(),
        64,
        &Extras {
            flags: 1,
            ..Extras::default()
        },
    );
    let e = ImageReader::open(Cursor::new(&img)).unwrap_err();
    assert!(matches!(e, ImageError::Inconsistent { .. }), "{e}");
    // A driver-handle record too short to hold the handle fields: refused.
    let img = by_hand(
        &with,
        64,
        &Extras {
            short_records: true,
            ..Extras::default()
        },
    );
    let e = ImageReader::open(Cursor::new(&img)).unwrap_err();
    assert!(matches!(e, ImageError::Malformed { .. }), "{e}");
}

#[test]
fn newer_minor_version_is_read() {
    let table = small_table();
    let x = Extras {
        minor: 7,
        flags: 1 << 40, // an optional flag this build does not know
        header: 24,
        blocks: true,
        record: 8,
        after_table: 16,
        gap: 40,
        trailer: 8,
        ..Extras::default()
    };
    let img = by_hand(&table, 64, &x);
    let mut r = ImageReader::open(Cursor::new(&img)).expect("a newer minor opens");
    assert_eq!((r.header().major, r.header().minor), (1, 7));
    assert_eq!(r.metadata(), &meta());
    let records: Vec<_> = r.allocations().iter().map(|e| e.record).collect();
    assert_eq!(records, table);
    r.verify().expect("verifies");
    for a in &table {
        let mut buf = vec![0; a.size as usize];
        r.read_allocation(a.id, &mut buf).unwrap();
        assert_eq!(buf, contents(a));
    }
    assert_eq!(r.summary().format_version, "1.7");
}

#[test]
fn format_1_0_without_the_device_ordinal_is_read() {
    let table = small_table();
    let x = Extras {
        minor: 0,
        ordinal: false,
        ..Extras::default()
    };
    let img = by_hand(&table, 64, &x);
    let mut r = ImageReader::open(Cursor::new(&img)).expect("a 1.0 image opens");
    assert_eq!((r.header().major, r.header().minor), (1, 0));
    let mut expected = meta();
    expected.gpu.ordinal = None;
    assert_eq!(r.metadata(), &expected);
    r.verify().expect("verifies");
    assert_eq!(r.summary().format_version, "1.0");
}

#[test]
fn unknown_required_flag_is_refused() {
    let img = by_hand(
        &small_table(),
        64,
        &Extras {
            flags: 1 << 3,
            ..Extras::default()
        },
    );
    let e = ImageReader::open(Cursor::new(&img)).unwrap_err();
    assert!(
        matches!(e, ImageError::UnsupportedFlags { flags: 8 }),
        "{e}"
    );
}

#[test]
fn unknown_addressing_mode_is_kept() {
    let mut img = by_hand(&small_table(), 64, &Extras::default());
    // The addressing byte ends the process block; reseal the metadata checksum and digest.
    let m = meta();
    let p = &m.process;
    let at =
        128 + 4 + 4 + 4 * 3 + p.executable.len() + p.hostname.len() + p.cudaw_version.len() + 8 + 4;
    assert_eq!(img[at], 0);
    img[at] = 5;
    common::reseal(&mut img);
    let mut r = ImageReader::open(Cursor::new(&img)).unwrap();
    assert_eq!(r.metadata().process.addressing, Addressing::Other(5));
    r.verify().unwrap();
}

/// The common description with a second device, ordinal 5.
fn two_device_meta() -> (ImageMetadata, GpuInfo) {
    let mut m = meta();
    let other = GpuInfo {
        name: "NVIDIA H100 80GB HBM3".into(),
        uuid: "GPU-11111111-2222-3333-4444-555555555555".into(),
        compute_capability_major: 9,
        compute_capability_minor: 0,
        total_memory: 85_029_158_912,
        ordinal: Some(5),
    };
    m.other_gpus.push(other.clone());
    (m, other)
}

/// [`small_table`] with its last allocation on device 5.
fn two_device_table() -> Vec<AllocationRecord> {
    let mut t = small_table();
    t.last_mut().unwrap().device = 5;
    t
}

#[test]
fn writer_output_with_several_devices_is_the_documented_format() {
    let (m, other) = two_device_meta();
    let table = two_device_table();
    for chunk_size in [16, 64, 1 << 20] {
        let mut w = ImageWriter::begin(Vec::new(), &m, &table, WriterOptions { chunk_size })
            .expect("begin");
        for r in &table {
            w.write_allocation(r.id, &contents(r)).expect("write");
        }
        let img = w.finish().expect("finish");
        let x = Extras {
            other_gpus: vec![other.clone()],
            ..Extras::default()
        };
        assert_eq!(
            img,
            by_hand(&table, chunk_size, &x),
            "chunk size {chunk_size}"
        );
        // The required flag: a 1.2 reader refuses the image.
        assert_eq!(
            u64::from_le_bytes(img[16..24].try_into().unwrap()),
            FLAG_DEVICES
        );
        let mut r = ImageReader::open(Cursor::new(&img)).expect("opens");
        assert_eq!(r.metadata(), &m);
        assert_eq!(r.metadata().gpus().count(), 2);
        assert_eq!(r.metadata().gpu_of(5), Some(&other));
        let records: Vec<_> = r.allocations().iter().map(|e| e.record).collect();
        assert_eq!(records, table);
        r.verify().expect("verifies");
        assert_eq!(r.summary().other_gpus, vec![other.clone()]);
    }
}

#[test]
fn several_devices_and_their_flag_must_agree() {
    let (_, other) = two_device_meta();
    let x = Extras {
        other_gpus: vec![other.clone()],
        ..Extras::default()
    };
    // Records of two devices without the flag: refused.
    let mut img = by_hand(&two_device_table(), 64, &x);
    img[16] = 0;
    common::reseal(&mut img);
    let e = ImageReader::open(Cursor::new(&img)).unwrap_err();
    assert!(matches!(e, ImageError::Inconsistent { .. }), "{e}");
    assert!(e.to_string().contains("several-devices flag"), "{e}");
    // The flag with records of one device: refused.
    let img = by_hand(
        &small_table(),
        64,
        &Extras {
            flags: FLAG_DEVICES,
            ..Extras::default()
        },
    );
    let e = ImageReader::open(Cursor::new(&img)).unwrap_err();
    assert!(matches!(e, ImageError::Inconsistent { .. }), "{e}");
    // A record of a device the list does not name: refused, naming both.
    let img = by_hand(&two_device_table(), 64, &Extras::default());
    let e = ImageReader::open(Cursor::new(&img)).unwrap_err();
    assert_eq!(
        e.to_string(),
        "allocation 9 is memory of device 5, which the image's GPU list does not name"
    );
    // A device named twice: refused.
    let mut twice = other;
    twice.ordinal = Some(3);
    let img = by_hand(
        &small_table(),
        64,
        &Extras {
            other_gpus: vec![twice],
            ..Extras::default()
        },
    );
    let e = ImageReader::open(Cursor::new(&img)).unwrap_err();
    assert!(
        matches!(e, ImageError::DuplicateDevice { ordinal: 3 }),
        "{e}"
    );
}

#[test]
fn the_writer_refuses_a_record_of_an_unnamed_device() {
    let e = ImageWriter::begin(
        Vec::new(),
        &meta(),
        &two_device_table(),
        WriterOptions::default(),
    )
    .unwrap_err();
    assert!(
        matches!(
            e,
            ImageError::UnknownDevice {
                id: Some(9),
                device: Some(5)
            }
        ),
        "{e}"
    );
}

#[test]
fn format_1_2_records_are_memory_of_the_one_device() {
    let table = small_table();
    let x = Extras {
        minor: 2,
        records_1_2: true,
        ..Extras::default()
    };
    let img = by_hand(&table, 64, &x);
    let mut r = ImageReader::open(Cursor::new(&img)).expect("a 1.2 image opens");
    assert_eq!(r.metadata(), &meta());
    // The device of every record: the one the GPU block names (3).
    let records: Vec<_> = r.allocations().iter().map(|e| e.record).collect();
    assert_eq!(records, table);
    r.verify().expect("verifies");
    assert_eq!(r.summary().format_version, "1.2");
}
