//! Scenario tests of the VMM over the checking host backend.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use vmm::testing::{HostBackend, Op};
use vmm::{
    Addressing, Allocation, Backend, Budget, ChunkPolicy, Config, HostCopy, HostStaging, LoadRange,
    Residency, Source, Staging, StagingError, StagingRange, Vmm, VmmError,
};

const MIB: u64 = 1 << 20;
const G: u64 = 2 * MIB;

fn mapped(limit: Option<u64>) -> Vmm<HostBackend> {
    let config = Config {
        memory_limit: limit,
        ..Config::mapped()
    };
    Vmm::new(HostBackend::new(G), config).unwrap()
}

fn fill(vmm: &Vmm<HostBackend>, a: &Allocation, seed: u8) -> Vec<u8> {
    let data: Vec<u8> = (0..a.size)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect();
    vmm.backend()
        .copy_from_host(vmm.translate(a.base).unwrap(), &data)
        .unwrap();
    data
}

fn read(vmm: &Vmm<HostBackend>, a: &Allocation) -> Vec<u8> {
    let mut buf = vec![0; a.size as usize];
    vmm.backend()
        .copy_to_host(&mut buf, vmm.translate(a.base).unwrap())
        .unwrap();
    buf
}

fn assert_empty(vmm: &Vmm<HostBackend>) {
    let s = vmm.stats();
    assert_eq!(
        (
            s.allocations,
            s.requested,
            s.mapped,
            s.committed,
            s.resident,
            s.evicted,
            s.chunks
        ),
        (0, 0, 0, 0, 0, 0, 0)
    );
    let b = vmm.backend();
    assert_eq!(
        (b.physical_count(), b.mapping_count(), b.linear_count()),
        (0, 0, 0)
    );
    assert!(b.violations().is_empty(), "{:?}", b.violations());
}

#[test]
fn alloc_free_alignment_lookup() {
    let vmm = mapped(None);
    let a = vmm.alloc(100, 7).unwrap();
    let b = vmm.alloc(300, 7).unwrap();
    let c = vmm.alloc(5 * MIB, 9).unwrap();
    for x in [&a, &b, &c] {
        assert_eq!(x.base % 256, 0);
        assert_eq!(vmm.lookup(x.base + x.size - 1).unwrap().id, x.id);
        assert_eq!(vmm.translate(x.base + 3), Some(x.base + 3));
    }
    assert_eq!(c.base % G, 0);
    assert_eq!(c.tag, 9);
    assert!(a.order < b.order && b.order < c.order);
    // Each slab class has its own shared chunk; the large one has its own 6 MiB.
    assert_eq!(vmm.stats().mapped, 2 * G + 6 * MIB);
    let d = vmm.alloc(200, 7).unwrap();
    assert_eq!(vmm.stats().mapped, 2 * G + 6 * MIB, "d shares a's granule");
    assert_eq!(d.base, a.base + 256);
    vmm.free(d.base).unwrap();
    assert_eq!(vmm.stats().requested, 100 + 300 + 5 * MIB);
    assert_eq!(
        vmm.free(a.base + 16),
        Err(VmmError::NotABase {
            ptr: a.base + 16,
            base: a.base
        })
    );
    assert_eq!(vmm.free(1), Err(VmmError::NotAllocated { ptr: 1 }));
    assert_eq!(vmm.free(1).unwrap_err().cuda_error_code(), 1);
    assert_eq!(vmm.alloc(0, 0), Err(VmmError::ZeroSize));
    vmm.free(a.base).unwrap();
    assert_eq!(
        vmm.free(a.base),
        Err(VmmError::NotAllocated { ptr: a.base })
    );
    vmm.free(b.base).unwrap();
    vmm.free(c.base).unwrap();
    assert_empty(&vmm);
    assert_eq!(vmm.backend().reservation_count(), 1);
    vmm.release_all().unwrap();
    assert_eq!(vmm.backend().reservation_count(), 0);
}

#[test]
fn hundred_thousand_small_allocations_share_granules() {
    let vmm = mapped(None);
    let ptrs: Vec<u64> = (0..100_000)
        .map(|_| vmm.alloc(256, 0).unwrap().base)
        .collect();
    let granules = vmm.stats().mapped / G;
    // 100,000 × 256 B = 24.4 MiB = 13 granules when packed.
    assert!(granules <= 13, "{granules} granules");
    assert_eq!(vmm.backend().physical_count() as u64, granules);
    let mut sorted = ptrs.clone();
    sorted.sort_unstable();
    sorted.dedup();
    assert_eq!(sorted.len(), 100_000);
    for p in ptrs {
        vmm.free(p).unwrap();
    }
    assert_empty(&vmm);
}

#[test]
fn limit_is_exact() {
    let vmm = mapped(Some(4 * G));
    let allocs: Vec<_> = (0..4).map(|_| vmm.alloc(G, 0).unwrap()).collect();
    let err = vmm.alloc(1, 0).unwrap_err();
    assert_eq!(
        err,
        VmmError::OutOfMemory {
            requested: 1,
            physical: G,
            limit: 4 * G,
            used: 4 * G
        }
    );
    assert_eq!(err.cuda_error_code(), 2);
    // Refused before the backend was asked.
    assert_eq!(vmm.backend().calls(Op::CreatePhysical), 4);
    vmm.free(allocs[0].base).unwrap();
    let x = vmm.alloc(G - 1, 0).unwrap();
    assert_eq!(vmm.stats().mapped, 4 * G);
    vmm.set_memory_limit(Some(5 * G));
    let (free, total) = vmm.memory_info().unwrap();
    assert_eq!((free, total), (G, 5 * G));
    for a in &allocs[1..] {
        vmm.free(a.base).unwrap();
    }
    vmm.free(x.base).unwrap();
    assert_empty(&vmm);
}

#[test]
fn evict_restore_roundtrip_mapped() {
    let vmm = mapped(None);
    let allocs: Vec<_> = [100, 256, 4000, 3 * MIB, 70_000]
        .iter()
        .map(|&s| vmm.alloc(s, 0).unwrap())
        .collect();
    let data: Vec<_> = allocs
        .iter()
        .enumerate()
        .map(|(i, a)| fill(&vmm, a, i as u8))
        .collect();
    let moved = vmm.evict_all(&mut HostStaging).unwrap();
    assert_eq!(moved.allocations, 5);
    assert!(vmm.is_paused());
    assert_eq!(vmm.backend().physical_count(), 0);
    assert_eq!(vmm.backend().mapping_count(), 0);
    let s = vmm.stats();
    assert_eq!((s.mapped, s.committed, s.resident), (0, 0, 0));
    assert_eq!(s.evicted, s.requested);
    assert!(matches!(
        vmm.alloc(10, 0),
        Err(VmmError::Paused { size: 10 })
    ));
    // Evicted memory really is gone: the backend refuses to read it.
    let mut buf = [0u8; 4];
    assert_eq!(
        vmm.backend()
            .copy_to_host(&mut buf, allocs[0].base)
            .unwrap_err()
            .code,
        700
    );
    assert_eq!(vmm.backend().faults(), 1);
    for a in vmm.snapshot() {
        assert_eq!(a.residency, Residency::EvictedToHost);
    }
    vmm.with_host_copy(allocs[1].id, |b| assert_eq!(b, &data[1][..]))
        .unwrap();
    let moved = vmm.restore_all(&mut HostStaging).unwrap();
    assert_eq!(moved.allocations, 5);
    assert!(!vmm.is_paused());
    for (a, d) in allocs.iter().zip(&data) {
        assert_eq!(vmm.lookup(a.base).unwrap().base, a.base);
        assert_eq!(&read(&vmm, a), d);
    }
    for a in &allocs {
        vmm.free(a.base).unwrap();
    }
    assert_empty(&vmm);
}

#[test]
fn shared_granule_released_only_when_all_evicted() {
    let vmm = mapped(None);
    let a = vmm.alloc(256, 0).unwrap();
    let b = vmm.alloc(256, 0).unwrap();
    let da = fill(&vmm, &a, 1);
    let db = fill(&vmm, &b, 2);
    vmm.evict(&[a.id], &mut HostStaging).unwrap();
    assert_eq!(
        vmm.backend().physical_count(),
        1,
        "b still resident in the granule"
    );
    assert_eq!(
        vmm.lookup(a.base).unwrap().residency,
        Residency::EvictedToHost
    );
    // Allocation continues while only some allocations are evicted.
    let c = vmm.alloc(256, 0).unwrap();
    let m = vmm.evict(&[b.id], &mut HostStaging).unwrap();
    assert_eq!(m.chunks, 0, "c keeps the granule");
    let m = vmm.evict(&[c.id], &mut HostStaging).unwrap();
    assert_eq!(m.chunks, 1);
    assert_eq!(vmm.backend().physical_count(), 0);
    assert!(matches!(
        vmm.evict(&[c.id], &mut HostStaging),
        Err(VmmError::WrongResidency { .. })
    ));
    vmm.restore(&[b.id], &mut HostStaging).unwrap();
    assert_eq!(read(&vmm, &b), db);
    vmm.restore(&[a.id], &mut HostStaging).unwrap();
    assert_eq!(read(&vmm, &a), da);
    // Freeing an evicted allocation drops its copy.
    vmm.free(c.base).unwrap();
    vmm.free(a.base).unwrap();
    vmm.free(b.base).unwrap();
    assert_empty(&vmm);
}

#[test]
fn free_while_evicted_releases_everything() {
    let vmm = mapped(None);
    let a = vmm.alloc(256, 0).unwrap();
    let b = vmm.alloc(8 * MIB, 0).unwrap();
    vmm.evict_all(&mut HostStaging).unwrap();
    vmm.free(a.base).unwrap();
    vmm.free(b.base).unwrap();
    assert_empty(&vmm);
    vmm.restore_all(&mut HostStaging).unwrap();
    assert!(!vmm.is_paused());
    vmm.alloc(1, 0).map(|a| vmm.free(a.base).unwrap()).unwrap();
}

#[test]
fn translated_addressing() {
    let vmm = Vmm::new(HostBackend::new(G), Config::translated()).unwrap();
    let a = vmm.alloc(1000, 1).unwrap();
    let b = vmm.alloc(256, 1).unwrap();
    assert!(a.base >= vmm::config::DEFAULT_TRANSLATED_BASE);
    assert_ne!(a.backing, a.base);
    assert_eq!(vmm.translate(a.base + 999), Some(a.backing + 999));
    assert_eq!(
        vmm.translate(a.base + 1000),
        Some(a.backing + 1000),
        "one past the end"
    );
    assert_eq!(vmm.translate(b.base + 10), Some(b.backing + 10));
    assert_eq!(vmm.translate(0x1234), None);
    assert!(vmm.in_translated_range(a.base) && !vmm.in_translated_range(a.backing));
    let da = fill(&vmm, &a, 5);
    vmm.evict_all(&mut HostStaging).unwrap();
    assert_eq!(vmm.translate(a.base), None);
    assert_eq!(vmm.backend().linear_count(), 0);
    vmm.restore_all(&mut HostStaging).unwrap();
    assert_eq!(read(&vmm, &a), da);
    assert_eq!(vmm.lookup(a.base + 5).unwrap().id, a.id);
    vmm.free(a.base).unwrap();
    vmm.free(b.base).unwrap();
    assert_empty(&vmm);
}

#[test]
fn backend_failures_roll_back() {
    let vmm = mapped(None);
    vmm.backend().fail_next(Op::Map, 1);
    assert!(matches!(vmm.alloc(256, 0), Err(VmmError::Backend(_))));
    assert_empty(&vmm);
    vmm.backend().fail_next(Op::CreatePhysical, 1);
    assert!(matches!(vmm.alloc(10 * MIB, 0), Err(VmmError::Backend(_))));
    assert_empty(&vmm);
    let a = vmm.alloc(10 * MIB, 0).unwrap();
    let d = fill(&vmm, &a, 3);
    // A failing copy-out leaves everything resident.
    vmm.backend().fail_next(Op::CopyToHost, 1);
    assert!(matches!(
        vmm.evict_all(&mut HostStaging),
        Err(VmmError::Staging(_))
    ));
    assert!(!vmm.is_paused());
    assert_eq!(vmm.lookup(a.base).unwrap().residency, Residency::Resident);
    assert_eq!(read(&vmm, &a), d);
    vmm.evict_all(&mut HostStaging).unwrap();
    // A failing re-creation or copy-in leaves it evicted with its copy.
    vmm.backend().fail_next(Op::CreatePhysical, 1);
    assert!(vmm.restore_all(&mut HostStaging).is_err());
    vmm.backend().fail_next(Op::CopyFromHost, 1);
    assert!(vmm.restore_all(&mut HostStaging).is_err());
    assert_eq!(vmm.backend().physical_count(), 0);
    assert_eq!(vmm.stats().committed, 0);
    vmm.restore_all(&mut HostStaging).unwrap();
    assert_eq!(read(&vmm, &a), d);
    vmm.free(a.base).unwrap();
    // Device out of memory surfaces as cudaErrorMemoryAllocation.
    let small = Vmm::new(HostBackend::new(G).with_capacity(2 * G), Config::mapped()).unwrap();
    let err = small.alloc(3 * G, 0).unwrap_err();
    assert_eq!(err.cuda_error_code(), 2);
    assert_empty(&vmm);
}

#[test]
fn restore_respects_limit() {
    let vmm = mapped(Some(2 * G));
    let a = vmm.alloc(G, 0).unwrap();
    vmm.evict(&[a.id], &mut HostStaging).unwrap();
    let b = vmm.alloc(2 * G, 0).unwrap();
    let err = vmm.restore(&[a.id], &mut HostStaging).unwrap_err();
    assert!(matches!(err, VmmError::OutOfMemory { .. }), "{err}");
    assert_eq!(vmm.backend().peak_physical_bytes(), 2 * G);
    vmm.free(b.base).unwrap();
    vmm.restore(&[a.id], &mut HostStaging).unwrap();
    vmm.free(a.base).unwrap();
    assert_empty(&vmm);
}

/// A staging that "writes" to a file: keeps bytes in a map by offset.
#[derive(Default)]
struct FileStaging {
    file: Vec<u8>,
}

impl<B: Backend + ?Sized> Staging<B> for FileStaging {
    fn save(
        &mut self,
        backend: &B,
        ranges: &[StagingRange],
    ) -> Result<Vec<HostCopy>, StagingError> {
        let mut out = Vec::new();
        for r in ranges {
            let offset = self.file.len() as u64;
            let mut buf = vec![0; r.len as usize];
            backend.copy_to_host(&mut buf, r.addr)?;
            self.file.extend_from_slice(&buf);
            out.push(HostCopy::File { offset });
        }
        Ok(out)
    }

    fn load(&mut self, backend: &B, ranges: &[LoadRange<'_>]) -> Result<(), StagingError> {
        for r in ranges {
            let Source::File { offset } = r.source else {
                return Err(StagingError::Unsupported {
                    id: r.id,
                    source_kind: r.source.kind(),
                });
            };
            backend.copy_from_host(
                r.addr,
                &self.file[offset as usize..(offset + r.len) as usize],
            )?;
        }
        Ok(())
    }
}

#[test]
fn file_staging_and_mark_in_file() {
    let vmm = mapped(None);
    let a = vmm.alloc(5000, 0).unwrap();
    let b = vmm.alloc(300, 0).unwrap();
    let da = fill(&vmm, &a, 1);
    let db = fill(&vmm, &b, 2);
    let mut fs = FileStaging::default();
    vmm.evict_all(&mut fs).unwrap();
    assert!(matches!(
        vmm.lookup(a.base).unwrap().residency,
        Residency::InFile { .. }
    ));
    assert!(matches!(
        vmm.with_host_copy(a.id, |_| ()),
        Err(VmmError::NoHostCopy { .. })
    ));
    vmm.restore_all(&mut fs).unwrap();
    assert_eq!(read(&vmm, &a), da);
    assert_eq!(read(&vmm, &b), db);
    // In-memory eviction, then a checkpoint moves the copy to a file.
    vmm.evict_all(&mut HostStaging).unwrap();
    let mut image = FileStaging::default();
    for x in [&a, &b] {
        let offset = image.file.len() as u64;
        vmm.with_host_copy(x.id, |bytes| image.file.extend_from_slice(bytes))
            .unwrap();
        vmm.mark_in_file(x.id, offset).unwrap();
        assert_eq!(
            vmm.lookup(x.base).unwrap().residency,
            Residency::InFile { offset }
        );
    }
    // The plain staging cannot read files: restore fails and changes nothing.
    assert!(matches!(
        vmm.restore_all(&mut HostStaging),
        Err(VmmError::Staging(StagingError::Unsupported { .. }))
    ));
    vmm.restore_all(&mut image).unwrap();
    assert_eq!(read(&vmm, &a), da);
    assert_eq!(read(&vmm, &b), db);
    vmm.free(a.base).unwrap();
    vmm.free(b.base).unwrap();
    assert_empty(&vmm);
}

struct CountingBudget {
    left: AtomicU64,
}

impl Budget for CountingBudget {
    fn acquire(&self, bytes: u64) -> bool {
        self.left
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |l| l.checked_sub(bytes))
            .is_ok()
    }
    fn release(&self, bytes: u64) {
        self.left.fetch_add(bytes, Ordering::SeqCst);
    }
}

#[test]
fn budget_is_consulted() {
    let budget = Arc::new(CountingBudget {
        left: AtomicU64::new(3 * G),
    });
    let vmm = Vmm::with_budget(HostBackend::new(G), Config::mapped(), budget.clone()).unwrap();
    let a = vmm.alloc(2 * G, 0).unwrap();
    assert_eq!(
        vmm.alloc(2 * G, 0),
        Err(VmmError::BudgetExceeded { physical: 2 * G })
    );
    assert_eq!(vmm.backend().calls(Op::CreatePhysical), 1);
    vmm.evict_all(&mut HostStaging).unwrap();
    assert_eq!(budget.left.load(Ordering::SeqCst), 3 * G);
    vmm.restore_all(&mut HostStaging).unwrap();
    vmm.free(a.base).unwrap();
    assert_eq!(budget.left.load(Ordering::SeqCst), 3 * G);
    assert_empty(&vmm);
}

#[test]
fn reservations_grow() {
    let config = Config {
        reservation_size: 8 * G,
        ..Config::mapped()
    };
    let vmm = Vmm::new(HostBackend::new(G), config).unwrap();
    let a: Vec<_> = (0..6).map(|_| vmm.alloc(3 * G, 0).unwrap()).collect();
    assert!(vmm.backend().reservation_count() >= 3);
    let big = vmm.alloc(20 * G, 0).unwrap();
    assert_eq!(
        vmm.stats().reserved,
        vmm.backend().reservation_count() as u64 * 8 * G + 12 * G
    );
    for x in a.iter().chain([&big]) {
        vmm.free(x.base).unwrap();
    }
    assert_empty(&vmm);
}

#[test]
fn no_sharing_policy_and_config_errors() {
    let config = Config {
        chunking: ChunkPolicy {
            slab_chunk_granules: 1,
            max_small: Some(0),
        },
        ..Config::mapped()
    };
    let vmm = Vmm::new(HostBackend::new(G), config).unwrap();
    let a = vmm.alloc(256, 0).unwrap();
    let b = vmm.alloc(256, 0).unwrap();
    assert_eq!(vmm.backend().physical_count(), 2);
    vmm.free(a.base).unwrap();
    vmm.free(b.base).unwrap();
    let bad = Config {
        chunking: ChunkPolicy {
            slab_chunk_granules: 0,
            max_small: None,
        },
        ..Config::mapped()
    };
    assert!(matches!(
        Vmm::new(HostBackend::new(G), bad),
        Err(VmmError::InvalidConfig { .. })
    ));
    let bad = Config {
        translated_base: 7,
        ..Config::translated()
    };
    assert!(matches!(
        Vmm::new(HostBackend::new(G), bad),
        Err(VmmError::InvalidConfig { .. })
    ));
    assert_eq!(
        "translated".parse::<Addressing>(),
        Ok(Addressing::Translated)
    );
}

#[test]
fn threads_share_a_fresh_chunk() {
    let vmm = Arc::new(
        Vmm::new(
            HostBackend::new(G).with_create_delay(Duration::from_millis(50)),
            Config::mapped(),
        )
        .unwrap(),
    );
    let handles: Vec<_> = (0..8)
        .map(|_| {
            let vmm = vmm.clone();
            std::thread::spawn(move || vmm.alloc(256, 0).unwrap())
        })
        .collect();
    let allocs: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    assert_eq!(
        vmm.backend().physical_count(),
        1,
        "one chunk, not one per thread"
    );
    for a in allocs {
        vmm.free(a.base).unwrap();
    }
    assert_empty(&vmm);
}

#[test]
fn threads_at_the_limit() {
    let limit = 16 * MIB;
    let config = Config {
        memory_limit: Some(limit),
        ..Config::mapped()
    };
    let backend = HostBackend::new(256 << 10).with_create_delay(Duration::from_micros(50));
    let vmm = Arc::new(Vmm::new(backend, config).unwrap());
    let handles: Vec<_> = (0..6u64)
        .map(|t| {
            let vmm = vmm.clone();
            std::thread::spawn(move || {
                let mut live = Vec::new();
                let mut ooms = 0;
                let mut x = t * 7919 + 1;
                for _ in 0..1500 {
                    x = x
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    let size = match (x >> 33) % 4 {
                        0 => (x >> 40) % 2048 + 1,
                        1 => (x >> 40) % (40 << 10) + 1,
                        _ => (x >> 40) % (3 * MIB) + 1,
                    };
                    if (x >> 20) % 3 != 0 || live.is_empty() {
                        match vmm.alloc(size, t as u32) {
                            Ok(a) => live.push(a.base),
                            Err(VmmError::OutOfMemory {
                                limit: l,
                                used,
                                physical,
                                ..
                            }) => {
                                assert!(used + physical > l);
                                ooms += 1;
                            }
                            Err(e) => panic!("{e}"),
                        }
                    } else {
                        let i = (x >> 45) as usize % live.len();
                        vmm.free(live.swap_remove(i)).unwrap();
                    }
                    assert!(vmm.stats().mapped <= limit);
                }
                for p in live {
                    vmm.free(p).unwrap();
                }
                ooms
            })
        })
        .collect();
    let ooms: u64 = handles.into_iter().map(|h| h.join().unwrap()).sum();
    assert!(ooms > 0, "the test should reach the limit");
    assert!(
        vmm.backend().peak_physical_bytes() <= limit,
        "peak {}",
        vmm.backend().peak_physical_bytes()
    );
    assert!(vmm.stats().peak_mapped <= limit);
    assert_empty(&vmm);
}

#[test]
fn threads_fill_exactly_to_the_limit() {
    let config = Config {
        memory_limit: Some(10 * G),
        ..Config::mapped()
    };
    let vmm = Arc::new(
        Vmm::new(
            HostBackend::new(G).with_create_delay(Duration::from_millis(2)),
            config,
        )
        .unwrap(),
    );
    let handles: Vec<_> = (0..4)
        .map(|_| {
            let vmm = vmm.clone();
            std::thread::spawn(move || {
                let mut got = Vec::new();
                while let Ok(a) = vmm.alloc(G, 0) {
                    got.push(a.base);
                }
                got
            })
        })
        .collect();
    let got: Vec<u64> = handles
        .into_iter()
        .flat_map(|h| h.join().unwrap())
        .collect();
    assert_eq!(got.len(), 10);
    assert_eq!(vmm.backend().peak_physical_bytes(), 10 * G);
    for p in got {
        vmm.free(p).unwrap();
    }
    assert_empty(&vmm);
}

#[test]
fn pause_with_concurrent_allocators() {
    let vmm = Arc::new(Vmm::new(HostBackend::new(64 << 10), Config::mapped()).unwrap());
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let workers: Vec<_> = (0..3u64)
        .map(|t| {
            let (vmm, stop) = (vmm.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut live: Vec<u64> = Vec::new();
                let mut i = t;
                while !stop.load(Ordering::Relaxed) {
                    i += 1;
                    match vmm.alloc(256 * (i % 700 + 1), 0) {
                        Ok(a) => live.push(a.base),
                        Err(VmmError::Paused { .. }) => std::thread::yield_now(),
                        Err(e) => panic!("{e}"),
                    }
                    if live.len() > 50 {
                        vmm.free(live.remove(0)).unwrap();
                    }
                }
                live
            })
        })
        .collect();
    for _ in 0..20 {
        vmm.evict_all(&mut HostStaging).unwrap();
        assert_eq!(vmm.backend().physical_count(), 0);
        assert_eq!(vmm.stats().resident, 0);
        vmm.restore_all(&mut HostStaging).unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        for p in w.join().unwrap() {
            vmm.free(p).unwrap();
        }
    }
    assert_empty(&vmm);
}

/// Counts the batches a restore hands over.
struct Counting(usize);

impl<B: vmm::Backend + ?Sized> Staging<B> for Counting {
    fn save(
        &mut self,
        backend: &B,
        ranges: &[vmm::StagingRange],
    ) -> Result<Vec<vmm::HostCopy>, vmm::StagingError> {
        HostStaging.save(backend, ranges)
    }

    fn load(
        &mut self,
        backend: &B,
        ranges: &[vmm::LoadRange<'_>],
    ) -> Result<(), vmm::StagingError> {
        self.0 += 1;
        HostStaging.load(backend, ranges)
    }
}

#[test]
fn restores_of_many_chunks_load_while_mapping_and_roll_back() {
    let vmm = mapped(None);
    // 24 chunks of 12 MiB: more than one load batch's worth, so loads may overlap the
    // mapping.
    let allocs: Vec<Allocation> = (0..24).map(|_| vmm.alloc(12 * MIB, 0).unwrap()).collect();
    let data: Vec<Vec<u8>> = allocs
        .iter()
        .enumerate()
        .map(|(i, a)| fill(&vmm, a, i as u8))
        .collect();
    vmm.evict_all(&mut HostStaging).unwrap();
    // A failing creation (the first chunk: the loads wait for it) or copy-in (while
    // chunks are still being mapped) leaves everything evicted, nothing mapped.
    vmm.backend().fail_next(Op::CreatePhysical, 1);
    assert!(vmm.restore_all(&mut HostStaging).is_err());
    vmm.backend().fail_next(Op::CopyFromHost, 1);
    assert!(vmm.restore_all(&mut HostStaging).is_err());
    assert_eq!(vmm.backend().physical_count(), 0);
    assert_eq!(vmm.stats().committed, 0);
    assert_eq!(vmm.stats().mapped, 0);
    // The first batch waits for its chunk; each batch then takes in every range whose
    // chunks are mapped by then, so how many batches there are depends on how fast the
    // mapping runs (one, when it finished while the first batch waited): at least one, at
    // most one per allocation.
    let mut counting = Counting(0);
    vmm.restore_all(&mut counting).unwrap();
    assert!(
        (1..=24).contains(&counting.0),
        "{} load batches",
        counting.0
    );
    for (a, d) in allocs.iter().zip(&data) {
        assert_eq!(&read(&vmm, a), d);
    }
    for a in &allocs {
        vmm.free(a.base).unwrap();
    }
    assert_empty(&vmm);
}

/// Loads every range with the byte `0xab` (as an image's bytes that differ from the host
/// copies would be).
struct Other;

impl Staging<HostBackend> for Other {
    fn save(&mut self, _: &HostBackend, _: &[StagingRange]) -> Result<Vec<HostCopy>, StagingError> {
        Err(StagingError::Io("loads only".into()))
    }

    fn load(
        &mut self,
        backend: &HostBackend,
        ranges: &[LoadRange<'_>],
    ) -> Result<(), StagingError> {
        for r in ranges {
            backend.copy_from_host(r.addr, &vec![0xab; r.len as usize])?;
        }
        Ok(())
    }
}

fn pending_load_rolls_back_or_commits(config: Config) {
    let vmm = Vmm::new(HostBackend::new(G), config).unwrap();
    let allocs: Vec<_> = [100, 4000, 3 * MIB]
        .iter()
        .map(|&s| vmm.alloc(s, 0).unwrap())
        .collect();
    let data: Vec<_> = allocs
        .iter()
        .enumerate()
        .map(|(i, a)| fill(&vmm, a, i as u8))
        .collect();
    vmm.evict_all(&mut HostStaging).unwrap();
    let before = vmm.stats();

    // Loaded, then dropped: the new memory is gone, the host copies are the old bytes.
    let pending = vmm.load_all(&mut Other).unwrap();
    assert_eq!(pending.moved().allocations, 3);
    assert!(vmm.backend().physical_bytes() + vmm.backend().linear_bytes() > 0);
    drop(pending);
    assert_eq!(vmm.backend().physical_count(), 0);
    assert_eq!(vmm.backend().linear_count(), 0);
    assert_eq!(vmm.stats(), before);
    assert!(vmm.is_paused());
    for (a, d) in allocs.iter().zip(&data) {
        assert_eq!(
            vmm.lookup(a.base).unwrap().residency,
            Residency::EvictedToHost
        );
        vmm.with_host_copy(a.id, |b| assert_eq!(b, &d[..])).unwrap();
    }
    // The old bytes come back as before.
    vmm.restore_all(&mut HostStaging).unwrap();
    for (a, d) in allocs.iter().zip(&data) {
        assert_eq!(&read(&vmm, a), d);
    }

    // Loaded and committed: resident with the loaded bytes, the host copies dropped.
    vmm.evict_all(&mut HostStaging).unwrap();
    let moved = vmm.load_all(&mut Other).unwrap().commit(&mut HostStaging);
    assert_eq!(moved.allocations, 3);
    assert!(!vmm.is_paused());
    for a in &allocs {
        assert_eq!(vmm.lookup(a.base).unwrap().residency, Residency::Resident);
        assert!(read(&vmm, a).iter().all(|&b| b == 0xab));
        assert!(matches!(
            vmm.with_host_copy(a.id, |_| ()),
            Err(VmmError::NoHostCopy { .. }) | Err(VmmError::WrongResidency { .. })
        ));
    }
    for a in &allocs {
        vmm.free(a.base).unwrap();
    }
    assert_empty(&vmm);
}

#[test]
fn a_pending_load_rolls_back_to_the_host_copies_or_commits_mapped() {
    pending_load_rolls_back_or_commits(Config::mapped());
}

#[test]
fn a_pending_load_rolls_back_to_the_host_copies_or_commits_translated() {
    pending_load_rolls_back_or_commits(Config::translated());
}
