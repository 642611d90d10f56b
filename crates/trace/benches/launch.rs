//! What recording one launch costs the store under `CUDAW_TRACE=metrics` (the counters and
//! the memory history): a kernel with a few pointer arguments, and a multi-tensor kernel
//! (PyTorch's optimizers) whose argument table holds 110 pointers into two allocations and
//! 220 sizes, among 20 live allocations; a timeline launch as the shims record it; recording
//! one call in the timeline; writing calls and launches (their buffers resolved).
//!
//! ```text
//! cargo bench -p cudaw-trace --bench launch -- --warm-up-time 1 --measurement-time 3
//! ```

use criterion::{criterion_group, criterion_main, Criterion};
use cudaw_trace::{Config, Mode, Tracer};
use std::hint::black_box;

fn bench(c: &mut Criterion) {
    let t = Tracer::new(Config::new(Mode::Metrics));
    let base = 0x7f00_0000_0000u64;
    for i in 0..20u64 {
        t.record_alloc(base + i * (64 << 20), 32 << 20, "cudaMalloc", None);
    }
    let k = t.kernel_id("_Z6kernelPfS_S_i");
    let few: Vec<(u16, u64)> = vec![(0, base + 4096), (1, base + (64 << 20)), (2, 1024)];
    let mut table = Vec::new();
    for i in 0..110u64 {
        table.push((0u16, base + (3 << 26) + i * 4096));
        table.push((0u16, base + (5 << 26) + i * 8192));
        table.push((0u16, 4096 + i));
    }
    let mut g = c.benchmark_group("record_launch (metrics)");
    g.bench_function("3 words", |b| {
        b.iter(|| t.record_launch(k, [1, 1, 1], [128, 1, 1], 0, 0, 1, black_box(&few)))
    });
    g.bench_function("330 words (multi-tensor table)", |b| {
        b.iter(|| t.record_launch(k, [1, 1, 1], [128, 1, 1], 0, 0, 1, black_box(&table)))
    });
    g.finish();

    // A launch as PyTorch makes them, with the caches cold: 300 live allocations, 5
    // pointers into different ones, and 32 MiB of other memory touched between launches
    // (the program's own work): what reading one launch's buffers costs in a real job,
    // where the history is not in cache. The eviction's own time is measured apart and
    // taken off.
    for mode in [Mode::Metrics, Mode::Timeline] {
        let (t, k, five) = three_hundred(Config::new(mode));
        let mut other = vec![0u64; 4 << 20];
        let mut evict = |n: u64| {
            for (i, w) in other.iter_mut().enumerate().step_by(8) {
                *w = w.wrapping_add(n ^ i as u64);
            }
            black_box(&other);
        };
        let mut g = c.benchmark_group(format!(
            "record_launch, cold caches ({mode:?}, 300 allocations)"
        ));
        g.bench_function(
            "5 pointers, after 32 MiB of other work (eviction time taken off)",
            |b| {
                b.iter_custom(|iters| {
                    let (mut launch, mut alone) =
                        (std::time::Duration::ZERO, std::time::Duration::ZERO);
                    for n in 0..iters {
                        evict(n);
                        let s = std::time::Instant::now();
                        t.record_launch(k, [1, 1, 1], [128, 1, 1], 0, 0, 1, black_box(&five));
                        launch += s.elapsed();
                        evict(n);
                        let s = std::time::Instant::now();
                        black_box(&five);
                        alone += s.elapsed();
                    }
                    launch.saturating_sub(alone)
                })
            },
        );
        g.finish();
    }

    // The timeline's launch as the shims record it by default: the history looks up one
    // launch in 16 of the kernel; every launch's 5 words go into the ring as they are.
    let (t, k, five) = three_hundred(Config {
        buffer_sample: 16,
        ..Config::new(Mode::Timeline)
    });
    let mut g = c.benchmark_group("record_launch (timeline, history 1 in 16)");
    g.bench_function("5 pointers", |b| {
        b.iter(|| t.record_launch(k, [1, 1, 1], [128, 1, 1], 0, 0, 1, black_box(&five)))
    });
    g.finish();

    // The timeline: one call recorded, from one thread and from two at once.
    let t = Tracer::new(Config::new(Mode::Timeline));
    let f = t.register_functions(&["cudaGetDevice"]);
    let mut g = c.benchmark_group("record_call (timeline)");
    g.bench_function("1 thread", |b| b.iter(|| t.record_call(black_box(f), 1, 2)));
    g.bench_function("2 threads at once (per call of each)", |b| {
        b.iter_custom(|iters| {
            let start = std::time::Instant::now();
            std::thread::scope(|s| {
                for _ in 0..2 {
                    s.spawn(|| {
                        for _ in 0..iters {
                            t.record_call(black_box(f), 1, 2);
                        }
                    });
                }
            });
            start.elapsed()
        })
    });
    g.finish();
}

/// Writing the timeline (at exit, or `cudaw-ckpt trace`): 100000 calls, the bulk of a
/// real job's events.
fn write(c: &mut Criterion) {
    let t = Tracer::new(Config::new(Mode::Timeline));
    let f = t.register_functions(&["cudaGetDevice", "cudaStreamIsCapturing"]);
    for i in 0..100_000u64 {
        t.record_call(f + (i % 2) as u32, i * 100, i * 100 + 40);
    }
    let mut g = c.benchmark_group("write_timeline");
    g.sample_size(10);
    bench_write(&mut g, "100000 calls", &t);

    // Writing launches: their words resolved into the allocations live when they ran (the
    // ring's allocations and frees replayed back from the live ones): 20000 launches of 5
    // pointers among 300 allocations, 100 of them freed and made again between launches.
    let t = Tracer::new(Config::new(Mode::Timeline));
    let base = 0x7f00_0000_0000u64;
    for i in 0..300u64 {
        t.record_alloc(base + i * (4 << 20), 2 << 20, "cudaMalloc", None);
    }
    let k = t.kernel_id("_Z6kernelPfS_S_i");
    for n in 0..20_000u64 {
        let five: Vec<(u16, u64)> = (0..5u64)
            .map(|i| (i as u16, base + ((n + i * 53) % 300) * (4 << 20) + 4096))
            .collect();
        t.record_launch(k, [1, 1, 1], [128, 1, 1], 0, n, n + 1, &five);
        if n % 200 == 0 {
            let b = base + (n / 200 % 300) * (4 << 20);
            t.record_free(b);
            t.record_alloc(b, 2 << 20, "cudaMalloc", None);
        }
    }
    bench_write(&mut g, "20000 launches, 5 pointers each, resolved", &t);
    g.finish();
}

/// A tracer with 300 live allocations of 2 MiB (4 MiB apart), a kernel, and a launch's 5
/// words pointing into 5 of them, far apart.
fn three_hundred(cfg: Config) -> (Tracer, u32, Vec<(u16, u64)>) {
    let base = 0x7f00_0000_0000u64;
    let t = Tracer::new(cfg);
    for i in 0..300u64 {
        t.record_alloc(base + i * (4 << 20), 2 << 20, "cudaMalloc", None);
    }
    let k = t.kernel_id("_Z6kernelPfS_S_i");
    let five = (0..5u64)
        .map(|i| (i as u16, base + (17 + i * 53) * (4 << 20) + 4096))
        .collect();
    (t, k, five)
}

/// Times writing `t`'s timeline into memory.
fn bench_write(
    g: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    name: &str,
    t: &Tracer,
) {
    g.bench_function(name, |b| {
        let mut out = Vec::with_capacity(16 << 20);
        b.iter(|| {
            out.clear();
            t.write_timeline(&mut out, 1, "bench").unwrap()
        })
    });
}

criterion_group!(benches, bench, write);
criterion_main!(benches);
