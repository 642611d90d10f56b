//! The panic boundary: no panic crosses `extern "C"`. A panic inside a wrapper becomes
//! `CUDA_ERROR_UNKNOWN` and one log line.

use std::panic::{catch_unwind, AssertUnwindSafe};

/// `CUDA_ERROR_UNKNOWN`.
pub const CUDA_ERROR_UNKNOWN: u32 = 999;

/// Runs `f`; a panic becomes `on_panic`, logged with `what`.
pub fn guard<T>(what: &str, on_panic: T, f: impl FnOnce() -> T) -> T {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|payload| {
        let msg = payload
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_default();
        crate::log::error(format_args!("internal error in {what}: {msg}"));
        on_panic
    })
}
