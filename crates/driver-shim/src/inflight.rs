//! Calls in flight (`driver::inflight`): the driver functions that can enqueue device work
//! (launches, copies, sets, graph launches, stream memory operations, prefetches:
//! `shim-build`'s `enqueues_device_work`) have in-flight trampolines, and this module is
//! their slow path. Each thread's block is registered with the runtime shim (through its
//! hooks), whose pause waits until no registered thread has such a call in flight; with
//! no runtime shim in the process there is no pause, and nothing is registered.

use crate::dispatch;
use crate::runtime;
use cudaw_shim_core::Library;
use driver::inflight::{self, Block, Gate};
use std::marker::PhantomData;
use std::sync::atomic::Ordering;

/// What [`Driver`]'s `ensure_initialised` runs: the layer above names its own (the whole
/// initialisation, `crate::init`), so that this layer need not name it.
pub trait Initialise: 'static {
    /// Initialises this library as far as its caller needs (once).
    fn ensure();
}

/// Inside one of cudaw's wrappers (reached only once the whole initialisation installed
/// it): the real driver's table, which the wrapper's forwarding needs, is all there is to
/// ensure.
pub struct Installed;

impl Initialise for Installed {
    fn ensure() {
        dispatch::DISPATCH.ensure_initialised();
    }
}

/// The driver shim, as the shared plumbing sees it, initialised by `I`.
pub struct Driver<I>(PhantomData<I>);

impl<I: Initialise> Library for Driver<I> {
    const SLOW_PATH: &'static str = "the driver slow path";
    const IN_FLIGHT_SLOW_PATH: &'static str = "the driver's in-flight slow path";
    const IN_FLIGHT_ADMISSION: &'static str = "the driver's in-flight admission";

    fn ensure_initialised() {
        I::ensure();
        runtime::install_pause_once();
    }
    fn target(index: u32) -> usize {
        dispatch::DISPATCH.target(index)
    }
    fn wait_while_paused() {
        runtime::wait_if_paused();
    }
    #[inline(always)]
    fn block() -> &'static Block {
        block()
    }
    fn return_thunk() -> usize {
        return_thunk()
    }
    fn with_gate<R>(f: impl FnOnce(&Gate<'_>) -> R) -> R {
        with_gate(f)
    }
}

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

/// The return thunk's address.
pub(crate) fn return_thunk() -> usize {
    cudaw_drv_inflight_return as *const () as usize
}

/// Runs `f` with this library's gate, as the runtime shim's hooks (or their absence) make
/// it.
pub(crate) fn with_gate<R>(f: impl FnOnce(&Gate<'_>) -> R) -> R {
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
    cudaw_shim_core::inflight::marked::<Driver<Installed>, R>(|| !gate_closed(), f)
}
