//! The contract between the virtual memory manager and whatever provides device memory.
//!
//! `crates/driver` implements it over the CUDA driver (the real `libcuda.so.1` or simgpu);
//! tests implement it over plain host memory. Keep this file the single definition: the
//! driver crate's implementation must follow any change.

use std::fmt;

/// A failure reported by a backend: the driver's numeric code and its name
/// (`CUDA_ERROR_OUT_OF_MEMORY`), so callers can map it to a runtime error code unchanged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackendError {
    /// The driver's `CUresult` value.
    pub code: u32,
    /// The driver's name for it, or a description for non-driver failures.
    pub name: String,
}

impl BackendError {
    /// `CUDA_ERROR_OUT_OF_MEMORY`.
    pub const OUT_OF_MEMORY: u32 = 2;
    /// `CUDA_ERROR_INVALID_VALUE`.
    pub const INVALID_VALUE: u32 = 1;

    /// Builds an error from a code and a name.
    pub fn new(code: u32, name: impl Into<String>) -> Self {
        Self {
            code,
            name: name.into(),
        }
    }

    /// Whether the driver said it is out of memory.
    pub fn is_out_of_memory(&self) -> bool {
        self.code == Self::OUT_OF_MEMORY
    }
}

impl fmt::Display for BackendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.name, self.code)
    }
}

impl std::error::Error for BackendError {}

/// Device memory primitives, one device. All addresses are device virtual addresses.
///
/// Implementations must be callable from many threads at once. Calls may block (a
/// driver call); the VMM never holds one of its locks across them.
pub trait Backend: Send + Sync {
    /// A handle to a piece of physical memory (`CUmemGenericAllocationHandle`).
    type Physical: Copy + Send + Sync + Eq + fmt::Debug;

    /// The physical allocation granularity in bytes (`cuMemGetAllocationGranularity`,
    /// minimum granularity); 2 MiB on an H100.
    fn granularity(&self) -> Result<u64, BackendError>;

    /// Reserves `size` bytes of virtual address space aligned to `alignment`
    /// (`cuMemAddressReserve`). Returns the base address.
    fn reserve(&self, size: u64, alignment: u64) -> Result<u64, BackendError>;

    /// Returns a reservation made by [`Backend::reserve`] (`cuMemAddressFree`).
    fn free_reservation(&self, base: u64, size: u64) -> Result<(), BackendError>;

    /// Creates `size` bytes of physical memory, a multiple of the granularity (`cuMemCreate`).
    fn create_physical(&self, size: u64) -> Result<Self::Physical, BackendError>;

    /// Releases physical memory (`cuMemRelease`). Mappings of it must be gone first.
    fn release_physical(&self, physical: Self::Physical) -> Result<(), BackendError>;

    /// Maps `physical` (its whole size, `size` bytes) at `addr` inside a reservation and
    /// enables read/write access from the device (`cuMemMap` + `cuMemSetAccess`).
    fn map(&self, addr: u64, size: u64, physical: Self::Physical) -> Result<(), BackendError>;

    /// Unmaps `size` bytes at `addr` (`cuMemUnmap`). After this, touching the range faults.
    fn unmap(&self, addr: u64, size: u64) -> Result<(), BackendError>;

    /// Allocates ordinary device memory (`cuMemAlloc`), for translated addressing.
    fn alloc_linear(&self, size: u64) -> Result<u64, BackendError>;

    /// Frees memory from [`Backend::alloc_linear`] (`cuMemFree`).
    fn free_linear(&self, addr: u64) -> Result<(), BackendError>;

    /// Copies device memory at `src` into `dst` (synchronous `cuMemcpyDtoH`).
    fn copy_to_host(&self, dst: &mut [u8], src: u64) -> Result<(), BackendError>;

    /// Copies `src` into device memory at `dst` (synchronous `cuMemcpyHtoD`).
    fn copy_from_host(&self, dst: u64, src: &[u8]) -> Result<(), BackendError>;

    /// Free and total device memory in bytes (`cuMemGetInfo`).
    fn memory_info(&self) -> Result<(u64, u64), BackendError>;
}
