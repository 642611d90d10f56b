//! One device's budget in one process: its limit, what it holds and held at most, and its
//! entry in the node ledger. Every path that takes device memory asks it first — the VMM
//! through [`vmm::Budget`], the driver's `cuMemCreate` and managed allocations directly —
//! so the limit holds over all of them together, exactly, under any number of threads.

use crate::ledger::{Grant, Ledger, View};
use parking_lot::Mutex;
use std::fmt;

/// Why memory was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// The process's own limit.
    Limit {
        /// Bytes asked for.
        bytes: u64,
        /// The limit.
        limit: u64,
        /// Bytes held.
        used: u64,
    },
    /// The card, shared through the node ledger.
    Node {
        /// Bytes asked for.
        bytes: u64,
        /// The card's total memory.
        capacity: u64,
        /// Bytes the other processes under cudaw hold on it.
        others: u64,
        /// Bytes this process holds.
        used: u64,
    },
    /// The limit or the node ledger cannot be kept (an invalid limit, a ledger that
    /// cannot be joined, read or written): refused rather than taken unaccounted.
    Unaccounted {
        /// Bytes asked for.
        bytes: u64,
        /// Why.
        why: String,
    },
}

fn gib(b: u64) -> String {
    format!("{:.2} GiB", b as f64 / (1u64 << 30) as f64)
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::Limit { bytes, limit, used } => write!(
                f,
                "{bytes} bytes refused: the process's limit is {limit} bytes ({}), {used} ({}) in use",
                gib(*limit),
                gib(*used)
            ),
            Refusal::Node {
                bytes,
                capacity,
                others,
                used,
            } => write!(
                f,
                "{bytes} bytes refused: the card's {capacity} bytes ({}) are shared, other processes under cudaw hold {others} ({}), this one {used} ({})",
                gib(*capacity),
                gib(*others),
                gib(*used)
            ),
            Refusal::Unaccounted { bytes, why } => write!(f, "{bytes} bytes refused: {why}"),
        }
    }
}

/// What a budget reports to its owner (to be logged).
#[derive(Debug, Clone, Copy)]
pub enum Note<'a> {
    /// An allocation was refused.
    Refused(&'a Refusal),
    /// The ledger failed: allocations are refused until it works again (said once per
    /// distinct reason).
    LedgerFailed(&'a str),
    /// The ledger works again, or repaired this process's entry.
    LedgerRepaired(&'a str),
}

/// A snapshot of one device's budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Usage {
    /// The limit, if any.
    pub limit: Option<u64>,
    /// Bytes held now.
    pub used: u64,
    /// The most held at once.
    pub peak: u64,
    /// Allocations refused so far.
    pub refused: u64,
}

/// Tries to join the node ledger again.
pub type Rejoin = Box<dyn FnMut() -> Result<Ledger, String> + Send>;

/// How a budget shares the card with the node's other processes.
pub enum Accounting {
    /// It does not (`CUDAW_LEDGER=off`): its limit alone holds.
    Off,
    /// Through the node ledger.
    Ledger(Ledger),
    /// The ledger could not be joined: every allocation tries again, and is refused while
    /// it cannot.
    Rejoin {
        /// Why it could not, last time.
        why: String,
        /// Joins it.
        rejoin: Rejoin,
    },
}

impl fmt::Debug for Accounting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Accounting::Off => f.write_str("Off"),
            Accounting::Ledger(l) => f.debug_tuple("Ledger").field(l).finish(),
            Accounting::Rejoin { why, .. } => f.debug_struct("Rejoin").field("why", why).finish(),
        }
    }
}

struct Inner {
    used: u64,
    peak: u64,
    refused: u64,
    accounting: Accounting,
    /// The last ledger failure said, so that a failure is said once, not per allocation.
    said: Option<String>,
}

/// What to tell the owner once the lock is dropped.
#[derive(Default)]
struct Tell {
    failed: Option<String>,
    repaired: Vec<String>,
}

impl Inner {
    /// Notes a ledger failure, to be said if it is not the one said last.
    fn failed(&mut self, tell: &mut Tell, why: &str) {
        if self.said.as_deref() != Some(why) {
            self.said = Some(why.to_owned());
            tell.failed = Some(why.to_owned());
        }
    }

    fn collect_notes(&mut self, tell: &mut Tell) {
        if let Accounting::Ledger(l) = &mut self.accounting {
            tell.repaired.extend(l.take_notes());
        }
    }
}

/// Why an allocation is refused while the ledger cannot be joined.
fn rejoin_failed(why: &str) -> String {
    format!("the node ledger cannot be joined: {why}")
}

/// One device's budget in this process.
pub struct DeviceBudget {
    /// The process's own limit (`CUDAW_MEM_LIMIT`).
    limit: Option<u64>,
    /// The node daemon's limit for the process's job (`memory` in its configuration),
    /// `u64::MAX` for none; set at any time, shared by every device's budget of the
    /// process ([`DeviceBudget::sharing_node_limit`]). The stricter of the two holds.
    node_limit: std::sync::Arc<std::sync::atomic::AtomicU64>,
    /// Set when the limit cannot be kept: every allocation is refused, with this reason.
    refuse_all: Option<String>,
    /// Whether a refusal now is a retry of one already counted (an allocation waiting for
    /// room tries every few milliseconds): not counted again in `refused`.
    retrying: fn() -> bool,
    inner: Mutex<Inner>,
    notify: Box<dyn Fn(Note<'_>) + Send + Sync>,
}

impl fmt::Debug for DeviceBudget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceBudget")
            .field("limit", &self.limit)
            .field("node_limit", &self.node_limit())
            .field("refuse_all", &self.refuse_all)
            .field("usage", &self.usage())
            .finish_non_exhaustive()
    }
}

impl DeviceBudget {
    /// A budget with an optional limit, sharing the card as `accounting` says; `notify`
    /// hears of refusals and ledger failures (it runs with no lock held). The reason an
    /// [`Accounting::Rejoin`] starts with is the creator's to say: it is said again only if
    /// it changes.
    pub fn new(
        limit: Option<u64>,
        accounting: Accounting,
        notify: impl Fn(Note<'_>) + Send + Sync + 'static,
    ) -> Self {
        let said = match &accounting {
            Accounting::Rejoin { why, .. } => Some(rejoin_failed(why)),
            _ => None,
        };
        Self {
            limit,
            node_limit: std::sync::Arc::new(std::sync::atomic::AtomicU64::new(u64::MAX)),
            refuse_all: None,
            retrying: || false,
            inner: Mutex::new(Inner {
                used: 0,
                peak: 0,
                refused: 0,
                accounting,
                said,
            }),
            notify: Box::new(notify),
        }
    }

    /// A budget that refuses every allocation, saying `why` (a limit that cannot be
    /// enforced: refused rather than ignored).
    pub fn refusing(why: String, notify: impl Fn(Note<'_>) + Send + Sync + 'static) -> Self {
        Self {
            refuse_all: Some(why),
            ..Self::new(None, Accounting::Off, notify)
        }
    }

    /// The limit in force, if any: the stricter of the process's own and the node
    /// daemon's.
    pub fn limit(&self) -> Option<u64> {
        let node = self.node_limit.load(std::sync::atomic::Ordering::Relaxed);
        match (self.limit, node) {
            (own, u64::MAX) => own,
            (Some(own), node) => Some(own.min(node)),
            (None, node) => Some(node),
        }
    }

    /// This budget with `retrying` saying when a refusal is a retry of one counted already
    /// (the caller's waiting allocations): `refused` counts allocations refused, not tries.
    pub fn counting_retries_once(mut self, retrying: fn() -> bool) -> Self {
        self.retrying = retrying;
        self
    }

    /// This budget with its node limit read from `shared` (`u64::MAX`: none), which the
    /// process's other budgets share: one store sets every device's, those made later too.
    pub fn sharing_node_limit(
        mut self,
        shared: std::sync::Arc<std::sync::atomic::AtomicU64>,
    ) -> Self {
        self.node_limit = shared;
        self
    }

    /// Sets the node daemon's limit (`None`: none) of every budget sharing it. Lowered
    /// below what the process holds, nothing is taken back: allocations are refused
    /// until the process has freed enough.
    pub fn set_node_limit(&self, bytes: Option<u64>) {
        self.node_limit.store(
            bytes.map_or(u64::MAX, |b| b.min(u64::MAX - 1)),
            std::sync::atomic::Ordering::Relaxed,
        );
    }

    /// The node daemon's limit, if any.
    pub fn node_limit(&self) -> Option<u64> {
        match self.node_limit.load(std::sync::atomic::Ordering::Relaxed) {
            u64::MAX => None,
            b => Some(b),
        }
    }

    /// Whether this budget records into a node ledger.
    pub fn has_ledger(&self) -> bool {
        matches!(self.inner.lock().accounting, Accounting::Ledger(_))
    }

    /// Limit, use and peak now.
    pub fn usage(&self) -> Usage {
        let g = self.inner.lock();
        Usage {
            limit: self.limit(),
            used: g.used,
            peak: g.peak,
            refused: g.refused,
        }
    }

    fn tell(&self, tell: Tell) {
        if let Some(msg) = &tell.failed {
            (self.notify)(Note::LedgerFailed(msg));
        }
        for msg in &tell.repaired {
            (self.notify)(Note::LedgerRepaired(msg));
        }
    }

    /// Takes `bytes` of device memory if they fit the limit and, with a ledger, the card
    /// beside the other processes.
    pub fn try_acquire(&self, bytes: u64) -> Result<(), Refusal> {
        let mut tell = Tell::default();
        let result = {
            let mut g = self.inner.lock();
            let result = self.acquire_locked(&mut g, bytes, &mut tell);
            if result.is_err() && !(self.retrying)() {
                g.refused += 1;
            }
            g.collect_notes(&mut tell);
            result
        };
        self.tell(tell);
        if let Err(r) = &result {
            (self.notify)(Note::Refused(r));
        }
        result
    }

    fn acquire_locked(&self, g: &mut Inner, bytes: u64, tell: &mut Tell) -> Result<(), Refusal> {
        if let Some(why) = &self.refuse_all {
            return Err(Refusal::Unaccounted {
                bytes,
                why: why.clone(),
            });
        }
        let after = g.used.checked_add(bytes);
        if let Some(limit) = self.limit() {
            if after.is_none_or(|a| a > limit) {
                return Err(Refusal::Limit {
                    bytes,
                    limit,
                    used: g.used,
                });
            }
        }
        let after = after.ok_or(Refusal::Limit {
            bytes,
            limit: u64::MAX,
            used: g.used,
        })?;
        if let Accounting::Rejoin { rejoin, .. } = &mut g.accounting {
            match rejoin() {
                Ok(l) => {
                    tell.repaired.push(match l.path() {
                        Some(p) => format!("joined the node ledger ({})", p.display()),
                        None => "joined the node ledger".to_owned(),
                    });
                    g.accounting = Accounting::Ledger(l);
                    g.said = None;
                }
                Err(e) => {
                    let why = rejoin_failed(&e);
                    g.failed(tell, &why);
                    if let Accounting::Rejoin { why: w, .. } = &mut g.accounting {
                        w.clone_from(&why);
                    }
                    return Err(Refusal::Unaccounted { bytes, why });
                }
            }
        }
        if let Accounting::Ledger(l) = &mut g.accounting {
            match l.acquire(bytes) {
                Ok(Grant::Granted) => g.said = None,
                Ok(Grant::Refused {
                    capacity, others, ..
                }) => {
                    return Err(Refusal::Node {
                        bytes,
                        capacity,
                        others,
                        used: g.used,
                    })
                }
                Ok(Grant::Unknown { why }) => {
                    return Err(Refusal::Unaccounted {
                        bytes,
                        why: format!("node ledger: {why}"),
                    })
                }
                Err(e) => {
                    let why = format!(
                        "node ledger: {e}; allocations are refused until it can be written"
                    );
                    g.failed(tell, &why);
                    return Err(Refusal::Unaccounted { bytes, why });
                }
            }
        }
        g.used = after;
        g.peak = g.peak.max(after);
        Ok(())
    }

    /// Gives back `bytes` taken with [`DeviceBudget::try_acquire`].
    pub fn give_back(&self, bytes: u64) {
        let mut tell = Tell::default();
        {
            let mut g = self.inner.lock();
            g.used = g.used.saturating_sub(bytes);
            if let Accounting::Ledger(l) = &mut g.accounting {
                if let Err(e) = l.release(bytes) {
                    // The entry keeps the larger figure: the card is under-promised, never
                    // over; the next write puts it right.
                    let why = format!(
                        "node ledger: {e}; this process's entry still counts {bytes} bytes it gave back"
                    );
                    g.failed(&mut tell, &why);
                }
            }
            g.collect_notes(&mut tell);
        }
        self.tell(tell);
    }

    /// The node ledger now, with a ledger joined (`None` without one, or when it cannot
    /// be read: said once).
    pub fn node(&self) -> Option<View> {
        self.node_state().ok().flatten()
    }

    /// `Ok(None)`: no ledger; `Err`: a ledger that cannot be used now.
    fn node_state(&self) -> Result<Option<View>, ()> {
        let mut tell = Tell::default();
        let r = {
            let mut g = self.inner.lock();
            let r = match &mut g.accounting {
                Accounting::Off => Ok(None),
                Accounting::Rejoin { .. } => Err(()),
                Accounting::Ledger(l) => match l.view() {
                    Ok(v) => Ok(Some(v)),
                    Err(e) => {
                        let why = format!("node ledger: {e}");
                        g.failed(&mut tell, &why);
                        Err(())
                    }
                },
            };
            g.collect_notes(&mut tell);
            r
        };
        self.tell(tell);
        r
    }

    /// `(free, total)` as `cudaMemGetInfo` should report them, given the card's figures:
    /// total is the limit (at most the card's), free what this process may still take —
    /// within its limit, within what the card has free, and within what the other
    /// processes in the ledger leave (nothing while the limit or the ledger cannot be
    /// kept).
    pub fn memory_info(&self, card_free: u64, card_total: u64) -> (u64, u64) {
        let used = self.inner.lock().used;
        let limit = self.limit();
        let total = limit.map_or(card_total, |l| l.min(card_total));
        let mut free = card_free.min(total);
        if self.refuse_all.is_some() {
            return (0, total);
        }
        if let Some(limit) = limit {
            free = free.min(limit.saturating_sub(used));
        }
        match self.node_state() {
            Ok(None) => {}
            Ok(Some(v)) => free = free.min(v.available()),
            Err(()) => free = 0,
        }
        (free, total)
    }

    /// Moves this budget onto another card's node ledger (the process was moved to
    /// another GPU): `accounting` is the new card's, and must take everything the budget
    /// holds now before the old card's entry is left. Refused (the new card has no room
    /// beside its other processes, or its ledger cannot be written), nothing changes: the
    /// old entry stays and the error says why. [`Accounting::Rejoin`] and
    /// [`Accounting::Off`] take the place of the old accounting as they are.
    pub fn move_to(&self, accounting: Accounting) -> Result<(), Refusal> {
        let mut tell = Tell::default();
        let result = {
            let mut g = self.inner.lock();
            let used = g.used;
            let mut accounting = accounting;
            let taken = match &mut accounting {
                Accounting::Ledger(l) => match l.acquire(used) {
                    Ok(Grant::Granted) => Ok(()),
                    Ok(Grant::Refused {
                        capacity, others, ..
                    }) => Err(Refusal::Node {
                        bytes: used,
                        capacity,
                        others,
                        used: 0,
                    }),
                    Ok(Grant::Unknown { why }) => Err(Refusal::Unaccounted {
                        bytes: used,
                        why: format!("node ledger: {why}"),
                    }),
                    Err(e) => Err(Refusal::Unaccounted {
                        bytes: used,
                        why: format!("node ledger: {e}"),
                    }),
                },
                Accounting::Off | Accounting::Rejoin { .. } => Ok(()),
            };
            match taken {
                Ok(()) => {
                    if let Accounting::Ledger(old) = &mut g.accounting {
                        if let Err(e) = old.leave() {
                            tell.repaired
                                .push(format!("leaving the old card's ledger: {e}"));
                        }
                    }
                    g.said = match &accounting {
                        Accounting::Rejoin { why, .. } => Some(rejoin_failed(why)),
                        _ => None,
                    };
                    g.accounting = accounting;
                    Ok(())
                }
                Err(r) => {
                    // The new entry, written with nothing granted, goes again.
                    if let Accounting::Ledger(l) = &mut accounting {
                        let _ = l.leave();
                    }
                    Err(r)
                }
            }
        };
        self.tell(tell);
        result
    }

    /// Removes this process from the ledger (at exit).
    pub fn leave(&self) {
        if let Accounting::Ledger(l) = &mut self.inner.lock().accounting {
            let _ = l.leave();
        }
    }
}

impl vmm::Budget for DeviceBudget {
    fn acquire(&self, bytes: u64) -> bool {
        self.try_acquire(bytes).is_ok()
    }

    fn release(&self, bytes: u64) {
        self.give_back(bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::process::ProcessId;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    const G: u64 = 1 << 30;
    const M2: u64 = 2 << 20;

    #[test]
    fn the_limit_holds_exactly_under_racing_threads() {
        let limit = 64 * M2 + M2 - 1;
        let refusals = Arc::new(AtomicUsize::new(0));
        let r = refusals.clone();
        let b = Arc::new(DeviceBudget::new(Some(limit), Accounting::Off, move |n| {
            if let Note::Refused(_) = n {
                r.fetch_add(1, Ordering::Relaxed);
            }
        }));
        let held: u64 = (0..8)
            .map(|_| {
                let b = b.clone();
                std::thread::spawn(move || {
                    let mut mine = 0;
                    while b.try_acquire(M2).is_ok() {
                        mine += M2;
                    }
                    mine
                })
            })
            .collect::<Vec<_>>()
            .into_iter()
            .map(|t| t.join().unwrap())
            .sum();
        assert_eq!(held, 64 * M2);
        assert_eq!(refusals.load(Ordering::Relaxed), 8);
        let u = b.usage();
        assert_eq!(
            (u.used, u.peak, u.limit, u.refused),
            (64 * M2, 64 * M2, Some(limit), 8)
        );
        b.give_back(M2);
        assert!(b.try_acquire(M2).is_ok());
        assert_eq!(
            b.try_acquire(M2),
            Err(Refusal::Limit {
                bytes: M2,
                limit,
                used: 64 * M2
            })
        );
    }

    #[test]
    fn the_node_limit_and_the_process_limit_the_stricter_holds_and_lowering_takes_nothing() {
        let b = DeviceBudget::new(Some(4 * G), Accounting::Off, |_| {});
        b.try_acquire(3 * G).unwrap();
        b.set_node_limit(Some(2 * G));
        assert_eq!((b.limit(), b.node_limit()), (Some(2 * G), Some(2 * G)));
        // Below what is held: nothing is taken back, but nothing more is given...
        assert!(matches!(b.try_acquire(1), Err(Refusal::Limit { limit, .. }) if limit == 2 * G));
        assert_eq!(b.memory_info(70 * G, 80 * G), (0, 2 * G));
        // ... until enough is freed.
        b.give_back(2 * G);
        b.try_acquire(G / 2).unwrap();
        // A node limit above the process's own: its own holds; none: its own again.
        b.set_node_limit(Some(8 * G));
        assert_eq!(b.limit(), Some(4 * G));
        b.set_node_limit(None);
        assert_eq!((b.limit(), b.node_limit()), (Some(4 * G), None));
        // A process without a limit of its own gets the node's.
        let free = DeviceBudget::new(None, Accounting::Off, |_| {});
        free.set_node_limit(Some(G));
        assert_eq!(free.usage().limit, Some(G));
        assert!(free.try_acquire(2 * G).is_err());
        // Shared by a process's budgets: one store sets them all, one made later too.
        let shared = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(u64::MAX));
        let d0 = DeviceBudget::new(None, Accounting::Off, |_| {})
            .sharing_node_limit(std::sync::Arc::clone(&shared));
        d0.set_node_limit(Some(3 * G));
        let d1 = DeviceBudget::new(Some(8 * G), Accounting::Off, |_| {})
            .sharing_node_limit(std::sync::Arc::clone(&shared));
        assert_eq!((d0.limit(), d1.limit()), (Some(3 * G), Some(3 * G)));
        d1.set_node_limit(None);
        assert_eq!((d0.limit(), d1.limit()), (None, Some(8 * G)));
    }

    #[test]
    fn retries_of_a_refused_allocation_are_not_counted_again() {
        static RETRYING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
        let b = DeviceBudget::new(Some(G), Accounting::Off, |_| {})
            .counting_retries_once(|| RETRYING.load(std::sync::atomic::Ordering::Relaxed));
        assert!(b.try_acquire(2 * G).is_err());
        RETRYING.store(true, std::sync::atomic::Ordering::Relaxed);
        for _ in 0..5 {
            assert!(b.try_acquire(2 * G).is_err());
        }
        RETRYING.store(false, std::sync::atomic::Ordering::Relaxed);
        assert_eq!(b.usage().refused, 1);
        assert!(b.try_acquire(2 * G).is_err());
        assert_eq!(b.usage().refused, 2);
    }

    #[test]
    fn memory_info_is_the_limit_and_what_is_left() {
        let b = DeviceBudget::new(Some(4 * G), Accounting::Off, |_| {});
        assert_eq!(b.memory_info(70 * G, 80 * G), (4 * G, 4 * G));
        b.try_acquire(G).unwrap();
        assert_eq!(b.memory_info(70 * G, 80 * G), (3 * G, 4 * G));
        // Never more than the card has free.
        assert_eq!(b.memory_info(G / 2, 80 * G), (G / 2, 4 * G));
        // A limit above the card: the card's total.
        let big = DeviceBudget::new(Some(100 * G), Accounting::Off, |_| {});
        assert_eq!(big.memory_info(70 * G, 80 * G), (70 * G, 80 * G));
        let none = DeviceBudget::new(None, Accounting::Off, |_| {});
        assert_eq!(none.memory_info(70 * G, 80 * G), (70 * G, 80 * G));
    }

    fn lives(_: ProcessId, _: u32) -> crate::process::Verdict {
        crate::process::Verdict::Live
    }

    fn join(dir: &std::path::Path, n: u32) -> Ledger {
        Ledger::join_as(
            dir,
            "GPU-x",
            4 * G,
            Some(3 * G),
            ProcessId {
                pid: (1 << 30) + n,
                start: 1,
            },
            lives,
        )
        .unwrap()
    }

    #[test]
    fn two_budgets_share_one_card_through_the_ledger() {
        let d = tempfile::tempdir().unwrap();
        let a = DeviceBudget::new(Some(3 * G), Accounting::Ledger(join(d.path(), 2)), |_| {});
        let b = DeviceBudget::new(Some(3 * G), Accounting::Ledger(join(d.path(), 4)), |_| {});
        a.try_acquire(3 * G).unwrap();
        assert_eq!(b.memory_info(4 * G, 4 * G), (G, 3 * G));
        assert_eq!(
            b.try_acquire(2 * G),
            Err(Refusal::Node {
                bytes: 2 * G,
                capacity: 4 * G,
                others: 3 * G,
                used: 0
            })
        );
        assert_eq!(b.usage().used, 0, "a refusal takes nothing");
        b.try_acquire(G).unwrap();
        a.give_back(2 * G);
        b.try_acquire(2 * G).unwrap();
        assert!(matches!(b.try_acquire(1), Err(Refusal::Limit { .. })));
        assert_eq!(b.node().unwrap().used(), 4 * G);
        let msg = Refusal::Node {
            bytes: 1,
            capacity: 4 * G,
            others: G,
            used: 0,
        }
        .to_string();
        assert!(msg.contains("other processes under cudaw hold"), "{msg}");
    }

    fn join_key(dir: &std::path::Path, key: &str, n: u32) -> Ledger {
        Ledger::join_as(
            dir,
            key,
            4 * G,
            None,
            ProcessId {
                pid: (1 << 30) + n,
                start: 1,
            },
            lives,
        )
        .unwrap()
    }

    #[test]
    fn a_budget_moves_to_another_card_only_where_it_fits() {
        let d = tempfile::tempdir().unwrap();
        let mine = DeviceBudget::new(
            None,
            Accounting::Ledger(join_key(d.path(), "GPU-a", 1)),
            |_| {},
        );
        mine.try_acquire(3 * G).unwrap();
        // Card b: another process holds 2 of its 4 GiB.
        let other = DeviceBudget::new(
            None,
            Accounting::Ledger(join_key(d.path(), "GPU-b", 2)),
            |_| {},
        );
        other.try_acquire(2 * G).unwrap();
        let refused = mine.move_to(Accounting::Ledger(join_key(d.path(), "GPU-b", 1)));
        assert_eq!(
            refused,
            Err(Refusal::Node {
                bytes: 3 * G,
                capacity: 4 * G,
                others: 2 * G,
                used: 0
            })
        );
        // Nothing changed: card a still counts the 3 GiB, card b only the other's 2.
        assert_eq!(join_key(d.path(), "GPU-a", 9).view().unwrap().used(), 3 * G);
        assert_eq!(join_key(d.path(), "GPU-b", 9).view().unwrap().used(), 2 * G);
        assert_eq!(mine.usage().used, 3 * G);
        other.give_back(2 * G);
        mine.move_to(Accounting::Ledger(join_key(d.path(), "GPU-b", 1)))
            .unwrap();
        assert_eq!(join_key(d.path(), "GPU-a", 9).view().unwrap().used(), 0);
        assert_eq!(join_key(d.path(), "GPU-b", 9).view().unwrap().used(), 3 * G);
        // The budget now takes from card b.
        assert!(other.try_acquire(2 * G).is_err());
        mine.give_back(3 * G);
        other.try_acquire(2 * G).unwrap();
    }

    /// Collects what a budget says.
    fn recorder() -> (
        Arc<parking_lot::Mutex<Vec<String>>>,
        impl Fn(Note<'_>) + Send + Sync + 'static,
    ) {
        let said = Arc::new(parking_lot::Mutex::new(Vec::new()));
        let s = said.clone();
        (said, move |n: Note<'_>| {
            s.lock().push(match n {
                Note::Refused(r) => format!("refused: {r}"),
                Note::LedgerFailed(m) => format!("failed: {m}"),
                Note::LedgerRepaired(m) => format!("repaired: {m}"),
            })
        })
    }

    #[test]
    fn a_limit_that_cannot_be_kept_refuses_everything() {
        let (said, notify) = recorder();
        let b = DeviceBudget::refusing("CUDAW_MEM_LIMIT=\"lots\" is not valid".into(), notify);
        for bytes in [1, G] {
            assert_eq!(
                b.try_acquire(bytes),
                Err(Refusal::Unaccounted {
                    bytes,
                    why: "CUDAW_MEM_LIMIT=\"lots\" is not valid".into()
                })
            );
        }
        assert_eq!(b.usage().refused, 2);
        assert_eq!(b.memory_info(4 * G, 4 * G), (0, 4 * G));
        assert_eq!(said.lock().len(), 2);
    }

    #[test]
    fn a_ledger_that_cannot_be_joined_refuses_until_it_can() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().to_owned();
        let ok = Arc::new(AtomicUsize::new(0));
        let o = ok.clone();
        let rejoin: Rejoin = Box::new(move || match o.load(Ordering::Relaxed) {
            0 => Err("the folder is away".into()),
            1 => Err("the folder is elsewhere".into()),
            _ => Ok(join(&dir, 6)),
        });
        let (said, notify) = recorder();
        let b = DeviceBudget::new(
            Some(3 * G),
            Accounting::Rejoin {
                why: "the folder is away".into(),
                rejoin,
            },
            notify,
        );
        for _ in 0..3 {
            assert!(matches!(
                b.try_acquire(G),
                Err(Refusal::Unaccounted { why, .. }) if why.contains("the folder is away")
            ));
        }
        assert_eq!(b.memory_info(4 * G, 4 * G), (0, 3 * G));
        // The first reason is the creator's to say; a new one is said, once.
        let failed = || {
            said.lock()
                .iter()
                .filter(|m| m.starts_with("failed"))
                .count()
        };
        assert_eq!(failed(), 0, "{:?}", said.lock());
        ok.store(1, Ordering::Relaxed);
        for _ in 0..3 {
            assert!(b.try_acquire(G).is_err());
        }
        assert_eq!(failed(), 1, "{:?}", said.lock());
        ok.store(2, Ordering::Relaxed);
        b.try_acquire(G).unwrap();
        assert!(b.has_ledger());
        assert!(said
            .lock()
            .iter()
            .any(|m| m.starts_with("repaired: joined")));
        assert_eq!(b.node().unwrap().used(), G);
    }

    #[test]
    fn a_ledger_that_fails_refuses_and_is_never_dropped() {
        let d = tempfile::tempdir().unwrap();
        let sub = d.path().join("node");
        std::fs::create_dir(&sub).unwrap();
        let (said, notify) = recorder();
        let b = DeviceBudget::new(None, Accounting::Ledger(join(&sub, 8)), notify);
        b.try_acquire(G).unwrap();
        // The folder goes away: nothing can be read nor written.
        std::fs::remove_dir_all(&sub).unwrap();
        assert!(matches!(
            b.try_acquire(G),
            Err(Refusal::Unaccounted { why, .. }) if why.contains("node ledger")
        ));
        assert!(b.has_ledger(), "still in the ledger: it is not dropped");
        assert_eq!(b.memory_info(4 * G, 4 * G).0, 0);
        assert!(said.lock().iter().any(|m| m.starts_with("failed")));
        // Back: the entry is written again, and memory is granted.
        std::fs::create_dir(&sub).unwrap();
        b.try_acquire(G).unwrap();
        assert_eq!(b.node().unwrap().used(), 2 * G);
    }
}
