//! Calls in flight (`driver::inflight`): the runtime shim's exports that can enqueue device
//! work (launches, copies, sets, graph launches, prefetches: `shim-build`'s
//! `enqueues_device_work`) have in-flight trampolines, and this module is their slow
//! path. It also keeps the process's registry of every thread's in-flight words — this
//! library's and the driver shim's (registered through the hooks) — which pause reads
//! (`wait_idle`).

use crate::dispatch::DISPATCH;
use crate::gate;
use cudaw_engine::inflight as pause;
use cudaw_shim_core::Library;
use driver::inflight::{self, Block, Gate, Registry};
use std::sync::atomic::Ordering;

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
    fn block() -> &'static Block {
        block()
    }
    fn return_thunk() -> usize {
        return_thunk()
    }
    fn with_gate<R>(f: impl FnOnce(&Gate<'_>) -> R) -> R {
        with_gate(f)
    }
    unsafe fn entered(index: u32, slot: *mut usize) {
        if gate::GATE.load(Ordering::Relaxed) & gate::TRACING != 0 {
            // SAFETY: the caller's contract: `slot` is this export call's return-address
            // slot, and the call jumps to its target next.
            unsafe { crate::tracing::enter(index, slot) };
        }
    }
}

/// Every thread's in-flight block, of both libraries.
pub static REGISTRY: Registry = Registry::new();

extern "C" {
    /// The return thunk of the in-flight trampolines (never called directly).
    fn cudaw_rt_inflight_return();
}

/// The calling thread's block ([`driver::inflight_block`]).
#[inline(always)]
pub(crate) fn block() -> &'static Block {
    driver::inflight_block!("cudaw_rt_inflight_tls")
}

/// Whether the calling thread is inside one of this library's calls in flight.
pub fn active() -> bool {
    block().in_flight()
}

use driver::hooks::RECORDING_LAUNCH;

/// Runs `f`, a launch this library's tracing records, flagged as such on the calling
/// thread (bit `RECORDING_LAUNCH` of its flags word, [`thread_flags`]), so that cudaw's
/// driver layer, which the launch passes through, does not record it again.
#[inline]
pub fn recording_launch_of<R>(f: impl FnOnce() -> R) -> R {
    struct Clear(&'static Block, usize);
    impl Drop for Clear {
        fn drop(&mut self) {
            self.0.flags.store(self.1, Ordering::Relaxed);
        }
    }
    let b = block();
    let before = b.flags.load(Ordering::Relaxed);
    b.flags.store(before | RECORDING_LAUNCH, Ordering::Relaxed);
    let _clear = Clear(b, before);
    f()
}

/// The calling thread's flags word ([`Block::flags`]; bit [`RECORDING_LAUNCH`] inside
/// [`recording_launch_of`]), for cudaw's driver layer, which keeps its address per thread.
pub fn thread_flags() -> *const std::sync::atomic::AtomicUsize {
    &block().flags
}

fn unregister(b: *const Block) {
    REGISTRY.unregister(b);
}

/// The registry's side of the driver shim's hooks.
pub fn register_foreign(b: *const Block) {
    REGISTRY.register(b);
}

/// The return thunk's address.
pub(crate) fn return_thunk() -> usize {
    cudaw_rt_inflight_return as *const () as usize
}

/// Runs `f` with this library's gate.
pub(crate) fn with_gate<R>(f: impl FnOnce(&Gate<'_>) -> R) -> R {
    let paused = gate::is_paused;
    let may_pass = || pause::in_wrapped_call() || pause::is_cudaw_thread();
    let register =
        |b: &Block| inflight::register_until_thread_exit(b, &|p| REGISTRY.register(p), unregister);
    f(&Gate {
        paused: &paused,
        may_pass: &may_pass,
        wait: &gate::wait_while_paused,
        register: &register,
    })
}

/// Runs `f`, a call that can enqueue device work, marked in flight by its wrapper rather
/// than by an in-flight trampoline (the launches: `build.rs`): [`inflight::marked`] with
/// this library's gate (a gate word paused or not initialised takes the slow path; the
/// tracing bits do not matter here: the launches' traced wrappers are marked this way too).
#[inline(always)]
pub(crate) fn marked<R>(f: impl FnOnce() -> R) -> R {
    cudaw_shim_core::inflight::marked::<Runtime, R>(
        || gate::GATE.load(Ordering::Relaxed) & (gate::PAUSED | gate::UNINITIALISED) == 0,
        f,
    )
}

/// The slow path of the in-flight trampolines ([`cudaw_shim_core::inflight::resolve`]).
pub(crate) extern "C" fn resolve(index: u32, slot: *mut usize) -> usize {
    // SAFETY: the assembly passes the address of this export call's return address, and
    // jumps to the result next.
    unsafe { cudaw_shim_core::inflight::resolve::<Runtime>(index, slot) }
}

/// Threads registered (that made at least one call in flight).
pub fn threads() -> usize {
    REGISTRY.len()
}

/// Prepares the barrier (once, at initialisation).
pub fn prepare() {
    if !inflight::prepare_barrier() {
        crate::log::info(format_args!(
            "membarrier is unavailable; pause fences with a page-protection change instead"
        ));
    }
}
