//! The driver layer: the CUDA driver calls cudaw needs, behind one object-safe trait
//! ([`Driver`]), and the real backend ([`LibCuda`]) that loads `libcuda.so.1` at run time
//! (`CUDAW_LIBCUDA=PATH` picks another library, such as simgpu's). [`DriverBackend`]
//! serves the VMM over any `Driver`.
//!
//! Driver ABI types come from `cudarc::driver::sys` (re-exported as [`sys`]); the functions
//! are resolved here, lazily, so a missing one is an error code and never a panic.
#![deny(unsafe_op_in_unsafe_fn)]
#![deny(missing_docs)]

pub mod abi;
pub mod api;
pub mod backend;
pub mod checkpoint;
pub mod error;
pub mod hooks;
pub mod inflight;
pub mod launch_args;
pub mod loader;
pub mod locate;
pub mod selfcost;
pub mod staging;

/// The CUDA driver ABI types (CUDA 13.0 layouts).
pub use cudarc::driver::sys;

pub use api::{
    Context, Device, Driver, Event, MemoryType, PhysicalHandle, Stream, LIMIT_STACK_SIZE,
};
pub use backend::{DriverBackend, KeptContext};
pub use error::{DriverError, Result};
pub use loader::LibCuda;
pub use staging::{
    ArenaDone, ArenaStatus, Completion, PageableCopy, PageableCopyError, PinnedStaging, Retaining,
    StagingConfig, ARENA_ALIGN,
};
