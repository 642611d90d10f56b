//! The allocation table: address (interior pointers included) → allocation, in O(log n).

use std::collections::BTreeMap;

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

/// The lookup index: a `BTreeMap` keyed by base address behind a read-mostly lock.
/// Readers (launch-argument translation) take the read lock only.
#[derive(Debug, Default)]
pub struct AllocationTable {
    map: RwLock<BTreeMap<u64, Allocation>>,
}

impl AllocationTable {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// The allocation containing `ptr` (`base <= ptr < base + size`).
    #[inline]
    pub fn lookup(&self, ptr: u64) -> Option<Allocation> {
        let map = self.map.read();
        let (_, a) = map.range(..=ptr).next_back()?;
        a.contains(ptr).then_some(*a)
    }

    /// The allocation containing `ptr`, or the one whose end `ptr` is when `ptr` is in no
    /// allocation (one-past-the-end pointers, e.g. `end` iterators).
    #[inline]
    pub fn lookup_or_end(&self, ptr: u64) -> Option<Allocation> {
        let map = self.map.read();
        let (_, a) = map.range(..=ptr).next_back()?;
        (ptr <= a.end()).then_some(*a)
    }

    /// The allocation whose base is exactly `base`.
    pub fn get(&self, base: u64) -> Option<Allocation> {
        self.map.read().get(&base).copied()
    }

    pub(crate) fn insert(&self, a: Allocation) {
        let old = self.map.write().insert(a.base, a);
        debug_assert!(old.is_none());
    }

    pub(crate) fn remove(&self, base: u64) -> Option<Allocation> {
        self.map.write().remove(&base)
    }

    pub(crate) fn update(&self, base: u64, f: impl FnOnce(&mut Allocation)) {
        if let Some(a) = self.map.write().get_mut(&base) {
            f(a);
        }
    }

    /// Number of live allocations.
    pub fn len(&self) -> usize {
        self.map.read().len()
    }

    /// Whether there are no live allocations.
    pub fn is_empty(&self) -> bool {
        self.map.read().is_empty()
    }

    /// Every allocation, by address, under one read lock.
    pub fn to_vec(&self) -> Vec<Allocation> {
        self.map.read().values().copied().collect()
    }
}
