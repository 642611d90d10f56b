//! Typed calls to the real runtime's functions, looked up in the dispatch table.

/// The real runtime's `NAME` as a typed function pointer, or `None` if it lacks it:
/// `real_fn!(cudaMemcpy: fn(*mut c_void, *const c_void, usize, i32) -> cudaError_t)`.
#[macro_export]
macro_rules! real_fn {
    ($name:ident : fn($($t:ty),* $(,)?) -> $r:ty) => {
        $crate::dispatch::real($crate::dispatch::idx::$name).map(|p| {
            // SAFETY: `p` is the address of the real runtime's exported `$name`, whose C
            // signature is the one written at this call site (from the CUDA headers).
            unsafe { std::mem::transmute::<usize, unsafe extern "C" fn($($t),*) -> $r>(p) }
        })
    };
}

/// Calls the real runtime's `NAME`, or returns `cudaErrorNotSupported` when it lacks it.
#[macro_export]
macro_rules! call_real {
    ($name:ident : fn($($t:ty),* $(,)?) -> $r:ty, $($arg:expr),* $(,)?) => {
        match $crate::real_fn!($name: fn($($t),*) -> $r) {
            // SAFETY: forwarding the caller's arguments unchanged, or translated into
            // equally valid ones, to the function they were meant for.
            Some(f) => unsafe { f($($arg),*) },
            None => $crate::types::ERROR_NOT_SUPPORTED,
        }
    };
}
