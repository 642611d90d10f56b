//! The memory history: per live allocation, how it was made (size, creation order, API,
//! the calling library), the copies into and out of it, the kernels that received it and
//! its last use. Hot allocations are used often; cold ones have sat unused longest. It is
//! what pinning and eviction decisions read.

use crate::timeline::AllocRef;
use crate::Direction;
use std::sync::Arc;

/// Distinct kernels remembered per allocation (launch counts go on beyond).
pub const KERNELS_PER_ALLOCATION: usize = 16;

/// One allocation's history.
#[derive(Debug, Clone)]
pub struct Record {
    /// Creation order in the process (0 for the first allocation seen).
    pub order: u64,
    /// Its address.
    pub base: u64,
    /// Its size in bytes.
    pub size: u64,
    /// The API that made it (`cudaMalloc`, `cuMemAlloc`, ...).
    pub api: &'static str,
    /// The library (or program) that called the API, when known.
    pub site: Option<Arc<str>>,
    /// When it was made (ticks).
    pub created: u64,
    /// Copies into it, and their bytes.
    pub copies_in: u64,
    /// Bytes copied into it.
    pub bytes_in: u64,
    /// Copies out of it.
    pub copies_out: u64,
    /// Bytes copied out of it.
    pub bytes_out: u64,
    /// Launches that received a pointer into it.
    pub launches: u64,
    /// The kernels (ids) that received it, first [`KERNELS_PER_ALLOCATION`] distinct ones
    /// (the first few inline: a launch's look at them touches no other memory).
    pub kernels: smallvec::SmallVec<[u32; 6]>,
    /// Its last use (copy or launch), in ticks; `None` if never used.
    pub last_use: Option<u64>,
}

impl Record {
    /// Copies and launches together.
    pub fn uses(&self) -> u64 {
        self.copies_in + self.copies_out + self.launches
    }

    /// When it was last used, or made if never used.
    pub fn last_touched(&self) -> u64 {
        self.last_use.unwrap_or(self.created)
    }

    /// How the timeline names it.
    pub fn alloc_ref(&self) -> AllocRef {
        AllocRef {
            order: self.order,
            base: self.base,
            size: self.size,
        }
    }
}

/// Of `index` ((base, end, value) by base), the entry containing `ptr`: the one with the
/// highest base at or below it, if `ptr` is before its end. The memory history finds a
/// launch's allocations so, and the timeline, replaying it, must find the same.
pub(crate) fn containing<T>(index: &[(u64, u64, T)], ptr: u64) -> Option<&(u64, u64, T)> {
    let at = index.partition_point(|e| e.0 <= ptr).checked_sub(1)?;
    let e = &index[at];
    (ptr < e.1).then_some(e)
}

/// Every live allocation's history.
///
/// Kept for a launch's lookups to touch little memory (a job's launches find their
/// allocations between its own work, with the caches cold): the live allocations' ranges in
/// one sorted array (`index`: base, end and slot, 24 bytes each, binary-searched) and
/// their records in a slab beside it, instead of a tree whose nodes hold the records (a
/// lookup there walked several nodes of records: ~3 µs for a launch of 5 pointers among
/// 300 allocations, cold; `benches/launch.rs`).
#[derive(Default)]
pub struct History {
    /// (base, end, slot) of every live allocation, by base.
    index: Vec<(u64, u64, u32)>,
    /// The records, by slot (`None`: a free slot, listed in `free_slots`).
    slots: Vec<Option<Record>>,
    free_slots: Vec<u32>,
    /// The lowest base of the live allocations and an end no live allocation passes (the
    /// highest end since the map was last empty; `(0, 0)`: none): a launch's words outside
    /// it (sizes, counts, flags) are no pointers to look up.
    span: (u64, u64),
    /// Whether two live allocations have overlapped since the map was last empty (one
    /// inside another): then a word inside an allocation a launch already counted may
    /// belong to another, and is looked up.
    overlap: bool,
    next_order: u64,
    freed: u64,
    site_cache: Vec<Arc<str>>,
}

impl History {
    /// The lowest base of the live allocations and an end none passes (`(0, 0)`: none).
    pub fn span(&self) -> (u64, u64) {
        self.span
    }

    /// The slot of the live allocation containing `ptr`: the one with the highest base at
    /// or below it, if `ptr` is before its end.
    fn slot_of(&self, ptr: u64) -> Option<usize> {
        containing(&self.index, ptr).map(|e| e.2 as usize)
    }

    /// The live allocation containing `ptr`.
    pub fn find_mut(&mut self, ptr: u64) -> Option<&mut Record> {
        let slot = self.slot_of(ptr)?;
        self.slots[slot].as_mut()
    }

    /// The live allocation containing `ptr`.
    pub fn find(&self, ptr: u64) -> Option<&Record> {
        self.slots[self.slot_of(ptr)?].as_ref()
    }

    /// Records a new allocation; returns its creation order.
    pub fn alloc(
        &mut self,
        base: u64,
        size: u64,
        api: &'static str,
        site: Option<&str>,
        at: u64,
    ) -> u64 {
        self.alloc_replacing(base, size, api, site, at).0
    }

    /// [`History::alloc`], also returning the live allocation at the same base it replaced
    /// (the driver reused the address without the free being seen), if any.
    pub fn alloc_replacing(
        &mut self,
        base: u64,
        size: u64,
        api: &'static str,
        site: Option<&str>,
        at: u64,
    ) -> (u64, Option<AllocRef>) {
        let order = self.next_order;
        self.next_order += 1;
        let site = site.map(|s| match self.site_cache.iter().find(|c| &***c == s) {
            Some(c) => c.clone(),
            None => {
                let c: Arc<str> = Arc::from(s);
                self.site_cache.push(c.clone());
                c
            }
        });
        let end = base.saturating_add(size.max(1));
        let pos = self.index.partition_point(|&(b, _, _)| b <= base);
        // An allocation at a base already live replaces it (the driver reused the address
        // without the free being seen).
        let replaces = pos > 0 && self.index[pos - 1].0 == base;
        let before = pos
            .checked_sub(if replaces { 2 } else { 1 })
            .map(|i| self.index[i].1);
        let after = self.index.get(pos).map(|&(b, _, _)| b);
        if before.is_some_and(|e| e > base) || after.is_some_and(|b| b < end) {
            self.overlap = true;
        }
        self.span = if self.index.is_empty() {
            (base, end)
        } else {
            (self.span.0.min(base), self.span.1.max(end))
        };
        let record = Record {
            order,
            base,
            size,
            api,
            site,
            created: at,
            copies_in: 0,
            bytes_in: 0,
            copies_out: 0,
            bytes_out: 0,
            launches: 0,
            kernels: smallvec::SmallVec::new(),
            last_use: None,
        };
        if replaces {
            let slot = self.index[pos - 1].2;
            self.index[pos - 1].1 = end;
            let old = self.slots[slot as usize].replace(record);
            return (order, old.map(|r| r.alloc_ref()));
        }
        let slot = match self.free_slots.pop() {
            Some(s) => {
                self.slots[s as usize] = Some(record);
                s
            }
            None => {
                self.slots.push(Some(record));
                (self.slots.len() - 1) as u32
            }
        };
        self.index.insert(pos, (base, end, slot));
        (order, None)
    }

    /// Forgets the allocation at `base`; its (order, size) if it was known.
    pub fn free(&mut self, base: u64, _at: u64) -> Option<(u64, u64)> {
        let i = self
            .index
            .binary_search_by_key(&base, |&(b, _, _)| b)
            .ok()?;
        let (_, _, slot) = self.index.remove(i);
        let r = self.slots[slot as usize].take()?;
        self.free_slots.push(slot);
        self.freed += 1;
        match self.index.first() {
            None => {
                self.span = (0, 0);
                self.overlap = false;
            }
            Some(&(lo, _, _)) => self.span.0 = lo,
        }
        Some((r.order, r.size))
    }

    /// Records a copy; returns the direction (inferred for [`Direction::Default`] from
    /// which side lies in a known allocation) and the allocations on each side.
    pub fn copy(
        &mut self,
        dir: Direction,
        bytes: u64,
        dst: u64,
        src: u64,
        at: u64,
    ) -> (Direction, Option<AllocRef>, Option<AllocRef>) {
        let mut d = None;
        let mut s = None;
        if let Some(r) = self.find_mut(dst) {
            r.copies_in += 1;
            r.bytes_in += bytes;
            r.last_use = Some(at);
            d = Some(r.alloc_ref());
        }
        if let Some(r) = self.find_mut(src) {
            r.copies_out += 1;
            r.bytes_out += bytes;
            r.last_use = Some(at);
            s = Some(r.alloc_ref());
        }
        let dir = match dir {
            Direction::Default => match (s.is_some(), d.is_some()) {
                (false, false) => Direction::HtoH,
                (false, true) => Direction::HtoD,
                (true, false) => Direction::DtoH,
                (true, true) => Direction::DtoD,
            },
            other => other,
        };
        (dir, d, s)
    }

    /// Records a launch of `kernel` whose argument words are `words` (parameter, value),
    /// counted `weight` times; returns the buffers it received, one per allocation: what
    /// the tests check [`History::launch_counted`] counted against (the timeline works
    /// its buffers out when it is read, `timeline::resolve_buffers`).
    #[cfg(test)]
    pub fn launch(
        &mut self,
        kernel: u32,
        words: impl IntoIterator<Item = (u16, u64)>,
        at: u64,
        weight: u64,
    ) -> Vec<crate::timeline::Buffer> {
        let mut out = Vec::new();
        self.launch_with(kernel, words, at, weight, |param, r| {
            out.push(crate::timeline::Buffer {
                param,
                alloc: r.alloc_ref(),
            })
        });
        out
    }

    /// Records a launch of `kernel` whose argument words are `words` (parameter, value),
    /// counted `weight` times on each allocation they point into (nothing allocated). The
    /// words are taken by value, read where they are (not copied first).
    pub fn launch_counted(
        &mut self,
        kernel: u32,
        words: impl IntoIterator<Item = (u16, u64)>,
        at: u64,
        weight: u64,
    ) {
        self.launch_with(kernel, words, at, weight, |_, _| {});
    }

    /// Counts the launch `weight` times (1, or the sample rate of launches whose buffers
    /// are read) on each allocation its words point into (once per allocation), calling
    /// `each` for it.
    fn launch_with(
        &mut self,
        kernel: u32,
        words: impl IntoIterator<Item = (u16, u64)>,
        at: u64,
        weight: u64,
        mut each: impl FnMut(u16, &Record),
    ) {
        // The allocations already counted (base, end): on the stack for the usual few. A
        // launch may pass hundreds of words (a multi-tensor kernel's table of pointers and
        // sizes, mostly into a few allocations): words outside every live allocation, and
        // words inside one already counted, are settled without a lookup.
        let mut seen: smallvec::SmallVec<[(u64, u64); 16]> = smallvec::SmallVec::new();
        let (lo, hi) = self.span;
        let disjoint = !self.overlap;
        for (param, w) in words {
            if w < lo || w >= hi || (disjoint && seen.iter().any(|&(b, e)| b <= w && w < e)) {
                continue;
            }
            let Some(r) = self.find_mut(w) else { continue };
            if seen.iter().any(|&(b, _)| b == r.base) {
                continue;
            }
            seen.push((r.base, r.base.saturating_add(r.size.max(1))));
            r.launches += weight;
            r.last_use = Some(at);
            if r.kernels.len() < KERNELS_PER_ALLOCATION && !r.kernels.contains(&kernel) {
                r.kernels.push(kernel);
            }
            each(param, r);
        }
    }

    /// Live allocations.
    pub fn live(&self) -> impl Iterator<Item = &Record> {
        self.index
            .iter()
            .filter_map(|&(_, _, slot)| self.slots[slot as usize].as_ref())
    }

    /// Allocations made over the run.
    pub fn made(&self) -> u64 {
        self.next_order
    }

    /// Allocations freed over the run.
    pub fn freed(&self) -> u64 {
        self.freed
    }

    /// The `n` hottest live allocations: most uses first, then most bytes moved.
    pub fn hottest(&self, n: usize) -> Vec<&Record> {
        let mut v: Vec<&Record> = self.live().filter(|r| r.uses() > 0).collect();
        v.sort_by(|a, b| {
            b.uses()
                .cmp(&a.uses())
                .then((b.bytes_in + b.bytes_out).cmp(&(a.bytes_in + a.bytes_out)))
                .then(a.order.cmp(&b.order))
        });
        v.truncate(n);
        v
    }

    /// The `n` coldest live allocations: untouched longest first (last use, or creation
    /// if never used), then fewest uses, then largest.
    pub fn coldest(&self, n: usize) -> Vec<&Record> {
        let mut v: Vec<&Record> = self.live().collect();
        v.sort_by(|a, b| {
            a.last_touched()
                .cmp(&b.last_touched())
                .then(a.uses().cmp(&b.uses()))
                .then(b.size.cmp(&a.size))
                .then(a.order.cmp(&b.order))
        });
        v.truncate(n);
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A multi-tensor kernel's table: hundreds of words, pointers into a few allocations
    /// and sizes between them; each allocation counted once, the sizes ignored, and an
    /// allocation inside another still found.
    #[test]
    fn many_words_into_few_allocations() {
        let mut h = History::default();
        let a = 0x7f00_0000_0000u64;
        let b = a + (64 << 20);
        h.alloc(a, 32 << 20, "cudaMalloc", None, 1);
        h.alloc(b, 32 << 20, "cudaMalloc", None, 2);
        let mut words = Vec::new();
        for i in 0..110u64 {
            words.push((0u16, a + i * 4096));
            words.push((0u16, b + i * 8192));
            words.push((0u16, 4096 + i));
        }
        let bufs = h.launch(3, words.iter().copied(), 5, 1);
        assert_eq!(
            bufs.iter().map(|b| b.alloc.base).collect::<Vec<_>>(),
            vec![a, b]
        );
        h.launch_counted(3, words.iter().copied(), 6, 1);
        assert_eq!(h.find(a).unwrap().launches, 2);
        assert_eq!(h.find(b).unwrap().launches, 2);
        // An allocation inside another (a pool's block in its reservation): found even
        // after the outer one was counted by an earlier word.
        let inner = a + (8 << 20);
        h.alloc(inner, 1 << 20, "cuMemAllocFromPoolAsync", None, 7);
        let bufs = h.launch(4, [(0, a), (1, inner + 16)], 8, 1);
        assert_eq!(
            bufs.iter().map(|b| b.alloc.base).collect::<Vec<_>>(),
            vec![a, inner]
        );
        // Below and above every allocation: no lookup, nothing found.
        assert!(h.launch(5, [(0, 1), (0, u64::MAX)], 9, 1).is_empty());
        h.free(a, 10);
        h.free(b, 10);
        h.free(inner, 10);
        assert_eq!(h.span, (0, 0));
        assert!(!h.overlap);
    }

    #[test]
    fn hot_and_cold() {
        let mut h = History::default();
        let mut t = 0;
        let mut tick = || {
            t += 1;
            t
        };
        let hot = [0x1000u64, 0x2000];
        for (i, &b) in hot.iter().enumerate() {
            assert_eq!(
                h.alloc(b, 0x100, "cudaMalloc", Some("prog"), tick()),
                i as u64
            );
        }
        let cold: Vec<u64> = (0..25u64).map(|i| 0x10_0000 + i * 0x1000).collect();
        for &b in &cold {
            h.alloc(b, 0x800, "cudaMalloc", None, tick());
            let now = tick();
            let (d, dst, src) = h.copy(Direction::HtoD, 0x800, b, 0x7fff_0000, now);
            assert_eq!(
                (d, dst.map(|a| a.base), src),
                (Direction::HtoD, Some(b), None)
            );
        }
        for _ in 0..175 {
            for &b in &hot {
                let now = tick();
                h.copy(Direction::HtoD, 0x100, b + 0x10, 0x7fff_0000, now);
                let now = tick();
                h.copy(Direction::Default, 0x100, 0x7fff_0000, b, now);
            }
            let now = tick();
            let bufs = h.launch(7, [(0, hot[0]), (1, hot[1] + 8), (2, 5)], now, 1);
            assert_eq!(bufs.len(), 2);
        }
        let hottest = h.hottest(2);
        assert_eq!(
            hottest.iter().map(|r| r.base).collect::<Vec<_>>(),
            hot.to_vec()
        );
        assert_eq!(
            (
                hottest[0].copies_in,
                hottest[0].copies_out,
                hottest[0].launches
            ),
            (175, 175, 175)
        );
        assert_eq!(hottest[0].kernels.as_slice(), [7]);
        let coldest = h.coldest(25);
        assert_eq!(coldest.iter().map(|r| r.base).collect::<Vec<_>>(), cold);
        assert!(coldest
            .iter()
            .all(|r| r.copies_in == 1 && r.copies_out == 0));
        // Interior pointers, one past the end, and frees.
        assert!(h.find(0x10ff).is_some() && h.find(0x1100).is_none());
        assert_eq!(h.free(0x1000, tick()), Some((0, 0x100)));
        assert_eq!(h.free(0x1000, tick()), None);
        assert_eq!((h.made(), h.freed(), h.live().count()), (27, 1, 26));
    }
}
