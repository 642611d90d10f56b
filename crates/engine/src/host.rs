//! What the engine needs from the library it runs in (its *host*: cudaw's `libcudart.so`,
//! or a test): the pause gate, the calls in flight the engine does not count itself, the
//! few real runtime calls it makes, the tracer, and small facts. Installed once
//! ([`install`]) before any other engine function runs: the runtime shim does it in its
//! load-time constructor, a test before its first step.

use cudaw_control::Reply;
use std::fs::File;
use std::path::Path;
use std::sync::OnceLock;

/// `cudaError_t` (the runtime's) or `CUresult`: the host's calls return the code as is.
pub type Code = u32;

/// The engine's host. Every method may be called from any thread, the control thread
/// included; the gate's methods also while the gate is closed.
pub trait Host: Send + Sync + 'static {
    // ---- the pause gate: the word every exported call loads first

    /// Closes the gate: calls entering the library wait until [`Host::open_gate`].
    fn close_gate(&self);
    /// Opens the gate and wakes every waiting thread.
    fn open_gate(&self);
    /// Opens the gate with one atomic operation, taking no lock and waking no one:
    /// async-signal-safe, for a forked child (whose gate lock a thread of the parent may
    /// have held at the fork) that can no longer pause.
    fn open_gate_after_fork(&self);
    /// Whether the gate is closed for a pause.
    fn gate_closed(&self) -> bool;
    /// Blocks the calling thread while the gate is closed.
    fn wait_while_closed(&self);
    /// How many threads wait at the closed gate now (0 for a host that does not count).
    fn gate_waiters(&self) -> usize {
        0
    }

    // ---- calls in flight the engine does not count itself

    /// Whether the calling thread is inside one of the host's calls marked in flight
    /// (an export with an in-flight trampoline), which a pause waits for already.
    fn in_marked_call(&self) -> bool;
    /// How many threads are inside calls marked in flight now, of every library that
    /// registered with the host (the runtime shim's and the driver shim's).
    fn marked_calls_in_flight(&self) -> usize;

    // ---- the real runtime

    /// Whether the host has loaded the real runtime (async-signal-safe: an atomic load).
    fn runtime_loaded(&self) -> bool;
    /// The real runtime's SONAME as this build carries it (`libcudart.so.13`).
    fn runtime_soname(&self) -> &'static str;
    /// The calling thread's current device (`cudaGetDevice`).
    fn current_device(&self) -> Result<i32, Code>;
    /// Initialises the runtime on the calling thread's device: its primary context is
    /// created and made current (`cudaFree(NULL)`).
    fn initialise_runtime(&self) -> Result<(), Code>;
    /// Writes device `ordinal`'s `cudaDeviceProp` into `prop`
    /// (`cudaGetDeviceProperties_v2`, else `cudaGetDeviceProperties`).
    fn device_properties(&self, ordinal: i32, prop: &mut [u64]) -> Result<(), Code>;
    /// Waits for the calling thread's device (`cudaDeviceSynchronize`).
    fn synchronize_device(&self) -> Result<(), Code>;
    /// An event (timing disabled) recorded on `stream` now (`cudaEventCreateWithFlags`,
    /// `cudaEventRecord`; destroyed again when recording fails).
    fn record_event(&self, stream: usize) -> Result<usize, Code>;
    /// Whether `event` has completed (`cudaEventQuery`), or, with `wait`, waits for it
    /// (`cudaEventSynchronize`): `true` unless the runtime answers "not ready".
    fn event_done(&self, event: usize, wait: bool) -> bool;
    /// Destroys `event` (`cudaEventDestroy`).
    fn destroy_event(&self, event: usize);

    // ---- the tracer

    /// The tracer's clock now (0 when tracing is off).
    fn trace_now(&self) -> u64;
    /// Records a pause (or a resume) from tick `start` until now, that moved `bytes` of
    /// `allocations`.
    fn trace_pause(&self, resume: bool, start: u64, allocations: u64, bytes: u64);
    /// Records an allocation of `size` bytes at `base`, made by `api`.
    fn trace_alloc(&self, base: u64, size: u64, api: &'static str);
    /// Answers a control request addressed to the tracer.
    fn tracer_request(&self, req: TracerRequest<'_>) -> Reply;

    // ---- facts for the exit summary

    /// Driver-level address reservations the host has seen (`cuMemAddressReserve`).
    fn driver_reservations(&self) -> usize;
}

/// A control request the tracer answers ([`Host::tracer_request`]).
#[derive(Debug)]
pub enum TracerRequest<'a> {
    /// `stats`: the metrics and the `top` hottest and coldest allocations.
    Stats {
        /// How many allocations of each.
        top: usize,
    },
    /// `tracing`: switch tracing on or off.
    Switch {
        /// On.
        on: bool,
    },
    /// `trace`: write the timeline so far.
    Timeline {
        /// Where (absolute).
        path: &'a Path,
        /// The file the client created and passed, to write into instead.
        file: Option<&'a File>,
    },
}

static HOST: OnceLock<&'static dyn Host> = OnceLock::new();

/// Installs the engine's host (once; a later call with another host is ignored and
/// returns `false`).
pub fn install(host: &'static dyn Host) -> bool {
    HOST.set(host).is_ok() || HOST.get().is_some_and(|h| std::ptr::addr_eq(*h, host))
}

/// The installed host.
///
/// # Panics
/// When none is installed (a host's bug: every caller of the engine is inside a panic
/// boundary, which turns it into an error code and a log line).
pub fn host() -> &'static dyn Host {
    match HOST.get() {
        Some(h) => *h,
        None => panic!("cudaw's engine was called before its host was installed"),
    }
}
