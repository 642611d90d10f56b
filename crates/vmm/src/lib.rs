//! cudaw's virtual memory manager. See `../shared/DESIGN.md`.
//!
//! Every device pointer a program holds under cudaw comes from a [`Vmm`]: pure logic over a
//! [`Backend`] of device-memory primitives, with no FFI.
//!
//! - **Mapped addressing** (default): pointers are real device addresses inside large
//!   reservations ([`Backend::reserve`], 1 TiB each by default, more when full). A best-fit
//!   allocator with coalescing hands out granule-aligned ranges; allocations up to
//!   [`ChunkPolicy::max_small`] share granule-sized chunks (slab classes, 256-byte
//!   aligned), larger ones get their own granule-rounded chunk. Physical memory is created
//!   and mapped when a chunk is first needed and released when no allocation uses it.
//! - **Translated addressing**: pointers come from a synthetic range; each allocation is
//!   backed by [`Backend::alloc_linear`], and [`Vmm::translate`] gives the backing of any
//!   interior (or one-past-the-end) pointer. Small allocations share 2 MiB virtual chunks
//!   per slab class (as in mapped addressing, with no physical chunk behind them), larger
//!   ones get whole 2 MiB units; each keeps at least 256 bytes of gap after its end.
//! - **Lookup** ([`AllocationTable`]): one flat directory entry per granule (2 MiB unit in
//!   translated addressing) of each reservation, either one large allocation or a shared
//!   chunk's slots; address → allocation is a shift, an index and a multiply-shift
//!   division, independent of the number of allocations.
//! - **Residency**: [`Vmm::evict`] / [`Vmm::evict_all`] copy allocations out through a
//!   caller's [`Staging`] (a batch at a time) and release physical memory no resident
//!   allocation needs; [`Vmm::restore`] / [`Vmm::restore_all`] re-create it at the same
//!   addresses and copy back.
//! - **Quotas**: a memory limit on physical bytes checked before any backend call, exact
//!   under concurrency; an optional node-wide [`Budget`]; [`MemoryStats`].
//!
//! Locking: one state mutex for bookkeeping (never held across a backend or staging call:
//! the work is reserved under it, done outside, then committed or rolled back) and a
//! read-mostly lock on the [`AllocationTable`], the only lock [`Vmm::lookup`] and
//! [`Vmm::translate`] take. Evictions and restores are serialised with each other.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod backend;
pub mod budget;
pub mod classes;
pub mod config;
pub mod error;
pub mod range;
pub mod staging;
pub mod table;
pub mod testing;
mod vmm;

pub use backend::{Backend, BackendError};
pub use budget::Budget;
pub use config::{parse_size, Addressing, ChunkPolicy, Config, ALLOCATION_ALIGNMENT};
pub use error::{StagingError, VmmError};
pub use staging::{HostCopy, HostStaging, LoadRange, Source, Staging, StagingRange};
pub use table::{Allocation, AllocationId, AllocationTable, Residency};
pub use vmm::{KeyHasher, KeyMap, MemoryStats, Moved, PendingRestore, Vmm};
