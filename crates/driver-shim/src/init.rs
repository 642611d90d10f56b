//! The glue on top: the generated trampolines and their slow paths, and this library's
//! initialisation. Every module is below this one, and none names it: the slow paths,
//! which every export's first call takes, run the whole initialisation; a lookup of a
//! real function ([`crate::dispatch::real`]) runs only its first stage (the real driver
//! loaded, the tables filled).

use crate::dispatch::{self, DISPATCH, GATE_PTR, LOCAL_GATE, N};
use crate::inflight::{Driver, Initialise};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Once;

/// The driver shim as its slow paths see it: [`ensure_initialised`] runs the whole
/// initialisation.
type Whole = Driver<Everything>;

/// [`Initialise`]: the whole initialisation.
struct Everything;

impl Initialise for Everything {
    fn ensure() {
        ensure_initialised();
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
    inflight_resolve = sym inflight_resolve,
);

extern "C" {
    fn cudaw_driver_slow_entry();
}

/// The slow path of every export ([`cudaw_shim_core::dispatch::slow_resolve`]).
extern "C" fn slow_resolve(index: u32, slot: *mut usize) -> usize {
    // SAFETY: the assembly passes the address of this export call's return address, and
    // jumps to the result next.
    unsafe { cudaw_shim_core::dispatch::slow_resolve::<Whole>(index, slot) }
}

/// The slow path of the in-flight trampolines ([`cudaw_shim_core::inflight::resolve`]).
extern "C" fn inflight_resolve(index: u32, slot: *mut usize) -> usize {
    // SAFETY: the assembly passes the address of this export call's return address, and
    // jumps to the result next.
    unsafe { cudaw_shim_core::inflight::resolve::<Whole>(index, slot) }
}

/// Initialises this library (once), then the runtime shim's pause machinery.
pub fn ensure_initialised() {
    static ONCE: Once = Once::new();
    DISPATCH.ensure_initialised();
    ONCE.call_once(initialise);
    crate::runtime::install_pause_once();
}

/// With the real driver loaded ([`DISPATCH`]'s first stage): installs cudaw's wrappers,
/// registers the report at exit and shares the runtime shim's gate.
fn initialise() {
    if let Ok(real) = crate::real::get() {
        crate::proc_address::index_real_exports();
        crate::trace::init();
        DISPATCH.install(wrappers());
        crate::log::info(format_args!(
            "forwarding {N} driver functions to {} ({} absent there)",
            real.path().display(),
            dispatch::absent()
        ));
    }
    crate::counts::report_at_exit();
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
/// group (`always`, `launch`, `copies`) the indices and `(index, wrapper)` pairs.
pub mod list {
    use crate::dispatch::idx;
    include!(concat!(env!("OUT_DIR"), "/wrapped.rs"));
}

/// cudaw's wrappers: (index, function); the copies only while tracing or smart pinning is
/// on ([`crate::copies`]), so that otherwise a copy goes straight to the real driver.
fn wrappers() -> Vec<(usize, usize)> {
    let mut w = list::always_wrappers().to_vec();
    if crate::copies::wanted() {
        w.extend(list::copies_wrappers());
    }
    w
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_has_a_trampoline() {
        for (i, name) in dispatch::ALL_NAMES.iter().enumerate() {
            assert_ne!(dispatch::trampoline(i), 0, "{name}");
        }
        let distinct: std::collections::BTreeSet<usize> =
            (0..N).map(dispatch::trampoline).collect();
        assert_eq!(distinct.len(), N);
    }

    #[test]
    fn the_wrapped_list_names_distinct_functions() {
        let w = list::always_wrappers();
        let names: std::collections::BTreeSet<usize> = w.iter().map(|&(i, _)| i).collect();
        assert_eq!(names.len(), w.len());
        assert!(w.iter().all(|&(_, f)| f != 0));
    }
}
