//! The allocation table: address (interior pointers included) → allocation, in O(1).
//!
//! Address space is cut into *units* (the physical granularity in mapped addressing, 2 MiB
//! in translated addressing) and every region the VMM hands addresses from (a reservation,
//! or the translated range) has a flat directory with one 16-byte `Entry` per unit,
//! indexed by `(ptr - region base) >> unit shift`. A unit is either empty, covered by one
//! allocation with a chunk of its own ("large"), or part of a shared chunk cut into slots of
//! one size class ("slab"). A lookup is one shift and one index into the directory, then
//! for a slab one multiply-shift division by the class size (no `div` instruction) and one
//! index into the slot array, and a bounds check against the allocation found: no search,
//! whatever the number of live allocations.

use parking_lot::RwLock;

/// A live allocation's identity: unique for the life of the VMM, never reused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AllocationId(pub u64);

/// Where an allocation's bytes are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Residency {
    /// On the device, at its address.
    Resident,
    /// Evicted; the bytes are in host memory (held by the VMM or retained by the staging).
    EvictedToHost,
    /// Evicted; the bytes are in a file (a checkpoint image) at `offset`.
    InFile {
        /// Byte offset of the copy in the file.
        offset: u64,
    },
}

impl Residency {
    /// Whether the bytes are on the device.
    pub fn is_resident(self) -> bool {
        self == Residency::Resident
    }
}

/// One allocation as the table records it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Allocation {
    /// Its id.
    pub id: AllocationId,
    /// The address the program holds (256-byte aligned).
    pub base: u64,
    /// Bytes the program asked for.
    pub size: u64,
    /// The device address backing `base`: `base` itself in mapped addressing; the
    /// [`crate::Backend::alloc_linear`] address in translated addressing (0 while evicted).
    pub backing: u64,
    /// Creation sequence number, increasing across the VMM's life.
    pub order: u64,
    /// The caller's opaque tag (e.g. which API created it).
    pub tag: u32,
    /// Where its bytes are.
    pub residency: Residency,
}

impl Allocation {
    /// One past the last byte.
    #[inline]
    pub fn end(&self) -> u64 {
        self.base + self.size
    }

    /// Whether `ptr` lies in `[base, base + size)`.
    #[inline]
    pub fn contains(&self, ptr: u64) -> bool {
        ptr >= self.base && ptr < self.end()
    }
}

/// Where the VMM placed an allocation, as the table must know to index it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Placement {
    /// In a slot of the shared chunk at `chunk` of slab class `class`; the slot starts at
    /// the allocation's base.
    Slab {
        /// The chunk's base address.
        chunk: u64,
        /// The slab class index.
        class: usize,
    },
    /// At the start of a unit-aligned range of its own (covering at least its bytes).
    Own,
}

/// Unit kinds in [`Entry::kind`]: empty, large, or `SLAB + class`.
const EMPTY: u32 = 0;
const LARGE: u32 = 1;
const SLAB: u32 = 2;
/// No allocation in a slot.
const NONE: u32 = u32::MAX;

/// One unit of a region's directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct Entry {
    /// [`EMPTY`], [`LARGE`], or [`SLAB`] + the slab class.
    kind: u32,
    /// Slab: this unit's index within its chunk.
    k: u32,
    /// Large: the allocation's cell; slab: the chunk's first slot.
    idx: u32,
    /// Slab: the chunk's index in `Index::slabs`.
    slab: u32,
}

/// A contiguous stretch of address space the VMM allocates from.
#[derive(Debug)]
struct Region {
    base: u64,
    size: u64,
    /// One entry per unit, grown on demand up to the highest unit used.
    dir: Vec<Entry>,
}

/// `n / d` as `(n * m) >> s` for every `n < 2^bits` (Granlund–Montgomery, round up).
#[derive(Debug, Clone, Copy)]
struct Divisor {
    m: u64,
    s: u32,
}

impl Divisor {
    fn new(d: u64, bits: u32) -> Self {
        debug_assert!(d > 0 && bits <= 62);
        let l = 64 - (d - 1).leading_zeros(); // ceil(log2 d)
        let s = bits + l;
        let m = (1u128 << s).div_ceil(u128::from(d));
        debug_assert!(m <= u128::from(u64::MAX));
        Self { m: m as u64, s }
    }

    #[inline]
    fn div(self, n: u64) -> u64 {
        ((u128::from(n) * u128::from(self.m)) >> self.s) as u64
    }
}

/// Geometry of one slab class.
#[derive(Debug, Clone, Copy)]
struct Class {
    size: u64,
    div: Divisor,
    /// Slots per chunk.
    count: u32,
}

/// A live shared chunk.
#[derive(Debug, Clone, Copy)]
struct SlabMeta {
    /// Allocations in it; the chunk leaves the directory when the last goes.
    live: u32,
}

#[derive(Debug)]
struct Index {
    shift: u32,
    /// Units per shared chunk.
    chunk_units: u64,
    classes: Vec<Class>,
    regions: Vec<Region>,
    /// Allocation cells (`size == 0`: free), indexed by `u32`.
    cells: Vec<Cell>,
    free_cells: Vec<u32>,
    /// Slot → cell (`NONE`: empty slot); each shared chunk owns `count` consecutive slots.
    slots: Vec<u32>,
    /// Per class: first slots of released slot ranges, for reuse.
    free_slots: Vec<Vec<u32>>,
    slabs: Vec<SlabMeta>,
    free_slabs: Vec<u32>,
    len: usize,
}

/// An allocation on a cache line of its own: a lookup touches one line for it.
#[derive(Debug, Clone, Copy)]
#[repr(align(64))]
struct Cell(Allocation);

const FREE_CELL: Cell = Cell(Allocation {
    id: AllocationId(u64::MAX),
    base: 0,
    size: 0,
    backing: 0,
    order: 0,
    tag: 0,
    residency: Residency::Resident,
});

impl Index {
    fn new(unit: u64, chunk: u64, class_sizes: &[u64]) -> Self {
        assert!(unit.is_power_of_two(), "unit {unit} is not a power of two");
        assert!(chunk > 0 && chunk % unit == 0, "chunk {chunk} not in units");
        let bits = 64 - (chunk - 1).leading_zeros();
        let classes = class_sizes
            .iter()
            .map(|&size| Class {
                size,
                div: Divisor::new(size, bits),
                count: u32::try_from(chunk / size).expect("slots per chunk fit in u32"),
            })
            .collect::<Vec<_>>();
        Self {
            shift: unit.trailing_zeros(),
            chunk_units: chunk / unit,
            free_slots: vec![Vec::new(); classes.len()],
            classes,
            regions: Vec::new(),
            cells: Vec::new(),
            free_cells: Vec::new(),
            slots: Vec::new(),
            slabs: Vec::new(),
            free_slabs: Vec::new(),
            len: 0,
        }
    }

    /// The region holding `ptr` and `ptr`'s unit index in it (the unit may lie past the
    /// directory's current end).
    #[inline]
    fn region_of(&self, ptr: u64) -> Option<(usize, u64)> {
        self.regions.iter().enumerate().find_map(|(i, r)| {
            let off = ptr.wrapping_sub(r.base);
            (off < r.size).then_some((i, off))
        })
    }

    /// The cell of the allocation containing `ptr`.
    #[inline(always)]
    fn find_cell(&self, ptr: u64) -> Option<u32> {
        // Usually one region: the loop runs once.
        for r in &self.regions {
            let off = ptr.wrapping_sub(r.base);
            if off >= r.size {
                continue;
            }
            let u = off >> self.shift;
            let e = r.dir.get(u as usize)?;
            let cell = match e.kind {
                EMPTY => return None,
                LARGE => e.idx,
                kind => {
                    let c = &self.classes[(kind - SLAB) as usize];
                    let in_chunk = off - ((u - u64::from(e.k)) << self.shift);
                    let slot = c.div.div(in_chunk);
                    if slot >= u64::from(c.count) {
                        return None; // the chunk's tail past its last slot
                    }
                    let cell = self.slots[e.idx as usize + slot as usize];
                    if cell == NONE {
                        return None;
                    }
                    cell
                }
            };
            let a = &self.cells[cell as usize].0;
            // The unit (large) or slot (slab) starts at or before the allocation's base.
            return (ptr >= a.base && ptr < a.end()).then_some(cell);
        }
        None
    }

    #[inline]
    fn find(&self, ptr: u64) -> Option<&Allocation> {
        self.find_cell(ptr).map(|c| &self.cells[c as usize].0)
    }

    /// The directory entries of `units` units from `ptr` (a unit boundary), grown as needed.
    fn entries_mut(&mut self, ptr: u64, units: u64) -> &mut [Entry] {
        let (ri, off) = self
            .region_of(ptr)
            .unwrap_or_else(|| panic!("address {ptr:#x} is in no region of the table"));
        let shift = self.shift;
        let r = &mut self.regions[ri];
        debug_assert!(off + (units << shift) <= r.size.next_multiple_of(1 << shift));
        let first = (off >> shift) as usize;
        let end = first + units as usize;
        if r.dir.len() < end {
            r.dir.resize(end, Entry::default());
        }
        &mut r.dir[first..end]
    }

    fn entry(&self, ptr: u64) -> Option<Entry> {
        let (ri, off) = self.region_of(ptr)?;
        self.regions[ri]
            .dir
            .get((off >> self.shift) as usize)
            .copied()
    }

    fn new_cell(&mut self, a: Allocation) -> u32 {
        match self.free_cells.pop() {
            Some(i) => {
                self.cells[i as usize] = Cell(a);
                i
            }
            None => {
                self.cells.push(Cell(a));
                u32::try_from(self.cells.len() - 1).expect("fewer than 2^32 allocations")
            }
        }
    }

    fn insert(&mut self, a: Allocation, place: Placement) {
        debug_assert!(a.size > 0);
        let cell = self.new_cell(a);
        self.len += 1;
        match place {
            Placement::Own => {
                let unit = 1u64 << self.shift;
                debug_assert_eq!(self.region_of(a.base).map(|r| r.1 % unit), Some(0));
                let units = a.size.div_ceil(unit);
                for e in self.entries_mut(a.base, units) {
                    debug_assert_eq!(e.kind, EMPTY, "unit of {:#x} already used", a.base);
                    *e = Entry {
                        kind: LARGE,
                        k: 0,
                        idx: cell,
                        slab: 0,
                    };
                }
            }
            Placement::Slab { chunk, class } => {
                let e = match self.entry(chunk).filter(|e| e.kind != EMPTY) {
                    Some(e) => e,
                    None => self.new_slab(chunk, class),
                };
                debug_assert_eq!(e.kind, SLAB + class as u32);
                let c = self.classes[class];
                let slot = (a.base - chunk) / c.size;
                debug_assert_eq!((a.base - chunk) % c.size, 0);
                let s = &mut self.slots[e.idx as usize + slot as usize];
                debug_assert_eq!(*s, NONE, "slot of {:#x} already used", a.base);
                *s = cell;
                self.slabs[e.slab as usize].live += 1;
            }
        }
    }

    /// Enters a shared chunk in the directory; returns its first unit's entry.
    fn new_slab(&mut self, chunk: u64, class: usize) -> Entry {
        let count = self.classes[class].count;
        let first = match self.free_slots[class].pop() {
            Some(f) => f,
            None => {
                let f = u32::try_from(self.slots.len()).expect("fewer than 2^32 slots");
                self.slots.resize(self.slots.len() + count as usize, NONE);
                f
            }
        };
        let meta = SlabMeta { live: 0 };
        let slab = match self.free_slabs.pop() {
            Some(s) => {
                self.slabs[s as usize] = meta;
                s
            }
            None => {
                self.slabs.push(meta);
                (self.slabs.len() - 1) as u32
            }
        };
        let units = self.chunk_units;
        for (k, e) in self.entries_mut(chunk, units).iter_mut().enumerate() {
            debug_assert_eq!(e.kind, EMPTY, "unit of chunk {chunk:#x} already used");
            *e = Entry {
                kind: SLAB + class as u32,
                k: k as u32,
                idx: first,
                slab,
            };
        }
        Entry {
            kind: SLAB + class as u32,
            k: 0,
            idx: first,
            slab,
        }
    }

    /// The cell of the allocation based at `base`.
    fn cell_of(&self, base: u64) -> Option<u32> {
        self.find_cell(base)
            .filter(|&c| self.cells[c as usize].0.base == base)
    }

    fn remove(&mut self, base: u64) -> Option<Allocation> {
        let cell = self.cell_of(base)?;
        let a = std::mem::replace(&mut self.cells[cell as usize], FREE_CELL).0;
        self.free_cells.push(cell);
        self.len -= 1;
        let e = self.entry(base).expect("a found allocation has an entry");
        if e.kind == LARGE {
            let units = a.size.div_ceil(1 << self.shift);
            self.entries_mut(base, units).fill(Entry::default());
            return Some(a);
        }
        let class = (e.kind - SLAB) as usize;
        let c = self.classes[class];
        let (_, off) = self.region_of(base)?;
        let unit_start = base - (off & ((1 << self.shift) - 1));
        let chunk = unit_start - (u64::from(e.k) << self.shift);
        let slot = (base - chunk) / c.size;
        self.slots[e.idx as usize + slot as usize] = NONE;
        let meta = &mut self.slabs[e.slab as usize];
        meta.live -= 1;
        if meta.live == 0 {
            self.free_slabs.push(e.slab);
            self.free_slots[class].push(e.idx);
            let units = self.chunk_units;
            self.entries_mut(chunk, units).fill(Entry::default());
        }
        Some(a)
    }
}

/// The lookup index, behind a read-mostly lock; readers (launch-argument translation) take
/// the read lock only. See the module documentation for the layout.
#[derive(Debug)]
pub struct AllocationTable {
    index: RwLock<Index>,
}

impl Default for AllocationTable {
    fn default() -> Self {
        Self::new()
    }
}

impl AllocationTable {
    /// An empty table with 2 MiB units and no slab classes.
    pub fn new() -> Self {
        Self::with_layout(2 << 20, 2 << 20, &[])
    }

    /// An empty table over `unit`-sized units (a power of two), with shared chunks of
    /// `chunk` bytes (a multiple of `unit`) cut into slots of the sizes `classes`.
    pub(crate) fn with_layout(unit: u64, chunk: u64, classes: &[u64]) -> Self {
        Self {
            index: RwLock::new(Index::new(unit, chunk, classes)),
        }
    }

    /// Adds `[base, base + size)` to the address space the table indexes (a reservation,
    /// or the translated range); offsets in it are counted in units from `base`. A region
    /// adjacent to existing ones (below, above or between) is merged with them, so an
    /// allocation the range allocator carved across the seam is indexed whole; regions
    /// other than the last of the address space are whole units.
    pub(crate) fn add_region(&self, base: u64, size: u64) {
        let mut index = self.index.write();
        let shift = index.shift;
        let mut new = Region {
            base,
            size,
            dir: Vec::new(),
        };
        let joined = |lo: Region, hi: Region| {
            let mut dir = lo.dir;
            if !hi.dir.is_empty() {
                dir.resize((lo.size >> shift) as usize, Entry::default());
                dir.extend(hi.dir);
            }
            Region {
                base: lo.base,
                size: lo.size + hi.size,
                dir,
            }
        };
        if let Some(i) = index.regions.iter().position(|r| r.base + r.size == base) {
            let lo = index.regions.swap_remove(i);
            new = joined(lo, new);
        }
        let end = new.base + new.size;
        if let Some(i) = index.regions.iter().position(|r| r.base == end) {
            let hi = index.regions.swap_remove(i);
            new = joined(new, hi);
        }
        index.regions.push(new);
    }

    /// Forgets every region (the table must be empty).
    pub(crate) fn clear_regions(&self) {
        let mut index = self.index.write();
        debug_assert_eq!(index.len, 0);
        index.regions.clear();
    }

    /// The allocation containing `ptr` (`base <= ptr < base + size`).
    #[inline]
    pub fn lookup(&self, ptr: u64) -> Option<Allocation> {
        self.index.read().find(ptr).copied()
    }

    /// The allocation containing `ptr`, or the one whose end `ptr` is when `ptr` is in no
    /// allocation (one-past-the-end pointers, e.g. `end` iterators).
    #[inline]
    pub fn lookup_or_end(&self, ptr: u64) -> Option<Allocation> {
        let index = self.index.read();
        if let Some(a) = index.find(ptr) {
            return Some(*a);
        }
        let a = index.find(ptr.checked_sub(1)?)?;
        (a.end() == ptr).then_some(*a)
    }

    /// The allocation whose base is exactly `base`.
    pub fn get(&self, base: u64) -> Option<Allocation> {
        self.index
            .read()
            .find(base)
            .filter(|a| a.base == base)
            .copied()
    }

    pub(crate) fn insert(&self, a: Allocation, place: Placement) {
        self.index.write().insert(a, place);
    }

    pub(crate) fn remove(&self, base: u64) -> Option<Allocation> {
        self.index.write().remove(base)
    }

    pub(crate) fn update(&self, base: u64, f: impl FnOnce(&mut Allocation)) {
        let mut index = self.index.write();
        if let Some(cell) = index.cell_of(base) {
            let a = &mut index.cells[cell as usize].0;
            let before = (a.base, a.size);
            f(a);
            debug_assert_eq!(
                (a.base, a.size),
                before,
                "update must not move an allocation"
            );
        }
    }

    /// Number of live allocations.
    pub fn len(&self) -> usize {
        self.index.read().len
    }

    /// Whether there are no live allocations.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every allocation, by address, under one read lock.
    pub fn to_vec(&self) -> Vec<Allocation> {
        let index = self.index.read();
        let mut v: Vec<Allocation> = index
            .cells
            .iter()
            .filter(|c| c.0.size > 0)
            .map(|c| c.0)
            .collect();
        v.sort_unstable_by_key(|a| a.base);
        v
    }
}

/// Test-only view of the index's bookkeeping.
#[cfg(test)]
impl AllocationTable {
    fn directory_units_in_use(&self) -> usize {
        let index = self.index.read();
        index
            .regions
            .iter()
            .flat_map(|r| r.dir.iter())
            .filter(|e| e.kind != EMPTY)
            .count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const U: u64 = 2 << 20;

    fn alloc(base: u64, size: u64) -> Allocation {
        Allocation {
            id: AllocationId(base),
            base,
            size,
            backing: base,
            order: 0,
            tag: 0,
            residency: Residency::Resident,
        }
    }

    #[test]
    fn divisor_is_exact() {
        for d in (256..=(512 << 10)).step_by(256) {
            let div = Divisor::new(d, 21);
            let mut n = 0u64;
            while n < (2 << 20) {
                assert_eq!(div.div(n), n / d, "{n} / {d}");
                assert_eq!(div.div(n + 255), (n + 255) / d, "{n} / {d}");
                n += 256 * 7 + 1;
            }
            assert_eq!(div.div((2 << 20) - 1), ((2 << 20) - 1) / d);
        }
        for d in [3u64, 7, 768, 1280, 1 << 20, (1 << 30) + 256] {
            let div = Divisor::new(d, 40);
            for n in [0, 1, d - 1, d, d + 1, 5 * d - 1, (1 << 40) - 1] {
                assert_eq!(div.div(n), n / d, "{n} / {d}");
            }
        }
    }

    #[test]
    fn large_and_slab_lookups() {
        let base = 0x7f00_0000_0000u64;
        let t = AllocationTable::with_layout(U, U, &[256, 768, 1280]);
        t.add_region(base, 64 * U);
        let big = alloc(base, 3 * U + 100);
        t.insert(big, Placement::Own);
        let chunk = base + 4 * U;
        let a = alloc(chunk + 768, 700);
        let b = alloc(chunk + 2 * 768, 768);
        for x in [a, b] {
            t.insert(x, Placement::Slab { chunk, class: 1 });
        }
        assert_eq!(t.lookup(base).map(|x| x.id), Some(big.id));
        assert_eq!(t.lookup(big.end() - 1).map(|x| x.id), Some(big.id));
        assert_eq!(t.lookup(big.end()), None);
        assert_eq!(t.lookup(chunk), None, "free slot");
        assert_eq!(t.lookup(a.base + 699).map(|x| x.id), Some(a.id));
        assert_eq!(t.lookup(a.base + 700), None, "slack of a slot");
        assert_eq!(t.lookup_or_end(a.base + 700).map(|x| x.id), Some(a.id));
        assert_eq!(t.lookup(b.base + 767).map(|x| x.id), Some(b.id));
        assert_eq!(t.lookup(chunk + U - 1), None, "tail past the last slot");
        assert_eq!(t.lookup(base - 1), None);
        assert_eq!(t.lookup(base + 64 * U), None);
        assert_eq!(t.lookup(3), None);
        assert_eq!(t.get(a.base + 256), None);
        assert_eq!(t.to_vec(), vec![big, a, b]);
        t.update(a.base, |x| x.residency = Residency::EvictedToHost);
        assert_eq!(
            t.lookup(a.base).unwrap().residency,
            Residency::EvictedToHost
        );
        assert_eq!(t.remove(a.base + 1), None);
        assert!(t.remove(a.base).is_some());
        assert_eq!(t.lookup(a.base), None);
        assert_eq!(t.remove(b.base), Some(b));
        assert_eq!(t.remove(big.base), Some(big));
        assert!(t.is_empty());
        assert_eq!(t.directory_units_in_use(), 0);
        // The chunk's slots are reused by the next chunk of the class.
        let c = alloc(base + 9 * U + 1280, 1000);
        t.insert(
            c,
            Placement::Slab {
                chunk: base + 9 * U,
                class: 2,
            },
        );
        assert_eq!(t.lookup(c.base + 999).map(|x| x.id), Some(c.id));
        assert_eq!(t.lookup(chunk + 768), None);
    }

    #[test]
    fn multi_unit_chunks_and_adjacent_regions() {
        let base = 1u64 << 40;
        // 64 KiB units, 4-unit chunks: slots of 96 KiB straddle units.
        let unit = 64 << 10;
        let t = AllocationTable::with_layout(unit, 4 * unit, &[96 << 10]);
        t.add_region(base, 8 * unit);
        t.add_region(base + 8 * unit, 8 * unit);
        let chunk = base;
        let a = alloc(chunk + (96 << 10), 90 << 10);
        t.insert(a, Placement::Slab { chunk, class: 0 });
        assert_eq!(t.lookup(chunk + 2 * unit - 100).map(|x| x.id), Some(a.id));
        assert_eq!(t.lookup(chunk + 2 * unit + 100).map(|x| x.id), Some(a.id));
        assert_eq!(t.lookup(chunk + unit + 100), None);
        assert_eq!(t.lookup(a.base + (90 << 10)), None);
        // Spans both reservations.
        let big = alloc(base + 7 * unit, 3 * unit);
        t.insert(big, Placement::Own);
        assert_eq!(t.lookup(base + 9 * unit + 5).map(|x| x.id), Some(big.id));
        assert_eq!(t.lookup(base + 10 * unit), None);
        // A region below, then one filling the hole between two: all one region.
        t.add_region(base - 4 * unit, 4 * unit);
        t.add_region(base + 20 * unit, 4 * unit);
        let c = alloc(base + 22 * unit, 100);
        t.insert(c, Placement::Own);
        t.add_region(base + 16 * unit, 4 * unit);
        assert_eq!(t.index.read().regions.len(), 1);
        let d = alloc(base - 4 * unit, 2 * unit);
        t.insert(d, Placement::Own);
        let e = alloc(base + 15 * unit, 6 * unit);
        t.insert(e, Placement::Own);
        for (x, ptr) in [
            (a, chunk + 2 * unit),
            (big, base + 8 * unit),
            (c, c.base + 99),
        ] {
            assert_eq!(t.lookup(ptr).map(|y| y.id), Some(x.id));
        }
        for (x, ptr) in [(d, base - 3 * unit), (e, base + 20 * unit + 7)] {
            assert_eq!(t.lookup(ptr).map(|y| y.id), Some(x.id));
        }
        assert_eq!(t.lookup(base - 2 * unit), None);
        assert_eq!(t.lookup(base - 4 * unit - 1), None);
        for x in [big, a, c, d, e] {
            assert_eq!(t.remove(x.base), Some(x));
        }
        assert_eq!(t.directory_units_in_use(), 0);
    }
}
