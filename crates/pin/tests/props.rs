//! Random programs of copies, failed registrations and memory given back: the history's
//! books always balance, the budget holds, pinned ranges never overlap, and nothing
//! pinned survives the memory it was in.

use cudaw_pin::*;
use proptest::prelude::*;

const MIB: u64 = 1 << 20;

#[derive(Debug, Clone)]
enum Op {
    /// A copy at buffer `b` (of 8), offset `off` pages, `mib` MiB long.
    Copy { b: u64, off: u64, mib: u64 },
    /// The last Pin failed.
    Fail,
    /// Buffer `b` is freed.
    Free { b: u64 },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => (0..8u64, 0..2u64, prop::sample::select(vec![1u64, 8, 16, 32]))
            .prop_map(|(b, off, mib)| Op::Copy { b, off, mib }),
        1 => Just(Op::Fail),
        1 => (0..8u64).prop_map(|b| Op::Free { b }),
    ]
}

fn base(b: u64) -> u64 {
    0x10_0000_0000 + b * 64 * MIB
}

proptest! {
    #[test]
    fn the_books_balance(ops in proptest::collection::vec(op(), 1..300), budget_mib in 0..200u64) {
        let budget = budget_mib * MIB;
        let mut h = History::new(Policy {
            mode: Mode::Auto,
            budget,
            min_bytes: MIB,
            // Cheap pinning: a range gets hot on its second or third copy.
            costs: Costs { pin_s_per_byte: 4e-11, ..Costs::default() },
        });
        let mut last_pin = None;
        for (now, op) in ops.into_iter().enumerate() {
            match op {
                Op::Copy { b, off, mib } => {
                    let ptr = base(b) + off * PAGE;
                    match h.copy(ptr, mib * MIB, "site", now as u64) {
                        Action::Pin { start, len } => {
                            prop_assert!(start <= ptr && ptr + mib * MIB <= start + len);
                            last_pin = Some(start);
                        }
                        Action::Direct(_) => {
                            let around = h.pinned_ranges().into_iter().any(|(s, l)| s <= ptr && ptr + mib * MIB <= s + l);
                            prop_assert!(around);
                        }
                        Action::Stage => {}
                    }
                }
                Op::Fail => {
                    if let Some(s) = last_pin.take() {
                        h.pin_failed(s);
                    }
                }
                Op::Free { b } => {
                    let (lo, hi) = (base(b), base(b) + 64 * MIB);
                    let before: Vec<_> = h.pinned_ranges().into_iter().filter(|(s, l)| *s < hi && s + l > lo).collect();
                    let released = h.release(lo, 64 * MIB, true);
                    prop_assert_eq!(&released, &before);
                    // The caller unregisters them, and says so.
                    for (s, _) in released {
                        h.unregistered(s);
                    }
                    prop_assert!(h.pinned_ranges().into_iter().all(|(s, l)| s >= hi || s + l <= lo));
                    last_pin = None;
                }
            }
            let pinned = h.pinned_ranges();
            // The bounds (from the index of registrations) are those of every range pinned.
            let lo = pinned.iter().map(|&(s, _)| s).min().unwrap_or(u64::MAX);
            let hi = pinned.iter().map(|&(s, l)| s + l).max().unwrap_or(0);
            prop_assert_eq!(h.pinned_bounds(), (lo, hi));
            let total: u64 = pinned.iter().map(|(_, l)| l).sum();
            prop_assert_eq!(h.stats().pinned_bytes, total);
            prop_assert_eq!(h.stats().pinned_ranges, pinned.len() as u64);
            prop_assert!(total <= budget);
            for w in pinned.windows(2) {
                prop_assert!(w[0].0 + w[0].1 <= w[1].0, "overlap: {:?}", w);
            }
        }
    }
}
