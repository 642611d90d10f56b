//! Slab size classes for small allocations and the slot bitmap of a shared chunk.

use crate::config::ALLOCATION_ALIGNMENT;

/// The size classes: multiples of 256 up to 1 KiB, then four classes per doubling, up to
/// and including the largest small size.
#[derive(Debug, Clone)]
pub struct SizeClasses {
    sizes: Vec<u64>,
}

impl SizeClasses {
    /// Classes for allocations of at most `max_small` bytes (`0`: no classes).
    pub fn new(max_small: u64) -> Self {
        let max_small = max_small / ALLOCATION_ALIGNMENT * ALLOCATION_ALIGNMENT;
        let mut sizes = Vec::new();
        let mut c = ALLOCATION_ALIGNMENT;
        while c <= max_small {
            sizes.push(c);
            // Largest power of two not above c, a quarter of it: four classes per doubling.
            let floor_pow2 = 1u64 << (63 - c.leading_zeros());
            c += (floor_pow2 / 4).max(ALLOCATION_ALIGNMENT);
        }
        if max_small > 0 && sizes.last() != Some(&max_small) {
            sizes.push(max_small);
        }
        Self { sizes }
    }

    /// The class index for `size` bytes, or `None` if it is not small.
    #[inline]
    pub fn class_for(&self, size: u64) -> Option<usize> {
        let i = self.sizes.partition_point(|&c| c < size);
        (i < self.sizes.len()).then_some(i)
    }

    /// The slot size of a class.
    #[inline]
    pub fn size(&self, class: usize) -> u64 {
        self.sizes[class]
    }

    /// Every class's slot size, increasing.
    pub fn sizes(&self) -> &[u64] {
        &self.sizes
    }

    /// Number of classes.
    pub fn len(&self) -> usize {
        self.sizes.len()
    }

    /// Whether there are no classes (sharing disabled).
    pub fn is_empty(&self) -> bool {
        self.sizes.is_empty()
    }
}

/// Which slots of a shared chunk are taken (a bit per slot, 1 = taken).
#[derive(Debug, Clone)]
pub struct Slots {
    words: Vec<u64>,
    count: u32,
    used: u32,
    hint: usize,
}

impl Slots {
    /// `count` free slots.
    pub fn new(count: u32) -> Self {
        let nwords = (count as usize).div_ceil(64);
        let mut words = vec![0u64; nwords];
        let tail = count as usize % 64;
        if tail != 0 {
            words[nwords - 1] = !0u64 << tail;
        }
        Self {
            words,
            count,
            used: 0,
            hint: 0,
        }
    }

    /// Takes the lowest free slot at or after the hint (wrapping).
    pub fn take(&mut self) -> Option<u32> {
        if self.used == self.count {
            return None;
        }
        let n = self.words.len();
        for k in 0..n {
            let w = (self.hint + k) % n;
            let word = self.words[w];
            if word != !0 {
                let bit = (!word).trailing_zeros();
                self.words[w] |= 1 << bit;
                self.used += 1;
                self.hint = w;
                return Some((w * 64) as u32 + bit);
            }
        }
        None
    }

    /// Frees a taken slot.
    pub fn put(&mut self, slot: u32) {
        let (w, bit) = (slot as usize / 64, slot % 64);
        debug_assert!(self.words[w] & (1 << bit) != 0, "slot {slot} freed twice");
        self.words[w] &= !(1 << bit);
        self.used -= 1;
        if w < self.hint {
            self.hint = w;
        }
    }

    /// Slots taken.
    pub fn used(&self) -> u32 {
        self.used
    }

    /// Whether every slot is taken.
    pub fn is_full(&self) -> bool {
        self.used == self.count
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_are_aligned_and_increasing() {
        let c = SizeClasses::new(256 << 10);
        assert_eq!(c.size(0), 256);
        for i in 1..c.len() {
            assert!(c.size(i) > c.size(i - 1));
            assert_eq!(c.size(i) % 256, 0);
            // At most 25% internal waste past 1 KiB.
            assert!(c.size(i) * 4 <= c.size(i - 1) * 5 + 1024);
        }
        assert_eq!(c.size(c.len() - 1), 256 << 10);
        assert_eq!(c.class_for(1), Some(0));
        assert_eq!(c.class_for(257), Some(1));
        assert_eq!(c.class_for((256 << 10) + 1), None);
        assert!(SizeClasses::new(0).is_empty());
    }

    #[test]
    fn slots_take_and_put() {
        let mut s = Slots::new(70);
        let taken: Vec<u32> = (0..70).map(|_| s.take().unwrap()).collect();
        assert_eq!(taken, (0..70).collect::<Vec<_>>());
        assert!(s.take().is_none());
        s.put(3);
        s.put(65);
        assert_eq!(s.take(), Some(3));
        assert_eq!(s.take(), Some(65));
        assert!(s.is_full());
    }
}
