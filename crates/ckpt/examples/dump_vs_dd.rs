//! Dump throughput against the disk's ceiling: writes an image of GIB GiB (allocations of
//! 256 MiB from host memory, 8 MiB chunks) through [`ckpt::ImageWriter`] into a new file in
//! DIR as `cudaw-ckpt dump` does (the engine's `write_image`: the writer over
//! [`cudaw_files::Streamed`], pieces of 8 MiB, then `fsync`), and times `dd if=/dev/zero
//! of=DIR/dd.bin bs=8M count=N conv=fsync` of the same size in the same folder, ROUNDS
//! times, alternating. Prints each round and the medians.
//!
//! ```sh
//! cargo run -p ckpt --example dump_vs_dd \
//!   --config 'profile.dev.package.ckpt.opt-level=3' \
//!   --config 'profile.dev.package.xxhash-rust.opt-level=3' -- DIR [GIB] [ROUNDS]
//! ```
//!
//! Each round also writes the image through a 1 MiB `BufWriter<File>` (the write path
//! before `Streamed`), for comparison in the same run.

use std::fs::File;
use std::io::BufWriter;
use std::path::Path;
use std::process::Command;
use std::time::Instant;

use ckpt::*;

const ALLOC: u64 = 256 << 20;
const PIECE: usize = 8 << 20;

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
            uuid: String::new(),
            compute_capability_major: 9,
            compute_capability_minor: 0,
            total_memory: 80 << 30,
            ordinal: Some(0),
        },
        other_gpus: Vec::new(),
    }
}

/// Writes the image of `bytes` bytes into `path`; returns the seconds it took (create to
/// fsync, as the engine's `write_ms`).
fn dump(path: &Path, bytes: u64, host: &[u8], plain: bool) -> f64 {
    let table: Vec<AllocationRecord> = (0..bytes / ALLOC)
        .map(|i| AllocationRecord {
            id: i,
            base: 0x7f00_0000_0000 + i * ALLOC,
            size: ALLOC,
            order: i,
            tag: 0,
            handle: None,
            device: 0,
        })
        .collect();
    let started = Instant::now();
    let file = File::create(path).expect("creating the image");
    let feed = |w: &mut dyn FnMut(u64, u64, &[u8])| {
        for a in &table {
            // The host copy of each allocation (here the same bytes each time).
            for (k, piece) in host[..a.size as usize].chunks(PIECE).enumerate() {
                w(a.id, (k * PIECE) as u64, piece);
            }
        }
    };
    if plain {
        let out = BufWriter::with_capacity(1 << 20, file);
        let mut w = ImageWriter::begin(out, &meta(), &table, WriterOptions::default()).unwrap();
        feed(&mut |id, off, piece| w.write_chunk(id, off, piece).unwrap());
        let out = w.finish().unwrap();
        out.into_inner().unwrap().sync_all().unwrap();
    } else {
        let out = cudaw_files::Streamed::new(file);
        let mut w = ImageWriter::begin(out, &meta(), &table, WriterOptions::default()).unwrap();
        feed(&mut |id, off, piece| w.write_chunk(id, off, piece).unwrap());
        let out = w.finish().unwrap();
        out.finish().unwrap();
    }
    started.elapsed().as_secs_f64()
}

/// `dd … conv=fsync` of `bytes` into `path`: seconds.
fn dd(path: &Path, bytes: u64) -> f64 {
    let started = Instant::now();
    let st = Command::new("dd")
        .arg("if=/dev/zero")
        .arg(format!("of={}", path.display()))
        .arg("bs=8M")
        .arg(format!("count={}", bytes >> 23))
        .arg("conv=fsync")
        .stderr(std::process::Stdio::null())
        .status()
        .expect("running dd");
    assert!(st.success(), "dd failed: {st}");
    started.elapsed().as_secs_f64()
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(dir) = args.first() else {
        eprintln!("usage: dump_vs_dd DIR [GIB] [ROUNDS]");
        std::process::exit(2);
    };
    let gib: u64 = args.get(1).map_or(2, |g| g.parse().expect("GIB"));
    let rounds: usize = args.get(2).map_or(3, |r| r.parse().expect("ROUNDS"));
    let bytes = gib << 30;
    let dir = Path::new(dir);
    let host: Vec<u8> = (0..ALLOC as usize)
        .map(|i| {
            (i as u64)
                .wrapping_mul(0x9e37_79b9_7f4a_7c15)
                .rotate_left(17) as u8
        })
        .collect();
    let (img, ddf) = (dir.join("bench.img"), dir.join("dd.bin"));
    // Per round: dd, the plain writer, Streamed (GB/s each).
    let mut runs: Vec<[f64; 3]> = Vec::new();
    for round in 0..rounds {
        let d = bytes as f64 / dd(&ddf, bytes) / 1e9;
        std::fs::remove_file(&ddf).ok();
        let mut w = [0.0; 2];
        for (i, plain) in [true, false].into_iter().enumerate() {
            let s = dump(&img, bytes, &host, plain);
            let len = std::fs::metadata(&img).map(|m| m.len()).unwrap_or(0);
            std::fs::remove_file(&img).ok();
            w[i] = len as f64 / s / 1e9;
        }
        println!(
            "round {round}: dd {d:.2} GB/s; BufWriter {:.2} GB/s = {:.2} of dd; Streamed {:.2} GB/s = {:.2} of dd",
            w[0],
            w[0] / d,
            w[1],
            w[1] / d
        );
        runs.push([d, w[0], w[1]]);
    }
    let med = |i: usize| median(&mut runs.iter().map(|r| r[i]).collect::<Vec<_>>());
    let ratio = |i: usize| median(&mut runs.iter().map(|r| r[i] / r[0]).collect::<Vec<_>>());
    println!(
        "{gib} GiB, {rounds} rounds, medians: dd {:.2} GB/s; BufWriter {:.2} GB/s ({:.2} of dd); Streamed {:.2} GB/s ({:.2} of dd)",
        med(0),
        med(1),
        ratio(1),
        med(2),
        ratio(2)
    );
}
