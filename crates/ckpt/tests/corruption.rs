//! Corrupt, truncated and hostile images: always an error naming the problem, never a
//! panic, never success.

mod common;

use std::io::Cursor;

use ckpt::*;
use common::{image, open_verify_read, reseal, small_table, Rng};

fn open(b: &[u8]) -> Result<ImageReader<Cursor<&[u8]>>, ImageError> {
    ImageReader::open(Cursor::new(b))
}

/// Where each byte of the small image is, per the documented layout.
#[derive(Debug, PartialEq)]
enum Region {
    Header,
    Metadata,
    /// Chunk header, payload or checksum of chunk `k` of allocation `id`.
    ChunkHeader(u64, u64),
    Payload(u64, u64),
    ChunkSum(u64, u64),
    Trailer,
}

fn region(r: &ImageReader<Cursor<&[u8]>>, at: u64) -> Region {
    let h = r.header();
    if at < h.header_len {
        return Region::Header;
    }
    if at < h.data_offset {
        return Region::Metadata;
    }
    if at >= h.trailer_offset {
        return Region::Trailer;
    }
    for e in r.allocations() {
        for k in 0..e.chunk_count {
            let start = e.data_offset + k * (h.chunk_size + CHUNK_OVERHEAD);
            let len = h.chunk_size.min(e.record.size - k * h.chunk_size);
            let id = e.record.id;
            if at < start + CHUNK_HEADER_LEN {
                return Region::ChunkHeader(id, k);
            }
            if at < start + CHUNK_HEADER_LEN + len {
                return Region::Payload(id, k);
            }
            if at < start + CHUNK_OVERHEAD + len {
                return Region::ChunkSum(id, k);
            }
        }
    }
    unreachable!("byte {at} is in no region")
}

#[test]
fn every_truncation_is_reported_with_its_offset() {
    let img = image(&small_table(), 64);
    let full = img.len() as u64;
    for len in 0..img.len() {
        let e = open(&img[..len])
            .err()
            .unwrap_or_else(|| panic!("{len} bytes opened"));
        match e {
            ImageError::Truncated { at, expected } => {
                assert_eq!(at, len as u64, "{e}");
                let want = if len < 128 { 128 } else { full };
                assert_eq!(expected, want, "{e}");
                assert!(e
                    .to_string()
                    .starts_with(&format!("image truncated at offset {len}")));
            }
            ImageError::NotAnImage { .. } if len == 0 => {
                assert_eq!(
                    e.to_string(),
                    "not a cudaw image: starts with nothing (empty)"
                );
            }
            e => panic!("{len} bytes: {e}"),
        }
    }
    // One byte too many.
    let mut long = img.clone();
    long.push(0);
    let e = open(&long).unwrap_err();
    assert!(matches!(e, ImageError::TrailingData { .. }), "{e}");
}

#[test]
fn every_single_bit_flip_is_caught_and_named() {
    let img = image(&small_table(), 64);
    let good = open(&img).unwrap();
    let mut flipped = img.clone();
    for bit in 0..img.len() * 8 {
        let at = bit / 8;
        flipped[at] ^= 1 << (bit % 8);
        let e = open_verify_read(&flipped)
            .err()
            .unwrap_or_else(|| panic!("flip of bit {bit} (byte {at}) went unnoticed"));
        let reg = region(&good, at as u64);
        let ok = match (&reg, &e) {
            (Region::Header, ImageError::NotAnImage { .. }) => at < 8,
            (Region::Header, ImageError::UnsupportedMajor { .. }) => (8..10).contains(&at),
            (Region::Header, ImageError::Malformed { offset: 12, .. }) => (12..16).contains(&at),
            (Region::Header, ImageError::Truncated { .. }) => (12..16).contains(&at),
            (Region::Header, ImageError::SectionChecksum { what: "header", .. }) => true,
            (
                Region::Metadata,
                ImageError::SectionChecksum {
                    what: "metadata", ..
                },
            ) => true,
            (
                Region::ChunkHeader(id, k),
                ImageError::ChunkHeader {
                    allocation, chunk, ..
                },
            ) => (id, k) == (allocation, chunk),
            (
                Region::Payload(id, k) | Region::ChunkSum(id, k),
                ImageError::ChunkChecksum {
                    allocation, chunk, ..
                },
            ) => (id, k) == (allocation, chunk),
            (Region::Trailer, ImageError::Inconsistent { .. })
            | (Region::Trailer, ImageError::DigestMismatch { .. })
            | (Region::Trailer, ImageError::BadEndMarker { .. }) => true,
            _ => false,
        };
        assert!(ok, "flip of bit {bit} (byte {at}, {reg:?}) gave: {e}");
        flipped[at] ^= 1 << (bit % 8);
    }
}

#[test]
fn payload_flip_is_found_by_verify_not_open() {
    let table = small_table();
    let img = image(&table, 64);
    let good = open(&img).unwrap();
    let e9 = *good.allocation(9).unwrap();
    // Byte 70 of allocation 9: chunk 1, offset 64.
    let at = e9.data_offset + (64 + CHUNK_OVERHEAD) + CHUNK_HEADER_LEN + 6;
    let mut bad = img.clone();
    bad[at as usize] ^= 0x10;
    let mut r = open(&bad).expect("open reads no data");
    let e = r.verify().unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.starts_with("checksum mismatch in chunk 1 of allocation 9 at offset 64 (file offset "),
        "{msg}"
    );
    // The chunks before it still read; the damaged one does not.
    let mut first = vec![0; 64];
    r.read_range(9, 0, &mut first).unwrap();
    let mut second = vec![0; 64];
    assert!(matches!(
        r.read_range(9, 64, &mut second),
        Err(ImageError::ChunkChecksum {
            allocation: 9,
            chunk: 1,
            ..
        })
    ));
    // Allocation 7 is intact.
    let mut a7 = vec![0; 300];
    r.read_allocation(7, &mut a7).unwrap();
}

#[test]
fn dense_random_corruption_of_a_larger_image() {
    let mut rng = Rng(0x5eed);
    let mut table = Vec::new();
    let mut base = 0x7f12_0000_0000u64;
    for id in 0..20 {
        let size = rng.below(6000);
        table.push(AllocationRecord {
            id: 100 + id,
            base,
            size,
            order: id,
            tag: id as u32,
            handle: None,
            device: 3,
        });
        base += size.next_multiple_of(256) + 256;
    }
    let img = image(&table, 1024);
    assert!(open_verify_read(&img).is_ok());
    let mut bad = img.clone();
    for round in 0..3000 {
        // One to four bit flips, or a run of random bytes.
        let mut edits = Vec::new();
        if round % 4 == 3 {
            let at = rng.below(img.len() as u64) as usize;
            let n = (1 + rng.below(40) as usize).min(img.len() - at);
            for (i, b) in bad.iter_mut().enumerate().skip(at).take(n) {
                let v = rng.next() as u8;
                if v != *b {
                    edits.push(i);
                    *b = v;
                }
            }
        } else {
            for _ in 0..1 + rng.below(4) {
                let at = rng.below(img.len() as u64) as usize;
                bad[at] ^= 1 << rng.below(8);
                edits.push(at);
            }
        }
        if bad != img {
            assert!(
                open_verify_read(&bad).is_err(),
                "round {round}: edits at {edits:?} unnoticed"
            );
        }
        for i in edits {
            bad[i] = img[i];
        }
        // And a random truncation.
        let len = rng.below(img.len() as u64) as usize;
        assert!(matches!(
            open(&img[..len]),
            Err(ImageError::Truncated { .. } | ImageError::NotAnImage { .. })
        ));
    }
}

#[test]
fn wrong_magic_says_what_the_file_starts_with() {
    let mut elf = b"\x7fELF\x02\x01\x01\x00".to_vec();
    elf.resize(4096, 0);
    let e = open(&elf).unwrap_err();
    assert_eq!(
        e.to_string(),
        "not a cudaw image: starts with 7f 45 4c 46 02 01 01 00 00 00 00 00 00 00 00 00 (\".ELF............\")"
    );
    let e = open(b"hello").unwrap_err();
    assert_eq!(
        e.to_string(),
        "not a cudaw image: starts with 68 65 6c 6c 6f (\"hello\")"
    );
}

#[test]
fn future_major_version_is_refused() {
    let mut img = image(&small_table(), 64);
    img[8..10].copy_from_slice(&2u16.to_le_bytes());
    reseal(&mut img);
    let e = open(&img).unwrap_err();
    assert!(matches!(
        e,
        ImageError::UnsupportedMajor {
            found: 2,
            supported: 1
        }
    ));
    assert_eq!(
        e.to_string(),
        "unsupported image format version 2.x (this build reads 1.x)"
    );
}

#[test]
fn newer_minor_of_a_writer_output_is_accepted() {
    let mut img = image(&small_table(), 64);
    img[10..12].copy_from_slice(&3u16.to_le_bytes());
    reseal(&mut img);
    let mut r = open(&img).unwrap();
    assert_eq!(r.header().minor, 3);
    r.verify().unwrap();
}

/// Byte offset of field `field` (0 id, 1 base, 2 size, 3 order, 5 data offset: in u64s;
/// the tag is at 32, the record kind at 36) of record `i` in the small image (1.3 records
/// of 112 bytes).
fn record_field(img: &[u8], i: usize, byte: usize) -> usize {
    let r = open(img).unwrap();
    let meta_end = (r.header().metadata_offset + r.header().metadata_len) as usize;
    let n = r.allocations().len();
    meta_end - 112 * (n - i) + byte
}

fn set64(img: &mut [u8], at: usize, v: u64) {
    img[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

#[test]
fn hostile_tables_are_refused_naming_the_allocations() {
    let table = small_table();
    let img = image(&table, 64);

    let mut t = img.clone();
    set64(&mut t, record_field(&img, 2, 8), 0x7f00_0000_0100); // 9 inside 7
    reseal(&mut t);
    let e = open(&t).unwrap_err();
    assert!(matches!(e, ImageError::Overlap { a: 7, b: 9, .. }), "{e}");

    let mut t = img.clone();
    set64(&mut t, record_field(&img, 0, 0), 9); // duplicate id
    reseal(&mut t);
    let e = open(&t).unwrap_err();
    assert!(matches!(e, ImageError::DuplicateId { id: 9 }), "{e}");

    let mut t = img.clone();
    set64(&mut t, record_field(&img, 0, 16), 301); // size of 7 no longer matches the data
    reseal(&mut t);
    let e = open(&t).unwrap_err();
    assert!(matches!(e, ImageError::DataOffset { id: 3, .. }), "{e}");
    assert!(
        e.to_string()
            .starts_with("allocation 3: data recorded at file offset"),
        "{e}"
    );

    let mut t = img.clone();
    set64(&mut t, record_field(&img, 2, 40), 12345); // data offset of 9
    reseal(&mut t);
    let e = open(&t).unwrap_err();
    assert!(
        matches!(
            e,
            ImageError::DataOffset {
                id: 9,
                recorded: 12345,
                ..
            }
        ),
        "{e}"
    );

    let mut t = img.clone();
    set64(&mut t, record_field(&img, 2, 16), u64::MAX - 3); // huge size
    reseal(&mut t);
    assert!(open(&t).is_err());

    // A count that cannot fit.
    let mut t = img.clone();
    let count_at = record_field(&img, 0, 0) - 12;
    set64(&mut t, count_at, u64::MAX);
    reseal(&mut t);
    let e = open(&t).unwrap_err();
    assert!(
        matches!(
            e,
            ImageError::Malformed {
                what: "allocation table",
                ..
            }
        ),
        "{e}"
    );
    assert!(
        e.to_string().contains("records of 112 bytes do not fit"),
        "{e}"
    );

    // An unknown record kind (a newer minor must flag what an older reader cannot read).
    let mut t = img.clone();
    t[record_field(&img, 1, 36)] = 7;
    reseal(&mut t);
    let e = open(&t).unwrap_err();
    assert!(e.to_string().contains("record kind 7"), "{e}");

    // Sections out of place.
    let mut t = img.clone();
    set64(&mut t, 48, 100); // data before the metadata ends
    reseal(&mut t);
    let e = open(&t).unwrap_err();
    assert!(
        matches!(
            e,
            ImageError::Malformed {
                what: "header",
                offset: 48,
                ..
            }
        ),
        "{e}"
    );
    let mut t = img.clone();
    set64(&mut t, 24, 0); // chunk size 0
    reseal(&mut t);
    assert!(matches!(open(&t), Err(ImageError::ChunkSize(0))));
}

#[test]
fn swapped_chunks_are_named() {
    // Two allocations of one chunk each and equal size: swap their chunks whole.
    let table = [
        AllocationRecord {
            id: 1,
            base: 0x1000,
            size: 32,
            order: 0,
            tag: 0,
            handle: None,
            device: 3,
        },
        AllocationRecord {
            id: 2,
            base: 0x2000,
            size: 32,
            order: 1,
            tag: 0,
            handle: None,
            device: 3,
        },
    ];
    let img = image(&table, 64);
    let r = open(&img).unwrap();
    let (a, b) = (
        r.allocation(1).unwrap().data_offset as usize,
        r.allocation(2).unwrap().data_offset as usize,
    );
    let mut t = img.clone();
    let ca = img[a..a + 64].to_vec();
    t[a..a + 64].copy_from_slice(&img[b..b + 64]);
    t[b..b + 64].copy_from_slice(&ca);
    let mut r = open(&t).unwrap();
    let e = r.verify().unwrap_err();
    assert!(
        matches!(
            e,
            ImageError::ChunkHeader {
                allocation: 1,
                found_allocation: 2,
                ..
            }
        ),
        "{e}"
    );
}

proptest::proptest! {
    /// Arbitrary bytes behind a valid magic and major version: an error, never a panic.
    #[test]
    fn arbitrary_bytes_never_panic(tail in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..600)) {
        let mut b = b"CUDAWIMG\x01\x00".to_vec();
        b.extend_from_slice(&tail);
        proptest::prop_assert!(open_verify_read(&b).is_err());
        // The same with a well-formed header length.
        if b.len() >= 16 {
            b[12..16].copy_from_slice(&128u32.to_le_bytes());
            proptest::prop_assert!(open_verify_read(&b).is_err());
        }
    }
}

#[test]
fn the_message_without_content_quotes_no_byte_of_the_file() {
    let e = open(b"root:$6$secret-hash:19000:0:99999:7:::\n").unwrap_err();
    assert!(e.to_string().contains("72 6f 6f 74"), "{e}");
    let m = e.message_without_content();
    assert_eq!(m, "not a cudaw image (bad magic)");
    let e = open(b"").unwrap_err();
    assert_eq!(e.message_without_content(), "not a cudaw image (bad magic)");
}
