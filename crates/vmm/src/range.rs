//! A best-fit allocator of address ranges with coalescing of free neighbours.

use std::collections::{BTreeMap, BTreeSet};

/// Free address ranges, indexed by address (for coalescing) and by size (for best fit).
///
/// Callers keep every size and base a multiple of their alignment unit; the allocator
/// itself only splits ranges from their front, so alignment is preserved.
#[derive(Debug, Default, Clone)]
pub struct RangeAllocator {
    by_addr: BTreeMap<u64, u64>,
    by_size: BTreeSet<(u64, u64)>,
    free_bytes: u64,
}

impl RangeAllocator {
    /// An allocator with no free space.
    pub fn new() -> Self {
        Self::default()
    }

    /// Total free bytes.
    pub fn free_bytes(&self) -> u64 {
        self.free_bytes
    }

    /// Number of separate free ranges.
    pub fn fragments(&self) -> usize {
        self.by_addr.len()
    }

    /// Takes `size` bytes from the smallest free range that holds them (lowest address
    /// among equals). Returns the base.
    pub fn alloc(&mut self, size: u64) -> Option<u64> {
        debug_assert!(size > 0);
        let &(fsize, fbase) = self.by_size.range((size, 0)..).next()?;
        self.by_size.remove(&(fsize, fbase));
        self.by_addr.remove(&fbase);
        if fsize > size {
            self.insert_raw(fbase + size, fsize - size);
        }
        self.free_bytes -= size;
        Some(fbase)
    }

    /// Returns `[base, base + size)` to the free space, merging it with free neighbours.
    /// The range must not overlap free space (checked in debug builds).
    pub fn free(&mut self, base: u64, size: u64) {
        debug_assert!(size > 0);
        let mut start = base;
        let mut end = base + size;
        if let Some((&pbase, &psize)) = self.by_addr.range(..base).next_back() {
            debug_assert!(pbase + psize <= base, "double free of range {base:#x}");
            if pbase + psize == base {
                self.remove_raw(pbase, psize);
                start = pbase;
            }
        }
        if let Some((&nbase, &nsize)) = self.by_addr.range(base..).next() {
            debug_assert!(nbase >= end, "double free of range {base:#x}");
            if nbase == end {
                self.remove_raw(nbase, nsize);
                end = nbase + nsize;
            }
        }
        self.insert_raw(start, end - start);
        self.free_bytes += size;
    }

    fn insert_raw(&mut self, base: u64, size: u64) {
        self.by_addr.insert(base, size);
        self.by_size.insert((size, base));
    }

    fn remove_raw(&mut self, base: u64, size: u64) {
        self.by_addr.remove(&base);
        self.by_size.remove(&(size, base));
    }

    /// The free ranges, by address.
    pub fn ranges(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.by_addr.iter().map(|(&b, &s)| (b, s))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn best_fit_and_coalesce() {
        let mut r = RangeAllocator::new();
        r.free(0, 1000);
        let a = r.alloc(100).unwrap();
        let b = r.alloc(200).unwrap();
        let c = r.alloc(300).unwrap();
        assert_eq!((a, b, c), (0, 100, 300));
        r.free(b, 200);
        // 150 fits the 200 hole better than the 400 tail.
        assert_eq!(r.alloc(150), Some(100));
        r.free(100, 150);
        r.free(a, 100);
        r.free(c, 300);
        assert_eq!(r.fragments(), 1);
        assert_eq!(r.free_bytes(), 1000);
        assert_eq!(r.alloc(1001), None);
        assert_eq!(r.alloc(1000), Some(0));
    }
}
