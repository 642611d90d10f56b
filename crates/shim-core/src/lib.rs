//! The plumbing cudaw's two cdylibs share: the runtime shim (`crates/cudart-shim`,
//! `libcudart.so`) and the driver layer (`crates/driver-shim`, `libcuda.so.1`), and the
//! engine (`crates/engine`) that both drive. Each cdylib keeps its exports, its wrappers
//! and its glue; what is the same in both lives here, parameterised by [`Library`] where
//! they differ.
//!
//! - [`log`]: one logging facade (`CUDAW_LOG`), each library naming itself.
//! - [`boundary`]: the panic boundary; no panic crosses `extern "C"`.
//! - [`dispatch`]: the dispatch table the generated trampolines jump through, its filling,
//!   and the trampolines' slow path.
//! - [`inflight`]: the slow path of the in-flight trampolines, and the marking of the calls
//!   whose wrappers mark themselves.
//! - [`real`]: finding and loading the real library, never cudaw itself.
//! - [`shadow`]: the tracing shadow stack (per-thread blocks of timed calls, the Rust
//!   path's enter and exit, the return thunk, the timeline's call buffers).
#![deny(unsafe_op_in_unsafe_fn)]

pub mod boundary;
pub mod dispatch;
pub mod inflight;
pub mod log;
pub mod real;
pub mod shadow;

pub use dispatch::Dispatch;

use driver::inflight::{Block, Gate};

/// What a cdylib tells the shared plumbing about itself: its dispatch table, its gate and
/// its in-flight block. Implemented by a unit type in each cdylib (`dispatch::Runtime`,
/// `dispatch::Driver`); every function here is generic over it, so each call is direct.
pub trait Library: 'static {
    /// Names the trampolines' slow path in the panic boundary's line.
    const SLOW_PATH: &'static str;
    /// Names the in-flight trampolines' slow path in the panic boundary's line.
    const IN_FLIGHT_SLOW_PATH: &'static str;
    /// Names the admission of a call its wrapper marks in flight.
    const IN_FLIGHT_ADMISSION: &'static str;

    /// Initialises the library (once; later calls return at once).
    fn ensure_initialised();
    /// Where export `index` goes now ([`Dispatch::target`]).
    fn target(index: u32) -> usize;
    /// Waits while the process is paused (a thread that may pass returns at once).
    fn wait_while_paused();
    /// The calling thread's in-flight block (`driver::inflight_block!`).
    fn block() -> &'static Block;
    /// The address of the in-flight trampolines' return thunk (`PREFIX_inflight_return`).
    fn return_thunk() -> usize;
    /// Runs `f` with this library's gate.
    fn with_gate<R>(f: impl FnOnce(&Gate<'_>) -> R) -> R;
    /// Called by the slow paths once the target of export `index` is known, before the
    /// call jumps to it (the runtime's tracing starts timing it here). Default: nothing.
    ///
    /// # Safety
    /// `slot` is the address of the export call's return address, and the call jumps to
    /// the target next.
    unsafe fn entered(index: u32, slot: *mut usize) {
        let _ = (index, slot);
    }
}

/// `global_asm!` of a file `shim-build` wrote for the target: AT&T syntax on x86-64, the
/// assembler's own elsewhere (AArch64). Operands end with a comma.
#[macro_export]
macro_rules! generated_asm {
    ($($operands:tt)*) => {
        #[cfg(target_arch = "x86_64")]
        std::arch::global_asm!($($operands)* options(att_syntax));
        #[cfg(not(target_arch = "x86_64"))]
        std::arch::global_asm!($($operands)*);
    };
}
