//! The panic boundary: no panic crosses `extern "C"`. A panic inside a wrapper becomes
//! `cudaErrorUnknown` (999) and one log line; a user's job never dies for cudaw's bug.

use std::panic::{catch_unwind, AssertUnwindSafe};

/// `cudaErrorUnknown`.
pub const CUDA_ERROR_UNKNOWN: u32 = 999;

/// Runs `f`, turning a panic into `on_panic` after logging `what` once.
pub fn guard<T>(what: &str, on_panic: T, f: impl FnOnce() -> T) -> T {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(v) => v,
        Err(payload) => {
            let msg = payload
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".to_owned());
            crate::log::error(format_args!("internal error in {what}: {msg}"));
            on_panic
        }
    }
}
