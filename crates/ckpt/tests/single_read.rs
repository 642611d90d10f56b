//! A load that reads the image once ([`ImageReader::begin_load`], [`ImageReader::finish_load`]):
//! every chunk checked as it is loaded, the digest at the end, and no byte read twice.

mod common;

use ckpt::*;
use common::*;
use std::io::{Cursor, Read, Seek, SeekFrom};

/// A reader that counts the bytes read through it.
struct Counting<R> {
    inner: R,
    read: u64,
}

impl<R: Read> Read for Counting<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.read += n as u64;
        Ok(n)
    }
}

impl<R: Seek> Seek for Counting<R> {
    fn seek(&mut self, to: SeekFrom) -> std::io::Result<u64> {
        self.inner.seek(to)
    }
}

/// Several allocations of several chunks each (chunk size 4096), and an empty one.
fn table() -> Vec<AllocationRecord> {
    [40_000u64, 4096, 0, 12_289, 100]
        .iter()
        .enumerate()
        .map(|(i, &size)| AllocationRecord {
            id: 10 + i as u64,
            base: 0x7f00_0000_0000 + (i as u64) * 0x10_0000,
            size,
            order: i as u64,
            tag: 0,
            handle: None,
            device: 3,
        })
        .collect()
}

const CHUNK: u64 = 4096;

/// Loads every allocation the way a restore does (in `order`, each in chunk-sized
/// pieces), then finishes the load: the bytes loaded, or the first error.
fn load<R: Read + Seek>(
    r: &mut ImageReader<R>,
    order: &[usize],
) -> Result<Vec<Vec<u8>>, ImageError> {
    let records: Vec<AllocationRecord> = r.allocations().iter().map(|e| e.record).collect();
    r.begin_load();
    let mut out = vec![Vec::new(); records.len()];
    for &i in order {
        let rec = records[i];
        let mut buf = vec![0u8; rec.size as usize];
        for (k, piece) in buf.chunks_mut(CHUNK as usize).enumerate() {
            r.read_range(rec.id, k as u64 * CHUNK, piece)?;
        }
        out[i] = buf;
    }
    r.finish_load(|_| {})?;
    Ok(out)
}

#[test]
fn a_load_reads_the_image_once_in_any_order() {
    let t = table();
    let img = image(&t, CHUNK);
    for order in [
        vec![0, 1, 2, 3, 4],
        vec![4, 3, 2, 1, 0],
        vec![3, 0, 4, 2, 1],
    ] {
        let mut r = ImageReader::open(Counting {
            inner: Cursor::new(&img[..]),
            read: 0,
        })
        .expect("open");
        let loaded = load(&mut r, &order).expect("a good image loads");
        for (rec, bytes) in t.iter().zip(&loaded) {
            assert_eq!(bytes, &contents(rec), "allocation {}", rec.id);
        }
        let counted = r.bytes_read();
        let inner = r.into_inner();
        assert_eq!(inner.read, counted, "the reader counts what it reads");
        // The header, the metadata, the trailer and the end marker are read by `open`,
        // some of them twice (its first 16 bytes, the 24-byte trailer, the end marker):
        // at most a few hundred bytes over the length, never a second pass.
        let len = img.len() as u64;
        assert!(
            counted >= len - 32 && counted <= len + 512,
            "order {order:?}: {counted} bytes read of a {len}-byte image"
        );
    }
}

#[test]
fn finishing_a_load_reads_only_what_the_load_did_not() {
    let t = table();
    let img = image(&t, CHUNK);
    let mut r = ImageReader::open(Cursor::new(&img[..])).expect("open");
    r.begin_load();
    let mut buf = vec![0u8; 100];
    r.read_range(14, 0, &mut buf).expect("the small allocation");
    let before = r.bytes_read();
    let report = r.finish_load(|_| {}).expect("the rest is read and checked");
    let total: u64 = t.iter().map(|r| r.size).sum();
    assert_eq!(report.data_bytes, total);
    assert_eq!(report.chunks, r.header().chunk_count);
    assert_eq!(report.digest, r.trailer().digest);
    let rest = r.bytes_read() - before;
    assert!(
        rest >= total - 100 && rest < img.len() as u64,
        "{rest} bytes read to finish"
    );
}

/// The image with the byte at `at` inverted.
fn flipped(img: &[u8], at: u64) -> Vec<u8> {
    let mut b = img.to_vec();
    b[at as usize] ^= 0xff;
    b
}

#[test]
fn a_corrupt_chunk_fails_the_load_where_it_is_read() {
    let t = table();
    let img = image(&t, CHUNK);
    let r = ImageReader::open(Cursor::new(&img[..])).expect("open");
    let big = *r.allocation(10).expect("allocation 10");
    let last = *r.allocation(14).expect("allocation 14");
    // The middle chunk of the first allocation, and the image's last chunk.
    let middle = big.data_offset + 4 * (CHUNK + 32) + 24 + 7;
    let end = last.data_offset + 24 + 99;
    for (at, chunk, id) in [(middle, 4, 10), (end, 0, 14)] {
        let bad = flipped(&img, at);
        let mut r = ImageReader::open(Cursor::new(&bad[..])).expect("open: no data is read");
        match load(&mut r, &[0, 1, 2, 3, 4]) {
            Err(ImageError::ChunkChecksum {
                allocation,
                chunk: k,
                ..
            }) => assert_eq!((allocation, k), (id, chunk)),
            other => panic!("byte {at}: {other:?}"),
        }
    }
}

#[test]
fn a_changed_trailer_digest_fails_at_the_end() {
    let t = table();
    let img = image(&t, CHUNK);
    // The trailer's digest (the trailer: chunk count, bytes, digest, end marker).
    let digest_at = img.len() as u64 - 8 - 8;
    let bad = flipped(&img, digest_at);
    let mut r = ImageReader::open(Cursor::new(&bad[..])).expect("open");
    match load(&mut r, &[0, 1, 2, 3, 4]) {
        Err(ImageError::DigestMismatch { stored, computed }) => assert_ne!(stored, computed),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_file_cut_short_while_loading_fails_with_an_error() {
    use std::cell::Cell;
    use std::rc::Rc;
    /// A reader whose data ends at `end` (changed after `open` saw the whole file).
    struct Cut<'a> {
        inner: Cursor<&'a [u8]>,
        end: Rc<Cell<u64>>,
    }
    impl Read for Cut<'_> {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            let left = self.end.get().saturating_sub(self.inner.position()) as usize;
            let n = buf.len().min(left);
            self.inner.read(&mut buf[..n])
        }
    }
    impl Seek for Cut<'_> {
        fn seek(&mut self, to: SeekFrom) -> std::io::Result<u64> {
            self.inner.seek(to)
        }
    }
    let t = table();
    let img = image(&t, CHUNK);
    let end = Rc::new(Cell::new(u64::MAX));
    let mut r = ImageReader::open(Cut {
        inner: Cursor::new(&img[..]),
        end: Rc::clone(&end),
    })
    .expect("open");
    let cut = r.allocation(13).expect("allocation 13").data_offset + 100;
    end.set(cut);
    match load(&mut r, &[0, 1, 2, 3, 4]) {
        Err(ImageError::Truncated { at, .. }) => assert_eq!(at, cut),
        other => panic!("{other:?}"),
    }
}

/// Reads whole allocations (several chunks each) with `read_range_unchecked`, checking
/// them only after every read, as a loader checks on another thread; the checksums
/// handed back (all, or all but allocation `skip`'s) before the load finishes.
fn load_apart(
    r: &mut ImageReader<Cursor<&[u8]>>,
    skip: Option<u64>,
) -> Result<Vec<Vec<u8>>, ImageError> {
    let records: Vec<AllocationRecord> = r.allocations().iter().map(|e| e.record).collect();
    r.begin_load();
    let mut read = Vec::new();
    for rec in &records {
        let mut buf = vec![0u8; rec.size as usize];
        let chunks = r.read_range_unchecked(rec.id, 0, &mut buf)?;
        read.push((rec.id, buf, chunks));
    }
    let mut out = Vec::new();
    for (id, buf, chunks) in read {
        let sums = chunks.check(&buf)?;
        if skip != Some(id) {
            r.loaded_checked(&sums);
        }
        out.push(buf);
    }
    r.finish_load(|_| {})?;
    Ok(out)
}

#[test]
fn a_load_checked_apart_from_its_reads_is_the_same_load() {
    let t = table();
    let img = image(&t, CHUNK);
    let mut r = ImageReader::open(Cursor::new(&img[..])).expect("open");
    let loaded = load_apart(&mut r, None).expect("a good image loads");
    for (rec, bytes) in t.iter().zip(&loaded) {
        assert_eq!(bytes, &contents(rec), "allocation {}", rec.id);
    }
    let once = r.bytes_read();
    assert!(once <= img.len() as u64 + 512, "{once} bytes read");
    // A chunk whose checksum is not handed back is read again by the finish.
    let mut r = ImageReader::open(Cursor::new(&img[..])).expect("open");
    load_apart(&mut r, Some(10)).expect("loads");
    assert!(r.bytes_read() >= once + 40_000, "allocation 10 read again");

    let big = *r.allocation(10).expect("allocation 10");
    // A payload byte of its third chunk, then a header byte (its offset field) of it.
    let third = big.data_offset + 2 * (CHUNK + 32);
    let bad = flipped(&img, third + 24 + 5);
    let mut r = ImageReader::open(Cursor::new(&bad[..])).expect("open");
    match load_apart(&mut r, None) {
        Err(ImageError::ChunkChecksum {
            allocation, chunk, ..
        }) => assert_eq!((allocation, chunk), (10, 2)),
        other => panic!("{other:?}"),
    }
    let bad = flipped(&img, third + 9);
    let mut r = ImageReader::open(Cursor::new(&bad[..])).expect("open");
    match load_apart(&mut r, None) {
        Err(ImageError::ChunkHeader {
            allocation, chunk, ..
        }) => assert_eq!((allocation, chunk), (10, 2)),
        other => panic!("{other:?}"),
    }
}
