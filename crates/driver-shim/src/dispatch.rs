//! The dispatch table, the generated trampolines and their slow path.
//!
//! `build.rs` writes `names.rs` (every driver function, sorted, with an index constant per
//! name), `trampolines.s` (one exported function per name, and the hidden array
//! `cudaw_driver_trampolines` of their addresses) and `slow.s`. A trampoline loads
//! [`GATE_PTR`], tests the "paused" bit of the word it points to, and jumps through
//! [`TABLE`]. Until this library is initialised `GATE_PTR` points to a local word with
//! that bit set, so the first call of any function takes the slow path, which loads the
//! real driver, fills the tables and points `GATE_PTR` at the runtime shim's gate (or
//! clears the local word when there is no runtime shim).

use cudaw_shim_core::{Dispatch, Library};
use driver::hooks::GATE_PAUSED;
use std::sync::atomic::{AtomicPtr, AtomicU32, Ordering};

pub use cudaw_shim_core::dispatch::CUDA_ERROR_NOT_SUPPORTED;

include!(concat!(env!("OUT_DIR"), "/names.rs"));

/// Number of names in the dispatch table.
pub const N: usize = ALL_NAMES.len();

// build.rs's trampolines test bit 2: the runtime shim's "paused" bit.
const _: () = assert!(GATE_PAUSED == 2);

/// Where each function goes (a wrapper of cudaw's, the real function, or a stub), and the
/// real driver's function for each name.
pub static DISPATCH: Dispatch<N> = Dispatch::new(&ALL_NAMES, initialise);

/// This library's own gate word: "paused" until initialised (which sends every first call
/// to the slow path), cleared then when no runtime shim shares its gate.
static LOCAL_GATE: AtomicU32 = AtomicU32::new(GATE_PAUSED);

/// The gate word the trampolines test (read by assembly: a plain pointer-sized atomic).
pub static GATE_PTR: AtomicPtr<AtomicU32> =
    AtomicPtr::new(&LOCAL_GATE as *const AtomicU32 as *mut AtomicU32);

/// The driver shim, as the shared plumbing sees it.
pub struct Driver;

impl Library for Driver {
    const SLOW_PATH: &'static str = "the driver slow path";
    const IN_FLIGHT_SLOW_PATH: &'static str = "the driver's in-flight slow path";
    const IN_FLIGHT_ADMISSION: &'static str = "the driver's in-flight admission";

    fn ensure_initialised() {
        ensure_initialised();
    }
    fn target(index: u32) -> usize {
        DISPATCH.target(index)
    }
    fn wait_while_paused() {
        crate::runtime::wait_if_paused();
    }
    #[inline(always)]
    fn block() -> &'static driver::inflight::Block {
        crate::inflight::block()
    }
    fn return_thunk() -> usize {
        crate::inflight::return_thunk()
    }
    fn with_gate<R>(f: impl FnOnce(&driver::inflight::Gate<'_>) -> R) -> R {
        crate::inflight::with_gate(f)
    }
}

// `{table}` is the dispatch table: the first field of `DISPATCH` (`repr(C)`).
cudaw_shim_core::generated_asm!(
    include_str!(concat!(env!("OUT_DIR"), "/trampolines.s")),
    gate = sym GATE_PTR,
    table = sym DISPATCH,
    slow = sym cudaw_driver_slow_entry,
);

cudaw_shim_core::generated_asm!(
    include_str!(concat!(env!("OUT_DIR"), "/slow.s")),
    entry = sym cudaw_driver_slow_entry,
    resolve = sym slow_resolve,
);

// The in-flight trampolines' support (prefix `cudaw_drv`): the per-thread block, the
// return thunk and their slow path ([`crate::inflight`]).
cudaw_shim_core::generated_asm!(
    include_str!(concat!(env!("OUT_DIR"), "/inflight.s")),
    inflight_resolve = sym crate::inflight::resolve,
);

extern "C" {
    fn cudaw_driver_slow_entry();
    /// Every trampoline's address, in [`ALL_NAMES`] order (defined in `trampolines.s`).
    static cudaw_driver_trampolines: [usize; N];
}

/// The address of this library's exported function `index` (its trampoline).
pub fn trampoline(index: usize) -> usize {
    // SAFETY: a read-only array of N addresses, written by the linker, never mutated.
    unsafe { cudaw_driver_trampolines[index] }
}

/// The slow path of every export ([`cudaw_shim_core::dispatch::slow_resolve`]).
extern "C" fn slow_resolve(index: u32, slot: *mut usize) -> usize {
    // SAFETY: the assembly passes the address of this export call's return address, and
    // jumps to the result next.
    unsafe { cudaw_shim_core::dispatch::slow_resolve::<Driver>(index, slot) }
}

/// Initialises this library (once), then the runtime shim's pause machinery.
pub fn ensure_initialised() {
    DISPATCH.ensure_initialised();
    crate::runtime::install_pause_once();
}

/// Loads the real driver and fills the tables.
fn initialise() {
    let stub = |_: &str| cudaw_shim_core::dispatch::unsupported_address();
    match crate::real::get() {
        Ok(real) => {
            let missing = DISPATCH.fill(|name| real.symbol(name), stub);
            crate::proc_address::index_real_exports();
            crate::trace::init();
            DISPATCH.install(wrappers());
            crate::log::info(format_args!(
                "forwarding {N} driver functions to {} ({} absent there)",
                real.path().display(),
                missing.len()
            ));
        }
        Err(e) => {
            crate::log::error(format_args!("{e}; every driver call will fail"));
            DISPATCH.fill_stubs(stub);
        }
    }
    crate::launch::report_at_exit();
    match crate::runtime::hooks() {
        Some(h) => {
            GATE_PTR.store(h.gate as *mut AtomicU32, Ordering::Release);
            crate::log::debug(format_args!("sharing the runtime shim's pause gate"));
        }
        None => {
            LOCAL_GATE.store(0, Ordering::Release);
            crate::log::info(format_args!(
                "no cudaw runtime in this process: driver calls are forwarded and counted, \
                 but cannot be paused"
            ));
        }
    }
}

/// The one list of wrapped functions, `data/wrapped.txt`, as `build.rs` writes it: per
/// group (`always`, `launch`, `traced`) the indices and `(index, wrapper)` pairs.
pub mod list {
    use super::idx;
    include!(concat!(env!("OUT_DIR"), "/wrapped.rs"));
}

/// cudaw's wrappers: (index, function); the copies only while tracing is on, so that with
/// tracing off a copy goes straight to the real driver.
fn wrappers() -> Vec<(usize, usize)> {
    let mut w = list::always_wrappers().to_vec();
    if crate::trace::on() {
        w.extend(list::traced_wrappers());
    }
    w
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

    #[test]
    fn every_name_has_a_trampoline() {
        for (i, name) in ALL_NAMES.iter().enumerate() {
            assert_ne!(trampoline(i), 0, "{name}");
        }
        let distinct: std::collections::BTreeSet<usize> = (0..N).map(trampoline).collect();
        assert_eq!(distinct.len(), N);
    }
}
