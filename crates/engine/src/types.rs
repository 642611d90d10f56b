//! The runtime's error codes and handle types the engine's memory calls use (layouts of
//! `cuda_runtime_api.h`, identical in CUDA 11, 12 and 13).

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

/// `cudaStream_t`.
pub type cudaStream_t = *mut c_void;
