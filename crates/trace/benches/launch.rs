//! What recording one launch costs the store under `CUDAW_TRACE=metrics` (the counters and
//! the memory history): a kernel with a few pointer arguments, and a multi-tensor kernel
//! (PyTorch's optimizers) whose argument table holds 110 pointers into two allocations and
//! 220 sizes, among 20 live allocations; and recording one call in the timeline.
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

criterion_group!(benches, bench);
criterion_main!(benches);
