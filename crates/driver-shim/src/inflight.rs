//! Calls in flight (`driver::inflight`): the driver functions that can enqueue device work
//! (launches, copies, sets, graph launches, stream memory operations, prefetches:
//! `shim-build`'s `enqueues_device_work`) have in-flight trampolines, and this module is
//! their slow path. Each thread's block is registered with the runtime shim (through its
//! hooks), whose pause waits until no registered thread has such a call in flight; with
//! no runtime shim in the process there is no pause, and nothing is registered.

use crate::{dispatch, runtime};
use driver::inflight::{self, Block, Gate};
use std::sync::atomic::Ordering;

extern "C" {
    /// The return thunk of the in-flight trampolines (never called directly).
    fn cudaw_drv_inflight_return();
}

/// The calling thread's block ([`driver::inflight_block`]).
#[inline(always)]
pub(crate) fn block() -> &'static Block {
    driver::inflight_block!("cudaw_drv_inflight_tls")
}

/// Whether the calling thread is inside one of this library's calls in flight.
pub fn active() -> bool {
    block().in_flight()
}

fn unregister(b: *const Block) {
    if let Some(h) = runtime::hooks() {
        (h.inflight_unregister)(b);
    }
}

/// Runs `f` with this library's gate, as the runtime shim's hooks (or their absence) make
/// it.
fn with_gate<R>(f: impl FnOnce(&Gate<'_>) -> R) -> R {
    let hooks = runtime::hooks();
    let paused = runtime::is_paused;
    let may_pass = || hooks.is_none_or(|h| (h.may_pass)());
    let wait = || {
        if let Some(h) = hooks {
            (h.wait_while_paused)();
        }
    };
    let register = |b: &Block| match hooks {
        Some(h) => {
            inflight::register_until_thread_exit(b, &|p| (h.inflight_register)(p), unregister)
        }
        None => true,
    };
    f(&Gate {
        paused: &paused,
        may_pass: &may_pass,
        wait: &wait,
        register: &register,
    })
}

/// Whether the gate the trampolines test is closed for pause.
#[inline(always)]
fn gate_closed() -> bool {
    let g = dispatch::GATE_PTR.load(Ordering::Relaxed);
    // SAFETY: the gate pointer always points to a live static word (this library's own,
    // or the runtime shim's, which is never unloaded).
    unsafe { &*g }.load(Ordering::Relaxed) & driver::hooks::GATE_PAUSED != 0
}

/// Runs `f`, a driver call that can enqueue device work, marked in flight by its wrapper
/// (cudaw's launch wrappers, whose trampolines are the plain kind: `build.rs`), so that the
/// return goes straight back to the caller: [`inflight::marked`] with this library's gate.
#[inline(always)]
pub(crate) fn marked<R>(f: impl FnOnce() -> R) -> R {
    inflight::marked(block(), || !gate_closed(), admit, f)
}

/// [`marked`]'s slow path: the gate is closed, or the thread's block is unregistered.
fn admit(b: &Block) -> bool {
    crate::boundary::guard("the driver's in-flight admission", false, || {
        dispatch::ensure_initialised();
        with_gate(|g| inflight::admit(b, g))
    })
}

/// The slow path of the in-flight trampolines: `index` is the function's, `slot` the
/// address of the caller's return address.
pub(crate) extern "C" fn resolve(index: u32, slot: *mut usize) -> usize {
    let b = block();
    let entered = std::cell::Cell::new(false);
    let target = crate::boundary::guard(
        "the driver's in-flight slow path",
        dispatch::unsupported_address(),
        || {
            dispatch::ensure_initialised();
            let thunk = cudaw_drv_inflight_return as *const () as usize;
            // SAFETY: the trampoline passes this call's return-address slot, and jumps to
            // the target next; `b` is this thread's block.
            entered.set(with_gate(|g| unsafe { inflight::enter(b, slot, thunk, g) }));
            dispatch::target(index)
        },
    );
    if !entered.get() && b.in_flight() {
        // A panic before the thunk was in place: nothing will clear the word but this.
        b.word.store(inflight::IDLE, Ordering::SeqCst);
    }
    target
}
