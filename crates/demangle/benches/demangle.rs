//! Demangling PyTorch's kernel names: the fast path against `cpp_demangle`.
//!
//! `cargo bench -p cudaw-demangle`

use criterion::{criterion_group, criterion_main, Criterion, Throughput};

#[path = "../tests/fixture/mod.rs"]
mod fixture;

fn bench(c: &mut Criterion) {
    let names = fixture::torch_names();
    let mut g = c.benchmark_group("torch 2.11 kernel names (21,132)");
    g.throughput(Throughput::Elements(names.len() as u64));
    g.sample_size(10);
    g.bench_function("cudaw_demangle::demangle", |b| {
        b.iter(|| {
            names
                .iter()
                .map(|n| cudaw_demangle::demangle(n).len())
                .sum::<usize>()
        })
    });
    g.bench_function("cpp_demangle", |b| {
        b.iter(|| {
            names
                .iter()
                .map(|n| cudaw_demangle::reference(n).map_or(0, |s| s.len()))
                .sum::<usize>()
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
