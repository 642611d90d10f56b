//! The crate's one error type and its mapping to CUDA runtime error codes.

use crate::backend::BackendError;
use crate::table::{AllocationId, Residency};

/// `cudaErrorInvalidValue`.
pub const CUDA_ERROR_INVALID_VALUE: u32 = 1;
/// `cudaErrorMemoryAllocation`.
pub const CUDA_ERROR_MEMORY_ALLOCATION: u32 = 2;
/// `cudaErrorInvalidDevicePointer` (deprecated by NVIDIA since CUDA 10.1; the runtime
/// itself now answers `cudaFree` of an unknown pointer with `cudaErrorInvalidValue`).
pub const CUDA_ERROR_INVALID_DEVICE_POINTER: u32 = 17;
/// `cudaErrorNotPermitted`.
pub const CUDA_ERROR_NOT_PERMITTED: u32 = 800;
/// `cudaErrorUnknown`.
pub const CUDA_ERROR_UNKNOWN: u32 = 999;

/// A failure of a [`crate::Staging`] implementation while copying allocations out or in.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StagingError {
    /// A device copy failed.
    #[error("staging copy failed: {0}")]
    Backend(#[from] BackendError),
    /// Reading or writing the host side (a file, a pinned pool) failed.
    #[error("staging i/o failed: {0}")]
    Io(String),
    /// The staging cannot load a copy kept in this kind of place.
    #[error("staging cannot load allocation {id:?} from {source_kind}")]
    Unsupported {
        /// The allocation.
        id: AllocationId,
        /// Where its host copy is (`"file"`, `"retained"`).
        source_kind: &'static str,
    },
    /// `save` returned a different number of host copies than ranges it was given.
    #[error("staging returned {seen} host copies for {expected} ranges")]
    Count {
        /// How many it returned.
        seen: usize,
        /// How many ranges it was given.
        expected: usize,
    },
}

/// Everything that can go wrong in the VMM.
///
/// [`VmmError::cuda_error_code`] is the mapping the shim uses to CUDA runtime codes:
///
/// | variant | runtime code |
/// | --- | --- |
/// | `OutOfMemory`, `BudgetExceeded`, `TooLarge`, `AddressSpaceExhausted` | `cudaErrorMemoryAllocation` (2) |
/// | `Backend` with `CUDA_ERROR_OUT_OF_MEMORY` | `cudaErrorMemoryAllocation` (2) |
/// | `ZeroSize`, `NotAllocated`, `NotABase`, `UnknownAllocation`, `WrongResidency`, `NoHostCopy`, `InvalidConfig` | `cudaErrorInvalidValue` (1) |
/// | `Paused` | `cudaErrorNotPermitted` (800) |
/// | `Backend` (other), `Staging` | `cudaErrorUnknown` (999) |
///
/// `NotAllocated` maps to `cudaErrorInvalidValue` (1), not `cudaErrorInvalidDevicePointer`
/// (17): NVIDIA deprecated 17 in CUDA 10.1 and `cudaFree` of an unknown pointer returns 1;
/// a shim that needs the old code for an old runtime uses
/// [`VmmError::cuda_error_code_legacy`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VmmError {
    /// The allocation would take physical memory past the memory limit.
    #[error("out of memory: {requested} bytes requested need {physical} physical bytes, {used} of the limit {limit} in use")]
    OutOfMemory {
        /// Bytes the caller asked for.
        requested: u64,
        /// Physical bytes the request needs (granule rounding included; 0 if it fits an existing chunk).
        physical: u64,
        /// The memory limit.
        limit: u64,
        /// Physical bytes committed when the request was refused.
        used: u64,
    },
    /// The node-wide [`crate::Budget`] refused the physical memory.
    #[error("node-wide budget refused {physical} physical bytes")]
    BudgetExceeded {
        /// Physical bytes asked of the budget.
        physical: u64,
    },
    /// The size cannot be represented once rounded, or exceeds the address range.
    #[error("allocation of {size} bytes is too large (at most {max})")]
    TooLarge {
        /// Bytes asked for.
        size: u64,
        /// The largest size this VMM can satisfy.
        max: u64,
    },
    /// The synthetic range of translated addressing is full.
    #[error(
        "translated address range exhausted: {size} bytes requested, range {range_size} bytes"
    )]
    AddressSpaceExhausted {
        /// Bytes asked for.
        size: u64,
        /// The configured size of the range.
        range_size: u64,
    },
    /// A zero-byte allocation was requested (the shim answers `cudaMalloc(0)` itself).
    #[error("zero-byte allocation requested")]
    ZeroSize,
    /// The pointer is not inside any allocation.
    #[error("pointer {ptr:#x} is not allocated")]
    NotAllocated {
        /// The pointer seen.
        ptr: u64,
    },
    /// The pointer is inside an allocation but is not its base (e.g. `cudaFree(p + 16)`).
    #[error("pointer {ptr:#x} is inside the allocation at {base:#x}, not its base")]
    NotABase {
        /// The pointer seen.
        ptr: u64,
        /// The base of the allocation containing it.
        base: u64,
    },
    /// No live allocation has this id.
    #[error("no allocation with id {id:?}")]
    UnknownAllocation {
        /// The id seen.
        id: AllocationId,
    },
    /// The allocation is not in the residency the operation needs.
    #[error("allocation {id:?} is {seen:?}, expected {expected}")]
    WrongResidency {
        /// The allocation.
        id: AllocationId,
        /// Its residency.
        seen: Residency,
        /// What the operation needs (`"resident"`, `"evicted"`).
        expected: &'static str,
    },
    /// The allocation's host copy is not held by the VMM (it is in a file or retained by the staging).
    #[error("allocation {id:?} has no host copy held by the vmm (it is {seen:?})")]
    NoHostCopy {
        /// The allocation.
        id: AllocationId,
        /// Its residency.
        seen: Residency,
    },
    /// Allocation was refused because the address space is paused (everything evicted).
    #[error("allocation of {size} bytes refused: the address space is paused")]
    Paused {
        /// Bytes asked for.
        size: u64,
    },
    /// A configuration value is out of range.
    #[error("invalid config: {field} = {value}, expected {expected}")]
    InvalidConfig {
        /// The field.
        field: &'static str,
        /// The value seen.
        value: u64,
        /// What is accepted.
        expected: &'static str,
    },
    /// The backend failed.
    #[error("backend: {0}")]
    Backend(#[from] BackendError),
    /// The staging failed while copying out or in; nothing changed residency.
    #[error("staging: {0}")]
    Staging(#[from] StagingError),
}

impl VmmError {
    /// The CUDA runtime error code (`cudaError_t`) the shim returns for this error.
    pub fn cuda_error_code(&self) -> u32 {
        match self {
            VmmError::OutOfMemory { .. }
            | VmmError::BudgetExceeded { .. }
            | VmmError::TooLarge { .. }
            | VmmError::AddressSpaceExhausted { .. } => CUDA_ERROR_MEMORY_ALLOCATION,
            VmmError::Backend(e) if e.is_out_of_memory() => CUDA_ERROR_MEMORY_ALLOCATION,
            VmmError::Staging(StagingError::Backend(e)) if e.is_out_of_memory() => {
                CUDA_ERROR_MEMORY_ALLOCATION
            }
            VmmError::ZeroSize
            | VmmError::NotAllocated { .. }
            | VmmError::NotABase { .. }
            | VmmError::UnknownAllocation { .. }
            | VmmError::WrongResidency { .. }
            | VmmError::NoHostCopy { .. }
            | VmmError::InvalidConfig { .. } => CUDA_ERROR_INVALID_VALUE,
            VmmError::Paused { .. } => CUDA_ERROR_NOT_PERMITTED,
            VmmError::Backend(_) | VmmError::Staging(_) => CUDA_ERROR_UNKNOWN,
        }
    }

    /// As [`VmmError::cuda_error_code`], but pointers that are not allocations give
    /// `cudaErrorInvalidDevicePointer` (17), as runtimes before CUDA 10.1 did.
    pub fn cuda_error_code_legacy(&self) -> u32 {
        match self {
            VmmError::NotAllocated { .. } | VmmError::NotABase { .. } => {
                CUDA_ERROR_INVALID_DEVICE_POINTER
            }
            other => other.cuda_error_code(),
        }
    }
}
