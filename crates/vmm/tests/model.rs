//! Property tests: random operation sequences checked against a simple model (a `Vec` of
//! live allocations) over the checking host backend.

use proptest::prelude::*;
use vmm::testing::HostBackend;
use vmm::{Allocation, Backend, Config, HostStaging, Residency, Vmm, VmmError};

const G: u64 = 64 << 10;

#[derive(Debug, Clone)]
enum Step {
    Alloc(u64),
    Free(usize),
    Evict(usize),
    Restore(usize),
    EvictAll,
    RestoreAll,
    Lookup(usize, u64),
    Write(usize, u8),
}

fn step() -> impl Strategy<Value = Step> {
    let size = prop_oneof![1u64..=1024, 1u64..=(G / 8), (G / 8)..=(5 * G)];
    prop_oneof![
        6 => size.prop_map(Step::Alloc),
        3 => any::<usize>().prop_map(Step::Free),
        2 => any::<usize>().prop_map(Step::Evict),
        2 => any::<usize>().prop_map(Step::Restore),
        1 => Just(Step::EvictAll),
        1 => Just(Step::RestoreAll),
        3 => (any::<usize>(), any::<u64>()).prop_map(|(i, o)| Step::Lookup(i, o)),
        1 => (any::<usize>(), any::<u8>()).prop_map(|(i, s)| Step::Write(i, s)),
    ]
}

struct Live {
    a: Allocation,
    data: Vec<u8>,
    resident: bool,
}

fn pattern(size: u64, seed: u8) -> Vec<u8> {
    (0..size)
        .map(|i| {
            (i as u8)
                .wrapping_mul(seed | 1)
                .wrapping_add((i >> 8) as u8 ^ seed)
        })
        .collect()
}

fn write(vmm: &Vmm<HostBackend>, l: &mut Live, seed: u8) {
    l.data = pattern(l.a.size, seed);
    let dev = vmm
        .translate(l.a.base)
        .expect("resident allocation translates");
    vmm.backend().copy_from_host(dev, &l.data).unwrap();
}

fn check_bytes(vmm: &Vmm<HostBackend>, l: &Live) {
    let mut buf = vec![0; l.a.size as usize];
    vmm.backend()
        .copy_to_host(&mut buf, vmm.translate(l.a.base).unwrap())
        .unwrap();
    assert!(
        buf == l.data,
        "bytes of allocation {:?} differ after restore",
        l.a.id
    );
}

fn check_invariants(vmm: &Vmm<HostBackend>, live: &[Live], limit: Option<u64>, mapped: bool) {
    let b = vmm.backend();
    assert!(b.violations().is_empty(), "{:?}", b.violations());
    let snap = vmm.snapshot();
    assert_eq!(snap.len(), live.len());
    let mut by_addr = snap.clone();
    by_addr.sort_by_key(|a| a.base);
    for w in by_addr.windows(2) {
        assert!(w[0].end() <= w[1].base, "overlap {:?} {:?}", w[0], w[1]);
    }
    for (s, l) in snap.iter().zip(live) {
        assert_eq!((s.id, s.base, s.size), (l.a.id, l.a.base, l.a.size));
        assert_eq!(s.base % 256, 0);
        assert_eq!(s.residency.is_resident(), l.resident);
    }
    for w in snap.windows(2) {
        assert!(w[0].order < w[1].order);
    }
    let st = vmm.stats();
    assert_eq!(st.allocations, live.len() as u64);
    assert_eq!(st.requested, live.iter().map(|l| l.a.size).sum::<u64>());
    assert_eq!(
        st.resident,
        live.iter()
            .filter(|l| l.resident)
            .map(|l| l.a.size)
            .sum::<u64>()
    );
    assert_eq!(st.evicted, st.requested - st.resident);
    assert_eq!(st.committed, st.mapped);
    if mapped {
        assert_eq!(b.physical_bytes(), st.mapped);
        assert_eq!(b.mapping_count(), b.physical_count());
        assert!(st.mapped >= st.resident);
    } else {
        assert_eq!(b.linear_bytes(), st.mapped);
    }
    if let Some(limit) = limit {
        assert!(st.peak_mapped <= limit);
        assert!(
            b.peak_physical_bytes() <= limit,
            "peak {} > limit {limit}",
            b.peak_physical_bytes()
        );
    }
}

fn run(steps: Vec<Step>, config: Config) {
    let mapped = config.addressing == vmm::Addressing::Mapped;
    let limit = config.memory_limit;
    let vmm = Vmm::new(HostBackend::new(G), config).unwrap();
    let mut live: Vec<Live> = Vec::new();
    let mut paused = false;
    let mut seed = 0u8;
    for s in steps {
        let n = live.len();
        match s {
            Step::Alloc(size) => match vmm.alloc(size, 3) {
                Ok(a) => {
                    assert!(!paused);
                    assert_eq!((a.size, a.tag, a.residency), (size, 3, Residency::Resident));
                    seed = seed.wrapping_add(1);
                    let mut l = Live {
                        a,
                        data: Vec::new(),
                        resident: true,
                    };
                    write(&vmm, &mut l, seed);
                    live.push(l);
                }
                Err(VmmError::Paused { .. }) => assert!(paused),
                Err(VmmError::OutOfMemory {
                    limit: l,
                    used,
                    physical,
                    ..
                }) => {
                    assert_eq!(Some(l), limit);
                    assert!(used + physical > l);
                }
                Err(e) => panic!("alloc({size}): {e}"),
            },
            Step::Free(i) if n > 0 => {
                let l = live.remove(i % n);
                vmm.free(l.a.base).unwrap();
                assert!(vmm.lookup(l.a.base).is_none_or(|a| a.id != l.a.id));
            }
            Step::Evict(i) if n > 0 => {
                let l = &mut live[i % n];
                match vmm.evict(&[l.a.id], &mut HostStaging) {
                    Ok(m) => {
                        assert!(l.resident);
                        assert_eq!(m.allocations, 1);
                        l.resident = false;
                    }
                    Err(VmmError::WrongResidency { .. }) => assert!(!l.resident),
                    Err(e) => panic!("evict: {e}"),
                }
            }
            Step::Restore(i) if n > 0 => {
                let l = &mut live[i % n];
                match vmm.restore(&[l.a.id], &mut HostStaging) {
                    Ok(_) => {
                        assert!(!l.resident);
                        l.resident = true;
                        check_bytes(&vmm, l);
                    }
                    Err(VmmError::WrongResidency { .. }) => assert!(l.resident),
                    Err(VmmError::OutOfMemory { .. }) => assert!(limit.is_some() && !l.resident),
                    Err(e) => panic!("restore: {e}"),
                }
            }
            Step::EvictAll => {
                vmm.evict_all(&mut HostStaging).unwrap();
                paused = true;
                for l in &mut live {
                    l.resident = false;
                }
                assert_eq!(vmm.stats().mapped, 0);
                assert_eq!(
                    vmm.backend().physical_count() + vmm.backend().linear_count(),
                    0
                );
            }
            Step::RestoreAll => match vmm.restore_all(&mut HostStaging) {
                Ok(_) => {
                    paused = false;
                    for l in &mut live {
                        l.resident = true;
                        check_bytes(&vmm, l);
                    }
                }
                Err(VmmError::OutOfMemory { .. }) => assert!(limit.is_some()),
                Err(e) => panic!("restore_all: {e}"),
            },
            Step::Lookup(i, off) if n > 0 => {
                let l = &live[i % n];
                let ptr = l.a.base + off % l.a.size;
                assert_eq!(vmm.lookup(ptr).map(|a| a.id), Some(l.a.id));
                let t = vmm.translate(ptr);
                if mapped {
                    assert_eq!(t, Some(ptr));
                } else if l.resident {
                    let backing = vmm.lookup(ptr).unwrap().backing;
                    assert_eq!(t, Some(backing + off % l.a.size));
                    // One past the end translates too.
                    assert_eq!(vmm.translate(l.a.end()), Some(backing + l.a.size));
                    let mut byte = [0u8];
                    vmm.backend().copy_to_host(&mut byte, t.unwrap()).unwrap();
                    assert_eq!(byte[0], l.data[(off % l.a.size) as usize]);
                } else {
                    assert_eq!(t, None);
                }
            }
            Step::Write(i, s) if n > 0 => {
                let l = &mut live[i % n];
                if l.resident {
                    write(&vmm, l, s);
                }
            }
            _ => {}
        }
        check_invariants(&vmm, &live, limit, mapped);
    }
    // Everything resident again holds its bytes; then free all: nothing left.
    if vmm.restore_all(&mut HostStaging).is_ok() {
        for l in &live {
            check_bytes(&vmm, l);
        }
    }
    for l in live.drain(..) {
        vmm.free(l.a.base).unwrap();
    }
    check_invariants(&vmm, &live, limit, mapped);
    let b = vmm.backend();
    assert_eq!(
        (b.physical_count(), b.mapping_count(), b.linear_count()),
        (0, 0, 0)
    );
    let st = vmm.stats();
    assert_eq!(
        (st.requested, st.mapped, st.committed, st.chunks),
        (0, 0, 0, 0)
    );
    vmm.release_all().unwrap();
    assert_eq!(b.reservation_count(), 0);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn mapped_matches_model(steps in proptest::collection::vec(step(), 1..80)) {
        run(steps, Config { reservation_size: 64 * G, ..Config::mapped() });
    }

    #[test]
    fn mapped_with_limit_matches_model(steps in proptest::collection::vec(step(), 1..80)) {
        run(steps, Config { reservation_size: 64 * G, ..Config::mapped() }.with_memory_limit(12 * G));
    }

    #[test]
    fn translated_matches_model(steps in proptest::collection::vec(step(), 1..80)) {
        run(steps, Config::translated());
    }

    #[test]
    fn translated_with_limit_matches_model(steps in proptest::collection::vec(step(), 1..80)) {
        run(steps, Config::translated().with_memory_limit(8 * G));
    }
}
