//! The generated trampolines and their slow path: the glue on top of the dispatch table.
//!
//! `build.rs` writes `trampolines.s` (one exported function per name of this build's
//! major). A trampoline tests [`crate::gate::GATE`] and jumps through
//! [`crate::dispatch::DISPATCH`]'s table; the slow path saves the argument registers, calls
//! `slow_resolve`, restores them and jumps to what it returned, so any signature (varargs
//! and structs by value included) passes through untouched. With tracing on
//! ([`gate::TRACING`]) every call takes the slow path: when the gate word is exactly
//! `TRACING` (metrics), `shim-build`'s assembly `trace_fast_path` times the call itself,
//! and falls back to the Rust slow path, which hands the call's return-address slot to
//! [`crate::tracing::enter`], for anything else (a thread's first call, a full shadow
//! stack, the timeline, a pause). The exports that can enqueue device work have in-flight
//! trampolines instead ([`crate::inflight`]), so that pause waits for them.

use crate::dispatch::DISPATCH;
use crate::gate;
use crate::inflight::Runtime;

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
