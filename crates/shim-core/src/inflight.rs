//! Calls in flight (`driver::inflight`), the part both cdylibs share: the slow path of the
//! in-flight trampolines ([`resolve`]), and the admission of a call whose wrapper marks it
//! in flight itself ([`marked`]). Each library supplies its block, gate and thunk
//! ([`Library`]).

use crate::boundary::guard;
use crate::dispatch::unsupported_address;
use crate::Library;
use driver::inflight::{self, Block};
use std::sync::atomic::Ordering;

/// Runs `f`, a call that can enqueue device work, marked in flight by its wrapper rather
/// than by an in-flight trampoline (the launches), so that the return goes straight back
/// to the caller: [`inflight::marked`] with `L`'s block and gate; `open` is the fast test
/// of the gate word.
#[inline(always)]
pub fn marked<L: Library, R>(open: impl FnOnce() -> bool, f: impl FnOnce() -> R) -> R {
    inflight::marked(L::block(), open, admit::<L>, f)
}

/// [`marked`]'s slow path: the gate is closed, or the thread's block is unregistered.
fn admit<L: Library>(b: &Block) -> bool {
    guard(L::IN_FLIGHT_ADMISSION, false, || {
        L::ensure_initialised();
        L::with_gate(|g| inflight::admit(b, g))
    })
}

/// The slow path of the in-flight trampolines (the assembly's `{inflight_resolve}`):
/// `index` is the export's, `slot` the address of the caller's return address.
///
/// # Safety
/// `slot` is the address of the export call's return address, and the call jumps to the
/// returned target next (the assembly's contract).
pub unsafe fn resolve<L: Library>(index: u32, slot: *mut usize) -> usize {
    let b = L::block();
    let entered = std::cell::Cell::new(false);
    let target = guard(L::IN_FLIGHT_SLOW_PATH, unsupported_address(), || {
        L::ensure_initialised();
        let thunk = L::return_thunk();
        // SAFETY: the caller's contract for `slot`; `b` is this thread's block.
        entered.set(L::with_gate(|g| unsafe {
            inflight::enter(b, slot, thunk, g)
        }));
        let target = L::target(index);
        // SAFETY: as above; a thunk put in place there returns into ours.
        unsafe { L::entered(index, slot) };
        target
    });
    if !entered.get() && b.in_flight() {
        // A panic before the thunk was in place: nothing will clear the word but this.
        b.word.store(inflight::IDLE, Ordering::SeqCst);
    }
    target
}
