//! The dispatch table and the generated trampolines.
//!
//! `build.rs` writes `names.rs` (every runtime export of every major, sorted, with an index
//! constant per name) and `trampolines.s` (one exported function per name of this build's
//! major). A trampoline tests [`crate::gate::GATE`] and jumps through [`TABLE`]; the slow
//! path saves the argument registers, calls `slow_resolve`, restores them and jumps to
//! what it returned, so any signature (varargs and structs by value included) passes
//! through untouched. With tracing on ([`gate::TRACING`]) every call takes the slow path:
//! when the gate word is exactly `TRACING` (metrics), `shim-build`'s assembly
//! `trace_fast_path` times the call itself, and falls back to the Rust slow path, which
//! hands the call's return-address slot to [`crate::tracing::enter`], for anything else
//! (a thread's first call, a full shadow stack, the timeline, a pause).
//! The exports that can enqueue device work have in-flight trampolines instead
//! ([`crate::inflight`]), so that pause waits for them.

use crate::gate;
use cudaw_shim_core::{Dispatch, Library};
use std::sync::atomic::Ordering;

include!(concat!(env!("OUT_DIR"), "/names.rs"));

/// Number of names in the dispatch table.
pub const N: usize = ALL_NAMES.len();

/// Where each export goes (a wrapper of cudaw's, the real function, or a stub), and the
/// real runtime's function for each name.
pub static DISPATCH: Dispatch<N> = Dispatch::new(&ALL_NAMES, initialise);

/// The runtime shim, as the shared plumbing sees it.
pub struct Runtime;

impl Library for Runtime {
    const SLOW_PATH: &'static str = "the export slow path";
    const IN_FLIGHT_SLOW_PATH: &'static str = "the in-flight slow path";
    const IN_FLIGHT_ADMISSION: &'static str = "the in-flight admission";

    fn ensure_initialised() {
        DISPATCH.ensure_initialised();
    }
    fn target(index: u32) -> usize {
        DISPATCH.target(index)
    }
    fn wait_while_paused() {
        gate::wait_while_paused();
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
    unsafe fn entered(index: u32, slot: *mut usize) {
        if gate::GATE.load(Ordering::Relaxed) & gate::TRACING != 0 {
            // SAFETY: the caller's contract: `slot` is this export call's return-address
            // slot, and the call jumps to its target next.
            unsafe { crate::tracing::enter(index, slot) };
        }
    }
}

// `{table}` is the dispatch table: the first field of `DISPATCH` (`repr(C)`).
cudaw_shim_core::generated_asm!(
    include_str!(concat!(env!("OUT_DIR"), "/trampolines.s")),
    gate = sym gate::GATE,
    table = sym DISPATCH,
    slow = sym cudaw_rt_trace_enter,
);

// The fast path of tracing (shim-build's `trace_fast_path`, prefix `cudaw_rt`): the
// trampolines' slow path; it goes on to `cudaw_slow_entry` unless the gate word is
// exactly `gate::TRACING`.
cudaw_shim_core::generated_asm!(
    include_str!(concat!(env!("OUT_DIR"), "/trace.s")),
    gate = sym gate::GATE,
    table = sym DISPATCH,
    full = sym cudaw_slow_entry,
    slow_return = sym crate::tracing::cudaw_trace_return,
    direct_full = sym crate::tracing::direct_full,
);

// The slow path (shim-build's `slow_path`): %r11d holds the export's index; every argument
// register is saved around slow_resolve(index, address of the caller's return address),
// then the call jumps to its result.
cudaw_shim_core::generated_asm!(
    include_str!(concat!(env!("OUT_DIR"), "/slow.s")),
    entry = sym cudaw_slow_entry,
    resolve = sym slow_resolve,
);

// The in-flight trampolines' support (shim-build's `in_flight_support_traced`, prefix
// `cudaw_rt`): the per-thread block, the return thunk, and their slow path, which calls
// [`crate::inflight`]'s resolver, or with the gate word exactly `gate::TRACING` puts the
// in-flight thunk in place and goes on to the fast path of tracing.
cudaw_shim_core::generated_asm!(
    include_str!(concat!(env!("OUT_DIR"), "/inflight.s")),
    gate = sym gate::GATE,
    inflight_resolve = sym crate::inflight::resolve,
);

extern "C" {
    fn cudaw_slow_entry();
    /// The trampolines' slow path: the fast path of tracing (`trace.s`).
    fn cudaw_rt_trace_enter();
}

/// The slow path of every export ([`cudaw_shim_core::dispatch::slow_resolve`]).
extern "C" fn slow_resolve(index: u32, slot: *mut usize) -> usize {
    // SAFETY: the assembly passes the address of this export call's return address, and
    // jumps to the result next.
    unsafe { cudaw_shim_core::dispatch::slow_resolve::<Runtime>(index, slot) }
}

/// Whether the shim has initialised (or begun to).
pub(crate) fn initialised() -> bool {
    DISPATCH.initialised()
}

/// Initialises the shim (once).
pub(crate) fn ensure_initialised() {
    DISPATCH.ensure_initialised();
}

/// Marks the shim initialised without loading a runtime: for tests that fill the table
/// themselves (in a process of their own).
#[cfg(test)]
pub(crate) fn skip_initialise_for_test() {
    DISPATCH.skip_initialise_for_test();
}

/// Loads the real runtime and fills the tables.
fn initialise() {
    let cfg = crate::config::get();
    for w in &cfg.warnings {
        crate::log::warn(format_args!("{w}"));
    }
    // Before the table is filled: tracing adds the launch wrappers.
    crate::tracing::init();
    match crate::real::load() {
        Ok(real) => {
            let missing = DISPATCH.fill(|name| real.symbol(name), stub_for);
            // cudaw's own versions of the calls it must see replace the real ones.
            DISPATCH.install(crate::wrappers::table());
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
        }
        Err(e) => {
            crate::log::error(format_args!("{e}; every CUDA call will fail"));
            DISPATCH.fill_stubs(stub_for);
        }
    }
    cudaw_engine::summary::log_at_exit_once();
    cudaw_engine::control::install_once();
    crate::inflight::prepare();
    gate::mark_initialised();
}

/// The real runtime's function `index`, or the stub for a name it lacks: where the export
/// goes when cudaw does not wrap it.
pub(crate) fn real_or_stub(index: usize) -> usize {
    match DISPATCH.real_now(index) {
        0 => stub_for(ALL_NAMES[index]),
        p => p,
    }
}

/// The stub for a name the real runtime lacks: a typed one where the return type is not a
/// `cudaError_t`, else the one returning `cudaErrorNotSupported`.
fn stub_for(name: &str) -> usize {
    match name {
        "cudaGetErrorString" | "cudaGetErrorName" => error_string_stub as *const () as usize,
        _ => cudaw_shim_core::dispatch::unsupported_address(),
    }
}

extern "C" fn error_string_stub() -> *const std::ffi::c_char {
    c"cudaw: the real CUDA runtime could not be loaded".as_ptr()
}

/// The index of `name` in [`ALL_NAMES`].
pub fn index_of(name: &str) -> Option<usize> {
    DISPATCH.index_of(name)
}

/// The real runtime's function for `index`, if it has one (initialising first).
#[inline]
pub fn real(index: usize) -> Option<usize> {
    DISPATCH.real(index)
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
