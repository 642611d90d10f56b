//! The dispatch table and the real driver's functions: the bottom layer, which names no
//! other module of this library but [`crate::real`].
//!
//! `build.rs` writes `names.rs` (every driver function, sorted, with an index constant per
//! name), `trampolines.s` (one exported function per name, and the hidden array
//! `cudaw_driver_trampolines` of their addresses) and `slow.s`, assembled by `crate::init`.
//! A trampoline loads
//! [`GATE_PTR`], tests the "paused" bit of the word it points to, and jumps through
//! [`DISPATCH`]. Until this library is initialised `GATE_PTR` points to a local word with
//! that bit set, so the first call of any function takes the slow path (`crate::init`),
//! which loads the real driver and fills the tables ([`DISPATCH`]'s first stage, also run
//! by the first [`real`] lookup), installs cudaw's wrappers and points `GATE_PTR` at the
//! runtime shim's gate (or clears the local word when there is no runtime shim).

use cudaw_shim_core::Dispatch;
use driver::hooks::GATE_PAUSED;
use std::sync::atomic::{AtomicPtr, AtomicU32, AtomicUsize, Ordering};

pub use cudaw_shim_core::dispatch::CUDA_ERROR_NOT_SUPPORTED;

include!(concat!(env!("OUT_DIR"), "/names.rs"));

/// Number of names in the dispatch table.
pub const N: usize = ALL_NAMES.len();

// build.rs's trampolines test bit 2: the runtime shim's "paused" bit.
const _: () = assert!(GATE_PAUSED == 2);

/// Where each function goes (a wrapper of cudaw's, the real function, or a stub), and the
/// real driver's function for each name.
pub static DISPATCH: Dispatch<N> = Dispatch::new(&ALL_NAMES, load_real);

/// This library's own gate word: "paused" until initialised (which sends every first call
/// to the slow path), cleared then when no runtime shim shares its gate.
pub(crate) static LOCAL_GATE: AtomicU32 = AtomicU32::new(GATE_PAUSED);

/// The gate word the trampolines test (read by assembly: a plain pointer-sized atomic).
pub static GATE_PTR: AtomicPtr<AtomicU32> =
    AtomicPtr::new(&LOCAL_GATE as *const AtomicU32 as *mut AtomicU32);

extern "C" {
    /// Every trampoline's address, in [`ALL_NAMES`] order (defined in `trampolines.s`,
    /// which `crate::init` assembles).
    static cudaw_driver_trampolines: [usize; N];
}

/// The address of this library's exported function `index` (its trampoline).
pub fn trampoline(index: usize) -> usize {
    // SAFETY: a read-only array of N addresses, written by the linker, never mutated.
    unsafe { cudaw_driver_trampolines[index] }
}

/// The real driver's functions missing from it, once [`load_real`] has run.
static ABSENT: AtomicUsize = AtomicUsize::new(0);

/// How many of the driver's functions the real driver lacks (0 before it is loaded).
pub fn absent() -> usize {
    ABSENT.load(Ordering::Relaxed)
}

/// The first stage of this library's initialisation, and all that [`real`] needs: loads
/// the real driver and fills the tables with its functions (stubs where it lacks one, or
/// everywhere without it). The rest (cudaw's wrappers, the gate) is `crate::init`'s,
/// which runs this first.
fn load_real() {
    // Also set by the load-time constructor; a first call made before it (from another
    // library's constructor) must log with the library's name too.
    cudaw_shim_core::log::set_origin("driver");
    let stub = |_: &str| cudaw_shim_core::dispatch::unsupported_address();
    match crate::real::get() {
        Ok(real) => {
            let missing = DISPATCH.fill(|name| real.symbol(name), stub);
            ABSENT.store(missing.len(), Ordering::Relaxed);
        }
        Err(e) => {
            crate::log::error(format_args!("{e}; every driver call will fail"));
            DISPATCH.fill_stubs(stub);
        }
    }
}

/// The index of `name` in [`ALL_NAMES`].
pub fn index_of(name: &str) -> Option<usize> {
    DISPATCH.index_of(name)
}

/// The real driver's function `index`, if it has one (initialising first).
#[inline]
pub fn real(index: usize) -> Option<usize> {
    DISPATCH.real(index)
}

/// Calls the real driver's `NAME` with a signature from `cuda.h` (checked against the
/// header's at compile time: `driver::check_signature!`), or returns
/// `CUDA_ERROR_NOT_SUPPORTED` when the real driver lacks it:
/// `forward!(cuMemFree_v2: fn(u64), ptr)`.
#[macro_export]
macro_rules! forward {
    ($name:ident : fn($($t:ty),* $(,)?) $(, $arg:expr)* $(,)?) => {{
        // The signature written here is cuda.h's (scripts/gen-signatures.py).
        driver::check_signature!(driver, $name, unsafe extern "C" fn($($t),*) -> u32);
        match $crate::dispatch::real($crate::dispatch::idx::$name) {
            Some(p) => {
                // SAFETY: `p` is the real driver's exported `$name`, whose C signature
                // (cuda.h) is the one written at this call site.
                let f = unsafe {
                    std::mem::transmute::<usize, unsafe extern "C" fn($($t),*) -> u32>(p)
                };
                // SAFETY: the caller's arguments, unchanged: the driver's contract is the
                // caller's, passed on.
                unsafe { f($($arg),*) }
            }
            None => $crate::dispatch::CUDA_ERROR_NOT_SUPPORTED,
        }
    }};
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_sorted_unique_and_indexed() {
        assert!(ALL_NAMES.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(ALL_NAMES[idx::cuLaunchKernel], "cuLaunchKernel");
        assert_eq!(index_of("cuMemAlloc_v2"), Some(idx::cuMemAlloc_v2));
        assert!(index_of("notADriverFunction").is_none());
        const { assert!(EXPORTED_COUNT == N) };
    }
}
