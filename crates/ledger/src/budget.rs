//! One device's budget in one process: its limit, what it holds and held at most, and its
//! entry in the node ledger. Every path that takes device memory asks it first — the VMM
//! through [`vmm::Budget`], the driver's `cuMemCreate` and managed allocations directly —
//! so the limit holds over all of them together, exactly, under any number of threads.

use crate::ledger::{Grant, Ledger, View};
use parking_lot::Mutex;
use std::fmt;

/// Why memory was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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
}

fn gib(b: u64) -> String {
    format!("{:.2} GiB", b as f64 / (1u64 << 30) as f64)
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Refusal::Limit { bytes, limit, used } => write!(
                f,
                "{bytes} bytes refused: the process's limit is {limit} bytes ({}), {used} ({}) in use",
                gib(limit),
                gib(used)
            ),
            Refusal::Node {
                bytes,
                capacity,
                others,
                used,
            } => write!(
                f,
                "{bytes} bytes refused: the card's {capacity} bytes ({}) are shared, other processes under cudaw hold {others} ({}), this one {used} ({})",
                gib(capacity),
                gib(others),
                gib(used)
            ),
        }
    }
}

/// What a budget reports to its owner (to be logged).
#[derive(Debug, Clone, Copy)]
pub enum Note<'a> {
    /// An allocation was refused.
    Refused(&'a Refusal),
    /// The ledger failed; the process goes on without it (its own limit still holds).
    LedgerFailed(&'a str),
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

struct Inner {
    used: u64,
    peak: u64,
    refused: u64,
    ledger: Option<Ledger>,
}

/// One device's budget in this process.
pub struct DeviceBudget {
    limit: Option<u64>,
    inner: Mutex<Inner>,
    notify: Box<dyn Fn(Note<'_>) + Send + Sync>,
}

impl fmt::Debug for DeviceBudget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceBudget")
            .field("limit", &self.limit)
            .field("usage", &self.usage())
            .finish_non_exhaustive()
    }
}

impl DeviceBudget {
    /// A budget with an optional limit and ledger; `notify` hears of refusals and ledger
    /// failures (it runs with no lock held).
    pub fn new(
        limit: Option<u64>,
        ledger: Option<Ledger>,
        notify: impl Fn(Note<'_>) + Send + Sync + 'static,
    ) -> Self {
        Self {
            limit,
            inner: Mutex::new(Inner {
                used: 0,
                peak: 0,
                refused: 0,
                ledger,
            }),
            notify: Box::new(notify),
        }
    }

    /// The limit, if any.
    pub fn limit(&self) -> Option<u64> {
        self.limit
    }

    /// Whether this budget records into a node ledger.
    pub fn has_ledger(&self) -> bool {
        self.inner.lock().ledger.is_some()
    }

    /// Limit, use and peak now.
    pub fn usage(&self) -> Usage {
        let g = self.inner.lock();
        Usage {
            limit: self.limit,
            used: g.used,
            peak: g.peak,
            refused: g.refused,
        }
    }

    /// Takes `bytes` of device memory if they fit the limit and, with a ledger, the card
    /// beside the other processes.
    pub fn try_acquire(&self, bytes: u64) -> Result<(), Refusal> {
        let mut failed = None;
        let result = {
            let mut g = self.inner.lock();
            let result = self.acquire_locked(&mut g, bytes, &mut failed);
            if result.is_err() {
                g.refused += 1;
            }
            result
        };
        if let Some(msg) = failed {
            (self.notify)(Note::LedgerFailed(&msg));
        }
        if let Err(r) = &result {
            (self.notify)(Note::Refused(r));
        }
        result
    }

    fn acquire_locked(
        &self,
        g: &mut Inner,
        bytes: u64,
        failed: &mut Option<String>,
    ) -> Result<(), Refusal> {
        let after = g.used.checked_add(bytes);
        if let Some(limit) = self.limit {
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
        if let Some(l) = g.ledger.as_mut() {
            match l.acquire(bytes) {
                Ok(Grant::Granted) => {}
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
                Err(e) => {
                    *failed = Some(format!("{e}; going on without the node ledger"));
                    g.ledger = None;
                }
            }
        }
        g.used = after;
        g.peak = g.peak.max(after);
        Ok(())
    }

    /// Gives back `bytes` taken with [`DeviceBudget::try_acquire`].
    pub fn give_back(&self, bytes: u64) {
        let mut failed = None;
        {
            let mut g = self.inner.lock();
            g.used = g.used.saturating_sub(bytes);
            if let Some(l) = g.ledger.as_mut() {
                if let Err(e) = l.release(bytes) {
                    failed = Some(format!("{e}; going on without the node ledger"));
                    g.ledger = None;
                }
            }
        }
        if let Some(msg) = failed {
            (self.notify)(Note::LedgerFailed(&msg));
        }
    }

    /// The node ledger now (dead processes reclaimed), with a ledger.
    pub fn node(&self) -> Option<View> {
        let mut failed = None;
        let view = {
            let mut g = self.inner.lock();
            match g.ledger.as_mut().map(Ledger::view) {
                None => None,
                Some(Ok(v)) => Some(v),
                Some(Err(e)) => {
                    failed = Some(format!("{e}; going on without the node ledger"));
                    g.ledger = None;
                    None
                }
            }
        };
        if let Some(msg) = failed {
            (self.notify)(Note::LedgerFailed(&msg));
        }
        view
    }

    /// `(free, total)` as `cudaMemGetInfo` should report them, given the card's figures:
    /// total is the limit (at most the card's), free what this process may still take —
    /// within its limit, within what the card has free, and within what the other
    /// processes in the ledger leave.
    pub fn memory_info(&self, card_free: u64, card_total: u64) -> (u64, u64) {
        let used = self.inner.lock().used;
        let total = self.limit.map_or(card_total, |l| l.min(card_total));
        let mut free = card_free.min(total);
        if let Some(limit) = self.limit {
            free = free.min(limit.saturating_sub(used));
        }
        if let Some(v) = self.node() {
            free = free.min(v.available());
        }
        (free, total)
    }

    /// Removes this process from the ledger (at exit).
    pub fn leave(&self) {
        if let Some(l) = self.inner.lock().ledger.as_mut() {
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
    use crate::ledger;
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
        let b = Arc::new(DeviceBudget::new(Some(limit), None, move |n| {
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
    fn memory_info_is_the_limit_and_what_is_left() {
        let b = DeviceBudget::new(Some(4 * G), None, |_| {});
        assert_eq!(b.memory_info(70 * G, 80 * G), (4 * G, 4 * G));
        b.try_acquire(G).unwrap();
        assert_eq!(b.memory_info(70 * G, 80 * G), (3 * G, 4 * G));
        // Never more than the card has free.
        assert_eq!(b.memory_info(G / 2, 80 * G), (G / 2, 4 * G));
        // A limit above the card: the card's total.
        let big = DeviceBudget::new(Some(100 * G), None, |_| {});
        assert_eq!(big.memory_info(70 * G, 80 * G), (70 * G, 80 * G));
        let none = DeviceBudget::new(None, None, |_| {});
        assert_eq!(none.memory_info(70 * G, 80 * G), (70 * G, 80 * G));
    }

    #[test]
    fn two_budgets_share_one_card_through_the_ledger() {
        let d = std::env::temp_dir().join(format!("cudaw-budget-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        let p = ledger::path(&d, "GPU-x");
        let lives = |_: ProcessId| true;
        let open = |pid: u32| {
            Ledger::open_as(
                &p,
                4 * G,
                Some(3 * G),
                ProcessId {
                    pid: (1 << 30) + pid,
                    start: 1,
                },
                lives,
            )
            .unwrap()
        };
        let a = DeviceBudget::new(Some(3 * G), Some(open(2)), |_| {});
        let b = DeviceBudget::new(Some(3 * G), Some(open(4)), |_| {});
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
}
