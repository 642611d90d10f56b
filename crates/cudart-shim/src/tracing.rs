//! `CUDAW_TRACE`: the runtime side of tracing. The store itself ([`cudaw_trace::Tracer`]:
//! counters, timeline ring, memory history) is a pure crate the driver shim can feed too;
//! this module times every export and feeds the store from the wrappers.
//!
//! Timing every export without knowing its signature: with tracing on, the gate word has
//! the [`gate::TRACING`] bit, so every call takes the trampolines' slow path. With the
//! word exactly `TRACING` (metrics, not paused), that is `shim-build`'s assembly
//! `trace_fast_path`: it pushes `(slot, return address, index, rdtsc)` on the thread's
//! shadow stack (`Block`, reached through static TLS words, `TraceTls`), replaces the
//! return address with its thunk and jumps to the target; the thunk reads the TSC, pops the
//! frame, adds to the thread's counters (`ThreadCounters::flat_calls`, plain adds) and jumps
//! back. With `CUDAW_TRACE_SAMPLE=N`, one call in N of each export is timed and the others
//! only counted (the merge scales the timed calls' ticks up to the count): a plain
//! trampoline counts an untimed call itself, in place (`shim-build`'s `trampolines` with
//! `count`: a plain add to the export's counter, no call), and jumps through its own table
//! entry; the others go on to the fast path. Under the
//! timeline every call is timed and the thunk also writes `(start, ticks, index)` into the
//! thread's call buffer (`Block::events`); when that is full the call takes the Rust
//! path, which moves the buffer's calls into the ring in one batch (`flush_calls`), and
//! readers of the timeline add what the buffers hold (`pending_calls`).
//! Anything else (a pause, a thread's first call, a full stack, a frame a `longjmp` left
//! behind, a full call buffer) takes the Rust path: [`enter`] pushes the same frame with
//! `cudaw_trace_return` as the thunk, which saves the return registers, calls `exit`
//! (time, counters, timeline) and jumps to the saved address. Nested calls (a callback
//! calling CUDA) stack up; frames a `longjmp` skipped are dropped when a shallower frame
//! returns or enters. The in-flight trampolines chain: their thunk is the return address
//! the tracing thunk goes back to. With tracing off, the gate word is what it always was
//! and the trampolines are unchanged.
//!
//! The wrappers add what the generic layer cannot see: kernel names and the allocations a
//! launch receives (from the parameter layouts), copy directions and sizes, allocations and
//! frees with the calling library, pauses and resumes.

use crate::dispatch::ALL_NAMES;
use crate::{gate, log, registry};
use cudaw_engine::trace;
use cudaw_shim_core::shadow;
use cudaw_trace::{Config, Mode, Tracer};
// The tick source: the time stamp counter on x86-64 (constant rate on every CPU that runs
// CUDA), the virtual counter on AArch64; calibrated against the monotonic clock.
use driver::selfcost::ticks;
use std::ffi::c_void;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

/// The id of `ALL_NAMES[0]` in the tracer's function table.
static FUNCTION_BASE: AtomicU32 = AtomicU32::new(0);

/// Sets tracing up from the configuration (once: while the shim initialises, before the
/// dispatch table is filled, or at the driver shim's first traced call, whichever comes
/// first); does nothing when `CUDAW_TRACE` is off. `always_timed`: the exports timed on
/// every call whatever `CUDAW_TRACE_SAMPLE` says, those that make allocations, whose
/// creation site is the caller's return address on the shadow stack (`exports/wrapped.txt`'s
/// `timed` group).
pub fn init(always_timed: &'static [usize]) {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        ALWAYS_TIMED.get_or_init(|| always_timed);
        init_once()
    });
}

fn init_once() {
    // SAFETY: the accessor only reads the GOT's thread-pointer offset of the words.
    gate::set_trace_tls(unsafe { cudaw_rt_trace_tls_offset() });
    let cfg = crate::config::get();
    if cfg.trace == Mode::Off {
        return;
    }
    let t = cudaw_trace::install(Config {
        mode: cfg.trace,
        ring_events: cfg.trace_events,
        clock: Some(ticks),
        buffer_sample: cfg.trace_buffer_sample,
    });
    FUNCTION_BASE.store(t.register_functions(&ALL_NAMES), Ordering::Relaxed);
    t.set_launch_source(Box::new(trace::driver_layer_launches));
    // SAFETY: registers a function with no arguments that never unwinds (it runs inside
    // the panic boundary).
    unsafe { libc::atexit(at_exit) };
    gate::GATE.fetch_or(gate_bits(cfg.trace), Ordering::SeqCst);
    if !cfg.trace_calls {
        log::info(format_args!(
            "tracing: calls are not counted or timed (CUDAW_TRACE_CALLS=off)"
        ));
    }
    if !cfg.trace_driver {
        log::info(format_args!(
            "tracing: the driver layer records nothing: launches and copies made through the driver API (cuBLAS, cuDNN, Triton) are left out (CUDAW_TRACE_DRIVER=off)"
        ));
    }
    log::info(format_args!(
        "tracing: {} ({}; ticks {:.3} per ns)",
        cfg.trace.as_str(),
        if cfg.trace == Mode::Timeline {
            format!(
                "a ring of {} events, written to {} at exit",
                cfg.trace_events,
                trace_file().display()
            )
        } else {
            "counters and the memory history".to_owned()
        },
        t.clock().rate()
    ));
}

/// The process's tracer, when tracing is on (and not switched off by [`set_active`]).
#[inline]
pub fn tracer() -> Option<&'static Tracer> {
    let t = cudaw_trace::get()?;
    (!SUSPENDED.load(Ordering::Relaxed)).then_some(t)
}

/// Whether tracing is on: configured (`CUDAW_TRACE`) and not switched off.
pub fn enabled() -> bool {
    configured() && !SUSPENDED.load(Ordering::Relaxed)
}

/// Whether `CUDAW_TRACE` asked for tracing when the process started.
pub fn configured() -> bool {
    crate::config::get().trace != Mode::Off
}

/// The mode tracing runs in now: `CUDAW_TRACE`'s, or [`Mode::Off`] while switched off.
pub fn mode() -> Mode {
    if enabled() {
        crate::config::get().trace
    } else {
        Mode::Off
    }
}

// ------------------------------------------------------------------ switching on and off

/// Tracing is switched off ([`set_active`]): the tracer and what it holds are kept, nothing
/// new is recorded, and calls take the untraced paths.
static SUSPENDED: AtomicBool = AtomicBool::new(false);

/// Held while tracing is switched, and while a launch export is pointed elsewhere
/// ([`when_direct`]), so that the launch entries always match the tracing state.
static SWITCH: parking_lot::Mutex<()> = parking_lot::Mutex::new(());

/// Runs `f`, which points a launch entry whose launches reach cudaw's driver layer at the
/// real runtime, if no wrapper of this library is needed for them now (mapped addressing,
/// and tracing off, switched off, or [`driver_layer_counts_launches`]), with the switch
/// held: a later switch installs what [`crate::wrappers`] picks then. Whether `f` ran.
pub(crate) fn when_direct(f: impl FnOnce()) -> bool {
    let _g = SWITCH.lock();
    let direct = !crate::memory::translated() && (!enabled() || driver_layer_counts_launches());
    if direct {
        f();
    }
    direct
}

/// Whether, tracing now, the launches that reach cudaw's driver layer are left to it: with
/// `metrics` (and `CUDAW_TRACE_DRIVER` on, and mapped addressing: the driver layer sees
/// the real runtime's pointers, which translated addressing makes differ), that layer
/// counts them in its own per-thread counters ([`driver_layer_launches`] adds them in
/// when read) and hands over the launches whose buffers the memory history looks up, so
/// the runtime's launch exports whose launches reach it ([`crate::launch_bypass`]) go
/// straight to the real runtime, as untraced. The timeline keeps this library's wrappers
/// (it records every launch, with the kernel's name from the registration).
pub(crate) fn driver_layer_counts_launches() -> bool {
    enabled()
        && mode() == Mode::Metrics
        && crate::config::get().trace_driver
        && !crate::memory::translated()
}

/// Switches tracing off (`false`) or back on (`true`) in this running process, which
/// started with `CUDAW_TRACE=metrics` or `timeline`: `cudaw-ckpt tracing PID off|on`, or a
/// program's own call of [`cudaw_trace_active_v1`](crate::wrappers::cudaw_trace_active_v1). Off, every call takes the path it
/// takes with `CUDAW_TRACE=off` (the gate word without the tracing bits, the launches'
/// thin wrappers, the driver layer told to stop recording); the counters, the memory
/// history and the timeline recorded so far stay readable, and recording resumes where it
/// left off when switched back on (calls made meanwhile are not counted; allocations made
/// meanwhile have no history). Returns whether tracing was on before.
pub fn set_active(on: bool, switch_launch_entries: fn(bool)) -> Result<bool, String> {
    if !configured() {
        return Err(
            "tracing is off in this process: start it with CUDAW_TRACE=metrics or timeline \
             to switch tracing on and off while it runs"
                .to_owned(),
        );
    }
    crate::dispatch::DISPATCH.ensure_initialised();
    let _g = SWITCH.lock();
    let was = !SUSPENDED.load(Ordering::SeqCst);
    if was == on {
        return Ok(was);
    }
    let bits = gate_bits(crate::config::get().trace);
    if on {
        SUSPENDED.store(false, Ordering::SeqCst);
        switch_launch_entries(true);
        trace::driver_layer_mode(mode());
        gate::GATE.fetch_or(bits, Ordering::SeqCst);
    } else {
        gate::GATE.fetch_and(!bits, Ordering::SeqCst);
        trace::driver_layer_mode(Mode::Off);
        switch_launch_entries(false);
        SUSPENDED.store(true, Ordering::SeqCst);
    }
    log::info(format_args!(
        "tracing switched {}",
        if on { "on" } else { "off" }
    ));
    Ok(was)
}

/// The gate bits tracing in `mode` sets.
fn gate_bits(mode: Mode) -> u32 {
    if !crate::config::get().trace_calls {
        return 0;
    }
    match mode {
        Mode::Off => 0,
        // The timeline's calls take the assembly fast path too: its thunk writes each
        // call's event into the thread's buffer ([`Block::events`]).
        Mode::Timeline | Mode::Metrics => gate::TRACING,
    }
}

/// `CUDAW_TRACE_FILE` (`%p` in it standing for the PID), or `cudaw-PID.trace.json` in the
/// working folder ([`cudaw_trace::files::trace_file_for`]).
pub fn trace_file() -> PathBuf {
    cudaw_trace::files::trace_file_for(
        crate::config::get().trace_file.as_deref(),
        std::process::id(),
    )
}

// ------------------------------------------------------------------ the shadow stack

/// This library's shadow stack ([`cudaw_shim_core::shadow`]).
pub(crate) struct Rt;

/// Its blocks and counts.
static SHADOW: shadow::State = shadow::State::new();

extern "C" {
    /// The calling thread's words (`trace.s`, [`shadow::TraceTls`]): 0 until the shadow
    /// stack makes the block.
    fn cudaw_rt_trace_block() -> *mut *mut c_void;
    /// The thread-pointer offset of those words, which the gate's line keeps for the fast
    /// path ([`gate::set_trace_tls`]).
    fn cudaw_rt_trace_tls_offset() -> usize;
}

// SAFETY: `cudaw_rt_trace_block` returns the calling thread's static TLS words
// (`shim-build`'s `TRACE_TLS_*`, zeroed at thread start, the thread's alone); the thunk is
// the one `return_thunk!` made for `Rt`.
unsafe impl shadow::Host for Rt {
    fn words() -> *mut shadow::TraceTls {
        // SAFETY: the accessor only computes the address of the calling thread's words.
        unsafe { cudaw_rt_trace_block() }.cast()
    }
    fn tracer() -> Option<&'static Tracer> {
        tracer()
    }
    fn state() -> &'static shadow::State {
        &SHADOW
    }
    fn function_base() -> u32 {
        FUNCTION_BASE.load(Ordering::Relaxed)
    }
    fn exports() -> usize {
        ALL_NAMES.len()
    }
    fn always_timed() -> &'static [usize] {
        ALWAYS_TIMED.get().copied().unwrap_or(&[])
    }
    fn direct_exports() -> &'static [usize] {
        if crate::config::get().trace_direct {
            &crate::dispatch::REGISTER_ARGS
        } else {
            &[]
        }
    }
    fn sample() -> u32 {
        crate::config::get().trace_sample
    }
    fn thunk() -> usize {
        cudaw_trace_return as *const () as usize
    }
}

cudaw_shim_core::return_thunk!(pub(crate) cudaw_trace_return, Rt);

/// Calls a thread's timeline buffer holds before they go to the ring.
#[doc(hidden)]
pub use shadow::EVENTS;

/// Starts timing the call of export `index` whose return address is at `slot`
/// ([`shadow::enter`]).
///
/// # Safety
/// `slot` is the address of the return address of the export call in progress on this
/// thread.
pub unsafe fn enter(index: u32, slot: *mut usize) {
    // SAFETY: the caller's contract.
    unsafe { shadow::enter::<Rt>(index, slot) }
}

/// A fast-path call from its own frame that returned to a full timeline buffer
/// ([`shadow::direct_full`]; `shim-build`'s `TRACE_DIRECT`).
pub(crate) extern "C" fn direct_full(index: u64, start: u64, ticks: u64) {
    shadow::direct_full::<Rt>(index, start, ticks)
}

/// Calls [`direct_full`] recorded so far (the fast path's test reads it).
#[doc(hidden)]
pub fn direct_full_calls() -> u64 {
    shadow::direct_full_calls::<Rt>()
}

/// Room left in the calling thread's timeline buffer, in calls (0 without one).
#[doc(hidden)]
pub fn timeline_room() -> usize {
    shadow::timeline_room::<Rt>()
}

/// The calls every thread's timeline buffer holds, not yet in the ring
/// ([`shadow::pending_calls`]).
pub fn pending_calls() -> Vec<cudaw_trace::timeline::Event> {
    shadow::pending_calls::<Rt>()
}

/// Calls timed on the Rust path rather than the assembly fast path ([`shadow::rust_enters`]).
pub fn rust_enters() -> u64 {
    shadow::rust_enters::<Rt>()
}

// ------------------------------------------------------------------ what wrappers record

/// The exports timed on every call whatever `CUDAW_TRACE_SAMPLE` says ([`init`]).
static ALWAYS_TIMED: std::sync::OnceLock<&'static [usize]> = std::sync::OnceLock::new();

/// A new allocation (any API cudaw serves), named by the API that made it.
pub fn alloc(base: u64, size: u64, api: &'static str) {
    if let Some(t) = tracer() {
        let site = shadow::caller_address::<Rt>().and_then(shadow::library_of);
        t.record_alloc(base, size, api, site.as_deref());
    }
}

/// The allocation at `base` is freed.
pub fn free(base: u64) {
    if let Some(t) = tracer() {
        t.record_free(base);
    }
}

/// Runs the copy `f` of `bytes` (`cudaMemcpyKind` `kind`) from `src` to `dst`, recording it
/// when it succeeds ([`cudaw_engine::trace::copy`]).
#[inline]
pub fn copy(
    kind: i32,
    bytes: usize,
    dst: *const c_void,
    src: *const c_void,
    f: impl FnOnce() -> u32,
) -> u32 {
    trace::copy(tracer(), kind, bytes, dst, src, f)
}

/// Runs the launch `run` of `rec`'s kernel, recording it when it succeeds
/// ([`cudaw_engine::trace::launch`]).
#[inline]
#[allow(clippy::too_many_arguments)]
pub fn launch(
    rec: Option<&registry::FunctionRecord>,
    lookup_ticks: u64,
    grid: [u32; 3],
    block: [u32; 3],
    shared: usize,
    args: *mut *mut c_void,
    sm: fn() -> u32,
    run: impl FnOnce(Option<bool>) -> (u32, bool),
) -> u32 {
    // SAFETY: `args` is the launch's argument array (the launch's contract).
    unsafe {
        trace::launch(
            tracer(),
            rec,
            lookup_ticks,
            grid,
            block,
            shared,
            args,
            sm,
            run,
        )
    }
}

/// `f()` and, with `CUDAW_TRACE_SELF=1` and tracing on, the ticks it took (else 0): a launch
/// wrapper times its record lookup with it.
#[inline]
pub fn self_timed<R>(f: impl FnOnce() -> R) -> (R, u64) {
    cudaw_engine::trace::self_timed(tracer().is_some(), f)
}

/// A pause (or a resume) that took from tick `start` until now and moved `bytes` of
/// `allocations`.
pub fn pause(resume: bool, start: u64, allocations: u64, bytes: u64) {
    if let Some(t) = tracer() {
        t.record_pause(resume, start, t.now(), allocations, bytes);
    }
}

/// Ticks now (0 when tracing is off).
pub fn now() -> u64 {
    tracer().map_or(0, |t| t.now())
}

// ------------------------------------------------------------------ reading

extern "C" fn at_exit() {
    crate::boundary::guard("the trace summary at exit", (), || {
        cudaw_engine::trace::log_exit_summary(&trace_file(), pending_calls, rust_enters())
    })
}
