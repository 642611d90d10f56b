//! CUDA runtime error codes (`cudaError_t`), with the real runtime's numbers, names and
//! descriptions.

use std::ffi::CStr;
use std::fmt;
use std::num::NonZeroU32;

use crate::error::CuError;

/// A failing `cudaError_t`: never zero, so `Result<(), RtError>` maps to 0 on success.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct RtError(NonZeroU32);

/// The result of a simulated runtime operation.
pub type RtResult<T> = Result<T, RtError>;

macro_rules! codes {
    ($($name:ident = $value:literal, $text:literal;)*) => {
        #[allow(non_upper_case_globals)]
        impl RtError {
            $(
                #[doc = concat!("`", stringify!($name), "` (", stringify!($value), "): ", $text, ".")]
                pub const $name: RtError = match NonZeroU32::new($value) {
                    Some(v) => RtError(v),
                    None => panic!("zero is success"),
                };
            )*
        }

        /// `cudaGetErrorName`: the runtime's name for a code, NUL-terminated, if simgpu
        /// knows it.
        pub fn name_of(code: u32) -> Option<&'static CStr> {
            match code {
                0 => Some(c"cudaSuccess"),
                $($value => Some(
                    match CStr::from_bytes_with_nul(concat!(stringify!($name), "\0").as_bytes()) {
                        Ok(s) => s,
                        Err(_) => panic!("names have no NUL"),
                    },
                ),)*
                _ => None,
            }
        }

        /// `cudaGetErrorString`: the runtime's description of a code, if simgpu knows it.
        pub fn description_of(code: u32) -> Option<&'static CStr> {
            match code {
                0 => Some(c"no error"),
                $($value => Some(
                    match CStr::from_bytes_with_nul(concat!($text, "\0").as_bytes()) {
                        Ok(s) => s,
                        Err(_) => panic!("descriptions have no NUL"),
                    },
                ),)*
                _ => None,
            }
        }
    };
}

codes! {
    cudaErrorInvalidValue = 1, "invalid argument";
    cudaErrorMemoryAllocation = 2, "out of memory";
    cudaErrorInitializationError = 3, "initialization error";
    cudaErrorCudartUnloading = 4, "driver shutting down";
    cudaErrorInvalidConfiguration = 9, "invalid configuration argument";
    cudaErrorInvalidPitchValue = 12, "invalid pitch argument";
    cudaErrorInvalidSymbol = 13, "invalid device symbol";
    cudaErrorInvalidDevicePointer = 17, "invalid device pointer";
    cudaErrorInvalidMemcpyDirection = 21, "invalid copy direction for memcpy";
    cudaErrorInvalidDeviceFunction = 98, "invalid device function";
    cudaErrorNoDevice = 100, "no CUDA-capable device is detected";
    cudaErrorInvalidDevice = 101, "invalid device ordinal";
    cudaErrorDeviceUninitialized = 201, "invalid device context";
    cudaErrorAlreadyMapped = 208, "resource already mapped";
    cudaErrorNotMapped = 211, "resource not mapped";
    cudaErrorPeerAccessUnsupported = 217, "peer access is not supported between these two devices";
    cudaErrorInvalidResourceHandle = 400, "invalid resource handle";
    cudaErrorSymbolNotFound = 500, "named symbol not found";
    cudaErrorNotReady = 600, "device not ready";
    cudaErrorIllegalAddress = 700, "an illegal memory access was encountered";
    cudaErrorLaunchOutOfResources = 701, "too many resources requested for launch";
    cudaErrorPeerAccessAlreadyEnabled = 704, "peer access is already enabled";
    cudaErrorPeerAccessNotEnabled = 705, "peer access has not been enabled";
    cudaErrorHostMemoryAlreadyRegistered = 712, "part or all of the requested memory range is already mapped";
    cudaErrorHostMemoryNotRegistered = 713, "pointer does not correspond to a registered memory region";
    cudaErrorMisalignedAddress = 716, "misaligned address";
    cudaErrorLaunchFailure = 719, "unspecified launch failure";
    cudaErrorNotPermitted = 800, "operation not permitted";
    cudaErrorNotSupported = 801, "operation not supported";
    cudaErrorStreamCaptureUnsupported = 900, "operation not permitted when stream is capturing";
    cudaErrorUnknown = 999, "unknown error";
}

impl RtError {
    /// The numeric `cudaError_t`.
    pub fn code(self) -> u32 {
        self.0.get()
    }

    /// The runtime's name for this code.
    pub fn name(self) -> &'static str {
        name_of(self.code())
            .and_then(|s| s.to_str().ok())
            .unwrap_or("cudaErrorUnknown")
    }

    /// The error for a non-zero code simgpu knows; `cudaErrorUnknown` for any other.
    pub fn from_code(code: u32) -> RtError {
        match NonZeroU32::new(code) {
            Some(v) if name_of(code).is_some() => RtError(v),
            _ => RtError::cudaErrorUnknown,
        }
    }

    /// The `cudaError_t` of a result: 0 on success.
    pub fn to_code(result: RtResult<()>) -> u32 {
        match result {
            Ok(()) => 0,
            Err(e) => e.code(),
        }
    }

    /// Whether this error corrupts the context, as a fault in a kernel does: every later
    /// call fails with it and `cudaGetLastError` cannot clear it.
    pub fn is_sticky(self) -> bool {
        matches!(self.code(), 700 | 716 | 719)
    }
}

/// The runtime error a driver error surfaces as. The runtime's numbers for the driver
/// errors simgpu raises are the driver's own (`CUDA_ERROR_INVALID_CONTEXT` 201 is
/// `cudaErrorDeviceUninitialized` 201, and so on).
impl From<CuError> for RtError {
    fn from(e: CuError) -> RtError {
        RtError::from_code(e.code())
    }
}

impl fmt::Debug for RtError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.name(), self.code())
    }
}

impl fmt::Display for RtError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

impl std::error::Error for RtError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_names_and_descriptions_are_the_runtimes() {
        assert_eq!(RtError::cudaErrorInvalidDeviceFunction.code(), 98);
        assert_eq!(RtError::cudaErrorNotReady.name(), "cudaErrorNotReady");
        assert_eq!(name_of(0), Some(c"cudaSuccess"));
        assert_eq!(description_of(2), Some(c"out of memory"));
        assert_eq!(name_of(4242), None);
        assert_eq!(std::mem::size_of::<RtResult<()>>(), 4);
        assert!(RtError::cudaErrorIllegalAddress.is_sticky());
        assert!(!RtError::cudaErrorInvalidValue.is_sticky());
    }

    #[test]
    fn driver_errors_keep_their_numbers() {
        for e in [
            CuError::CUDA_ERROR_INVALID_VALUE,
            CuError::CUDA_ERROR_OUT_OF_MEMORY,
            CuError::CUDA_ERROR_NOT_INITIALIZED,
            CuError::CUDA_ERROR_INVALID_CONTEXT,
            CuError::CUDA_ERROR_INVALID_HANDLE,
            CuError::CUDA_ERROR_NOT_READY,
            CuError::CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED,
            CuError::CUDA_ERROR_NOT_SUPPORTED,
        ] {
            assert_eq!(RtError::from(e).code(), e.code(), "{e}");
        }
    }
}
