//! Typed calls to the real runtime's functions, looked up in the dispatch table.

/// The real runtime's `NAME` as a typed function pointer, or `None` if it lacks it:
/// `real_fn!(cudaMemcpy: fn(*mut c_void, *const c_void, usize, i32) -> cudaError_t)`.
#[macro_export]
macro_rules! real_fn {
    ($name:ident : fn($($t:ty),* $(,)?) -> $r:ty) => {{
        // The signature written here is the header's (scripts/gen-signatures.py).
        driver::check_signature!(runtime, $name, unsafe extern "C" fn($($t),*) -> $r);
        $crate::dispatch::real($crate::dispatch::idx::$name).map(|p| {
            // SAFETY: `p` is the address of the real runtime's exported `$name`, whose C
            // signature is the one written at this call site (from the CUDA headers).
            unsafe { std::mem::transmute::<usize, unsafe extern "C" fn($($t),*) -> $r>(p) }
        })
    }};
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

/// Defines exported-name wrappers that share one implementation taking the real function's
/// dispatch index: `variants!(impl_fn => cudaX, cudaX_ptds; (a: A, b: B))`. Each body runs
/// inside the panic boundary, counted in flight for pause ([`crate::engine::inflight::enter`]); with
/// `marked` first (`variants!(marked impl_fn => ...)`), for calls that can enqueue device
/// work and whose trampolines leave the marking to their wrappers (the launches:
/// `build.rs`), marked in flight on the calling thread instead
/// (`crate::inflight::marked`: a word of the thread's own, no shared counter), as the
/// untraced launches' thin wrappers are.
#[macro_export]
macro_rules! variants {
    (marked $imp:ident => $($name:ident),+ ; $params:tt) => {
        $( $crate::variant!(marked, $imp, $name, $params); )+
    };
    ($imp:ident => $($name:ident),+ ; $params:tt) => {
        $( $crate::variant!(counted, $imp, $name, $params); )+
    };
}

/// One wrapper of [`variants!`].
#[macro_export]
macro_rules! variant {
    (counted, $imp:ident, $name:ident, ($($a:ident : $t:ty),*)) => {
        $crate::variant!(@wrap $name, ($($a: $t),*), {
            let _in_flight = $crate::engine::inflight::enter();
            $imp($crate::dispatch::idx::$name, $($a),*)
        });
    };
    (marked, $imp:ident, $name:ident, ($($a:ident : $t:ty),*)) => {
        $crate::variant!(@wrap $name, ($($a: $t),*), {
            $crate::inflight::marked(|| $imp($crate::dispatch::idx::$name, $($a),*))
        });
    };
    (@wrap $name:ident, ($($a:ident : $t:ty),*), $body:block) => {
        // The wrapper takes what the real function takes (scripts/gen-signatures.py).
        driver::check_signature!(runtime, $name, extern "C" fn($($t),*) -> $crate::types::cudaError_t);
        pub(crate) extern "C" fn $name($($a: $t),*) -> $crate::types::cudaError_t {
            $crate::boundary::guard(stringify!($name), $crate::types::ERROR_UNKNOWN, || $body)
        }
    };
}
