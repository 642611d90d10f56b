//! How evicted bytes leave the device and come back: the [`Staging`] trait.
//!
//! The VMM decides *what* moves (which allocations, at which device addresses); the
//! staging decides *how*. It receives the whole batch at once so a real implementation
//! can split it over pinned buffers and several streams and overlap the copies.

use crate::backend::Backend;
use crate::error::StagingError;
use crate::table::AllocationId;

/// One range to copy off the device during eviction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StagingRange {
    /// The allocation the range belongs to.
    pub id: AllocationId,
    /// The device address to copy from (the backing address; the pointer itself in mapped
    /// addressing).
    pub addr: u64,
    /// Bytes to copy.
    pub len: u64,
}

/// Where [`Staging::save`] put one range's bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostCopy {
    /// Here are the bytes: the VMM keeps them until restore or free
    /// ([`crate::Residency::EvictedToHost`]).
    Memory(Vec<u8>),
    /// The staging keeps the bytes itself (a pinned pool), findable by allocation id
    /// ([`crate::Residency::EvictedToHost`]).
    Retained,
    /// The bytes went to a file at `offset` ([`crate::Residency::InFile`]).
    File {
        /// Byte offset in the file.
        offset: u64,
    },
}

/// Where [`Staging::load`] finds one range's bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source<'a> {
    /// The bytes the VMM held.
    Memory(&'a [u8]),
    /// The staging retained them ([`HostCopy::Retained`]).
    Retained,
    /// In the file at `offset`.
    File {
        /// Byte offset in the file.
        offset: u64,
    },
}

impl Source<'_> {
    /// A short name for error messages.
    pub fn kind(&self) -> &'static str {
        match self {
            Source::Memory(_) => "memory",
            Source::Retained => "retained",
            Source::File { .. } => "file",
        }
    }
}

/// One range to copy back onto the device during restore.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoadRange<'a> {
    /// The allocation the range belongs to.
    pub id: AllocationId,
    /// The device address to copy to (mapped and ready; in translated addressing a fresh
    /// backing that may differ from the one saved from).
    pub addr: u64,
    /// Bytes to copy.
    pub len: u64,
    /// Where the bytes are.
    pub source: Source<'a>,
}

/// Moves allocations' bytes between the device and the host, a batch at a time.
///
/// The VMM calls it without holding any lock. Device memory is mapped for the whole call;
/// the VMM releases it only after `save` returns `Ok`, and on `Err` nothing changes state
/// (the eviction or restore is rolled back), so a failing staging loses no data.
/// Implementations must have finished every copy (streams synchronised) when they return.
pub trait Staging<B: Backend + ?Sized> {
    /// Copies every range off the device. Returns one [`HostCopy`] per range, in order.
    fn save(&mut self, backend: &B, ranges: &[StagingRange])
        -> Result<Vec<HostCopy>, StagingError>;

    /// Copies every range onto the device.
    fn load(&mut self, backend: &B, ranges: &[LoadRange<'_>]) -> Result<(), StagingError>;

    /// Takes back host copies the VMM no longer needs (their ranges were just loaded), so
    /// that a later [`Staging::save`] may write into their memory, already faulted in,
    /// rather than into fresh pages. The default drops them.
    fn recycle(&mut self, copies: Vec<Vec<u8>>) {
        drop(copies);
    }
}

/// The simple staging: synchronous [`Backend::copy_to_host`] / [`Backend::copy_from_host`]
/// into `Vec<u8>`s the VMM keeps in RAM. Loads [`Source::Memory`] only.
#[derive(Debug, Clone, Copy, Default)]
pub struct HostStaging;

impl<B: Backend + ?Sized> Staging<B> for HostStaging {
    fn save(
        &mut self,
        backend: &B,
        ranges: &[StagingRange],
    ) -> Result<Vec<HostCopy>, StagingError> {
        ranges
            .iter()
            .map(|r| {
                let len = usize::try_from(r.len).map_err(|_| {
                    StagingError::Io(format!("range of {} bytes exceeds usize", r.len))
                })?;
                let mut buf = vec![0u8; len];
                backend.copy_to_host(&mut buf, r.addr)?;
                Ok(HostCopy::Memory(buf))
            })
            .collect()
    }

    fn load(&mut self, backend: &B, ranges: &[LoadRange<'_>]) -> Result<(), StagingError> {
        for r in ranges {
            match r.source {
                Source::Memory(bytes) => backend.copy_from_host(r.addr, bytes)?,
                other => {
                    return Err(StagingError::Unsupported {
                        id: r.id,
                        source_kind: other.kind(),
                    })
                }
            }
        }
        Ok(())
    }
}
