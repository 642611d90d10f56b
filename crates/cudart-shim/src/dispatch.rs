//! The dispatch table and the generated trampolines.
//!
//! `build.rs` writes `names.rs` (every runtime export of every major, sorted, with an index
//! constant per name) and `trampolines.s` (one exported function per name of this build's
//! major). A trampoline tests [`crate::gate::GATE`] and jumps through [`TABLE`]; the slow
//! path saves the argument registers, calls [`slow_resolve`], restores them and jumps to
//! what it returned, so any signature (varargs and structs by value included) passes
//! through untouched. With tracing on ([`gate::TRACING`]) every call takes the slow path:
//! when the gate word is exactly `TRACING` (metrics), `shim-build`'s assembly
//! `trace_fast_path` times the call itself, and falls back to the Rust slow path, which
//! hands the call's return-address slot to [`crate::tracing::enter`], for anything else
//! (a thread's first call, a full shadow stack, the timeline, a pause).
//! The exports that can enqueue device work have in-flight trampolines instead
//! ([`crate::inflight`]), so that pause waits for them.

use crate::gate;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Once;

include!(concat!(env!("OUT_DIR"), "/names.rs"));

/// Number of names in the dispatch table.
pub const N: usize = ALL_NAMES.len();

/// Where each export goes: a wrapper of cudaw's, the real function, or a stub.
pub static TABLE: [AtomicUsize; N] = [const { AtomicUsize::new(0) }; N];
/// The real runtime's function for each name (0: the real runtime lacks it).
pub static REAL: [AtomicUsize; N] = [const { AtomicUsize::new(0) }; N];

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
    gate = sym gate::GATE,
    table = sym TABLE,
    slow = sym cudaw_rt_trace_enter,
);

// The fast path of tracing (shim-build's `trace_fast_path`, prefix `cudaw_rt`): the
// trampolines' slow path; it goes on to `cudaw_slow_entry` unless the gate word is
// exactly `gate::TRACING`.
generated_asm!(
    include_str!(concat!(env!("OUT_DIR"), "/trace.s")),
    gate = sym gate::GATE,
    table = sym TABLE,
    full = sym cudaw_slow_entry,
    slow_return = sym crate::tracing::cudaw_trace_return,
    direct_full = sym crate::tracing::direct_full,
);

// The slow path (shim-build's `slow_path`): %r11d holds the export's index; every argument
// register is saved around slow_resolve(index, address of the caller's return address),
// then the call jumps to its result.
generated_asm!(
    include_str!(concat!(env!("OUT_DIR"), "/slow.s")),
    entry = sym cudaw_slow_entry,
    resolve = sym slow_resolve,
);

// The in-flight trampolines' support (shim-build's `in_flight_support_traced`, prefix
// `cudaw_rt`): the per-thread block, the return thunk, and their slow path, which calls
// [`crate::inflight`]'s resolver, or with the gate word exactly `gate::TRACING` puts the
// in-flight thunk in place and goes on to the fast path of tracing.
generated_asm!(
    include_str!(concat!(env!("OUT_DIR"), "/inflight.s")),
    gate = sym gate::GATE,
    inflight_resolve = sym crate::inflight::resolve,
);

extern "C" {
    fn cudaw_slow_entry();
    /// The trampolines' slow path: the fast path of tracing (`trace.s`).
    fn cudaw_rt_trace_enter();
}

static INIT: Once = Once::new();

/// The slow path of every export: initialise once, wait while paused, start timing the
/// call when tracing, return the target. `slot` is where the caller's return address is.
extern "C" fn slow_resolve(index: u32, slot: *mut usize) -> usize {
    crate::boundary::guard(
        "the export slow path",
        unsupported as *const () as usize,
        || {
            INIT.call_once(initialise);
            // A thread inside a call in flight is already waited for: never hold it.
            if !crate::inflight::active() {
                gate::wait_while_paused();
            }
            let target = target(index);
            if gate::GATE.load(Ordering::Relaxed) & gate::TRACING != 0 {
                // SAFETY: the assembly passes the address of this export call's return
                // address, and jumps to `target` next.
                unsafe { crate::tracing::enter(index, slot) };
            }
            target
        },
    )
}

/// Whether the shim has initialised (or begun to).
pub(crate) fn initialised() -> bool {
    INIT.is_completed()
}

/// Initialises the shim (once).
pub(crate) fn ensure_initialised() {
    INIT.call_once(initialise);
}

/// Marks the shim initialised without loading a runtime: for tests that fill [`TABLE`]
/// themselves (in a process of their own).
#[cfg(test)]
pub(crate) fn skip_initialise_for_test() {
    INIT.call_once(|| {});
}

/// Where export `index` goes now.
pub(crate) fn target(index: u32) -> usize {
    match TABLE.get(index as usize).map(|t| t.load(Ordering::Acquire)) {
        Some(0) | None => unsupported_address(),
        Some(target) => target,
    }
}

/// The stub returning `cudaErrorNotSupported`.
pub(crate) fn unsupported_address() -> usize {
    unsupported as *const () as usize
}

/// Loads the real runtime and fills the tables.
fn initialise() {
    let cfg = crate::config::get();
    for w in &cfg.warnings {
        crate::log::warn(format_args!("{w}"));
    }
    let mut missing = Vec::new();
    // Before the table is filled: tracing adds the launch wrappers.
    crate::tracing::init();
    match crate::real::load() {
        Ok(real) => {
            for (i, name) in ALL_NAMES.iter().enumerate() {
                match real.symbol(name) {
                    Some(p) => {
                        REAL[i].store(p, Ordering::Release);
                        TABLE[i].store(p, Ordering::Release);
                    }
                    None => {
                        TABLE[i].store(stub_for(name), Ordering::Release);
                        missing.push(*name);
                    }
                }
            }
            // cudaw's own versions of the calls it must see replace the real ones.
            for (i, f) in crate::wrappers::table() {
                TABLE[i].store(f, Ordering::Release);
            }
            crate::log::info(format_args!(
                "forwarding {} exports ({SONAME}) to {}",
                EXPORTED_COUNT,
                real.path().display()
            ));
            if !missing.is_empty() {
                crate::log::debug(format_args!(
                    "{} names absent from the real runtime: {}",
                    missing.len(),
                    missing.join(" ")
                ));
            }
            // The real runtime stays loaded for the life of the process.
            std::mem::forget(real);
        }
        Err(e) => {
            crate::log::error(format_args!("{e}; every CUDA call will fail"));
            for (i, name) in ALL_NAMES.iter().enumerate() {
                TABLE[i].store(stub_for(name), Ordering::Release);
            }
        }
    }
    crate::memory::log_summary_at_exit_once();
    crate::pause::install_once();
    crate::inflight::prepare();
    gate::mark_initialised();
}

/// The real runtime's function `index`, or the stub for a name it lacks: where the export
/// goes when cudaw does not wrap it.
pub(crate) fn real_or_stub(index: usize) -> usize {
    match REAL[index].load(Ordering::Acquire) {
        0 => stub_for(ALL_NAMES[index]),
        p => p,
    }
}

/// The stub for a name the real runtime lacks: a typed one where the return type is not a
/// `cudaError_t`, else [`unsupported`].
fn stub_for(name: &str) -> usize {
    match name {
        "cudaGetErrorString" | "cudaGetErrorName" => error_string_stub as *const () as usize,
        _ => unsupported as *const () as usize,
    }
}

/// `cudaErrorNotSupported`: what a call the real runtime lacks returns.
pub const CUDA_ERROR_NOT_SUPPORTED: u32 = 801;

extern "C" fn unsupported() -> u32 {
    CUDA_ERROR_NOT_SUPPORTED
}

extern "C" fn error_string_stub() -> *const std::ffi::c_char {
    c"cudaw: the real CUDA runtime could not be loaded".as_ptr()
}

/// The index of `name` in [`ALL_NAMES`].
pub fn index_of(name: &str) -> Option<usize> {
    ALL_NAMES.binary_search(&name).ok()
}

/// The real runtime's function for `index`, if it has one (initialising first).
#[inline]
pub fn real(index: usize) -> Option<usize> {
    // Filled before any wrapper is reachable: a wrapper's forward finds it on the first
    // load, without the initialisation's `Once` (as the driver layer's `dispatch::real`).
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_sorted_unique_and_indexed() {
        assert!(ALL_NAMES.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(index_of("cudaMalloc"), Some(idx::cudaMalloc));
        assert_eq!(ALL_NAMES[idx::cudaLaunchKernel], "cudaLaunchKernel");
        assert!(index_of("notACudaFunction").is_none());
        const { assert!(EXPORTED_COUNT <= N) };
    }
}
