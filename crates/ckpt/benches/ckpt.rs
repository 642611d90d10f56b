//! Write and verify throughput of a 1 GiB image (8 allocations of 128 MiB, 8 MiB chunks):
//! writing to a sink from a staging buffer, verifying and reading from memory; raw XXH3-64
//! for reference. `cargo bench -p ckpt --bench ckpt`.

use std::hint::black_box;
use std::io::{self, Cursor};

use ckpt::*;
use criterion::{criterion_group, criterion_main, Criterion, Throughput};

const GIB: u64 = 1 << 30;
const ALLOC: u64 = 128 << 20;
const STAGING: usize = 16 << 20;

fn meta() -> ImageMetadata {
    ImageMetadata {
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
            name: "bench".into(),
            uuid: "GPU-0".into(),
            compute_capability_major: 9,
            compute_capability_minor: 0,
            total_memory: 80 * GIB,
            ordinal: Some(0),
        },
        other_gpus: Vec::new(),
    }
}

fn table() -> Vec<AllocationRecord> {
    (0..GIB / ALLOC)
        .map(|i| AllocationRecord {
            id: i,
            base: 0x7f00_0000_0000 + i * ALLOC,
            size: ALLOC,
            order: i,
            tag: 0,
            handle: None,
            device: 0,
        })
        .collect()
}

/// Writes the image from `staging` (each allocation's bytes are the staging buffer
/// repeated, as if copied from the device through it).
fn write<W: io::Write>(out: W, staging: &[u8]) -> W {
    let table = table();
    let mut w = ImageWriter::begin(out, &meta(), &table, WriterOptions::default()).unwrap();
    for a in &table {
        let mut off = 0;
        while off < a.size {
            let n = (staging.len() as u64).min(a.size - off) as usize;
            w.write_chunk(a.id, off, &staging[..n]).unwrap();
            off += n as u64;
        }
    }
    w.finish().unwrap()
}

fn bench(c: &mut Criterion) {
    let staging: Vec<u8> = (0..STAGING).map(|i| (i * 7 + i / 4096) as u8).collect();
    let mut g = c.benchmark_group("image_1GiB");
    g.sample_size(10);
    g.throughput(Throughput::Bytes(GIB));

    g.bench_function("xxh3_64_reference", |b| {
        b.iter(|| {
            let mut h = 0;
            for _ in 0..GIB / STAGING as u64 {
                h ^= xxhash_rust::xxh3::xxh3_64(black_box(&staging));
            }
            h
        })
    });
    g.bench_function("write_to_sink", |b| b.iter(|| write(io::sink(), &staging)));

    let image = write(Vec::with_capacity((GIB + (1 << 20)) as usize), &staging);
    g.bench_function("open_verify_from_memory", |b| {
        b.iter(|| {
            let mut r = ImageReader::open(Cursor::new(&image[..])).unwrap();
            r.verify().unwrap()
        })
    });
    let mut buf = vec![0u8; STAGING];
    g.bench_function("read_chunks_into_staging_from_memory", |b| {
        b.iter(|| {
            let mut r = ImageReader::open(Cursor::new(&image[..])).unwrap();
            for a in table() {
                let mut off = 0;
                while off < a.size {
                    let n = (buf.len() as u64).min(a.size - off) as usize;
                    r.read_range(a.id, off, &mut buf[..n]).unwrap();
                    off += n as u64;
                }
            }
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
