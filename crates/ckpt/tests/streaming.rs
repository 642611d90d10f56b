//! A 1 GiB image written from a generator to a file and read back chunk by chunk, with the
//! process's heap measured: the writer holds no payload, the reader only the caller's buffer.
//! (Its own test binary: the counting allocator sees this test alone.)
//!
//! The file is a memfd: a real file, outside the heap, that needs no free disk (CI machines
//! have had less than 1 GiB free in their temporary folder).

use std::alloc::System;
use std::fs::File;
use std::io::{BufReader, BufWriter, Seek, SeekFrom};

use cap::Cap;
use ckpt::*;

#[global_allocator]
static HEAP: Cap<System> = Cap::new(System, usize::MAX);

const GIB: u64 = 1 << 30;
const CHUNK: u64 = 8 << 20;
/// The caller's staging buffer: not a multiple of the chunk size, so writes straddle chunks.
const PIECE: usize = 3 << 20;

/// Deterministic contents: a fixed pseudo-random pattern, each 4 KiB block stamped with
/// its allocation and offset so that no two blocks are alike (cheap even in a debug build).
fn generate(pattern: &[u8], id: u64, offset: u64, buf: &mut [u8]) {
    let shift = (offset % 4096) as usize;
    buf.copy_from_slice(&pattern[shift..shift + buf.len()]);
    let mut at = (4096 - shift) % 4096;
    while at < buf.len() {
        let mut stamp = [0u8; 16];
        stamp[..8].copy_from_slice(&id.to_le_bytes());
        stamp[8..].copy_from_slice(&(offset + at as u64).to_le_bytes());
        let n = 16.min(buf.len() - at);
        buf[at..at + n].copy_from_slice(&stamp[..n]);
        at += 4096;
    }
}

/// A random 4 KiB block, repeated (so that `pattern[o % 4096..]` continues at any offset).
fn pattern() -> Vec<u8> {
    let mut x = 0x1234_5678_9abc_def0u64;
    let block: Vec<u8> = (0..4096)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    block.repeat(2 * CHUNK as usize / 4096 + 1)
}

#[test]
fn one_gib_streams_in_bounded_memory() {
    // Five allocations adding up to 1 GiB, one of them not a multiple of the chunk size.
    let sizes = [512 << 20, 200 << 20, (100 << 20) + 4096, 64 << 20, 0];
    let mut sizes = sizes.to_vec();
    let rest = GIB - sizes.iter().sum::<u64>();
    sizes.push(rest);
    let mut table = Vec::new();
    let mut base = 0x7f00_0000_0000u64;
    for (i, &size) in sizes.iter().enumerate() {
        table.push(AllocationRecord {
            id: i as u64 + 1,
            base,
            size,
            order: i as u64,
            tag: 0,
            handle: None,
            device: 0,
        });
        base += size.next_multiple_of(2 << 20);
    }
    assert_eq!(table.iter().map(|a| a.size).sum::<u64>(), GIB);
    let meta = ImageMetadata {
        process: ProcessInfo {
            pid: 1,
            executable: "/bin/train".into(),
            hostname: "h".into(),
            cudaw_version: "0.1.0".into(),
            created_unix_nanos: 0,
            cuda_runtime_major: 13,
            addressing: Addressing::Mapped,
        },
        gpu: GpuInfo {
            name: "sim".into(),
            uuid: "GPU-0".into(),
            compute_capability_major: 9,
            compute_capability_minor: 0,
            total_memory: 80 * GIB,
            ordinal: Some(0),
        },
        other_gpus: Vec::new(),
    };
    let file = File::from(
        rustix::fs::memfd_create("streaming-test-image", rustix::fs::MemfdFlags::CLOEXEC).unwrap(),
    );
    let mut read_side = file.try_clone().unwrap();

    let pattern = pattern();
    let mut piece = vec![0u8; PIECE];
    let baseline = HEAP.allocated();
    let file = BufWriter::with_capacity(64 << 10, file);
    let mut w =
        ImageWriter::begin(file, &meta, &table, WriterOptions { chunk_size: CHUNK }).unwrap();
    let mut peak_during_write = 0;
    for a in &table {
        let mut off = 0;
        while off < a.size {
            let n = (PIECE as u64).min(a.size - off) as usize;
            generate(&pattern, a.id, off, &mut piece[..n]);
            w.write_chunk(a.id, off, &piece[..n]).unwrap();
            assert_eq!(w.buffered_bytes(), 0);
            peak_during_write = peak_during_write.max(HEAP.allocated());
            off += n as u64;
        }
    }
    let total = w.progress().total_bytes;
    w.finish().unwrap();
    let grown = HEAP.max_allocated().saturating_sub(baseline);
    // Header, metadata, table, a 64 KiB BufWriter: far below one chunk.
    assert!(
        grown < (1 << 20),
        "writing 1 GiB grew the heap by {grown} bytes"
    );
    assert!(peak_during_write - baseline < (1 << 20));
    assert_eq!(read_side.metadata().unwrap().len(), total);
    // The two handles share one offset: the reader starts where the writer stopped.
    read_side.seek(SeekFrom::Start(0)).unwrap();

    // Read back through a "pinned" buffer of two chunks, each chunk checked as it is read.
    let mut staging = vec![0u8; 2 * CHUNK as usize];
    let mut expect = vec![0u8; 2 * CHUNK as usize];
    let baseline = HEAP.allocated();
    let mut r = ImageReader::open(BufReader::with_capacity(64 << 10, read_side)).unwrap();
    assert!(r.check_against(&table).is_empty());
    for a in &table {
        let mut off = 0;
        while off < a.size {
            let n = (staging.len() as u64).min(a.size - off) as usize;
            r.read_range(a.id, off, &mut staging[..n]).unwrap();
            generate(&pattern, a.id, off, &mut expect[..n]);
            assert!(
                staging[..n] == expect[..n],
                "allocation {} differs at {off}",
                a.id
            );
            off += n as u64;
        }
    }
    let grown = HEAP.max_allocated().saturating_sub(baseline);
    assert!(
        grown < (1 << 20),
        "reading 1 GiB grew the heap by {grown} bytes"
    );
}
