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

use crate::boundary::guard;
use driver::hooks::GATE_PAUSED;
use std::sync::atomic::{AtomicPtr, AtomicU32, AtomicUsize, Ordering};
use std::sync::Once;

include!(concat!(env!("OUT_DIR"), "/names.rs"));

/// Number of names in the dispatch table.
pub const N: usize = ALL_NAMES.len();

// build.rs's trampolines test bit 2: the runtime shim's "paused" bit.
const _: () = assert!(GATE_PAUSED == 2);

/// Where each function goes: a wrapper of cudaw's, the real function, or a stub.
pub static TABLE: [AtomicUsize; N] = [const { AtomicUsize::new(0) }; N];
/// The real driver's function for each name (0: the real driver lacks it).
pub static REAL: [AtomicUsize; N] = [const { AtomicUsize::new(0) }; N];

/// This library's own gate word: "paused" until initialised (which sends every first call
/// to the slow path), cleared then when no runtime shim shares its gate.
static LOCAL_GATE: AtomicU32 = AtomicU32::new(GATE_PAUSED);

/// The gate word the trampolines test (read by assembly: a plain pointer-sized atomic).
pub static GATE_PTR: AtomicPtr<AtomicU32> =
    AtomicPtr::new(&LOCAL_GATE as *const AtomicU32 as *mut AtomicU32);

/// `global_asm!` of a file `shim-build` wrote for the target: AT&T syntax on x86-64, the
/// assembler's own elsewhere (AArch64). Operands end with a comma.
macro_rules! generated_asm {
    ($($operands:tt)*) => {
        #[cfg(target_arch = "x86_64")]
        std::arch::global_asm!($($operands)* options(att_syntax));
        #[cfg(not(target_arch = "x86_64"))]
        std::arch::global_asm!($($operands)*);
    };
}

generated_asm!(
    include_str!(concat!(env!("OUT_DIR"), "/trampolines.s")),
    gate = sym GATE_PTR,
    table = sym TABLE,
    slow = sym cudaw_driver_slow_entry,
);

generated_asm!(
    include_str!(concat!(env!("OUT_DIR"), "/slow.s")),
    entry = sym cudaw_driver_slow_entry,
    resolve = sym slow_resolve,
);

// The in-flight trampolines' support (prefix `cudaw_drv`): the per-thread block, the
// return thunk and their slow path ([`crate::inflight`]).
generated_asm!(
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

static INIT: Once = Once::new();

/// The slow path of every export: initialise once, wait while paused, return the target.
extern "C" fn slow_resolve(index: u32) -> usize {
    guard(
        "the driver slow path",
        unsupported as *const () as usize,
        || {
            ensure_initialised();
            // A thread inside a call in flight is already waited for: never hold it.
            if !crate::inflight::active() {
                crate::runtime::wait_if_paused();
            }
            target(index)
        },
    )
}

/// Where function `index` goes now.
pub(crate) fn target(index: u32) -> usize {
    match TABLE.get(index as usize).map(|t| t.load(Ordering::Acquire)) {
        Some(0) | None => unsupported_address(),
        Some(target) => target,
    }
}

/// The stub returning `CUDA_ERROR_NOT_SUPPORTED`.
pub(crate) fn unsupported_address() -> usize {
    unsupported as *const () as usize
}

/// Initialises this library (once), then the runtime shim's pause machinery.
pub fn ensure_initialised() {
    INIT.call_once(initialise);
    crate::runtime::install_pause_once();
}

/// Loads the real driver and fills the tables.
fn initialise() {
    match crate::real::get() {
        Some(real) => {
            let mut missing = 0usize;
            for (i, name) in ALL_NAMES.iter().enumerate() {
                match real.symbol(name) {
                    Some(p) => {
                        REAL[i].store(p, Ordering::Release);
                        TABLE[i].store(p, Ordering::Release);
                    }
                    None => {
                        TABLE[i].store(unsupported as *const () as usize, Ordering::Release);
                        missing += 1;
                    }
                }
            }
            crate::proc_address::index_real_exports();
            crate::trace::init();
            for (i, f) in wrappers() {
                TABLE[i].store(f, Ordering::Release);
            }
            crate::log::info(format_args!(
                "forwarding {N} driver functions to {} ({missing} absent there)",
                real.path()
            ));
        }
        None => {
            crate::log::error(format_args!(
                "cannot find the real libcuda.so.1 to forward to (set CUDAW_REAL_LIBCUDA); \
                 tried: {}; every driver call will fail",
                crate::real::tried()
            ));
            for t in &TABLE {
                t.store(unsupported as *const () as usize, Ordering::Release);
            }
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

/// cudaw's wrappers: (index, function).
fn wrappers() -> Vec<(usize, usize)> {
    let mut w = crate::proc_address::table();
    w.extend(crate::launch::table());
    w.extend(crate::memory::table());
    w.extend(crate::trace::table());
    w
}

/// `CUDA_ERROR_NOT_SUPPORTED`: what a function the real driver lacks returns.
pub const CUDA_ERROR_NOT_SUPPORTED: u32 = 801;

extern "C" fn unsupported() -> u32 {
    CUDA_ERROR_NOT_SUPPORTED
}

/// The index of `name` in [`ALL_NAMES`].
pub fn index_of(name: &str) -> Option<usize> {
    ALL_NAMES.binary_search(&name).ok()
}

/// The real driver's function `index`, if it has one (initialising first).
#[inline]
pub fn real(index: usize) -> Option<usize> {
    // Filled before any wrapper is reachable: a wrapper's forward finds it on the first
    // load, without the initialisation's `Once` (one cache line fewer on a launch).
    match REAL.get(index)?.load(Ordering::Acquire) {
        0 => real_initialised(index),
        p => Some(p),
    }
}

#[cold]
fn real_initialised(index: usize) -> Option<usize> {
    INIT.call_once(initialise);
    match REAL.get(index)?.load(Ordering::Acquire) {
        0 => None,
        p => Some(p),
    }
}

/// Calls the real driver's `NAME` with a signature from `cuda.h`, or returns
/// `CUDA_ERROR_NOT_SUPPORTED` when the real driver lacks it:
/// `forward!(cuMemFree_v2: fn(u64), ptr)`.
#[macro_export]
macro_rules! forward {
    ($name:ident : fn($($t:ty),* $(,)?) $(, $arg:expr)* $(,)?) => {
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
    };
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
