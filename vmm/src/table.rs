//! The allocation table: address (interior pointers included) → allocation, in O(log n).

use std::collections::{BTreeMap, HashMap};
use std::hash::{BuildHasherDefault, Hasher};

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

/// Addresses are indexed by pages of 64 KiB.
const PAGE_SHIFT: u32 = 16;
/// Allocations up to this size are listed in every page they overlap (at most 17);
/// larger ones live in a B-tree.
const PAGED_MAX: u64 = 16 << PAGE_SHIFT;

/// A cheap multiplicative hasher for page numbers and base addresses.
#[derive(Debug, Default, Clone, Copy)]
struct AddrHasher(u64);

impl Hasher for AddrHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }

    #[inline]
    fn write_u64(&mut self, v: u64) {
        let h = (self.0 ^ v).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        self.0 = h ^ (h >> 29);
    }
}

type AddrMap<V> = HashMap<u64, V, BuildHasherDefault<AddrHasher>>;

#[derive(Debug, Default)]
struct Index {
    /// Page number → the small allocations overlapping the page, by base (an allocation
    /// crossing pages is copied into each).
    pages: AddrMap<Vec<Allocation>>,
    /// Allocations larger than `PAGED_MAX`, by base.
    large: BTreeMap<u64, Allocation>,
    len: usize,
}

impl Index {
    #[inline]
    fn find(&self, ptr: u64) -> Option<&Allocation> {
        if let Some(v) = self.pages.get(&(ptr >> PAGE_SHIFT)) {
            let i = v.partition_point(|a| a.base <= ptr);
            if i > 0 && ptr < v[i - 1].end() {
                return Some(&v[i - 1]);
            }
        }
        if self.large.is_empty() {
            return None;
        }
        let (_, a) = self.large.range(..=ptr).next_back()?;
        (ptr < a.end()).then_some(a)
    }

    fn pages_of(a: &Allocation) -> std::ops::RangeInclusive<u64> {
        (a.base >> PAGE_SHIFT)..=((a.end() - 1) >> PAGE_SHIFT)
    }
}

/// The lookup index, behind a read-mostly lock; readers (launch-argument translation) take
/// the read lock only. Allocations up to 1 MiB are listed in a hash map of 64 KiB pages (a
/// lookup is one hash probe and a binary search among at most a few hundred neighbours);
/// larger ones in a B-tree consulted when the page has no match.
#[derive(Debug, Default)]
pub struct AllocationTable {
    index: RwLock<Index>,
}

impl AllocationTable {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
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

    pub(crate) fn insert(&self, a: Allocation) {
        debug_assert!(a.size > 0);
        let mut index = self.index.write();
        index.len += 1;
        if a.size > PAGED_MAX {
            let old = index.large.insert(a.base, a);
            debug_assert!(old.is_none());
            return;
        }
        for p in Index::pages_of(&a) {
            let v = index.pages.entry(p).or_default();
            let i = v.partition_point(|x| x.base < a.base);
            v.insert(i, a);
        }
    }

    pub(crate) fn remove(&self, base: u64) -> Option<Allocation> {
        let mut index = self.index.write();
        let a = *index.find(base).filter(|a| a.base == base)?;
        index.len -= 1;
        if a.size > PAGED_MAX {
            index.large.remove(&base);
            return Some(a);
        }
        for p in Index::pages_of(&a) {
            if let Some(v) = index.pages.get_mut(&p) {
                if let Ok(i) = v.binary_search_by_key(&base, |x| x.base) {
                    v.remove(i);
                }
                if v.is_empty() {
                    index.pages.remove(&p);
                }
            }
        }
        Some(a)
    }

    pub(crate) fn update(&self, base: u64, f: impl Fn(&mut Allocation)) {
        let mut index = self.index.write();
        let Some(a) = index.find(base).filter(|a| a.base == base).copied() else {
            return;
        };
        if a.size > PAGED_MAX {
            if let Some(x) = index.large.get_mut(&base) {
                f(x);
            }
            return;
        }
        for p in Index::pages_of(&a) {
            if let Some(v) = index.pages.get_mut(&p) {
                if let Ok(i) = v.binary_search_by_key(&base, |x| x.base) {
                    f(&mut v[i]);
                    debug_assert_eq!(
                        (v[i].base, v[i].size),
                        (a.base, a.size),
                        "update must not move an allocation"
                    );
                }
            }
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
        let mut v: Vec<Allocation> = index.large.values().copied().collect();
        for (&p, list) in &index.pages {
            // Each small allocation once: from the page holding its base.
            v.extend(list.iter().filter(|a| a.base >> PAGE_SHIFT == p).copied());
        }
        v.sort_unstable_by_key(|a| a.base);
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn lookup_small_crossing_and_large() {
        let t = AllocationTable::new();
        let page = 1u64 << PAGE_SHIFT;
        let a = alloc(page - 256, 512); // crosses a page boundary
        let b = alloc(page + 256, 100);
        let big = alloc(4 * page + 256, 3 * PAGED_MAX);
        for x in [a, b, big] {
            t.insert(x);
        }
        assert_eq!(t.lookup(page - 256).map(|x| x.base), Some(a.base));
        assert_eq!(t.lookup(page + 255).map(|x| x.base), Some(a.base));
        assert_eq!(t.lookup(page + 256 + 99).map(|x| x.base), Some(b.base));
        assert_eq!(t.lookup(page + 256 + 100), None);
        assert_eq!(
            t.lookup_or_end(page + 256 + 100).map(|x| x.base),
            Some(b.base)
        );
        assert_eq!(
            t.lookup(big.base + 2 * PAGED_MAX).map(|x| x.base),
            Some(big.base)
        );
        assert_eq!(t.lookup(big.end()), None);
        assert_eq!(t.lookup(3), None);
        assert_eq!(t.remove(a.base), Some(a));
        assert_eq!(t.lookup(page + 10), None);
        assert_eq!(t.to_vec(), vec![b, big]);
        t.remove(b.base);
        t.remove(big.base);
        assert!(t.is_empty());
        assert!(t.index.read().pages.is_empty());
    }
}
