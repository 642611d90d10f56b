//! The host arena of [`PinnedStaging`] (`CUDAW_HOST_ARENA=pinned`) through the real
//! [`DriverBackend`] on simgpu: the first whole-process pause copies into host memory, an
//! arena is made in the background, later pauses leave the bytes in it
//! ([`HostCopy::Retained`], readable through [`PinnedStaging::retained`]) and resumes load
//! them straight back, byte-exact in both addressing modes; an arena too small takes what
//! fits; single evictions keep the ordinary path; a failed copy retains nothing.

use std::sync::mpsc;
use std::sync::Arc;

use driver::api::read_write_access;
use driver::{sys, Driver, DriverBackend, LibCuda, PinnedStaging, Retaining, StagingConfig};
use vmm::{Backend, Config, Residency, Vmm, VmmError};

mod common;
use common::simgpu_path;

fn new_vmm(config: Config) -> Vmm<DriverBackend> {
    let lib: Arc<dyn Driver> =
        Arc::new(LibCuda::open_path(simgpu_path().to_str().unwrap()).unwrap());
    Vmm::new(DriverBackend::new(lib, 0).unwrap(), config).unwrap()
}

use simgpu::testing::pattern;

fn arena_config() -> StagingConfig {
    StagingConfig {
        host_arena: true,
        ..StagingConfig::new(2, 64 << 10, 3)
    }
}

/// Sizes from 1 byte to several MiB, around page and huge-page boundaries.
fn sizes() -> Vec<u64> {
    let mut v = vec![
        1,
        3,
        4095,
        4096,
        4097,
        65537,
        100_003,
        3 << 20,
        (2 << 20) + 17,
    ];
    v.extend((0..12).map(|i| 1 + i * 7919));
    v
}

fn fill(vmm: &Vmm<DriverBackend>, sizes: &[u64], seed: u64) -> Vec<vmm::Allocation> {
    sizes
        .iter()
        .enumerate()
        .map(|(i, &s)| {
            let a = vmm.alloc(s, 0).unwrap();
            let dev = vmm.translate(a.base).unwrap();
            vmm.backend()
                .copy_from_host(dev, &pattern(s as usize, seed + i as u64))
                .unwrap();
            a
        })
        .collect()
}

fn verify(vmm: &Vmm<DriverBackend>, allocs: &[vmm::Allocation], seed: u64) {
    for (i, a) in allocs.iter().enumerate() {
        let now = vmm.allocation(a.id).unwrap();
        assert_eq!(now.residency, Residency::Resident);
        let mut back = vec![0u8; a.size as usize];
        vmm.backend()
            .copy_to_host(&mut back, vmm.translate(a.base).unwrap())
            .unwrap();
        assert!(
            back == pattern(a.size as usize, seed + i as u64),
            "allocation {i} ({} bytes) differs",
            a.size
        );
    }
}

/// What an arena for these allocations needs.
fn demand(allocs: &[vmm::Allocation]) -> u64 {
    allocs
        .iter()
        .map(|a| a.size.next_multiple_of(driver::ARENA_ALIGN))
        .sum()
}

/// Makes the arena in the background and waits for it; checks `done` is called.
fn make_arena(staging: &mut PinnedStaging, b: &DriverBackend, bytes: u64) {
    let (tx, rx) = mpsc::channel();
    let started = staging.start_arena(b, bytes, Box::new(move |r| tx.send(r.map(|_| ())).unwrap()));
    assert!(started);
    rx.recv().unwrap().expect("the arena is made");
    staging.wait_for_arena(b);
    let s = staging.arena_status(b);
    assert!(s.bytes as u64 >= bytes, "{s:?}");
    assert_eq!((s.building, s.retained), (0, 0));
}

fn arena_round_trips(config: Config) {
    let vmm = new_vmm(config);
    let b = vmm.backend();
    let allocs = fill(&vmm, &sizes(), 0);
    let mut staging = PinnedStaging::new(arena_config());

    // The first pause: no arena yet, the bytes go to host memory the VMM holds.
    vmm.evict_all(&mut Retaining(&mut staging)).unwrap();
    for a in &allocs {
        vmm.with_host_copy(a.id, |_| ()).unwrap();
        assert!(staging.retained(b, a.id).is_none());
    }
    vmm.restore_all(&mut staging).unwrap();
    staging.forget_all(b);
    verify(&vmm, &allocs, 0);

    make_arena(&mut staging, b, demand(&allocs));
    // Nothing to do a second time.
    assert!(!staging.start_arena(b, demand(&allocs), Box::new(|_| {})));

    for round in 0..3u64 {
        let seed = 100 * (round + 1);
        for (i, a) in allocs.iter().enumerate() {
            b.copy_from_host(
                vmm.translate(a.base).unwrap(),
                &pattern(a.size as usize, seed + i as u64),
            )
            .unwrap();
        }
        let moved = vmm.evict_all(&mut Retaining(&mut staging)).unwrap();
        assert_eq!(moved.allocations, allocs.len());
        assert_eq!(vmm.stats().mapped, 0, "every chunk released");
        assert_eq!(staging.arena_status(b).retained, allocs.len());
        for (i, a) in allocs.iter().enumerate() {
            assert_eq!(
                vmm.allocation(a.id).unwrap().residency,
                Residency::EvictedToHost
            );
            // The VMM holds no copy: the arena does.
            assert!(matches!(
                vmm.with_host_copy(a.id, |_| ()),
                Err(VmmError::NoHostCopy { .. })
            ));
            let kept = staging.retained(b, a.id).expect("retained");
            assert!(
                kept == pattern(a.size as usize, seed + i as u64),
                "round {round}: arena copy of allocation {i} differs"
            );
        }
        vmm.restore_all(&mut staging).unwrap();
        staging.forget_all(b);
        verify(&vmm, &allocs, seed);
    }
    assert!(staging.take_notes().is_empty());
    for a in &allocs {
        vmm.free(a.base).unwrap();
    }
    staging.release().unwrap();
    assert_eq!(staging.arena_status(b).bytes, 0);
}

#[test]
fn mapped_pauses_retain_in_the_arena() {
    arena_round_trips(Config::mapped());
}

#[test]
fn translated_pauses_retain_in_the_arena() {
    arena_round_trips(Config::translated());
}

#[test]
fn off_by_default_and_from_the_environment() {
    let mut w = Vec::new();
    let c = StagingConfig::from_lookup(
        |k| (k == "CUDAW_HOST_ARENA").then(|| "pinned".to_string()),
        &mut w,
    );
    assert!(c.host_arena && w.is_empty());
    let c = StagingConfig::from_lookup(
        |k| (k == "CUDAW_HOST_ARENA").then(|| "lots".to_string()),
        &mut w,
    );
    assert!(!c.host_arena);
    assert_eq!(w.len(), 1, "{w:?}");
    assert!(!StagingConfig::default().host_arena);
    // Off: no arena is made.
    let vmm = new_vmm(Config::mapped());
    let mut staging = PinnedStaging::new(StagingConfig::new(2, 64 << 10, 2));
    assert!(!staging.start_arena(vmm.backend(), 1 << 20, Box::new(|_| {})));
    assert_eq!(staging.arena_status(vmm.backend()).bytes, 0);
}

#[test]
fn a_small_arena_takes_what_fits_and_grows() {
    let vmm = new_vmm(Config::mapped());
    let b = vmm.backend();
    // 6 MiB first, then a 3 MiB arena... rounded to 2 MiB: 4 MiB holds the first 3 MiB
    // allocation only.
    let sizes = [3 << 20, 3 << 20, 5000, 3 << 20];
    let allocs = fill(&vmm, &sizes, 7);
    let mut staging = PinnedStaging::new(arena_config());
    make_arena(&mut staging, b, 3 << 20);
    vmm.evict_all(&mut Retaining(&mut staging)).unwrap();
    let retained: Vec<bool> = allocs
        .iter()
        .map(|a| staging.retained(b, a.id).is_some())
        .collect();
    assert_eq!(retained, [true, false, true, false]);
    for (a, r) in allocs.iter().zip(&retained) {
        assert_eq!(vmm.with_host_copy(a.id, |_| ()).is_ok(), !r);
    }
    // Not replaced while it holds bytes.
    assert!(!staging.start_arena(b, demand(&allocs), Box::new(|_| {})));
    vmm.restore_all(&mut staging).unwrap();
    staging.forget_all(b);
    verify(&vmm, &allocs, 7);
    // Now it grows, and takes everything.
    make_arena(&mut staging, b, demand(&allocs));
    vmm.evict_all(&mut Retaining(&mut staging)).unwrap();
    assert!(allocs.iter().all(|a| staging.retained(b, a.id).is_some()));
    vmm.restore_all(&mut staging).unwrap();
    staging.forget_all(b);
    verify(&vmm, &allocs, 7);
}

#[test]
fn single_evictions_frees_and_dumps_beside_the_arena() {
    let vmm = new_vmm(Config::mapped());
    let b = vmm.backend();
    let sizes = sizes();
    let allocs = fill(&vmm, &sizes, 3);
    let mut staging = PinnedStaging::new(arena_config());
    make_arena(&mut staging, b, demand(&allocs));

    // A single eviction takes the ordinary path, even with an arena.
    vmm.evict(&[allocs[2].id], &mut staging).unwrap();
    vmm.with_host_copy(allocs[2].id, |_| ()).unwrap();
    assert_eq!(staging.arena_status(b).retained, 0);
    vmm.restore(&[allocs[2].id], &mut staging).unwrap();

    // A whole pause, then a single restore, a free of an evicted allocation, and the bytes
    // of one handed elsewhere (as a dump does) and forgotten.
    vmm.evict_all(&mut Retaining(&mut staging)).unwrap();
    vmm.restore(&[allocs[0].id], &mut staging).unwrap();
    let gone = allocs[1];
    vmm.free(gone.base).unwrap();
    assert!(staging.forget(b, gone.id));
    let moved_out = allocs[3];
    let elsewhere = staging.retained(b, moved_out.id).unwrap().to_vec();
    vmm.mark_in_file(moved_out.id, 0).unwrap();
    assert!(staging.forget(b, moved_out.id));
    assert!(staging.retained(b, moved_out.id).is_none());

    // A load of a copy in a file, or of what the arena no longer holds, fails and changes
    // nothing.
    let others: Vec<vmm::AllocationId> = allocs
        .iter()
        .filter(|a| ![allocs[0].id, gone.id].contains(&a.id))
        .map(|a| a.id)
        .collect();
    let err = vmm.restore(&others, &mut staging).unwrap_err();
    assert!(err.to_string().contains("from file"), "{err}");
    let lost = allocs[5];
    assert!(staging.forget(b, lost.id));
    let rest: Vec<vmm::AllocationId> = others
        .iter()
        .copied()
        .filter(|&id| id != moved_out.id)
        .collect();
    let err = vmm.restore(&rest, &mut staging).unwrap_err();
    assert!(err.to_string().contains("not in the host arena"), "{err}");
    assert_eq!(
        vmm.allocation(allocs[4].id).unwrap().residency,
        Residency::EvictedToHost
    );
    // The rest load.
    let rest: Vec<vmm::AllocationId> = rest.into_iter().filter(|&id| id != lost.id).collect();
    vmm.restore(&rest, &mut staging).unwrap();
    staging.forget_all(b);
    assert!(elsewhere == pattern(moved_out.size as usize, 3 + 3));
    let keep: Vec<vmm::Allocation> = allocs
        .iter()
        .enumerate()
        .filter(|(i, _)| ![1, 3, 5].contains(i))
        .map(|(_, a)| *a)
        .collect();
    for a in &keep {
        let i = allocs.iter().position(|x| x.id == a.id).unwrap() as u64;
        let mut back = vec![0u8; a.size as usize];
        b.copy_to_host(&mut back, a.base).unwrap();
        assert!(back == pattern(a.size as usize, 3 + i), "allocation {i}");
    }
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
fn a_failed_copy_into_the_arena_retains_nothing() {
    let vmm = new_vmm(Config::mapped());
    let mut sizes = sizes();
    sizes.extend([3 << 20, 3 << 20]);
    let allocs = fill(&vmm, &sizes, 9);
    let b = vmm.backend();
    let mut staging = PinnedStaging::new(arena_config());
    make_arena(&mut staging, b, demand(&allocs));
    let victim = allocs[allocs.len() - 1];
    let before = vmm.stats();
    set_access(
        &vmm,
        victim.base,
        4 << 20,
        sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_NONE,
    );
    let err = vmm.evict_all(&mut Retaining(&mut staging)).unwrap_err();
    assert!(err.to_string().contains("cuMemcpyDtoHAsync"), "{err}");
    assert_eq!(vmm.stats(), before, "nothing evicted");
    assert_eq!(staging.arena_status(b).retained, 0, "nothing retained");
    assert!(!vmm.is_paused());
    set_access(
        &vmm,
        victim.base,
        4 << 20,
        sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
    );
    vmm.evict_all(&mut Retaining(&mut staging)).unwrap();
    assert_eq!(staging.arena_status(b).retained, allocs.len());
    vmm.restore_all(&mut staging).unwrap();
    verify(&vmm, &allocs, 9);
}

/// What a resume that loads the program's allocations before the driver handles it still
/// owes does: the arena forgets every place but those kept, and the next pause places its
/// bytes after the kept ones (never over them); once nothing is kept, pauses start at the
/// arena's beginning again.
#[test]
fn kept_places_survive_a_forget_and_the_next_pause() {
    let vmm = new_vmm(Config::mapped());
    let b = vmm.backend();
    let sizes = [3 << 20, 5000, 1 << 20];
    let allocs = fill(&vmm, &sizes, 21);
    let mut staging = PinnedStaging::new(arena_config());
    // Room for two pauses' bytes.
    make_arena(&mut staging, b, 2 * demand(&allocs));
    vmm.evict_all(&mut Retaining(&mut staging)).unwrap();
    let kept = allocs[0].id;
    let kept_bytes = staging.retained(b, kept).unwrap().to_vec();
    assert!(kept_bytes == pattern(3 << 20, 21));
    // The allocations come back; allocation 0's place is kept as if it were still owed.
    vmm.restore_all(&mut staging).unwrap();
    assert_eq!(staging.forget_all_but(b, |id| id == kept), 1);
    assert_eq!(staging.retained_ids(b), vec![kept]);
    // New bytes, a second pause: each allocation gets a place of its own again (the kept
    // id's place is replaced by a new one), after the kept place.
    for (i, a) in allocs.iter().enumerate() {
        b.copy_from_host(a.base, &pattern(a.size as usize, 50 + i as u64))
            .unwrap();
    }
    let stale = staging.retained(b, kept).unwrap().as_ptr();
    vmm.evict_all(&mut Retaining(&mut staging)).unwrap();
    assert_eq!(staging.arena_status(b).retained, allocs.len());
    for (i, a) in allocs.iter().enumerate() {
        let now = staging.retained(b, a.id).expect("in the arena");
        assert!(
            now == pattern(a.size as usize, 50 + i as u64),
            "allocation {i}"
        );
        assert!(now.as_ptr() > stale, "placed after the kept place");
    }
    vmm.restore_all(&mut staging).unwrap();
    verify(&vmm, &allocs, 50);
    // Nothing kept: the next pause starts at the beginning (where the kept place was).
    assert_eq!(staging.forget_all_but(b, |_| false), 0);
    vmm.evict_all(&mut Retaining(&mut staging)).unwrap();
    assert_eq!(staging.retained(b, allocs[0].id).unwrap().as_ptr(), stale);
    vmm.restore_all(&mut staging).unwrap();
    staging.forget_all(b);
    assert!(staging.retained_ids(b).is_empty());
    verify(&vmm, &allocs, 50);
}
