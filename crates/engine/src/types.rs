//! The runtime's C types and error codes that cudaw's engine and wrappers touch. Layouts
//! are those of `cuda_runtime_api.h` / `driver_types.h`, identical in CUDA 11, 12 and 13.

#![allow(non_camel_case_types)]

use std::ffi::c_void;

/// `cudaError_t`.
pub type cudaError_t = u32;
/// `cudaSuccess`.
pub const SUCCESS: cudaError_t = 0;
/// `cudaErrorInvalidValue`.
pub const ERROR_INVALID_VALUE: cudaError_t = 1;
/// `cudaErrorMemoryAllocation`.
pub const ERROR_MEMORY_ALLOCATION: cudaError_t = 2;
/// `cudaErrorInitializationError`.
pub const ERROR_INITIALIZATION: cudaError_t = 3;
/// `cudaErrorNotReady`.
pub const ERROR_NOT_READY: cudaError_t = 600;
/// `cudaErrorNotSupported`.
pub const ERROR_NOT_SUPPORTED: cudaError_t = 801;
/// `cudaErrorUnknown`.
pub const ERROR_UNKNOWN: cudaError_t = 999;

/// `cudaStream_t`.
pub type cudaStream_t = *mut c_void;
/// `cudaEvent_t`.
pub type cudaEvent_t = *mut c_void;

/// `dim3`: passed by value in two integer registers, like C.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Dim3 {
    /// x.
    pub x: u32,
    /// y.
    pub y: u32,
    /// z.
    pub z: u32,
}

/// `cudaExtent`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct cudaExtent {
    /// Width in bytes (linear memory).
    pub width: usize,
    /// Height in rows.
    pub height: usize,
    /// Depth in slices.
    pub depth: usize,
}

/// `cudaPitchedPtr`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct cudaPitchedPtr {
    /// The allocation.
    pub ptr: *mut c_void,
    /// Bytes per row.
    pub pitch: usize,
    /// Logical width in bytes.
    pub xsize: usize,
    /// Logical height in rows.
    pub ysize: usize,
}

/// `cudaPos`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct cudaPos {
    /// x.
    pub x: usize,
    /// y.
    pub y: usize,
    /// z.
    pub z: usize,
}

/// `cudaMemcpy3DParms`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct cudaMemcpy3DParms {
    /// Source array (`cudaArray_t`).
    pub src_array: *mut c_void,
    /// Source position.
    pub src_pos: cudaPos,
    /// Source pointer.
    pub src_ptr: cudaPitchedPtr,
    /// Destination array.
    pub dst_array: *mut c_void,
    /// Destination position.
    pub dst_pos: cudaPos,
    /// Destination pointer.
    pub dst_ptr: cudaPitchedPtr,
    /// Extent.
    pub extent: cudaExtent,
    /// `cudaMemcpyKind`.
    pub kind: i32,
}

/// `cudaLaunchConfig_t` (the fields cudaw reads; attributes are passed through).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct cudaLaunchConfig_t {
    /// Grid.
    pub grid_dim: Dim3,
    /// Block.
    pub block_dim: Dim3,
    /// Dynamic shared memory.
    pub dynamic_smem_bytes: usize,
    /// Stream.
    pub stream: cudaStream_t,
    /// Attributes.
    pub attrs: *mut c_void,
    /// Attribute count.
    pub num_attrs: u32,
}

/// `cudaMemoryTypeDevice`, in `cudaPointerAttributes::type`.
pub const MEMORY_TYPE_DEVICE: i32 = 2;

/// `cudaPointerAttributes` (CUDA ≥ 11 layout).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct cudaPointerAttributes {
    /// `cudaMemoryType`.
    pub type_: i32,
    /// Device ordinal.
    pub device: i32,
    /// Device-side address.
    pub device_pointer: *mut c_void,
    /// Host-side address.
    pub host_pointer: *mut c_void,
}

/// `cudaDevAttrComputeCapabilityMajor`.
pub const DEV_ATTR_CC_MAJOR: i32 = 75;
/// `cudaDevAttrComputeCapabilityMinor`.
pub const DEV_ATTR_CC_MINOR: i32 = 76;
/// `cudaEventDisableTiming`.
pub const EVENT_DISABLE_TIMING: u32 = 2;

/// `cudaMemcpyDeviceToDevice`.
pub const MEMCPY_DEVICE_TO_DEVICE: i32 = 3;

impl From<Dim3> for [u32; 3] {
    fn from(d: Dim3) -> [u32; 3] {
        [d.x, d.y, d.z]
    }
}

driver::abi_struct!(Dim3, cudaExtent, cudaPitchedPtr);
