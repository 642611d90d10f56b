//! Indexing and layout lookup on a ~300 MB fatbin (FATBIN.md: libtorch_cuda.so's
//! `.nv_fatbin` is 297 MB). Make the input first (once):
//!
//! ```text
//! crates/fatbin/benches/make_input.sh            # writes target/fatbin-bench/large.fatbin
//! CARGO_TARGET_DIR=target/h-fatbin cargo bench -p fatbin --bench large
//! ```
//!
//! `FATBIN_BENCH_INPUT=FILE` benchmarks another file instead (any input `Fatbin::parse`
//! takes, e.g. a `libtorch_cuda.so`).

use std::hint::black_box;
use std::io::Read;
use std::path::PathBuf;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use fatbin::{Compression, Fatbin};

const SM: u32 = 90;

fn input() -> Option<(PathBuf, Vec<u8>)> {
    let path = std::env::var_os("FATBIN_BENCH_INPUT")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/fatbin-bench/large.fatbin")
        });
    match std::fs::read(&path) {
        Ok(data) => Some((path, data)),
        Err(e) => {
            eprintln!(
                "SKIPPED: {}: {e}; run crates/fatbin/benches/make_input.sh first",
                path.display()
            );
            None
        }
    }
}

fn large(c: &mut Criterion) {
    let Some((path, data)) = input() else { return };
    let fb = Fatbin::parse(&data).expect("parse");
    let chosen = fb.select(SM);
    let compressed: usize = chosen.iter().map(|e| e.raw_payload.len()).sum();
    let uncompressed: u64 = chosen.iter().map(|e| e.uncompressed_size).sum();
    let first_name = chosen[0].kernels().expect("kernels")[0].name.clone();
    let kernels = fb.kernels_for_sm(SM).expect("kernels").len();
    eprintln!(
        "{}: {} bytes, {} containers, {} entries; sm_{SM} picks {} entries ({compressed} bytes \
         compressed, {uncompressed} uncompressed), {kernels} distinct kernels",
        path.display(),
        data.len(),
        fb.containers().len(),
        fb.entries().len(),
        chosen.len(),
    );
    drop(fb);

    let mut g = c.benchmark_group("large");
    g.sample_size(10).measurement_time(Duration::from_secs(20));
    g.bench_function("a_index_no_decompression", |b| {
        b.iter(|| Fatbin::parse(black_box(&data)).unwrap().entries().len())
    });
    g.bench_function("b_every_kernel_layout_sm90", |b| {
        b.iter(|| {
            let fb = Fatbin::parse(black_box(&data)).unwrap();
            fb.kernels_for_sm(SM).unwrap().len()
        })
    });
    g.bench_function("c_first_request_kernel_in_first_container", |b| {
        b.iter(|| {
            let fb = Fatbin::parse(black_box(&data)).unwrap();
            fb.kernel(&first_name, SM).unwrap().unwrap().params.len()
        })
    });
    g.bench_function("c_first_request_from_registered_container", |b| {
        // What the shim does: the wrapper gives one container; index exactly its bytes.
        b.iter(|| {
            let len = fatbin::container_len(black_box(&data[..16])).unwrap() as usize;
            let fb = Fatbin::parse(&data[..len]).unwrap();
            fb.kernel(&first_name, SM).unwrap().unwrap().params.len()
        })
    });
    g.bench_function("c_first_request_absent_name_full_scan", |b| {
        b.iter(|| {
            let fb = Fatbin::parse(black_box(&data)).unwrap();
            fb.kernel("no_such_kernel", SM).unwrap().is_none()
        })
    });
    g.bench_function("c_cached_request", |b| {
        let fb = Fatbin::parse(&data).unwrap();
        fb.kernel(&first_name, SM).unwrap();
        b.iter(|| {
            fb.kernel(black_box(&first_name), SM)
                .unwrap()
                .unwrap()
                .params
                .len()
        })
    });

    // The zstd decoder choice: the C library (used) against ruzstd (pure Rust), on the
    // entries sm_90 picks.
    let fb = Fatbin::parse(&data).unwrap();
    let zstd_entries: Vec<_> = fb
        .select(SM)
        .into_iter()
        .filter(|e| e.compression == Compression::Zstd)
        .collect();
    g.bench_function("d_decompress_sm90_zstd_c", |b| {
        b.iter(|| {
            zstd_entries
                .iter()
                .map(|e| e.payload().unwrap().len())
                .sum::<usize>()
        })
    });
    g.bench_function("d_decompress_sm90_ruzstd", |b| {
        b.iter(|| {
            zstd_entries
                .iter()
                .map(|e| {
                    let input = &e.raw_payload[..e.compressed_size as usize];
                    let mut out = Vec::with_capacity(e.uncompressed_size as usize);
                    ruzstd::decoding::StreamingDecoder::new(input)
                        .unwrap()
                        .read_to_end(&mut out)
                        .unwrap();
                    out.len()
                })
                .sum::<usize>()
        })
    });
    // ruzstd's whole-frame decoder into the reserved output (its fastest way, no Read).
    g.bench_function("d_decompress_sm90_ruzstd_decode_all", |b| {
        let mut d = ruzstd::decoding::FrameDecoder::new();
        b.iter(|| {
            zstd_entries
                .iter()
                .map(|e| {
                    let input = &e.raw_payload[..e.compressed_size as usize];
                    let mut out = Vec::with_capacity(e.uncompressed_size as usize);
                    d.decode_all_to_vec(input, &mut out).unwrap();
                    out.len()
                })
                .sum::<usize>()
        })
    });
    g.finish();
}

criterion_group!(benches, large);
criterion_main!(benches);
