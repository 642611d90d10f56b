//! The virtual memory manager itself.

use std::collections::{BTreeSet, HashMap};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Arc;

use parking_lot::{Condvar, Mutex, MutexGuard};
use slab::Slab;

use crate::backend::{Backend, BackendError};
use crate::budget::Budget;
use crate::classes::{SizeClasses, Slots};
use crate::config::{Addressing, Config, ALLOCATION_ALIGNMENT};
use crate::error::{StagingError, VmmError};
use crate::range::RangeAllocator;
use crate::staging::{HostCopy, LoadRange, Source, Staging, StagingRange};
use crate::table::{Allocation, AllocationId, AllocationTable, Placement, Residency};

/// Bytes a restore hands to the staging at once while the chunks after them are still
/// being created and mapped.
const LOAD_BATCH: u64 = 256 << 20;

/// Byte counts for quotas and `cudaMemGetInfo`, taken under one lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MemoryStats {
    /// Live allocations.
    pub allocations: u64,
    /// Bytes the program asked for, over live allocations.
    pub requested: u64,
    /// Virtual bytes reserved from the backend (mapped addressing).
    pub reserved: u64,
    /// Physical bytes created and mapped now, granule rounding included (translated
    /// addressing: backing bytes, rounded to 256).
    pub mapped: u64,
    /// `mapped` plus creations in flight: what the memory limit is checked against.
    pub committed: u64,
    /// Requested bytes of resident allocations.
    pub resident: u64,
    /// Requested bytes of evicted allocations.
    pub evicted: u64,
    /// Highest `requested` seen.
    pub peak_requested: u64,
    /// Highest `mapped` seen.
    pub peak_mapped: u64,
    /// Physical chunks mapped now (translated addressing: backing allocations).
    pub chunks: u64,
    /// The memory limit on physical bytes.
    pub limit: Option<u64>,
}

/// What an eviction or a restore moved.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Moved {
    /// Allocations whose residency changed.
    pub allocations: usize,
    /// Their requested bytes.
    pub bytes: u64,
    /// Physical chunks released (eviction) or re-created (restore).
    pub chunks: usize,
}

#[derive(Debug)]
enum Phys<P> {
    /// Physical memory being created for a new chunk.
    Pending,
    Mapped(P),
    /// Released while every allocation in it is evicted.
    Unmapped,
}

#[derive(Debug)]
struct Chunk<P> {
    base: u64,
    size: u64,
    /// `Some` for a shared chunk of slab class `class`.
    class: Option<usize>,
    slots: Option<Slots>,
    live: u32,
    resident: u32,
    phys: Phys<P>,
    /// An eviction or restore of this chunk's physical memory is in flight.
    busy: bool,
}

/// A shared virtual chunk of translated addressing: `TRANSLATED_UNIT` bytes of the
/// synthetic range cut into slots of one slab class (no physical memory of its own).
#[derive(Debug)]
struct VirtualSlab {
    base: u64,
    class: usize,
    slots: Slots,
}

/// Where an allocation lives, besides its address.
#[derive(Debug, Clone, Copy)]
struct Home {
    /// Chunk key (mapped addressing).
    chunk: Option<usize>,
    /// Virtual slab key (translated addressing, small allocations).
    vslab: Option<usize>,
    /// Slot in the chunk or virtual slab.
    slot: u32,
    /// How the table indexes it.
    place: Placement,
}

#[derive(Debug)]
struct Record {
    alloc: Allocation,
    /// Chunk key (mapped addressing).
    chunk: Option<usize>,
    /// Virtual slab key (translated addressing).
    vslab: Option<usize>,
    slot: u32,
    /// The host copy held by the VMM while evicted.
    host: Option<Vec<u8>>,
    /// An eviction or restore of this allocation is in flight.
    busy: bool,
}

#[derive(Debug)]
struct State<P> {
    paused: bool,
    limit: Option<u64>,
    next_order: u64,
    space: RangeAllocator,
    reservations: Vec<(u64, u64)>,
    reserving: bool,
    chunks: Slab<Chunk<P>>,
    /// Per slab class: shared chunks that are mapped, not busy, with a free slot.
    open: Vec<BTreeSet<usize>>,
    /// Per slab class: new shared chunks whose physical memory is being created.
    pending_by_class: Vec<u32>,
    /// Translated addressing: shared virtual chunks of small allocations.
    vslabs: Slab<VirtualSlab>,
    /// Per slab class: virtual slabs with a free slot.
    vopen: Vec<BTreeSet<usize>>,
    /// Allocations whose backing is being created.
    creating: u32,
    /// Bytes whose release is in flight (still counted in `committed`).
    releasing: u64,
    records: KeyMap<u64, Record>,
    ids: KeyMap<AllocationId, u64>,
    stats: MemoryStats,
}

enum LimitCheck {
    Fits,
    Wait,
}

enum Which<'a> {
    All,
    Ids(&'a [AllocationId]),
}

/// cudaw's virtual memory manager over a [`Backend`]. See the crate documentation.
pub struct Vmm<B: Backend> {
    backend: B,
    config: Config,
    granularity: u64,
    slab_chunk: u64,
    classes: SizeClasses,
    state: Mutex<State<B::Physical>>,
    changed: Condvar,
    table: AllocationTable,
    budget: Option<Arc<dyn Budget>>,
    /// Serialises evictions and restores with each other.
    residency: Mutex<()>,
}

impl<B: Backend> std::fmt::Debug for Vmm<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Vmm")
            .field("config", &self.config)
            .field("granularity", &self.granularity)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

/// A multiplicative hasher for keys that are addresses and ids cudaw handed out or was
/// handed (not input an attacker chooses): cheaper than SipHash on the allocate / free
/// path, and on the launch path's per-thread caches (cudart-shim's registry).
#[derive(Debug, Default, Clone, Copy)]
pub struct KeyHasher(u64);

impl Hasher for KeyHasher {
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

    #[inline]
    fn write_usize(&mut self, v: usize) {
        self.write_u64(v as u64);
    }
}

/// A `HashMap` keyed by addresses or ids, with [`KeyHasher`].
pub type KeyMap<K, V> = HashMap<K, V, BuildHasherDefault<KeyHasher>>;

/// Unit of the translated range's directory and size of its shared virtual chunks.
const TRANSLATED_UNIT: u64 = 2 << 20;

#[inline]
fn round_up(x: u64, to: u64) -> Option<u64> {
    x.checked_add(to - 1).map(|v| v / to * to)
}

impl<B: Backend> Vmm<B> {
    /// A VMM over `backend`. Asks the backend for its granularity (mapped addressing);
    /// reserves nothing until the first allocation.
    pub fn new(backend: B, config: Config) -> Result<Self, VmmError> {
        Self::build(backend, config, None)
    }

    /// A VMM whose physical creations are also granted by a node-wide [`Budget`].
    pub fn with_budget(
        backend: B,
        config: Config,
        budget: Arc<dyn Budget>,
    ) -> Result<Self, VmmError> {
        Self::build(backend, config, Some(budget))
    }

    fn build(
        backend: B,
        config: Config,
        budget: Option<Arc<dyn Budget>>,
    ) -> Result<Self, VmmError> {
        let invalid = |field, value, expected| VmmError::InvalidConfig {
            field,
            value,
            expected,
        };
        let mut space = RangeAllocator::new();
        let (granularity, slab_chunk, classes) = match config.addressing {
            Addressing::Mapped => {
                let g = backend.granularity()?;
                if g < ALLOCATION_ALIGNMENT || !g.is_power_of_two() {
                    return Err(invalid("granularity", g, "a power of two, at least 256"));
                }
                let granules = config.chunking.slab_chunk_granules;
                if granules == 0 {
                    return Err(invalid("chunking.slab_chunk_granules", 0, "at least 1"));
                }
                let slab_chunk = g.checked_mul(granules).ok_or(invalid(
                    "chunking.slab_chunk_granules",
                    granules,
                    "a chunk size below 2^64",
                ))?;
                let max_small = config.chunking.max_small.unwrap_or(slab_chunk / 8);
                if max_small > slab_chunk {
                    return Err(invalid(
                        "chunking.max_small",
                        max_small,
                        "at most the shared chunk size",
                    ));
                }
                if config.reservation_size == 0 {
                    return Err(invalid("reservation_size", 0, "non-zero"));
                }
                (g, slab_chunk, SizeClasses::new(max_small))
            }
            Addressing::Translated => {
                let (b, s) = (config.translated_base, config.translated_size);
                if b == 0 || b % ALLOCATION_ALIGNMENT != 0 {
                    return Err(invalid("translated_base", b, "a non-zero multiple of 256"));
                }
                if s < TRANSLATED_UNIT || b.checked_add(s).is_none() {
                    return Err(invalid("translated_size", s, "at least 2 MiB, within 2^64"));
                }
                // Whole units only: every virtual range handed out is unit-aligned in it.
                space.free(b, s / TRANSLATED_UNIT * TRANSLATED_UNIT);
                (
                    ALLOCATION_ALIGNMENT,
                    TRANSLATED_UNIT,
                    SizeClasses::new(TRANSLATED_UNIT / 8),
                )
            }
        };
        let nclasses = classes.len();
        let table = match config.addressing {
            Addressing::Mapped => {
                AllocationTable::with_layout(granularity, slab_chunk, classes.sizes())
            }
            Addressing::Translated => {
                let t = AllocationTable::with_layout(TRANSLATED_UNIT, slab_chunk, classes.sizes());
                t.add_region(config.translated_base, config.translated_size);
                t
            }
        };
        Ok(Self {
            backend,
            config,
            granularity,
            slab_chunk,
            classes,
            state: Mutex::new(State {
                paused: false,
                limit: config.memory_limit,
                next_order: 0,
                space,
                reservations: Vec::new(),
                reserving: false,
                chunks: Slab::new(),
                open: vec![BTreeSet::new(); nclasses],
                pending_by_class: vec![0; nclasses],
                vslabs: Slab::new(),
                vopen: vec![BTreeSet::new(); nclasses],
                creating: 0,
                releasing: 0,
                records: KeyMap::default(),
                ids: KeyMap::default(),
                stats: MemoryStats {
                    limit: config.memory_limit,
                    ..MemoryStats::default()
                },
            }),
            changed: Condvar::new(),
            table,
            budget,
            residency: Mutex::new(()),
        })
    }

    /// The backend.
    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// The configuration it was built with (the memory limit may have changed since; see
    /// [`Vmm::memory_limit`]).
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The physical granularity (256 in translated addressing).
    pub fn granularity(&self) -> u64 {
        self.granularity
    }

    /// The current memory limit on physical bytes.
    pub fn memory_limit(&self) -> Option<u64> {
        self.state.lock().limit
    }

    /// Changes the memory limit. Lowering it below what is in use refuses later
    /// allocations; it takes nothing away.
    pub fn set_memory_limit(&self, limit: Option<u64>) {
        let mut st = self.state.lock();
        st.limit = limit;
        st.stats.limit = limit;
        self.changed.notify_all();
    }

    /// Whether [`Vmm::evict_all`] paused the address space (allocation refused until
    /// [`Vmm::restore_all`]).
    pub fn is_paused(&self) -> bool {
        self.state.lock().paused
    }

    /// The accounting, consistent under one lock.
    pub fn stats(&self) -> MemoryStats {
        self.state.lock().stats
    }

    /// `(free, total)` as `cudaMemGetInfo` should report them: the backend's figures,
    /// capped by the memory limit.
    pub fn memory_info(&self) -> Result<(u64, u64), VmmError> {
        let (free, total) = self.backend.memory_info()?;
        let st = self.state.lock();
        Ok(match st.limit {
            Some(limit) => (
                free.min(limit.saturating_sub(st.stats.committed)),
                total.min(limit),
            ),
            None => (free, total),
        })
    }

    /// The allocation containing `ptr` (interior pointers included). The hot path: one
    /// read lock and a directory index (see [`AllocationTable`]).
    #[inline]
    pub fn lookup(&self, ptr: u64) -> Option<Allocation> {
        self.table.lookup(ptr)
    }

    /// The live allocation with this id.
    pub fn allocation(&self, id: AllocationId) -> Option<Allocation> {
        let st = self.state.lock();
        st.ids
            .get(&id)
            .and_then(|b| st.records.get(b))
            .map(|r| r.alloc)
    }

    /// The device address backing `ptr`, for any pointer into an allocation or one past its
    /// end: `ptr` itself in mapped addressing; the linear backing in translated addressing
    /// (`None` while the allocation is evicted there). `None` for pointers the VMM does not own.
    #[inline]
    pub fn translate(&self, ptr: u64) -> Option<u64> {
        match self.config.addressing {
            Addressing::Mapped => self.table.lookup_or_end(ptr).map(|_| ptr),
            Addressing::Translated => {
                if !self.in_translated_range(ptr) {
                    return None;
                }
                let a = self.table.lookup_or_end(ptr)?;
                a.residency
                    .is_resident()
                    .then(|| a.backing + (ptr - a.base))
            }
        }
    }

    /// Whether `ptr` lies in the synthetic range of translated addressing (always `false`
    /// in mapped addressing): a cheap filter before [`Vmm::translate`].
    #[inline]
    pub fn in_translated_range(&self, ptr: u64) -> bool {
        self.config.addressing == Addressing::Translated
            && ptr >= self.config.translated_base
            && ptr - self.config.translated_base < self.config.translated_size
    }

    /// Every live allocation, in creation order, from one consistent view of the table
    /// (an eviction in flight shows its allocations as they were before it).
    pub fn snapshot(&self) -> Vec<Allocation> {
        let mut v = self.table.to_vec();
        v.sort_unstable_by_key(|a| a.order);
        v
    }

    /// Allocates `size` bytes, 256-byte aligned, tagged with the caller's `tag`. The memory
    /// is mapped and usable when this returns.
    pub fn alloc(&self, size: u64, tag: u32) -> Result<Allocation, VmmError> {
        if size == 0 {
            return Err(VmmError::ZeroSize);
        }
        let max = u64::MAX / 4;
        if size > max {
            return Err(VmmError::TooLarge { size, max });
        }
        match self.config.addressing {
            Addressing::Mapped => self.alloc_mapped(size, tag),
            Addressing::Translated => self.alloc_translated(size, tag),
        }
    }

    fn check_limit(
        &self,
        st: &State<B::Physical>,
        size: u64,
        need: u64,
    ) -> Result<LimitCheck, VmmError> {
        let Some(limit) = st.limit else {
            return Ok(LimitCheck::Fits);
        };
        let used = st.stats.committed;
        if used.saturating_add(need) <= limit {
            Ok(LimitCheck::Fits)
        } else if st.releasing > 0 && (used - st.releasing).saturating_add(need) <= limit {
            Ok(LimitCheck::Wait)
        } else {
            Err(VmmError::OutOfMemory {
                requested: size,
                physical: need,
                limit,
                used,
            })
        }
    }

    fn alloc_mapped(&self, size: u64, tag: u32) -> Result<Allocation, VmmError> {
        let class = self.classes.class_for(size);
        let need = match class {
            Some(_) => self.slab_chunk,
            None => round_up(size, self.granularity).ok_or(VmmError::TooLarge {
                size,
                max: u64::MAX / 4,
            })?,
        };
        let mut st = self.state.lock();
        loop {
            if st.paused {
                return Err(VmmError::Paused { size });
            }
            if let Some(class) = class {
                if let Some(&ck) = st.open[class].first() {
                    let chunk = &mut st.chunks[ck];
                    let slots = chunk.slots.as_mut().expect("shared chunk has slots");
                    let slot = slots.take().expect("open chunk has a free slot");
                    let full = slots.is_full();
                    chunk.live += 1;
                    chunk.resident += 1;
                    let base = chunk.base + u64::from(slot) * self.classes.size(class);
                    if full {
                        st.open[class].remove(&ck);
                    }
                    let home = Home {
                        chunk: Some(ck),
                        vslab: None,
                        slot,
                        place: Placement::Slab {
                            chunk: st.chunks[ck].base,
                            class,
                        },
                    };
                    return Ok(self.commit_record(&mut st, base, size, tag, home, base));
                }
                if st.pending_by_class[class] > 0 {
                    // Another thread is creating a chunk of this class: share it.
                    self.changed.wait(&mut st);
                    continue;
                }
            }
            match self.check_limit(&st, size, need)? {
                LimitCheck::Fits => {}
                LimitCheck::Wait => {
                    self.changed.wait(&mut st);
                    continue;
                }
            }
            let Some(base) = st.space.alloc(need) else {
                self.grow(&mut st, need)?;
                continue;
            };
            st.stats.committed += need;
            let slots = class.map(|c| Slots::new((self.slab_chunk / self.classes.size(c)) as u32));
            let ck = st.chunks.insert(Chunk {
                base,
                size: need,
                class,
                slots,
                live: 1,
                resident: 1,
                phys: Phys::Pending,
                busy: false,
            });
            let slot = st.chunks[ck]
                .slots
                .as_mut()
                .map_or(0, |s| s.take().expect("fresh chunk"));
            if let Some(c) = class {
                st.pending_by_class[c] += 1;
            }
            st.creating += 1;
            let created = MutexGuard::unlocked(&mut st, || self.create_and_map(base, need));
            st.creating -= 1;
            if let Some(c) = class {
                st.pending_by_class[c] -= 1;
            }
            self.changed.notify_all();
            return match created {
                Ok(p) => {
                    let chunk = &mut st.chunks[ck];
                    chunk.phys = Phys::Mapped(p);
                    let open = chunk.slots.as_ref().is_some_and(|s| !s.is_full());
                    if let (Some(c), true) = (class, open) {
                        st.open[c].insert(ck);
                    }
                    st.stats.mapped += need;
                    st.stats.chunks += 1;
                    st.stats.peak_mapped = st.stats.peak_mapped.max(st.stats.mapped);
                    let addr = base + u64::from(slot) * class.map_or(0, |c| self.classes.size(c));
                    let home = Home {
                        chunk: Some(ck),
                        vslab: None,
                        slot,
                        place: match class {
                            Some(class) => Placement::Slab { chunk: base, class },
                            None => Placement::Own,
                        },
                    };
                    Ok(self.commit_record(&mut st, addr, size, tag, home, addr))
                }
                Err(e) => {
                    st.chunks.remove(ck);
                    st.space.free(base, need);
                    st.stats.committed -= need;
                    Err(e)
                }
            };
        }
    }

    /// Adds a reservation big enough for `need` bytes, or waits for another thread's.
    fn grow(&self, st: &mut MutexGuard<'_, State<B::Physical>>, need: u64) -> Result<(), VmmError> {
        if st.reserving {
            self.changed.wait(st);
            return Ok(());
        }
        let g = self.granularity;
        let size =
            round_up(self.config.reservation_size.max(need), g).ok_or(VmmError::TooLarge {
                size: need,
                max: u64::MAX / 4,
            })?;
        st.reserving = true;
        let r = MutexGuard::unlocked(st, || self.backend.reserve(size, g));
        st.reserving = false;
        self.changed.notify_all();
        let base = r?;
        self.table.add_region(base, size);
        st.reservations.push((base, size));
        st.space.free(base, size);
        st.stats.reserved += size;
        Ok(())
    }

    /// Budget, create, map; undoes its own steps on failure.
    fn create_and_map(&self, base: u64, size: u64) -> Result<B::Physical, VmmError> {
        if let Some(b) = &self.budget {
            if !b.acquire(size) {
                return Err(VmmError::BudgetExceeded { physical: size });
            }
        }
        let undo_budget = || {
            if let Some(b) = &self.budget {
                b.release(size);
            }
        };
        let p = match self.backend.create_physical(size) {
            Ok(p) => p,
            Err(e) => {
                undo_budget();
                return Err(e.into());
            }
        };
        if let Err(e) = self.backend.map(base, size, p) {
            let _ = self.backend.release_physical(p);
            undo_budget();
            return Err(e.into());
        }
        Ok(p)
    }

    /// Unmap and release; `Err((unmapped, e))`.
    fn unmap_and_release(
        &self,
        base: u64,
        size: u64,
        p: B::Physical,
    ) -> Result<(), (bool, BackendError)> {
        self.backend.unmap(base, size).map_err(|e| (false, e))?;
        self.backend.release_physical(p).map_err(|e| (true, e))?;
        if let Some(b) = &self.budget {
            b.release(size);
        }
        Ok(())
    }

    fn commit_record(
        &self,
        st: &mut State<B::Physical>,
        base: u64,
        size: u64,
        tag: u32,
        home: Home,
        backing: u64,
    ) -> Allocation {
        let order = st.next_order;
        st.next_order += 1;
        let alloc = Allocation {
            id: AllocationId(order),
            base,
            size,
            backing,
            order,
            tag,
            residency: Residency::Resident,
        };
        st.records.insert(
            base,
            Record {
                alloc,
                chunk: home.chunk,
                vslab: home.vslab,
                slot: home.slot,
                host: None,
                busy: false,
            },
        );
        st.ids.insert(alloc.id, base);
        self.table.insert(alloc, home.place);
        let s = &mut st.stats;
        s.allocations += 1;
        s.requested += size;
        s.resident += size;
        s.peak_requested = s.peak_requested.max(s.requested);
        alloc
    }

    fn translated_sizes(size: u64) -> (u64, u64) {
        let backing = size.div_ceil(ALLOCATION_ALIGNMENT) * ALLOCATION_ALIGNMENT;
        // A gap of 256 bytes after each allocation keeps one-past-the-end pointers unambiguous.
        (backing, backing + ALLOCATION_ALIGNMENT)
    }

    fn alloc_translated(&self, size: u64, tag: u32) -> Result<Allocation, VmmError> {
        let (need, vsize) = Self::translated_sizes(size);
        let mut st = self.state.lock();
        loop {
            if st.paused {
                return Err(VmmError::Paused { size });
            }
            match self.check_limit(&st, size, need)? {
                LimitCheck::Fits => break,
                LimitCheck::Wait => self.changed.wait(&mut st),
            }
        }
        let (base, vslab) = self.take_virtual(&mut st, size, vsize)?;
        st.stats.committed += need;
        st.creating += 1;
        let created = MutexGuard::unlocked(&mut st, || self.alloc_backing(need));
        st.creating -= 1;
        self.changed.notify_all();
        match created {
            Ok(backing) => {
                st.stats.mapped += need;
                st.stats.chunks += 1;
                st.stats.peak_mapped = st.stats.peak_mapped.max(st.stats.mapped);
                let home = match vslab {
                    Some((vs, slot)) => Home {
                        chunk: None,
                        vslab: Some(vs),
                        slot,
                        place: Placement::Slab {
                            chunk: st.vslabs[vs].base,
                            class: st.vslabs[vs].class,
                        },
                    },
                    None => Home {
                        chunk: None,
                        vslab: None,
                        slot: 0,
                        place: Placement::Own,
                    },
                };
                Ok(self.commit_record(&mut st, base, size, tag, home, backing))
            }
            Err(e) => {
                self.put_virtual(&mut st, base, vsize, vslab);
                st.stats.committed -= need;
                Err(e)
            }
        }
    }

    /// Takes the virtual range of a translated allocation of `vsize` bytes (gap included):
    /// a slot of a shared virtual chunk of its class, or whole units of its own. Returns
    /// the base and the slab slot.
    fn take_virtual(
        &self,
        st: &mut State<B::Physical>,
        size: u64,
        vsize: u64,
    ) -> Result<(u64, Option<(usize, u32)>), VmmError> {
        let exhausted = VmmError::AddressSpaceExhausted {
            size,
            range_size: self.config.translated_size,
        };
        let Some(class) = self.classes.class_for(vsize) else {
            let units = round_up(vsize, TRANSLATED_UNIT).ok_or(exhausted.clone())?;
            return Ok((st.space.alloc(units).ok_or(exhausted)?, None));
        };
        let vs = match st.vopen[class].first() {
            Some(&vs) => vs,
            None => {
                let base = st.space.alloc(TRANSLATED_UNIT).ok_or(exhausted)?;
                let count = (TRANSLATED_UNIT / self.classes.size(class)) as u32;
                let vs = st.vslabs.insert(VirtualSlab {
                    base,
                    class,
                    slots: Slots::new(count),
                });
                st.vopen[class].insert(vs);
                vs
            }
        };
        let v = &mut st.vslabs[vs];
        let slot = v.slots.take().expect("open virtual slab has a free slot");
        let base = v.base + u64::from(slot) * self.classes.size(class);
        if v.slots.is_full() {
            st.vopen[class].remove(&vs);
        }
        Ok((base, Some((vs, slot))))
    }

    /// Gives back what [`Vmm::take_virtual`] took.
    fn put_virtual(
        &self,
        st: &mut State<B::Physical>,
        base: u64,
        vsize: u64,
        vslab: Option<(usize, u32)>,
    ) {
        let Some((vs, slot)) = vslab else {
            let units = round_up(vsize, TRANSLATED_UNIT).expect("taken before");
            st.space.free(base, units);
            return;
        };
        let v = &mut st.vslabs[vs];
        v.slots.put(slot);
        let class = v.class;
        if v.slots.used() == 0 {
            let v = st.vslabs.remove(vs);
            st.vopen[class].remove(&vs);
            st.space.free(v.base, TRANSLATED_UNIT);
        } else {
            st.vopen[class].insert(vs);
        }
    }

    fn alloc_backing(&self, need: u64) -> Result<u64, VmmError> {
        if let Some(b) = &self.budget {
            if !b.acquire(need) {
                return Err(VmmError::BudgetExceeded { physical: need });
            }
        }
        self.backend.alloc_linear(need).map_err(|e| {
            if let Some(b) = &self.budget {
                b.release(need);
            }
            e.into()
        })
    }

    fn free_backing(&self, backing: u64, need: u64) -> Result<(), BackendError> {
        self.backend.free_linear(backing)?;
        if let Some(b) = &self.budget {
            b.release(need);
        }
        Ok(())
    }

    /// Frees the allocation whose base is `ptr`. An evicted allocation's host copy is
    /// dropped. Physical memory no allocation uses any more is unmapped and released.
    pub fn free(&self, ptr: u64) -> Result<(), VmmError> {
        let mut st = self.state.lock();
        let rec = loop {
            match st.records.get(&ptr) {
                None => {
                    return Err(match self.table.lookup(ptr) {
                        Some(a) => VmmError::NotABase { ptr, base: a.base },
                        None => VmmError::NotAllocated { ptr },
                    })
                }
                Some(r) if r.busy => self.changed.wait(&mut st),
                Some(_) => break st.records.remove(&ptr).expect("present"),
            }
        };
        st.ids.remove(&rec.alloc.id);
        self.table.remove(ptr);
        let size = rec.alloc.size;
        let was_resident = rec.alloc.residency.is_resident();
        {
            let s = &mut st.stats;
            s.allocations -= 1;
            s.requested -= size;
            if was_resident {
                s.resident -= size;
            } else {
                s.evicted -= size;
            }
        }
        let result = match rec.chunk {
            None => self.free_translated(&mut st, &rec, was_resident),
            Some(ck) => self.free_in_chunk(&mut st, ck, rec.slot, was_resident),
        };
        drop(st);
        drop(rec); // the host copy, if any, outside the lock
        result
    }

    fn free_translated(
        &self,
        st: &mut MutexGuard<'_, State<B::Physical>>,
        rec: &Record,
        was_resident: bool,
    ) -> Result<(), VmmError> {
        let (need, vsize) = Self::translated_sizes(rec.alloc.size);
        let mut result = Ok(());
        if was_resident {
            st.releasing += need;
            let r = MutexGuard::unlocked(st, || self.free_backing(rec.alloc.backing, need));
            st.releasing -= need;
            match r {
                Ok(()) => {
                    st.stats.committed -= need;
                    st.stats.mapped -= need;
                    st.stats.chunks -= 1;
                }
                Err(e) => result = Err(e.into()),
            }
            self.changed.notify_all();
        }
        let vslab = rec.vslab.map(|vs| (vs, rec.slot));
        self.put_virtual(st, rec.alloc.base, vsize, vslab);
        result
    }

    fn free_in_chunk(
        &self,
        st: &mut MutexGuard<'_, State<B::Physical>>,
        ck: usize,
        slot: u32,
        was_resident: bool,
    ) -> Result<(), VmmError> {
        let chunk = &mut st.chunks[ck];
        chunk.live -= 1;
        if was_resident {
            chunk.resident -= 1;
        }
        if let Some(s) = chunk.slots.as_mut() {
            s.put(slot);
        }
        if chunk.busy {
            // Another thread is releasing or restoring this chunk's memory; it finishes the job.
            return Ok(());
        }
        let (base, size, class) = (chunk.base, chunk.size, chunk.class);
        let empty = chunk.live == 0;
        // Only evicted allocations left: their memory is not needed until restore.
        let idle = chunk.resident == 0 && matches!(chunk.phys, Phys::Mapped(_));
        if !empty && !idle {
            if let (Some(c), Phys::Mapped(_)) = (class, &chunk.phys) {
                st.open[c].insert(ck);
            }
            return Ok(());
        }
        if let Some(c) = class {
            st.open[c].remove(&ck);
        }
        let Phys::Mapped(p) = st.chunks[ck].phys else {
            // Unmapped and now empty.
            st.chunks.remove(ck);
            st.space.free(base, size);
            return Ok(());
        };
        st.chunks[ck].busy = true;
        st.releasing += size;
        let r = MutexGuard::unlocked(st, || self.unmap_and_release(base, size, p));
        st.releasing -= size;
        let chunk = &mut st.chunks[ck];
        chunk.busy = false;
        // Unmapped but not released: the range is reusable; the memory is leaked.
        let unmapped = !matches!(r, Err((false, _)));
        if unmapped {
            chunk.phys = Phys::Unmapped;
            st.stats.committed -= size;
            st.stats.mapped -= size;
            st.stats.chunks -= 1;
        }
        if st.chunks[ck].live == 0 {
            st.chunks.remove(ck);
            if unmapped {
                st.space.free(base, size);
            } // else: still mapped; the range and its memory are lost to the VMM, and stay counted.
        }
        self.changed.notify_all();
        r.map_err(|(_, e)| e.into())
    }

    /// Evicts the given resident allocations through `staging`: copies them out, then
    /// releases every chunk whose allocations are all evicted. Allocation stays possible.
    /// Fails without changing anything if an id is unknown or not resident, or if the
    /// staging fails.
    pub fn evict<S: Staging<B> + ?Sized>(
        &self,
        ids: &[AllocationId],
        staging: &mut S,
    ) -> Result<Moved, VmmError> {
        self.evict_impl(Which::Ids(ids), staging, false)
    }

    /// Pauses the address space (allocation is refused from now on) and evicts every
    /// resident allocation through `staging`, releasing all physical memory.
    pub fn evict_all<S: Staging<B> + ?Sized>(&self, staging: &mut S) -> Result<Moved, VmmError> {
        self.evict_impl(Which::All, staging, true)
    }

    /// Restores the given evicted allocations through `staging`, at the same addresses
    /// (mapped) or on fresh backing (translated). Fails without changing anything if an id
    /// is unknown or not evicted, if the memory limit or budget refuses, or if the staging
    /// or the backend fails.
    pub fn restore<S: Staging<B> + ?Sized>(
        &self,
        ids: &[AllocationId],
        staging: &mut S,
    ) -> Result<Moved, VmmError> {
        self.restore_impl(Which::Ids(ids), staging, false)
    }

    /// Restores every evicted allocation and lifts the pause of [`Vmm::evict_all`].
    pub fn restore_all<S: Staging<B> + ?Sized>(&self, staging: &mut S) -> Result<Moved, VmmError> {
        self.restore_impl(Which::All, staging, true)
    }

    fn targets(
        &self,
        st: &State<B::Physical>,
        which: &Which<'_>,
        want_resident: bool,
    ) -> Result<Vec<u64>, VmmError> {
        let mut bases = match which {
            Which::All => st
                .records
                .values()
                .filter(|r| r.alloc.residency.is_resident() == want_resident)
                .map(|r| r.alloc.base)
                .collect::<Vec<_>>(),
            Which::Ids(ids) => {
                let mut v = Vec::with_capacity(ids.len());
                for &id in *ids {
                    let base = *st.ids.get(&id).ok_or(VmmError::UnknownAllocation { id })?;
                    let r = &st.records[&base];
                    if r.alloc.residency.is_resident() != want_resident {
                        return Err(VmmError::WrongResidency {
                            id,
                            seen: r.alloc.residency,
                            expected: if want_resident { "resident" } else { "evicted" },
                        });
                    }
                    v.push(base);
                }
                v
            }
        };
        bases.sort_unstable();
        bases.dedup();
        Ok(bases)
    }

    fn evict_impl<S: Staging<B> + ?Sized>(
        &self,
        which: Which<'_>,
        staging: &mut S,
        pause: bool,
    ) -> Result<Moved, VmmError> {
        let _serial = self.residency.lock();
        let mut st = self.state.lock();
        let was_paused = st.paused;
        if pause {
            st.paused = true;
            // Allocations already past the gate finish first, so they are evicted too, and
            // releases in flight finish, so no physical memory is left when this returns.
            while st.creating > 0 || st.releasing > 0 {
                self.changed.wait(&mut st);
            }
        }
        let targets = match self.targets(&st, &which, true) {
            Ok(t) => t,
            Err(e) => {
                st.paused = was_paused;
                return Err(e);
            }
        };
        let mapped = self.config.addressing == Addressing::Mapped;
        let mut ranges = Vec::with_capacity(targets.len());
        let mut per_chunk: HashMap<usize, u32> = HashMap::new();
        let mut bytes = 0;
        for &base in &targets {
            let r = st.records.get_mut(&base).expect("target exists");
            r.busy = true;
            ranges.push(StagingRange {
                id: r.alloc.id,
                addr: r.alloc.backing,
                len: r.alloc.size,
            });
            bytes += r.alloc.size;
            if let Some(ck) = r.chunk {
                *per_chunk.entry(ck).or_default() += 1;
            }
        }
        // Chunks whose every resident allocation is evicted now: release their memory.
        let mut release: Vec<(usize, u64, u64, B::Physical)> = Vec::new();
        for (&ck, &n) in &per_chunk {
            let c = &mut st.chunks[ck];
            if let (true, Phys::Mapped(p)) = (c.resident == n, &c.phys) {
                c.busy = true;
                release.push((ck, c.base, c.size, *p));
            }
        }
        release.sort_unstable_by_key(|r| r.1);
        let mut releasing = 0;
        for &(ck, _, size, _) in &release {
            if let Some(c) = st.chunks[ck].class {
                st.open[c].remove(&ck);
            }
            releasing += size;
        }
        let linear: u64 = if mapped {
            0
        } else {
            targets
                .iter()
                .map(|b| Self::translated_sizes(st.records[b].alloc.size).0)
                .sum()
        };
        st.releasing += releasing + linear;

        // Copy out, then release, with no lock held.
        let outcome = MutexGuard::unlocked(&mut st, || {
            let saved = staging
                .save(&self.backend, &ranges)
                .map_err(VmmError::Staging)?;
            if saved.len() != ranges.len() {
                return Err(VmmError::Staging(StagingError::Count {
                    seen: saved.len(),
                    expected: ranges.len(),
                }));
            }
            let mut released = Vec::with_capacity(release.len());
            let mut first_err = None;
            for &(_, base, size, p) in &release {
                let r = self.unmap_and_release(base, size, p);
                if let Err((_, e)) = &r {
                    first_err.get_or_insert_with(|| e.clone());
                }
                released.push(r.map_err(|(unmapped, _)| unmapped));
            }
            let mut freed = Vec::with_capacity(targets.len());
            if !mapped {
                for rg in &ranges {
                    let need = Self::translated_sizes(rg.len).0;
                    let r = self.free_backing(rg.addr, need);
                    if let Err(e) = &r {
                        first_err.get_or_insert_with(|| e.clone());
                    }
                    freed.push(r.is_ok());
                }
            }
            Ok((saved, released, freed, first_err))
        });
        st.releasing -= releasing + linear;
        let (saved, released, freed, first_err) = match outcome {
            Ok(v) => v,
            Err(e) => {
                for &base in &targets {
                    st.records.get_mut(&base).expect("busy target stays").busy = false;
                }
                for &(ck, _, _, _) in &release {
                    let c = &mut st.chunks[ck];
                    c.busy = false;
                    let open = c.slots.as_ref().is_some_and(|s| !s.is_full());
                    if let (Some(cl), true) = (c.class, open) {
                        st.open[cl].insert(ck);
                    }
                }
                st.paused = was_paused;
                self.changed.notify_all();
                return Err(e);
            }
        };
        for (i, (&base, copy)) in targets.iter().zip(saved).enumerate() {
            let r = st.records.get_mut(&base).expect("busy target stays");
            r.busy = false;
            let residency = match copy {
                HostCopy::Memory(v) => {
                    r.host = Some(v);
                    Residency::EvictedToHost
                }
                HostCopy::Retained => Residency::EvictedToHost,
                HostCopy::File { offset } => Residency::InFile { offset },
            };
            r.alloc.residency = residency;
            let size = r.alloc.size;
            let chunk = r.chunk;
            if !mapped {
                r.alloc.backing = 0;
                let need = Self::translated_sizes(size).0;
                if freed[i] {
                    st.stats.committed -= need;
                    st.stats.mapped -= need;
                    st.stats.chunks -= 1;
                }
            }
            self.table.update(base, |a| {
                a.residency = residency;
                if !mapped {
                    a.backing = 0;
                }
            });
            if let Some(ck) = chunk {
                st.chunks[ck].resident -= 1;
            }
            st.stats.resident -= size;
            st.stats.evicted += size;
        }
        let mut chunks = 0;
        for (&(ck, _, size, _), r) in release.iter().zip(released) {
            let c = &mut st.chunks[ck];
            c.busy = false;
            match r {
                Ok(()) | Err(true) => {
                    c.phys = Phys::Unmapped;
                    st.stats.committed -= size;
                    st.stats.mapped -= size;
                    st.stats.chunks -= 1;
                    chunks += 1;
                }
                Err(false) => {} // still mapped; restore copies into it
            }
        }
        self.changed.notify_all();
        match first_err {
            Some(e) => Err(e.into()),
            None => Ok(Moved {
                allocations: targets.len(),
                bytes,
                chunks,
            }),
        }
    }

    fn restore_impl<S: Staging<B> + ?Sized>(
        &self,
        which: Which<'_>,
        staging: &mut S,
        unpause: bool,
    ) -> Result<Moved, VmmError> {
        Ok(self.load_impl(which, staging, unpause)?.commit(staging))
    }

    /// Restores every evicted allocation into new device memory through `staging` but
    /// commits nothing: until [`PendingRestore::commit`] the allocations stay evicted,
    /// their host copies (and the image a dump left them in) untouched, and dropping the
    /// [`PendingRestore`] releases the new memory again — the address space as it was,
    /// not a byte of the old copies lost. A restore from an image loads every device this
    /// way, checks the image digest, and only then commits them all. The VMM's residency
    /// changes (evict, restore) wait until the pending restore is committed or dropped.
    pub fn load_all<S: Staging<B> + ?Sized>(
        &self,
        staging: &mut S,
    ) -> Result<PendingRestore<'_, B>, VmmError> {
        self.load_impl(Which::All, staging, true)
    }

    fn load_impl<S: Staging<B> + ?Sized>(
        &self,
        which: Which<'_>,
        staging: &mut S,
        unpause: bool,
    ) -> Result<PendingRestore<'_, B>, VmmError> {
        let serial = self.residency.lock();
        let mut st = self.state.lock();
        let mapped = self.config.addressing == Addressing::Mapped;
        // Targets may change while waiting for a release in flight: recompute after each wait.
        let (targets, create, need) = loop {
            let targets = self.targets(&st, &which, false)?;
            if targets
                .iter()
                .any(|b| st.records[b].chunk.is_some_and(|ck| st.chunks[ck].busy))
            {
                // A free is releasing a chunk we need: let it finish.
                self.changed.wait(&mut st);
                continue;
            }
            // Chunks to re-create (mapped) or backings to allocate (translated).
            let mut create: Vec<(usize, u64, u64)> = Vec::new();
            let mut need = 0u64;
            if mapped {
                let mut seen = BTreeSet::new();
                for b in &targets {
                    let ck = st.records[b]
                        .chunk
                        .expect("mapped allocations live in chunks");
                    let c = &st.chunks[ck];
                    if matches!(c.phys, Phys::Unmapped) && seen.insert(ck) {
                        create.push((ck, c.base, c.size));
                        need += c.size;
                    }
                }
                create.sort_unstable_by_key(|c| c.1);
            } else {
                need = targets
                    .iter()
                    .map(|b| Self::translated_sizes(st.records[b].alloc.size).0)
                    .sum();
            }
            let requested = targets.iter().map(|b| st.records[b].alloc.size).sum();
            match self.check_limit(&st, requested, need)? {
                LimitCheck::Fits => break (targets, create, need),
                LimitCheck::Wait => self.changed.wait(&mut st),
            }
        };
        let mut bytes = 0u64;
        st.stats.committed += need;
        for &(ck, _, _) in &create {
            st.chunks[ck].busy = true;
        }
        // For each target, how many of `create` (in order) must be mapped before it loads.
        let order: HashMap<usize, usize> = create
            .iter()
            .enumerate()
            .map(|(i, &(ck, _, _))| (ck, i + 1))
            .collect();
        let needs: Vec<usize> = targets
            .iter()
            .map(|b| {
                st.records[b]
                    .chunk
                    .and_then(|ck| order.get(&ck).copied())
                    .unwrap_or(0)
            })
            .collect();
        let mut hosts = Vec::with_capacity(targets.len());
        let mut meta = Vec::with_capacity(targets.len());
        for b in &targets {
            let r = st.records.get_mut(b).expect("target exists");
            r.busy = true;
            hosts.push(r.host.take());
            meta.push((r.alloc.id, r.alloc.base, r.alloc.size, r.alloc.residency));
            bytes += r.alloc.size;
        }

        let outcome = MutexGuard::unlocked(
            &mut st,
            || -> Result<(Vec<B::Physical>, Vec<u64>), VmmError> {
                if let Some(b) = &self.budget {
                    if need > 0 && !b.acquire(need) {
                        return Err(VmmError::BudgetExceeded { physical: need });
                    }
                }
                let mut backs = Vec::new();
                if !mapped {
                    for &(_, _, size, _) in &meta {
                        match self.backend.alloc_linear(Self::translated_sizes(size).0) {
                            Ok(a) => backs.push(a),
                            Err(e) => {
                                self.release_loaded(&create, &[], &backs, need);
                                return Err(e.into());
                            }
                        }
                    }
                }
                let ranges: Vec<LoadRange<'_>> = meta
                    .iter()
                    .zip(&hosts)
                    .enumerate()
                    .map(|(i, (&(id, base, size, residency), host))| LoadRange {
                        id,
                        addr: if mapped { base } else { backs[i] },
                        len: size,
                        source: match (host, residency) {
                            (Some(v), _) => Source::Memory(v),
                            (None, Residency::InFile { offset }) => Source::File { offset },
                            (None, _) => Source::Retained,
                        },
                    })
                    .collect();
                let (phys, loaded) = self.create_and_load(&create, &needs, &ranges, staging);
                if let Err(e) = loaded {
                    self.release_loaded(&create, &phys, &backs, need);
                    return Err(e);
                }
                Ok((phys, backs))
            },
        );
        let mut pending = PendingRestore {
            vmm: self,
            _serial: serial,
            targets,
            create,
            need,
            hosts,
            phys: Vec::new(),
            backs: Vec::new(),
            bytes,
            unpause,
            made: true,
            open: true,
        };
        drop(st);
        match outcome {
            Ok((phys, backs)) => {
                pending.phys = phys;
                pending.backs = backs;
                Ok(pending)
            }
            Err(e) => {
                // The memory made was released: only the bookkeeping goes back.
                pending.made = false;
                drop(pending);
                Err(e)
            }
        }
    }

    /// Unmaps and releases the memory a load made (`phys` for the first of `create`, the
    /// linear backings `backs`) and gives its budget charge back.
    fn release_loaded(
        &self,
        create: &[(usize, u64, u64)],
        phys: &[B::Physical],
        backs: &[u64],
        need: u64,
    ) {
        for (&(_, base, size), &p) in create.iter().zip(phys) {
            let _ = self.backend.unmap(base, size);
            let _ = self.backend.release_physical(p);
        }
        for &a in backs {
            let _ = self.backend.free_linear(a);
        }
        if let Some(b) = &self.budget {
            if need > 0 {
                b.release(need);
            }
        }
    }

    /// Creates and maps `create`'s chunks (in order) on a helper thread while `staging`
    /// loads `ranges` in batches of about [`LOAD_BATCH`] bytes, each batch once the chunks
    /// it needs (`needs[i]`: how many of `create` range `i` waits for) are mapped: the
    /// driver's create/map work overlaps the copies. A batch takes in every later range
    /// whose chunks are mapped by then (creating is fast on a GPU, so usually the rest).
    /// Returns the physical memory made (to undo on failure) and the outcome; on failure
    /// the helper stops early.
    fn create_and_load<S: Staging<B> + ?Sized>(
        &self,
        create: &[(usize, u64, u64)],
        needs: &[usize],
        ranges: &[LoadRange<'_>],
        staging: &mut S,
    ) -> (Vec<B::Physical>, Result<(), VmmError>) {
        struct Progress {
            mapped: usize,
            failed: Option<BackendError>,
            stop: bool,
        }
        let progress = Mutex::new(Progress {
            mapped: 0,
            failed: None,
            stop: false,
        });
        let moved = Condvar::new();
        let make = || {
            let mut phys = Vec::with_capacity(create.len());
            for &(_, base, size) in create {
                if progress.lock().stop {
                    break;
                }
                let step = self.backend.create_physical(size).and_then(|p| {
                    match self.backend.map(base, size, p) {
                        Ok(()) => Ok(p),
                        Err(e) => {
                            let _ = self.backend.release_physical(p);
                            Err(e)
                        }
                    }
                });
                let mut pr = progress.lock();
                match step {
                    Ok(p) => {
                        phys.push(p);
                        pr.mapped += 1;
                    }
                    Err(e) => pr.failed = Some(e),
                }
                let failed = pr.failed.is_some();
                drop(pr);
                moved.notify_all();
                if failed {
                    break;
                }
            }
            phys
        };
        let load = |staging: &mut S| -> Result<(), VmmError> {
            let mut start = 0;
            while start < ranges.len() {
                let (mut end, mut bytes, mut need) = (start, 0u64, 0usize);
                while end < ranges.len() && (end == start || bytes < LOAD_BATCH) {
                    bytes += ranges[end].len;
                    need = need.max(needs[end]);
                    end += 1;
                }
                let ready = {
                    let mut pr = progress.lock();
                    while pr.mapped < need && pr.failed.is_none() {
                        moved.wait(&mut pr);
                    }
                    if pr.mapped < need {
                        let e = pr.failed.clone().expect("failed");
                        return Err(e.into());
                    }
                    pr.mapped
                };
                // Whatever is mapped already goes in the same call: every call ends by
                // waiting for its copies, and each wait leaves the copy engines idle.
                while end < ranges.len() && needs[end] <= ready {
                    end += 1;
                }
                staging.load(&self.backend, &ranges[start..end])?;
                start = end;
            }
            Ok(())
        };
        if create.len() < 2 {
            // Nothing worth a thread.
            let phys = make();
            let failed = progress.lock().failed.take();
            if let Some(e) = failed {
                return (phys, Err(e.into()));
            }
            return (phys, load(staging));
        }
        std::thread::scope(|s| {
            let helper = s.spawn(make);
            let loaded = load(staging);
            if loaded.is_err() {
                progress.lock().stop = true;
            }
            let phys = helper.join().unwrap_or_default();
            let failed = progress.lock().failed.take();
            let result = match (loaded, failed) {
                (Err(e), _) => Err(e),
                (Ok(()), Some(e)) => Err(e.into()),
                (Ok(()), None) if phys.len() < create.len() => Err(VmmError::Staging(
                    StagingError::Io("mapping the restored chunks stopped early".into()),
                )),
                (Ok(()), None) => Ok(()),
            };
            (phys, result)
        })
    }

    /// Records that an evicted allocation's host copy now lives in a file at `offset`
    /// (a checkpoint wrote it): the VMM drops its in-memory copy and later restores load
    /// [`Source::File`].
    pub fn mark_in_file(&self, id: AllocationId, offset: u64) -> Result<(), VmmError> {
        let mut st = self.state.lock();
        let base = *st.ids.get(&id).ok_or(VmmError::UnknownAllocation { id })?;
        let r = st.records.get_mut(&base).expect("id maps to a record");
        if r.alloc.residency.is_resident() || r.busy {
            return Err(VmmError::WrongResidency {
                id,
                seen: r.alloc.residency,
                expected: "evicted",
            });
        }
        let host = r.host.take();
        let residency = Residency::InFile { offset };
        r.alloc.residency = residency;
        self.table.update(base, |a| a.residency = residency);
        drop(st);
        drop(host);
        Ok(())
    }

    /// Runs `f` on the host copy the VMM holds for an evicted allocation (e.g. to write it
    /// into a checkpoint image). The VMM's lock is held during `f`: keep it to plain I/O.
    pub fn with_host_copy<R>(
        &self,
        id: AllocationId,
        f: impl FnOnce(&[u8]) -> R,
    ) -> Result<R, VmmError> {
        let st = self.state.lock();
        let base = *st.ids.get(&id).ok_or(VmmError::UnknownAllocation { id })?;
        let r = &st.records[&base];
        match &r.host {
            Some(v) if !r.busy => Ok(f(v)),
            _ => Err(VmmError::NoHostCopy {
                id,
                seen: r.alloc.residency,
            }),
        }
    }

    /// Frees every allocation and returns every reservation to the backend. For process
    /// teardown: call it when no other thread uses the VMM. Returns the first error met.
    pub fn release_all(&self) -> Result<(), VmmError> {
        let mut first = None;
        for a in self.table.to_vec() {
            if let Err(e) = self.free(a.base) {
                first.get_or_insert(e);
            }
        }
        let mut st = self.state.lock();
        if st.chunks.is_empty() {
            let reservations = std::mem::take(&mut st.reservations);
            let mut space = RangeAllocator::new();
            if self.config.addressing == Addressing::Translated {
                let units = self.config.translated_size / TRANSLATED_UNIT * TRANSLATED_UNIT;
                space.free(self.config.translated_base, units);
            }
            st.space = space;
            st.stats.reserved = 0;
            st.vslabs.clear();
            st.vopen.iter_mut().for_each(BTreeSet::clear);
            if self.config.addressing == Addressing::Mapped {
                self.table.clear_regions();
            }
            drop(st);
            for (base, size) in reservations {
                if let Err(e) = self.backend.free_reservation(base, size) {
                    first.get_or_insert(e.into());
                }
            }
        }
        match first {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

/// A restore loaded into new device memory but not committed ([`Vmm::load_all`]): the
/// allocations are still evicted, their host copies kept. [`PendingRestore::commit`] makes
/// them resident; dropping it releases the new memory and leaves everything as it was.
#[must_use = "dropping a pending restore rolls it back"]
pub struct PendingRestore<'v, B: Backend> {
    vmm: &'v Vmm<B>,
    /// The VMM's residency changes wait until this one is committed or dropped.
    _serial: MutexGuard<'v, ()>,
    /// The restored allocations' bases.
    targets: Vec<u64>,
    /// The chunks re-created (mapped addressing): index, base, size.
    create: Vec<(usize, u64, u64)>,
    /// Physical bytes charged.
    need: u64,
    /// The targets' host copies, taken from their records (given back on rollback).
    hosts: Vec<Option<Vec<u8>>>,
    /// The physical memory of `create`.
    phys: Vec<B::Physical>,
    /// The new backings (translated addressing), one per target.
    backs: Vec<u64>,
    bytes: u64,
    unpause: bool,
    /// Whether `phys`, `backs` and the budget charge are still held (to release on
    /// rollback).
    made: bool,
    /// Neither committed nor rolled back yet.
    open: bool,
}

impl<B: Backend> std::fmt::Debug for PendingRestore<'_, B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PendingRestore")
            .field("allocations", &self.targets.len())
            .field("bytes", &self.bytes)
            .finish_non_exhaustive()
    }
}

impl<B: Backend> PendingRestore<'_, B> {
    /// Allocations and bytes loaded.
    pub fn moved(&self) -> Moved {
        Moved {
            allocations: self.targets.len(),
            bytes: self.bytes,
            chunks: self.create.len(),
        }
    }

    /// Makes the loaded allocations resident (and lifts the pause of
    /// [`Vmm::evict_all`]); their host copies go to `staging`'s
    /// [`Staging::recycle`]. Cannot fail: everything that could was done by the load.
    pub fn commit<S: Staging<B> + ?Sized>(mut self, staging: &mut S) -> Moved {
        self.open = false;
        let vmm = self.vmm;
        let mapped = vmm.config.addressing == Addressing::Mapped;
        let moved = self.moved();
        let phys = std::mem::take(&mut self.phys);
        let backs = std::mem::take(&mut self.backs);
        let hosts = std::mem::take(&mut self.hosts);
        let mut st = vmm.state.lock();
        for (&(ck, _, size), p) in self.create.iter().zip(phys) {
            let c = &mut st.chunks[ck];
            c.phys = Phys::Mapped(p);
            c.busy = false;
            let open = c.slots.as_ref().is_some_and(|s| !s.is_full());
            if let (Some(cl), true) = (c.class, open) {
                st.open[cl].insert(ck);
            }
            st.stats.mapped += size;
            st.stats.chunks += 1;
        }
        if !mapped {
            st.stats.mapped += self.need;
            st.stats.chunks += self.targets.len() as u64;
        }
        st.stats.peak_mapped = st.stats.peak_mapped.max(st.stats.mapped);
        for (i, b) in self.targets.iter().enumerate() {
            let r = st.records.get_mut(b).expect("busy target stays");
            r.busy = false;
            r.alloc.residency = Residency::Resident;
            if !mapped {
                r.alloc.backing = backs[i];
            }
            let (size, chunk, backing) = (r.alloc.size, r.chunk, r.alloc.backing);
            vmm.table.update(*b, |a| {
                a.residency = Residency::Resident;
                a.backing = backing;
            });
            if let Some(ck) = chunk {
                st.chunks[ck].resident += 1;
            }
            st.stats.resident += size;
            st.stats.evicted -= size;
        }
        if self.unpause {
            st.paused = false;
        }
        vmm.changed.notify_all();
        drop(st);
        // The restored host copies, outside the lock: the staging may keep their memory.
        staging.recycle(hosts.into_iter().flatten().collect());
        moved
    }
}

impl<B: Backend> Drop for PendingRestore<'_, B> {
    /// Rolls the load back: the new memory released, the allocations evicted as before
    /// with their host copies.
    fn drop(&mut self) {
        if !self.open {
            return;
        }
        let vmm = self.vmm;
        if self.made {
            vmm.release_loaded(&self.create, &self.phys, &self.backs, self.need);
        }
        let mut st = vmm.state.lock();
        st.stats.committed -= self.need;
        for (b, host) in self.targets.iter().zip(std::mem::take(&mut self.hosts)) {
            let r = st.records.get_mut(b).expect("busy target stays");
            r.busy = false;
            r.host = host;
        }
        for &(ck, _, _) in &self.create {
            st.chunks[ck].busy = false;
        }
        vmm.changed.notify_all();
    }
}
