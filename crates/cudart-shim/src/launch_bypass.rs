//! Launches that need no wrapper of this library: with mapped addressing and no tracing, a
//! launch export only has to be marked in flight, so that a pause waits for it
//! (`crate::inflight::marked`). When the real runtime's launches reach cudaw's driver
//! layer (`crates/driver-shim`, loaded as `libcuda.so.1` by `cudaw run`), that layer's
//! launch wrappers already mark them, through this library's gate: the export can then go
//! straight to the real runtime (its plain trampoline still tests the gate), and the
//! runtime layer adds nothing to a launch.
//!
//! Whether they do is observed, not assumed, once per export: its first successful launch
//! through the thin wrapper is made between two reads of the driver layer's count of
//! launches on the calling thread (`cudaw_driver_thread_launches_v1`). If the count grew,
//! the real runtime's launch passed the driver layer's wrapper, and the export's table
//! entry becomes the real function; if not (no driver layer, `cudaw run
//! --no-driver-layer`, a driver layer not connected to this runtime, simgpu's runtime
//! calling its driver directly), the thin wrapper stays. `CUDAW_DIRECT_LAUNCHES=off` keeps
//! it everywhere.
//!
//! Why it is safe: a thread that passed the export's gate before a pause closed it is, until
//! it reaches the driver layer's launch wrapper, outside any call in flight; the wrapper
//! then holds it at the closed gate (it is neither in a wrapped call of this library nor
//! cudaw's own thread), so its launch is queued after the resume, at the same addresses.
//! Inside the wrapper it is in flight, and the pause waits for it, as for any driver launch.
//! A thread held there may hold the real runtime's locks, as any forwarded call may: the
//! pause never calls the real runtime while the gate is closed.

use crate::dispatch;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::OnceLock;

/// Not yet observed.
const UNTESTED: u8 = 0;
/// The real runtime's launches through this export reach the driver layer's wrappers.
const REACHES_DRIVER_LAYER: u8 = 1;
/// They do not: the export keeps its thin wrapper.
const KEEPS_WRAPPER: u8 = 2;

/// Each export's state (by dispatch index; only the launches' are used).
static STATE: [AtomicU8; dispatch::N] = [const { AtomicU8::new(UNTESTED) }; dispatch::N];

/// The driver layer's count of launches on the calling thread, if that layer is loaded.
type ThreadLaunches = extern "C" fn() -> u64;

fn driver_layer() -> Option<ThreadLaunches> {
    static F: OnceLock<Option<ThreadLaunches>> = OnceLock::new();
    *F.get_or_init(|| {
        // SAFETY: dlsym reads the loader's tables; RTLD_DEFAULT searches the global scope.
        let f = unsafe {
            libc::dlsym(
                libc::RTLD_DEFAULT,
                c"cudaw_driver_thread_launches_v1".as_ptr(),
            )
        };
        // SAFETY: cudaw's driver layer exports this name as `extern "C" fn() -> u64`.
        (!f.is_null())
            .then(|| unsafe { std::mem::transmute::<*mut libc::c_void, ThreadLaunches>(f) })
    })
}

/// Whether export `index`'s launches are still to be observed (one load).
#[inline(always)]
pub(crate) fn untested(index: usize) -> bool {
    STATE[index].load(Ordering::Relaxed) == UNTESTED
}

/// Whether export `index` goes straight to the real runtime when no wrapper is needed.
pub(crate) fn reaches_driver_layer(index: usize) -> bool {
    STATE[index].load(Ordering::Acquire) == REACHES_DRIVER_LAYER
}

/// Runs `launch` (the thin wrapper's marked forward of export `index`) and, when it
/// succeeds, settles whether the export's launches reach the driver layer; when they do,
/// points the export at the real runtime (unless a wrapper is needed now: translated
/// addressing, tracing that records launches in this layer).
#[cold]
#[inline(never)]
pub(crate) fn observe(index: usize, name: &str, launch: impl FnOnce() -> u32) -> u32 {
    settle(index, name, launch).0
}

/// [`observe`] for the traced wrapper of export `index` under `metrics`, whose launch
/// (`launch`, not flagged as recorded by this layer) the driver layer counts when it
/// reaches it: the launch's result, and whether the driver layer saw it (false: not
/// counted there, for the caller to record; also when it failed).
#[cold]
#[inline(never)]
pub(crate) fn observe_unrecorded(index: usize, launch: impl FnOnce() -> u32) -> (u32, bool) {
    let name = dispatch::ALL_NAMES
        .get(index)
        .copied()
        .unwrap_or("a launch");
    settle(index, name, launch)
}

fn settle(index: usize, name: &str, launch: impl FnOnce() -> u32) -> (u32, bool) {
    let count = driver_layer().filter(|_| crate::config::get().direct_launches);
    let Some(count) = count else {
        STATE[index].store(KEEPS_WRAPPER, Ordering::Release);
        return (launch(), false);
    };
    let before = count();
    let rc = launch();
    if rc != 0 {
        // A failed launch may not reach the driver: the next one is observed.
        return (rc, count() > before);
    }
    if count() > before {
        STATE[index].store(REACHES_DRIVER_LAYER, Ordering::Release);
        let direct = crate::tracing::when_direct(|| {
            dispatch::DISPATCH.set(index, dispatch::real_or_stub(index))
        });
        crate::log::info(format_args!(
            "{name}: the real runtime's launches reach cudaw's driver layer, which marks them \
             in flight{}",
            if direct {
                ": the export now goes straight to the real runtime"
            } else {
                " (the export keeps its wrapper while it translates or records launches)"
            }
        ));
        (rc, true)
    } else {
        STATE[index].store(KEEPS_WRAPPER, Ordering::Release);
        crate::log::debug(format_args!(
            "{name}: the real runtime's launches do not reach cudaw's driver layer: the \
             export keeps its thin wrapper, which marks them in flight"
        ));
        (rc, false)
    }
}
