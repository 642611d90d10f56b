//! Property tests of the address → allocation directory: random allocate / free / evict /
//! restore sequences against a model (the live allocations in a `Vec`). After every step,
//! every interior address probed maps to its allocation, addresses in no allocation map to
//! none, one-past-the-end pointers translate, and no two allocations overlap; in several
//! layouts (granularity, multi-granule shared chunks, no sharing, translated addressing).

use proptest::prelude::*;
use vmm::testing::HostBackend;
use vmm::{Allocation, ChunkPolicy, Config, HostStaging, Vmm, VmmError};

#[derive(Debug, Clone)]
enum Step {
    Alloc(u64),
    Free(usize),
    Evict(usize),
    Restore(usize),
    EvictAll,
    RestoreAll,
}

/// Sizes around the slab classes' edges, small, medium and multi-granule ones.
fn size() -> impl Strategy<Value = u64> {
    prop_oneof![
        1u64..=4096,
        (1u64..=64).prop_map(|k| k * 256),
        (1u64..=64).prop_map(|k| k * 256 - 1),
        (1u64..=64).prop_map(|k| k * 256 + 1),
        1u64..=(600 << 10),
        (1u64..=12).prop_map(|k| k << 20),
        1u64..=(9 << 20),
    ]
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        8 => size().prop_map(Step::Alloc),
        4 => any::<usize>().prop_map(Step::Free),
        2 => any::<usize>().prop_map(Step::Evict),
        2 => any::<usize>().prop_map(Step::Restore),
        1 => Just(Step::EvictAll),
        1 => Just(Step::RestoreAll),
    ]
}

struct Model {
    live: Vec<Allocation>,
    resident: Vec<bool>,
}

impl Model {
    fn owner(&self, ptr: u64) -> Option<&Allocation> {
        self.live.iter().find(|a| a.contains(ptr))
    }
}

fn xorshift(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

fn check(vmm: &Vmm<HostBackend>, m: &Model, mapped: bool, seed: &mut u64) {
    let id = |a: Option<Allocation>| a.map(|a| a.id);
    // No overlap, 256-byte alignment, the table's view is the model's.
    let mut snap = vmm.snapshot();
    assert_eq!(snap.len(), m.live.len());
    snap.sort_by_key(|a| a.base);
    for w in snap.windows(2) {
        assert!(w[0].end() <= w[1].base, "overlap {:?} {:?}", w[0], w[1]);
    }
    for (a, &resident) in m.live.iter().zip(&m.resident) {
        assert_eq!(a.base % 256, 0);
        let now = vmm
            .lookup(a.base)
            .expect("live allocation found at its base");
        assert_eq!((now.id, now.base, now.size), (a.id, a.base, a.size));
        assert_eq!(now.residency.is_resident(), resident);
        // Interior pointers: both ends, every 2 MiB boundary inside, random ones.
        let mut probes = vec![a.base, a.end() - 1, a.base + a.size / 2];
        let mut p = (a.base | ((2 << 20) - 1)) + 1;
        while p < a.end() {
            probes.extend([p - 1, p]);
            p += 2 << 20;
        }
        probes.extend((0..8).map(|_| a.base + xorshift(seed) % a.size));
        for ptr in probes {
            assert_eq!(id(vmm.lookup(ptr)), Some(a.id), "{ptr:#x} in {a:?}");
            let t = vmm.translate(ptr);
            if mapped {
                assert_eq!(t, Some(ptr));
            } else if resident {
                assert_eq!(t, Some(now.backing + (ptr - a.base)));
            } else {
                assert_eq!(t, None, "evicted allocations do not translate");
            }
        }
        // One past the end: the next allocation's byte if there is one, else this one's end.
        let end = a.end();
        match m.owner(end) {
            Some(next) => assert_eq!(id(vmm.lookup(end)), Some(next.id)),
            None => {
                assert_eq!(vmm.lookup(end), None, "{end:#x} past {a:?}");
                if mapped {
                    assert_eq!(vmm.translate(end), Some(end));
                } else if resident {
                    assert_eq!(vmm.translate(end), Some(now.backing + a.size));
                }
            }
        }
        // Just around it: the model decides.
        for ptr in [
            a.base.wrapping_sub(1),
            end + 255,
            end + 256,
            end + (1 << 20),
        ] {
            assert_eq!(
                id(vmm.lookup(ptr)),
                m.owner(ptr).map(|o| o.id),
                "{ptr:#x} near {a:?}"
            );
        }
    }
    // Random addresses over the whole span in use, mostly in gaps.
    if let (Some(lo), Some(hi)) = (
        m.live.iter().map(|a| a.base).min(),
        m.live.iter().map(|a| a.end()).max(),
    ) {
        let span = hi - lo + (8 << 20);
        for _ in 0..64 {
            let ptr = (lo - (4 << 20).min(lo)) + xorshift(seed) % span;
            let want = m.owner(ptr).map(|o| o.id);
            assert_eq!(id(vmm.lookup(ptr)), want, "{ptr:#x}");
            if want.is_none() && m.owner(ptr.wrapping_sub(1)).is_none() {
                assert_eq!(vmm.translate(ptr), None, "{ptr:#x} is in a gap");
            }
        }
    }
    assert_eq!(vmm.lookup(0), None);
    assert_eq!(vmm.lookup(u64::MAX), None);
}

fn run(steps: Vec<Step>, granularity: u64, config: Config) {
    let mapped = config.addressing == vmm::Addressing::Mapped;
    let vmm = Vmm::new(HostBackend::new(granularity), config).unwrap();
    let mut m = Model {
        live: Vec::new(),
        resident: Vec::new(),
    };
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut freed: Vec<Allocation> = Vec::new();
    for s in steps {
        let n = m.live.len();
        match s {
            Step::Alloc(size) => match vmm.alloc(size, 0) {
                Ok(a) => {
                    assert_eq!(a.size, size);
                    m.live.push(a);
                    m.resident.push(true);
                }
                Err(VmmError::Paused { .. }) => {}
                Err(e) => panic!("alloc({size}): {e}"),
            },
            Step::Free(i) if n > 0 => {
                let a = m.live.remove(i % n);
                m.resident.remove(i % n);
                vmm.free(a.base).unwrap();
                assert_eq!(
                    vmm.free(a.base),
                    Err(match m.owner(a.base) {
                        Some(o) => VmmError::NotABase {
                            ptr: a.base,
                            base: o.base,
                        },
                        None => VmmError::NotAllocated { ptr: a.base },
                    })
                );
                freed.push(a);
            }
            Step::Evict(i) if n > 0 => {
                let i = i % n;
                if m.resident[i] {
                    vmm.evict(&[m.live[i].id], &mut HostStaging).unwrap();
                    m.resident[i] = false;
                }
            }
            Step::Restore(i) if n > 0 => {
                let i = i % n;
                if !m.resident[i] {
                    vmm.restore(&[m.live[i].id], &mut HostStaging).unwrap();
                    m.resident[i] = true;
                }
            }
            Step::EvictAll => {
                vmm.evict_all(&mut HostStaging).unwrap();
                m.resident.iter_mut().for_each(|r| *r = false);
            }
            Step::RestoreAll => {
                vmm.restore_all(&mut HostStaging).unwrap();
                m.resident.iter_mut().for_each(|r| *r = true);
            }
            _ => {}
        }
        check(&vmm, &m, mapped, &mut seed);
        // Freed allocations are gone, unless their range was handed out again.
        for a in &freed {
            for ptr in [a.base, a.end() - 1] {
                assert_eq!(
                    vmm.lookup(ptr).map(|x| x.id),
                    m.owner(ptr).map(|o| o.id),
                    "{ptr:#x} of freed {a:?}"
                );
            }
        }
    }
    for a in m.live.drain(..) {
        vmm.free(a.base).unwrap();
    }
    for a in &freed {
        assert_eq!(vmm.lookup(a.base), None);
    }
    assert!(vmm.snapshot().is_empty());
    vmm.release_all().unwrap();
    assert!(vmm.backend().violations().is_empty());
}

const MIB: u64 = 1 << 20;

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn mapped_2mib_granules(steps in proptest::collection::vec(step(), 1..120)) {
        run(steps, 2 * MIB, Config { reservation_size: 64 * MIB, ..Config::mapped() });
    }

    #[test]
    fn mapped_64kib_granules_3_granule_chunks(
        steps in proptest::collection::vec(step(), 1..120)
    ) {
        // Shared chunks of 192 KiB: slots straddle granules; small reservations: many of them.
        let chunking = ChunkPolicy { slab_chunk_granules: 3, max_small: None };
        run(steps, 64 << 10, Config { reservation_size: 8 * MIB, chunking, ..Config::mapped() });
    }

    #[test]
    fn mapped_without_sharing(steps in proptest::collection::vec(step(), 1..120)) {
        let chunking = ChunkPolicy { slab_chunk_granules: 1, max_small: Some(0) };
        run(steps, 2 * MIB, Config { chunking, ..Config::mapped() });
    }

    #[test]
    fn translated(steps in proptest::collection::vec(step(), 1..120)) {
        run(steps, 2 * MIB, Config::translated());
    }

    #[test]
    fn translated_unaligned_range(steps in proptest::collection::vec(step(), 1..120)) {
        // A base that is not a 2 MiB boundary and a size that is not whole units.
        let config = Config {
            translated_base: (1 << 44) + 0x1_2300,
            translated_size: (1 << 36) + 0x4500,
            ..Config::translated()
        };
        run(steps, 2 * MIB, config);
    }
}
