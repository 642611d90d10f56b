//! The driver layer's one error type: the driver's code and name, and the call that failed.

/// A failed driver call. `code` is the `CUresult` the driver returned (or, for failures
/// before any call could be made, the closest driver code: `CUDA_ERROR_NOT_FOUND` for a
/// missing library or symbol), `name` its name as `cuGetErrorName` gives it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{call} failed: {name} ({code})")]
pub struct DriverError {
    /// The driver's `CUresult`.
    pub code: u32,
    /// The driver's name for the code (`CUDA_ERROR_OUT_OF_MEMORY`); for a library that
    /// could not be loaded, the loader's message.
    pub name: String,
    /// The driver function (or step) that failed.
    pub call: &'static str,
}

/// The result of a driver call.
pub type Result<T, E = DriverError> = std::result::Result<T, E>;

/// `CUDA_ERROR_INVALID_VALUE`.
pub const CUDA_ERROR_INVALID_VALUE: u32 = 1;
/// `CUDA_ERROR_OUT_OF_MEMORY`.
pub const CUDA_ERROR_OUT_OF_MEMORY: u32 = 2;
/// `CUDA_ERROR_NOT_FOUND`.
pub const CUDA_ERROR_NOT_FOUND: u32 = 500;
/// `CUDA_ERROR_NOT_READY`.
pub const CUDA_ERROR_NOT_READY: u32 = 600;

impl DriverError {
    /// Whether the driver said it is out of memory.
    pub fn is_out_of_memory(&self) -> bool {
        self.code == CUDA_ERROR_OUT_OF_MEMORY
    }
}

/// The names of the codes cudaw meets most, for when the driver cannot name them itself.
pub fn known_name(code: u32) -> Option<&'static str> {
    Some(match code {
        0 => "CUDA_SUCCESS",
        1 => "CUDA_ERROR_INVALID_VALUE",
        2 => "CUDA_ERROR_OUT_OF_MEMORY",
        3 => "CUDA_ERROR_NOT_INITIALIZED",
        4 => "CUDA_ERROR_DEINITIALIZED",
        34 => "CUDA_ERROR_STUB_LIBRARY",
        35 => "CUDA_ERROR_INSUFFICIENT_DRIVER",
        100 => "CUDA_ERROR_NO_DEVICE",
        101 => "CUDA_ERROR_INVALID_DEVICE",
        201 => "CUDA_ERROR_INVALID_CONTEXT",
        208 => "CUDA_ERROR_ALREADY_MAPPED",
        211 => "CUDA_ERROR_NOT_MAPPED",
        400 => "CUDA_ERROR_INVALID_HANDLE",
        500 => "CUDA_ERROR_NOT_FOUND",
        600 => "CUDA_ERROR_NOT_READY",
        700 => "CUDA_ERROR_ILLEGAL_ADDRESS",
        712 => "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED",
        713 => "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED",
        800 => "CUDA_ERROR_NOT_PERMITTED",
        801 => "CUDA_ERROR_NOT_SUPPORTED",
        999 => "CUDA_ERROR_UNKNOWN",
        _ => return None,
    })
}

impl From<DriverError> for vmm::backend::BackendError {
    fn from(e: DriverError) -> Self {
        vmm::backend::BackendError::new(e.code, e.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn displays_call_name_and_code() {
        let e = DriverError {
            code: 2,
            name: "CUDA_ERROR_OUT_OF_MEMORY".into(),
            call: "cuMemCreate",
        };
        assert_eq!(
            e.to_string(),
            "cuMemCreate failed: CUDA_ERROR_OUT_OF_MEMORY (2)"
        );
        assert!(e.is_out_of_memory());
        let b: vmm::backend::BackendError = e.into();
        assert!(b.is_out_of_memory());
        assert_eq!(known_name(600), Some("CUDA_ERROR_NOT_READY"));
    }
}
