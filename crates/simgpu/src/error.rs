//! CUDA driver result codes, with the real driver's numbers and names.

use std::fmt;
use std::num::NonZeroU32;

/// A failing `CUresult`: never zero, so `Result<(), CuError>` maps to 0 on success.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct CuError(NonZeroU32);

/// The result of a simulated driver operation.
pub type CuResult<T> = Result<T, CuError>;

macro_rules! codes {
    ($($name:ident = $value:literal,)*) => {
        impl CuError {
            $(
                #[doc = concat!("`", stringify!($name), "` (", stringify!($value), ").")]
                pub const $name: CuError = match NonZeroU32::new($value) {
                    Some(v) => CuError(v),
                    None => panic!("zero is success"),
                };
            )*

            /// The driver's name for a code (`cuGetErrorName`), if it is one simgpu knows.
            pub fn name_of(code: u32) -> Option<&'static str> {
                match code {
                    0 => Some("CUDA_SUCCESS"),
                    $($value => Some(stringify!($name)),)*
                    _ => None,
                }
            }
        }
    };
}

codes! {
    CUDA_ERROR_INVALID_VALUE = 1,
    CUDA_ERROR_OUT_OF_MEMORY = 2,
    CUDA_ERROR_NOT_INITIALIZED = 3,
    CUDA_ERROR_DEINITIALIZED = 4,
    CUDA_ERROR_NO_DEVICE = 100,
    CUDA_ERROR_INVALID_DEVICE = 101,
    CUDA_ERROR_INVALID_IMAGE = 200,
    CUDA_ERROR_INVALID_CONTEXT = 201,
    CUDA_ERROR_ALREADY_MAPPED = 208,
    CUDA_ERROR_NOT_MAPPED = 211,
    CUDA_ERROR_PEER_ACCESS_UNSUPPORTED = 217,
    CUDA_ERROR_INVALID_HANDLE = 400,
    CUDA_ERROR_ILLEGAL_STATE = 401,
    CUDA_ERROR_NOT_FOUND = 500,
    CUDA_ERROR_NOT_READY = 600,
    CUDA_ERROR_ILLEGAL_ADDRESS = 700,
    CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED = 704,
    CUDA_ERROR_PEER_ACCESS_NOT_ENABLED = 705,
    CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED = 712,
    CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED = 713,
    CUDA_ERROR_NOT_PERMITTED = 800,
    CUDA_ERROR_NOT_SUPPORTED = 801,
    CUDA_ERROR_UNKNOWN = 999,
}

impl CuError {
    /// The numeric `CUresult`.
    pub fn code(self) -> u32 {
        self.0.get()
    }

    /// The error a non-zero `CUresult` is (`None` for 0).
    pub fn from_code(code: u32) -> Option<CuError> {
        NonZeroU32::new(code).map(CuError)
    }

    /// The driver's name for this code.
    pub fn name(self) -> &'static str {
        Self::name_of(self.code()).unwrap_or("CUDA_ERROR_UNKNOWN")
    }

    /// The `CUresult` of a result: 0 on success.
    pub fn to_code(result: CuResult<()>) -> u32 {
        match result {
            Ok(()) => 0,
            Err(e) => e.code(),
        }
    }
}

impl fmt::Debug for CuError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.name(), self.code())
    }
}

impl fmt::Display for CuError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

impl std::error::Error for CuError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_codes_are_the_drivers() {
        assert_eq!(CuError::CUDA_ERROR_OUT_OF_MEMORY.code(), 2);
        assert_eq!(
            CuError::CUDA_ERROR_INVALID_HANDLE.name(),
            "CUDA_ERROR_INVALID_HANDLE"
        );
        assert_eq!(CuError::name_of(600), Some("CUDA_ERROR_NOT_READY"));
        assert_eq!(CuError::name_of(0), Some("CUDA_SUCCESS"));
        assert_eq!(CuError::name_of(12345), None);
        assert_eq!(std::mem::size_of::<CuResult<()>>(), 4);
    }
}
