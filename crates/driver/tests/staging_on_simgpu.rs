//! [`PinnedStaging`] through the real [`DriverBackend`] on simgpu (whose streams run on
//! worker threads, so the copies really are asynchronous): evict/restore round trips of
//! many allocations of odd sizes, from 1 byte to several buffers, are byte-exact in both
//! addressing modes and with degenerate pipelines; a copy failing part-way leaves the VMM
//! and the staging as they were, and both work afterwards.

use std::sync::Arc;

use driver::api::read_write_access;
use driver::{sys, Driver, DriverBackend, LibCuda, PinnedStaging, StagingConfig};
use vmm::{
    Backend, Config, HostCopy, LoadRange, Residency, Source, Staging, StagingError, StagingRange,
    Vmm, VmmError,
};

mod common;
use common::simgpu_path;

fn new_vmm(config: Config) -> Vmm<DriverBackend> {
    let lib: Arc<dyn Driver> =
        Arc::new(LibCuda::open_path(simgpu_path().to_str().unwrap()).unwrap());
    Vmm::new(DriverBackend::new(lib, 0).unwrap(), config).unwrap()
}

use simgpu::testing::pattern;

/// A small pipeline so that many batches, shared buffers and buffer reuse all happen.
fn small(streams: usize, buffer: usize, threads: usize) -> StagingConfig {
    StagingConfig::new(streams, buffer, threads)
}

const BUFFER: usize = 64 << 10;

/// Sizes from 1 byte to several buffers, around every boundary of the 64 KiB buffer and
/// the 4 KiB page.
fn odd_sizes() -> Vec<u64> {
    let mut v = vec![1, 2, 3, 255, 4095, 4096, 4097, 65535, 65536, 65537, 100_003];
    v.extend([
        3 * BUFFER as u64 + 1,
        5 << 20,
        (2 << 20) + 17,
        777,
        1,
        131_072,
    ]);
    v.extend((0..24).map(|i| 1 + i * 7919));
    v
}

fn fill(vmm: &Vmm<DriverBackend>, sizes: &[u64]) -> Vec<vmm::Allocation> {
    sizes
        .iter()
        .enumerate()
        .map(|(i, &s)| {
            let a = vmm.alloc(s, 0).unwrap();
            let dev = vmm.translate(a.base).unwrap();
            vmm.backend()
                .copy_from_host(dev, &pattern(s as usize, i as u64))
                .unwrap();
            a
        })
        .collect()
}

fn verify(vmm: &Vmm<DriverBackend>, allocs: &[vmm::Allocation]) {
    for (i, a) in allocs.iter().enumerate() {
        let now = vmm.allocation(a.id).unwrap();
        assert_eq!(now.residency, Residency::Resident);
        let mut back = vec![0u8; a.size as usize];
        vmm.backend()
            .copy_to_host(&mut back, vmm.translate(a.base).unwrap())
            .unwrap();
        assert!(
            back == pattern(a.size as usize, i as u64),
            "allocation {i} ({} bytes) differs",
            a.size
        );
    }
}

fn round_trips(config: Config, staging: StagingConfig) {
    let vmm = new_vmm(config);
    let sizes = odd_sizes();
    let allocs = fill(&vmm, &sizes);
    let mut staging = PinnedStaging::new(staging);
    for round in 0..2 {
        let moved = vmm.evict_all(&mut staging).unwrap();
        assert_eq!(moved.allocations, allocs.len(), "round {round}");
        assert_eq!(moved.bytes, sizes.iter().sum::<u64>());
        assert_eq!(vmm.stats().mapped, 0, "every chunk released");
        // The host copies the VMM keeps are the device bytes.
        for (i, a) in allocs.iter().enumerate() {
            assert_eq!(
                vmm.allocation(a.id).unwrap().residency,
                Residency::EvictedToHost
            );
            let same = vmm
                .with_host_copy(a.id, |b| b == pattern(a.size as usize, i as u64))
                .unwrap();
            assert!(
                same,
                "host copy of allocation {i} ({} bytes) differs",
                a.size
            );
        }
        vmm.restore_all(&mut staging).unwrap();
        verify(&vmm, &allocs);
    }
    assert!(staging.take_notes().is_empty(), "the pinned pool was used");
    for a in &allocs {
        vmm.free(a.base).unwrap();
    }
}

#[test]
fn mapped_round_trips_are_byte_exact() {
    round_trips(Config::mapped(), small(3, BUFFER, 4));
}

#[test]
fn translated_round_trips_are_byte_exact() {
    round_trips(Config::translated(), small(2, BUFFER, 3));
}

#[test]
fn default_configuration_round_trips() {
    round_trips(Config::mapped(), StagingConfig::default());
}

#[test]
fn degenerate_pipelines_round_trip() {
    // One buffer shared by many threads; more threads than batches; one thread and a
    // pool from cuMemHostAlloc; streaming stores.
    let mut one_buffer = small(1, 4096, 4);
    one_buffer.buffers = 1;
    round_trips(Config::mapped(), one_buffer);
    round_trips(Config::mapped(), small(8, 16 << 20, 16));
    let mut plain = small(1, 4096, 1);
    plain.huge_pages = false;
    plain.prefault = false;
    plain.pin_in_place = false;
    round_trips(Config::translated(), plain);
    let mut streaming = small(2, BUFFER, 3);
    streaming.streaming_stores = true;
    round_trips(Config::mapped(), streaming);
}

/// Takes device access away from the mapping at `addr` (or gives it back).
fn set_access(vmm: &Vmm<DriverBackend>, addr: u64, size: u64, flags: sys::CUmemAccess_flags) {
    let b = vmm.backend();
    b.make_current().unwrap();
    let mut desc = read_write_access(b.device());
    desc.flags = flags;
    b.driver().mem_set_access(addr, size, &[desc]).unwrap();
}

#[test]
fn a_failed_copy_out_changes_nothing() {
    let vmm = new_vmm(Config::mapped());
    // 3 MiB allocations have chunks (4 MiB mappings) of their own.
    let mut sizes = odd_sizes();
    sizes.extend([3 << 20, 3 << 20, 3 << 20]);
    let allocs = fill(&vmm, &sizes);
    let victim = allocs[allocs.len() - 2];
    let before = vmm.stats();
    let mut staging = PinnedStaging::new(small(2, BUFFER, 3));
    set_access(
        &vmm,
        victim.base,
        4 << 20,
        sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_NONE,
    );
    let err = vmm.evict_all(&mut staging).unwrap_err();
    assert!(
        matches!(err, VmmError::Staging(StagingError::Backend(_))),
        "{err}"
    );
    assert!(err.to_string().contains("cuMemcpyDtoHAsync"), "{err}");
    assert_eq!(vmm.stats(), before, "nothing evicted, nothing released");
    // Not paused: allocation still works.
    let extra = vmm.alloc(100, 0).unwrap();
    vmm.free(extra.base).unwrap();
    set_access(
        &vmm,
        victim.base,
        4 << 20,
        sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
    );
    verify(&vmm, &allocs);
    // The same staging works afterwards.
    vmm.evict_all(&mut staging).unwrap();
    vmm.restore_all(&mut staging).unwrap();
    verify(&vmm, &allocs);
}

#[test]
fn failed_copies_return_errors_and_the_pool_stays_usable() {
    let vmm = new_vmm(Config::mapped());
    let sizes = [300_000u64, 3 << 20, 5000];
    let allocs = fill(&vmm, &sizes);
    let b = vmm.backend();
    let mut staging = PinnedStaging::new(small(2, BUFFER, 4));
    // A range nobody mapped, between good ones.
    let reservation = b.reserve(4 << 20, 0).unwrap();
    let good = |i: usize| StagingRange {
        id: allocs[i].id,
        addr: allocs[i].base,
        len: allocs[i].size,
    };
    let bad = StagingRange {
        id: allocs[2].id,
        addr: reservation,
        len: 1 << 20,
    };
    let err = staging.save(b, &[good(0), bad, good(1)]).unwrap_err();
    assert!(err.to_string().contains("cuMemcpyDtoHAsync"), "{err}");

    // Loading: the bad range comes after several batches of good ones.
    let data: Vec<Vec<u8>> = sizes.iter().map(|&s| vec![0xAB; s as usize]).collect();
    let load = |i: usize| LoadRange {
        id: allocs[i].id,
        addr: allocs[i].base,
        len: allocs[i].size,
        source: Source::Memory(&data[i]),
    };
    let bad_load = LoadRange {
        id: allocs[2].id,
        addr: reservation,
        len: 1 << 20,
        source: Source::Memory(&data[1][..1 << 20]),
    };
    let err = staging
        .load(b, &[load(0), load(1), bad_load, load(2)])
        .unwrap_err();
    assert!(err.to_string().contains("cuMemcpyHtoDAsync"), "{err}");

    // A copy in a file or a short one is refused before anything is copied.
    let file = LoadRange {
        source: Source::File { offset: 0 },
        ..load(0)
    };
    let err = staging.load(b, &[load(1), file]).unwrap_err();
    assert!(matches!(err, StagingError::Unsupported { .. }), "{err}");
    let short = LoadRange {
        source: Source::Memory(&data[0][..10]),
        ..load(0)
    };
    assert!(matches!(
        staging.load(b, &[short]),
        Err(StagingError::Io(_))
    ));
    b.free_reservation(reservation, 4 << 20).unwrap();

    // The staging still round-trips exactly. (The failed load wrote part of its bytes: the
    // VMM throws such device memory away; here the patterns are written again.)
    for (i, a) in allocs.iter().enumerate() {
        b.copy_from_host(a.base, &pattern(sizes[i] as usize, i as u64))
            .unwrap();
    }
    let ranges: Vec<StagingRange> = (0..3).map(good).collect();
    let saved = staging.save(b, &ranges).unwrap();
    let copies: Vec<Vec<u8>> = saved
        .into_iter()
        .map(|c| match c {
            HostCopy::Memory(v) => v,
            other => panic!("expected memory, got {other:?}"),
        })
        .collect();
    for (i, c) in copies.iter().enumerate() {
        assert!(*c == pattern(sizes[i] as usize, i as u64), "range {i}");
    }
    for i in 0..3 {
        b.copy_from_host(allocs[i].base, &vec![0; sizes[i] as usize])
            .unwrap();
    }
    let back: Vec<LoadRange<'_>> = (0..3)
        .map(|i| LoadRange {
            source: Source::Memory(&copies[i]),
            ..load(i)
        })
        .collect();
    staging.load(b, &back).unwrap();
    verify(&vmm, &allocs);
    assert!(staging.save(b, &[]).unwrap().is_empty());
    staging.load(b, &[]).unwrap();
    staging.release().unwrap();
    assert!(!staging.is_prepared(b));
    staging.prepare(b).unwrap();
    assert!(staging.is_prepared(b));
}
