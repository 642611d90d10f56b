//! Per-thread counters. Only the owning thread writes them, with a plain load and store
//! (no read-modify-write, no lock, no shared cache line); readers load them at any time
//! and [`merge`] sums every thread's. Tables grow in chunks made on first use, so a thread
//! that calls few functions holds little.

use crate::Direction;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

/// Ids per chunk.
pub const CHUNK: usize = 256;
/// Chunks per table: ids below `CHUNK * CHUNKS` are counted, higher ones ignored.
pub const CHUNKS: usize = 256;

/// A table of `T` by id, made a chunk at a time.
pub struct Table<T> {
    chunks: [OnceLock<Box<[T]>>; CHUNKS],
}

impl<T: Default> Table<T> {
    fn new() -> Table<T> {
        Table {
            chunks: [const { OnceLock::new() }; CHUNKS],
        }
    }

    /// Slot `i`, making its chunk if needed; `None` beyond the table.
    #[inline]
    fn slot(&self, i: usize) -> Option<&T> {
        let chunk = self.chunks.get(i / CHUNK)?;
        let c = chunk.get_or_init(|| (0..CHUNK).map(|_| T::default()).collect());
        c.get(i % CHUNK)
    }

    /// Every slot made so far, with its id.
    fn iter(&self) -> impl Iterator<Item = (usize, &T)> {
        self.chunks.iter().enumerate().flat_map(|(ci, c)| {
            c.get()
                .into_iter()
                .flat_map(move |s| s.iter().enumerate().map(move |(i, v)| (ci * CHUNK + i, v)))
        })
    }
}

/// Adds `by` to a counter only this thread writes.
#[inline]
fn bump(a: &AtomicU64, by: u64) {
    a.store(
        a.load(Ordering::Relaxed).wrapping_add(by),
        Ordering::Relaxed,
    );
}

/// One function's calls on one thread. The layout is fixed (`repr(C)`: count, ticks, max,
/// timed, 8 bytes each) because a host library's assembly may add to it directly
/// ([`ThreadCounters::flat_calls`]). `ticks` and `max` are of the `timed` calls: a host
/// library may time only some of the calls it counts, and [`merge`] scales `ticks` up to
/// `count` (the mean of the timed calls stands for the others).
#[derive(Default)]
#[repr(C)]
pub struct CallSlot {
    count: AtomicU64,
    ticks: AtomicU64,
    max: AtomicU64,
    timed: AtomicU64,
}

/// Bit 63 of a slot's `timed` counter: every call of it is timed, whatever the sampling
/// (set by the host library, read by its assembly; not a count).
const ALWAYS: u64 = 1 << 63;
/// The mark a host library sets on a function its fast path calls from its own frame
/// (`shim-build`'s `TRACE_DIRECT`): like [`ALWAYS`], not part of the count.
const DIRECT: u64 = 1 << 62;

impl CallSlot {
    /// Marks this function's calls to be timed every time (a host library that samples
    /// reads the mark: see `ALWAYS`).
    pub fn time_always(&self) {
        self.timed.fetch_or(ALWAYS, Ordering::Relaxed);
    }

    /// Marks this function as one a host library's fast path calls from its own frame
    /// (its arguments all in registers): see `DIRECT`.
    pub fn call_direct(&self) {
        self.timed.fetch_or(DIRECT, Ordering::Relaxed);
    }
}

/// One direction's copies on one thread.
#[derive(Default)]
pub struct CopySlot {
    count: AtomicU64,
    bytes: AtomicU64,
}

/// One thread's counters.
pub struct ThreadCounters {
    /// The thread's number in the timeline (1 for the first thread seen).
    pub tid: u32,
    /// Its name, when it has one.
    pub name: Option<String>,
    calls: Table<CallSlot>,
    /// A contiguous range of call slots (ids `base..base + len`), when a host library asked
    /// for one ([`ThreadCounters::flat_calls`]).
    flat: OnceLock<Flat>,
    kernels: Table<AtomicU64>,
    copies: [CopySlot; 5],
}

/// Call slots for ids `base..base + slots.len()`, in one array.
struct Flat {
    base: usize,
    slots: Box<[CallSlot]>,
}

impl ThreadCounters {
    /// Empty counters for thread `tid`.
    pub fn new(tid: u32, name: Option<String>) -> ThreadCounters {
        ThreadCounters {
            tid,
            name,
            calls: Table::new(),
            flat: OnceLock::new(),
            kernels: Table::new(),
            copies: Default::default(),
        }
    }

    /// The slots of ids `base..base + len` as one array of [`CallSlot`]s (made on the first
    /// request; `None` when an earlier request asked for another range). Only the owning
    /// thread may add to them, with plain loads and stores (assembly included); the
    /// tracer reads them like every other counter.
    pub fn flat_calls(&self, base: u32, len: usize) -> Option<&[CallSlot]> {
        let f = self.flat.get_or_init(|| Flat {
            base: base as usize,
            slots: (0..len).map(|_| CallSlot::default()).collect(),
        });
        (f.base == base as usize && f.slots.len() == len).then_some(&f.slots[..])
    }

    /// The slot counting calls of function `f`.
    #[inline]
    fn call_slot(&self, f: usize) -> Option<&CallSlot> {
        if let Some(fl) = self.flat.get() {
            if let Some(s) = f.checked_sub(fl.base).and_then(|i| fl.slots.get(i)) {
                return Some(s);
            }
        }
        self.calls.slot(f)
    }

    /// One call of function `f` lasting `ticks`.
    #[inline]
    pub fn call(&self, f: usize, ticks: u64) {
        if let Some(s) = self.call_slot(f) {
            bump(&s.count, 1);
            bump(&s.timed, 1);
            bump(&s.ticks, ticks);
            if ticks > s.max.load(Ordering::Relaxed) {
                s.max.store(ticks, Ordering::Relaxed);
            }
        }
    }

    /// One launch of kernel `k`; the thread's launches of it before this one (0 for a
    /// kernel beyond the table, which is not counted).
    #[inline]
    pub fn launch(&self, k: usize) -> u64 {
        match self.kernels.slot(k) {
            Some(s) => {
                let n = s.load(Ordering::Relaxed);
                s.store(n.wrapping_add(1), Ordering::Relaxed);
                n
            }
            None => 0,
        }
    }

    /// One copy of `bytes` in `dir`.
    #[inline]
    pub fn copy(&self, dir: Direction, bytes: u64) {
        let s = &self.copies[dir as usize];
        bump(&s.count, 1);
        bump(&s.bytes, bytes);
    }
}

/// Every thread's counters summed.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Merged {
    /// Per function id: (calls, ticks, largest ticks).
    pub calls: Vec<(u64, u64, u64)>,
    /// Per kernel id: launches.
    pub kernels: Vec<u64>,
    /// Per direction ([`Direction`] order): (copies, bytes).
    pub copies: [(u64, u64); 5],
}

/// Sums `threads`' counters.
pub fn merge(threads: &[std::sync::Arc<ThreadCounters>]) -> Merged {
    let mut m = Merged::default();
    let r = |a: &AtomicU64| a.load(Ordering::Relaxed);
    for t in threads {
        let flat = t.flat.get().into_iter().flat_map(|f| {
            f.slots
                .iter()
                .enumerate()
                .map(move |(i, s)| (f.base + i, s))
        });
        for (i, s) in t.calls.iter().chain(flat) {
            let c = r(&s.count);
            if c == 0 {
                continue;
            }
            if m.calls.len() <= i {
                m.calls.resize(i + 1, (0, 0, 0));
            }
            let e = &mut m.calls[i];
            e.0 += c;
            let (ticks, timed) = (r(&s.ticks), r(&s.timed) & !(ALWAYS | DIRECT));
            e.1 += if timed == 0 || timed >= c {
                ticks
            } else {
                (u128::from(ticks) * u128::from(c) / u128::from(timed)) as u64
            };
            e.2 = e.2.max(r(&s.max));
        }
        for (i, s) in t.kernels.iter() {
            let c = r(s);
            if c == 0 {
                continue;
            }
            if m.kernels.len() <= i {
                m.kernels.resize(i + 1, 0);
            }
            m.kernels[i] += c;
        }
        for (d, s) in t.copies.iter().enumerate() {
            m.copies[d].0 += r(&s.count);
            m.copies[d].1 += r(&s.bytes);
        }
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn threads_count_apart_and_merge() {
        let a = Arc::new(ThreadCounters::new(1, None));
        let b = Arc::new(ThreadCounters::new(2, None));
        let bb = b.clone();
        std::thread::spawn(move || {
            for _ in 0..1000 {
                bb.call(3, 10);
            }
            bb.call(3, 50);
            bb.launch(CHUNK + 1);
            bb.copy(Direction::DtoH, 8);
        })
        .join()
        .unwrap();
        a.call(3, 20);
        a.call(CHUNK * CHUNKS, 1); // beyond the table: ignored
        a.copy(Direction::DtoH, 4);
        let m = merge(&[a, b]);
        assert_eq!(m.calls[3], (1002, 10_070, 50));
        assert_eq!(m.kernels[CHUNK + 1], 1);
        assert_eq!(m.copies[Direction::DtoH as usize], (2, 12));
        assert_eq!(m.calls.len(), 4);
    }

    #[test]
    fn flat_slots_count_and_merge_with_the_table() {
        let a = Arc::new(ThreadCounters::new(1, None));
        let b = Arc::new(ThreadCounters::new(2, None));
        let slots = a.flat_calls(10, 5).unwrap();
        assert_eq!(slots.len(), 5);
        assert!(a.flat_calls(11, 5).is_none(), "another range is refused");
        assert_eq!(a.flat_calls(10, 5).unwrap().as_ptr(), slots.as_ptr());
        // What the assembly does: plain adds to the slot.
        slots[2].count.store(3, Ordering::Relaxed);
        slots[2].ticks.store(30, Ordering::Relaxed);
        slots[2].max.store(12, Ordering::Relaxed);
        slots[2].timed.store(3, Ordering::Relaxed);
        a.call(12, 40); // inside the range: the flat slot
        a.call(3, 7); // outside: the table
        let bs = b.flat_calls(10, 5).unwrap();
        b.call(12, 5);
        // Two more counted on `b`'s slot without being timed: its 5 ticks stand for 3 calls.
        bs[2].count.store(3, Ordering::Relaxed);
        let m = merge(&[a, b]);
        assert_eq!(m.calls[12], (7, 70 + 15, 40));
        assert_eq!(m.calls[3], (1, 7, 7));
        assert_eq!(m.calls.len(), 13);
    }
}
