//! Criterion benches: address → allocation lookup with 100,000 live allocations, and
//! allocate + free over a backend whose calls cost nothing.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion};
use vmm::testing::NullBackend;
use vmm::{Config, Vmm};

const G: u64 = 2 << 20;

fn xorshift(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

/// 100,000 live allocations and 4096 random interior pointers into them. `mixed`: 99% uniform
/// in 1 B..200 KB, 1% up to 64 MiB (about 14 GB in all). Otherwise small: 90% up to 4 KiB, 9%
/// up to 1 MiB, 1% up to 64 MiB.
fn populated(config: Config, mixed: bool) -> (Vmm<NullBackend>, Vec<u64>) {
    let vmm = Vmm::new(NullBackend::new(G), config).unwrap();
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let allocs: Vec<_> = (0..100_000)
        .map(|_| {
            let r = xorshift(&mut x);
            let size = match (mixed, r % 100) {
                (_, 0) => (r >> 8) % (64 << 20) + 1,
                (true, _) => (r >> 8) % 200_000 + 1,
                (false, 1..=9) => (r >> 8) % (1 << 20) + 1,
                (false, _) => (r >> 8) % 4096 + 1,
            };
            vmm.alloc(size, 0).unwrap()
        })
        .collect();
    let ptrs = (0..4096)
        .map(|_| {
            let a = &allocs[(xorshift(&mut x) % allocs.len() as u64) as usize];
            a.base + xorshift(&mut x) % a.size
        })
        .collect();
    (vmm, ptrs)
}

fn lookup(c: &mut Criterion) {
    let cases = [
        ("mapped/100k_small", Config::mapped(), false),
        ("translated/100k_small", Config::translated(), false),
        ("mapped/100k_mixed", Config::mapped(), true),
        ("translated/100k_mixed", Config::translated(), true),
    ];
    for (name, config, mixed) in cases {
        let (vmm, ptrs) = populated(config, mixed);
        let mut i = 0usize;
        c.bench_function(&format!("lookup/{name}"), |b| {
            b.iter(|| {
                i = (i + 1) & 4095;
                black_box(vmm.lookup(black_box(ptrs[i])))
            })
        });
        c.bench_function(&format!("translate/{name}"), |b| {
            b.iter(|| {
                i = (i + 1) & 4095;
                black_box(vmm.translate(black_box(ptrs[i])))
            })
        });
    }
}

fn alloc_free(c: &mut Criterion) {
    for (name, config) in [
        ("mapped", Config::mapped()),
        ("translated", Config::translated()),
    ] {
        let (vmm, _) = populated(config, false);
        c.bench_function(&format!("alloc_free/{name}/256B/100k_live"), |b| {
            b.iter(|| {
                let a = vmm.alloc(black_box(256), 0).unwrap();
                vmm.free(a.base).unwrap();
            })
        });
        c.bench_function(&format!("alloc_free/{name}/8MiB/100k_live"), |b| {
            b.iter(|| {
                let a = vmm.alloc(black_box(8 << 20), 0).unwrap();
                vmm.free(a.base).unwrap();
            })
        });
    }
    // A burst: 1000 allocations of mixed small sizes, then free them all (per pair).
    let vmm = Vmm::new(NullBackend::new(G), Config::mapped()).unwrap();
    let mut bases = Vec::with_capacity(1000);
    c.bench_function("alloc_free/mapped/burst_1000_mixed_small(per pair)", |b| {
        b.iter_custom(|iters| {
            let start = std::time::Instant::now();
            for _ in 0..iters.div_ceil(1000) {
                for k in 0..1000u64 {
                    bases.push(vmm.alloc(256 + (k * 997) % 60_000, 0).unwrap().base);
                }
                for p in bases.drain(..) {
                    vmm.free(p).unwrap();
                }
            }
            start.elapsed() * iters as u32 / (iters.div_ceil(1000) * 1000) as u32
        })
    });
}

criterion_group!(benches, lookup, alloc_free);
criterion_main!(benches);
